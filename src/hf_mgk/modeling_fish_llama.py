"""A Llama-architecture decoder with a Finite Admixture of Shared Heads as an ordinary HF model.

FiSH: Nguyen et al., "Improving Transformer with an Admixture of Attention Heads" (NeurIPS 2022,
openreview.net/forum?id=0VFQhPGF1M3): M global query/key heads give M score matrices; each of the H local heads
attends with a mixture of them (Eqn. 9-12) over its own value head. Neither the paper nor its code puts FiSH on
this stack (rotary positions, grouped-query attention, RMSNorm, SwiGLU): a new combination, not a reproduction.
`q_proj` and `k_proj` project to the M global heads, rotated by the positions; the H local heads read the
`num_key_value_heads` value heads by groups, as grouped-query attention's query heads do. A stock Llama checkpoint
converts as grouped-query attention converts multi-head checkpoints (Ainslie et al., "GQA: Training Generalized
Multi-Query Transformer Models from Multi-Head Checkpoints", EMNLP 2023, Sec. 2.1: mean-pooled heads): each global
head is the mean of a group of the stock heads. The math lives in `attention_fish.py`, the FiSH weights in
`modeling_fish.py`, the Llama stack in `modeling_llama_stack.py`.
Imports: torch, transformers and siblings only (remote code)."""

import torch
from torch import nn
from transformers.generation import GenerationMixin

# transformers 5.8 and 5.9 copy, from a local folder, only the siblings the model file itself imports: so it
# names every sibling its siblings import, too.
from .attention_autotune import choose  # noqa: F401
from .attention_blocks import row_blocks  # noqa: F401
from .attention_fish import fish_attention  # noqa: F401
from .attention_fish_recomputed import mix  # noqa: F401
from .attention_fish_triton import fish_triton  # noqa: F401
# (LOG2E: a name these two have without Triton too)
from .attention_fish_triton_linear import LOG2E  # noqa: F401
from .attention_fish_triton_network import LOG2E  # noqa: F401,F811
from .attention_masks import allowed_pairs  # noqa: F401
from .attention_triton import available  # noqa: F401
from .config_checks import check_key_value_heads  # noqa: F401
from .configuration_fish import FiSHConfigMixin  # noqa: F401
from .configuration_fish_llama import FiSHLlamaConfig
from .modeling_common import cached_length, mask_for_cached_keys, wants_attentions
from .modeling_decoder import cache_update
from .modeling_fish import FiSHAttentionCore, init_fish_weights
from .modeling_heads import CausalLMHeadMixin  # noqa: F401
from .modeling_llama_stack import (
    LlamaStackForCausalLMMixin,
    LlamaStackForSequenceClassificationMixin,
    LlamaStackModelMixin,
    LlamaStackPreTrainedModel,
    expand_groups,
    rotate,
)
from .modeling_warm_start import converted_model  # noqa: F401
from .transformers_compat import init  # noqa: F401


class FiSHLlamaAttention(FiSHAttentionCore):
    """Causal self-attention: softmax (Llama's grouped-query attention, the baseline) or FiSH (M global Q/K heads,
    H local heads reading the key/value heads' values by groups).

    The KV cache holds what the next tokens need: the M rotated global keys and the `num_key_value_heads` values
    (the softmax baseline: Llama's keys and values)."""

    def __init__(self, config: FiSHLlamaConfig, layer_idx=None):
        head_dim = config.attention_head_size
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        softmax = config.attention_type == "softmax"
        super().__init__(config, heads, heads if softmax else config.num_global_heads, head_dim, head_dim**-0.5,
                         config.attention_dropout)
        self.layer_idx = layer_idx
        self.num_key_value_heads = kv_heads
        self.num_key_heads = kv_heads if softmax else self.num_qk_heads
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.num_qk_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_key_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)

    def _heads(self, x, n_heads):
        return x.view(*x.shape[:-1], n_heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden_states, position_embeddings, past_key_values=None, attention_mask=None, **kwargs):
        """attention_mask: None, bool (B, S_past + N) (True = real token) or a caller's whole (B, 1, N, S) mask (see
        `attention_mask_from`)."""
        query = self._heads(self.q_proj(hidden_states), self.num_qk_heads)
        key = self._heads(self.k_proj(hidden_states), self.num_key_heads)
        value = self._heads(self.v_proj(hidden_states), self.num_key_value_heads)
        query, key = rotate(query, key, position_embeddings)
        if past_key_values is not None:
            past = cached_length(past_key_values, self.layer_idx)
            key, value = cache_update(past_key_values, self.layer_idx, key, value)
            attention_mask = mask_for_cached_keys(attention_mask, True, past, query.shape[-2], key.shape[-2],
                                                  key.device)
        if self.attention_type == "softmax":
            key = expand_groups(key, self.num_heads)
        out, weights = self.attend(query, key, expand_groups(value, self.num_heads), attention_mask,
                                   wants_attentions(self.config, kwargs))
        out = out.transpose(1, 2).reshape(*hidden_states.shape[:-1], self.num_heads * self.head_dim)
        return self.o_proj(out), weights


class FiSHLlamaPreTrainedModel(LlamaStackPreTrainedModel):
    """`from_pretrained` of a stock Llama checkpoint (model_type "llama") with FiSH heads asked for converts it:
    its embeddings, MLPs, norms, values and output projections are copied; global query head k is the mean of the
    checkpoint's query heads k * H/M ... (k + 1) * H/M - 1 (so M must divide H), global key head k the mean of the
    key/value heads those query heads read; FiSH's and hard FiSH's mixing starts with each local head reading its
    group's global head alone (p_kj = 1 where k = j // (H/M), else 0), so that with M = H and hard FiSH the
    converted model is the checkpoint's function. MiSH's and GFiSH's mixing cannot pick a head per local head and
    start as new models' do (see `fish_mixing_init`)."""

    config_class = FiSHLlamaConfig
    config: FiSHLlamaConfig
    attention_class = FiSHLlamaAttention
    _auto_map = {
        "AutoModel": "FiSHLlamaModel",
        "AutoModelForCausalLM": "FiSHLlamaForCausalLM",
        "AutoModelForSequenceClassification": "FiSHLlamaForSequenceClassification",
    }
    _family_fields = ("attention_type", "num_global_heads", "fish_noise_init", "fish_mixing_init", "backend")
    _new_parameters = (".self_attn.mixing", ".self_attn.noise_std")

    def _init_family_weights(self, module):
        init_fish_weights(self, module)

    @classmethod
    def _check_stock_shape(cls, config, checkpoint):
        heads, m = config.num_attention_heads, config.num_global_heads
        if config.attention_type != "softmax" and heads % m:
            raise ValueError(
                f"cannot convert a Llama checkpoint with {heads} query heads into num_global_heads={m}: each global "
                f"head is the mean of a group of the checkpoint's query heads, so num_global_heads must divide {heads}"
            )

    @classmethod
    def _convert_stock_state(cls, state, config, stock_config):
        if config.attention_type == "softmax":
            return dict(state)
        heads, m, kv_heads = config.num_attention_heads, config.num_global_heads, config.num_key_value_heads
        d, group = config.attention_head_size, heads // m
        reads = torch.arange(heads) // (heads // kv_heads)  # the key/value head each query head reads

        def pooled(tensor, rows):  # (rows of heads * d, ...) -> the mean of each group of `group` heads
            per_head = tensor.reshape(-1, d, *tensor.shape[1:])[rows]
            return per_head.reshape(m, group, d, *tensor.shape[1:]).mean(1).reshape(m * d, *tensor.shape[1:])

        out = {}
        for name, tensor in state.items():
            if ".self_attn.q_proj." in name:
                tensor = pooled(tensor, torch.arange(heads))
            elif ".self_attn.k_proj." in name:
                tensor = pooled(tensor, reads)
            out[name] = tensor
            if name.endswith(".self_attn.q_proj.weight") and config.attention_type in ("fish", "hard_fish"):
                one_hot = torch.arange(m)[:, None] == torch.arange(heads)[None] // group  # p_kj
                out[name.replace("q_proj.weight", "mixing")] = one_hot.to(tensor.dtype)
        return out


class FiSHLlamaModel(LlamaStackModelMixin, FiSHLlamaPreTrainedModel):
    pass


class FiSHLlamaForCausalLM(LlamaStackForCausalLMMixin, FiSHLlamaPreTrainedModel, GenerationMixin):
    base_model_class = FiSHLlamaModel


class FiSHLlamaForSequenceClassification(LlamaStackForSequenceClassificationMixin, FiSHLlamaPreTrainedModel):
    base_model_class = FiSHLlamaModel


__all__ = [
    "FiSHLlamaPreTrainedModel",
    "FiSHLlamaModel",
    "FiSHLlamaForCausalLM",
    "FiSHLlamaForSequenceClassification",
]
