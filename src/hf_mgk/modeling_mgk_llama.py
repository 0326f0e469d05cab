"""A Llama-architecture decoder with Mixture-of-Gaussian-Keys attention as an ordinary HF model.

MGK: Nguyen et al., "Improving Transformers with Probabilistic Attention Keys" (ICML 2022, arXiv:2110.08678):
each position has M keys and a query attends to their Gaussian mixture (Eq. 7), the prior pi learned, estimated by
EM (Eq. 8) or uniform. Neither the paper nor its code puts MGK on this stack (rotary positions, grouped-query
attention, RMSNorm, SwiGLU): a new combination, not a reproduction. Each key/value head holds M keys and one value
per position for its group of query heads; rotary positions rotate the queries and every key. The math lives in
`attention_mgk.py`, the MGK weights in `modeling_mgk.py`, the Llama stack in `modeling_llama_stack.py`.
Imports: torch, transformers and siblings only (remote code)."""

import torch
from torch import nn
from transformers.generation import GenerationMixin

# transformers 5.8 and 5.9 copy, from a local folder, only the siblings the model file itself imports: so it
# names every sibling its siblings import, too.
from .attention_autotune import choose  # noqa: F401
from .attention_blocks import row_blocks  # noqa: F401
from .attention_masks import allowed_pairs  # noqa: F401
from .attention_mgk import mgk_attention  # noqa: F401
from .attention_mgk_blocked import mgk_blocked  # noqa: F401
from .attention_mgk_triton import mgk_triton  # noqa: F401
from .attention_triton import available  # noqa: F401
from .config_checks import check_key_value_heads  # noqa: F401
from .configuration_mgk import MGKConfigMixin  # noqa: F401
from .configuration_mgk_llama import MGKLlamaConfig
from .modeling_common import cached_length, mask_for_cached_keys, wants_attentions
from .modeling_decoder import cache_update
from .modeling_heads import CausalLMHeadMixin  # noqa: F401
from .modeling_llama_stack import (
    LlamaStackForCausalLMMixin,
    LlamaStackForSequenceClassificationMixin,
    LlamaStackModelMixin,
    LlamaStackPreTrainedModel,
    expand_groups,
    rotate,
)
from .modeling_mgk import SEPARATE_KEY_TYPES, MGKAttentionCore, extra_key_start, init_mgk_weights
from .modeling_warm_start import converted_model  # noqa: F401
from .transformers_compat import init  # noqa: F401


class MGKLlamaAttention(MGKAttentionCore):
    """Causal self-attention: softmax (Llama's grouped-query attention, the baseline) or MGK with M keys per
    position and key/value head.

    The KV cache holds what later tokens need of a position: its value and its M rotated keys, side by side in one
    head of width M * D per key/value head (the softmax baseline: its one key)."""

    def __init__(self, config: MGKLlamaConfig, layer_idx=None):
        head_dim = config.attention_head_size
        super().__init__(config, config.num_attention_heads, head_dim, True, config.attention_dropout,
                         key_heads=config.num_key_value_heads)
        self.layer_idx = layer_idx
        self.num_key_value_heads = config.num_key_value_heads
        self.scaling = head_dim**-0.5  # the softmax baseline's
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_key_value_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_key_value_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * head_dim, hidden, bias=bias)
        if self.has_extra_keys:
            self.extra_keys = nn.ModuleList(nn.Linear(hidden, self.num_key_value_heads * head_dim, bias=bias)
                                            for _ in range(self.num_keys - 1))

    def first_key_module(self):
        return self.k_proj

    def first_key_parameters(self):
        return self.k_proj.weight, self.k_proj.bias

    def _heads(self, x, n_heads):
        return x.view(*x.shape[:-1], n_heads, self.head_dim).transpose(1, 2)

    def _keys(self, hidden_states, key):
        """Every key of every position, (B, Hkv, M, N, D), before rotation: option A's M projections, option B's
        one key plus each shift."""
        if self.has_extra_keys:
            extra = [self._heads(k(hidden_states), self.num_key_value_heads) for k in self.extra_keys]
            return torch.stack([key, *extra], dim=2)
        return self.all_keys(key)

    def forward(self, hidden_states, position_embeddings, past_key_values=None, attention_mask=None, **kwargs):
        """attention_mask: None, bool (B, S_past + N) (True = real token) or a caller's whole (B, 1, N, S) mask (see
        `attention_mask_from`)."""
        batch, length = hidden_states.shape[:2]
        hkv, m, d = self.num_key_value_heads, self.num_keys, self.head_dim
        query = self._heads(self.q_proj(hidden_states), self.num_heads)
        key = self._heads(self.k_proj(hidden_states), hkv)
        value = self._heads(self.v_proj(hidden_states), hkv)
        softmax = self.attention_type == "softmax"
        if softmax:
            query, stored = rotate(query, key, position_embeddings)
        else:
            query, keys = rotate(query, self._keys(hidden_states, key).flatten(1, 2), position_embeddings)
            stored = keys.view(batch, hkv, m, length, d).transpose(2, 3).flatten(-2)  # (B, Hkv, N, M * D)
        if past_key_values is not None:
            past = cached_length(past_key_values, self.layer_idx)
            stored, value = cache_update(past_key_values, self.layer_idx, stored, value)
            attention_mask = mask_for_cached_keys(attention_mask, True, past, length, value.shape[-2], value.device)
        # view with the traced sizes, not unflatten (see MGK-GPT2's _project)
        keys = stored if softmax else stored.view(*stored.shape[:-1], m, d).permute(0, 1, 3, 2, 4)
        out, weights = self.attend(query, expand_groups(keys, self.num_heads), expand_groups(value, self.num_heads),
                                   attention_mask, wants_attentions(self.config, kwargs), scale=self.scaling,
                                   every_key=not softmax)
        out = out.transpose(1, 2).reshape(batch, length, self.num_heads * d)
        return self.o_proj(out), weights


class MGKLlamaPreTrainedModel(LlamaStackPreTrainedModel):
    """`from_pretrained` of a stock Llama checkpoint (model_type "llama") converts it: every weight is copied, and
    option A's extra keys start from the checkpoint's keys plus small noise, option B's shifts from zero for the
    first key and small noise for the others. `attention_type="softmax"` is stock Llama."""

    config_class = MGKLlamaConfig
    config: MGKLlamaConfig
    attention_class = MGKLlamaAttention
    _auto_map = {
        "AutoModel": "MGKLlamaModel",
        "AutoModelForCausalLM": "MGKLlamaForCausalLM",
        "AutoModelForSequenceClassification": "MGKLlamaForSequenceClassification",
    }
    _family_fields = ("attention_type", "num_keys", "e_step", "mgk_prior", "mgk_variances", "backend")
    _new_parameters = (".self_attn.key_shift", ".self_attn.prior")

    def _init_family_weights(self, module):
        init_mgk_weights(self, module)

    @classmethod
    def _convert_stock_state(cls, state, config, stock_config):
        extra = config.num_keys - 1 if config.attention_type in SEPARATE_KEY_TYPES else 0
        out = {}
        for name, tensor in state.items():
            out[name] = tensor
            if ".self_attn.k_proj." in name:
                for r in range(extra):
                    start = extra_key_start(tensor, config.initializer_range) if name.endswith("weight") \
                        else tensor.clone()
                    out[name.replace(".self_attn.k_proj.", f".self_attn.extra_keys.{r}.")] = start
        return out


class MGKLlamaModel(LlamaStackModelMixin, MGKLlamaPreTrainedModel):
    pass


class MGKLlamaForCausalLM(LlamaStackForCausalLMMixin, MGKLlamaPreTrainedModel, GenerationMixin):
    base_model_class = MGKLlamaModel


class MGKLlamaForSequenceClassification(LlamaStackForSequenceClassificationMixin, MGKLlamaPreTrainedModel):
    base_model_class = MGKLlamaModel


__all__ = [
    "MGKLlamaPreTrainedModel",
    "MGKLlamaModel",
    "MGKLlamaForCausalLM",
    "MGKLlamaForSequenceClassification",
]
