"""GPT-2 with a Finite Admixture of Shared Heads (FiSHformer) as an ordinary HF model.

Nguyen et al., "Improving Transformer with an Admixture of Attention Heads" (NeurIPS 2022,
openreview.net/forum?id=0VFQhPGF1M3). M global query/key heads give M score matrices; each of the H local heads
attends with a mixture of them (Eqn. 9-12 of the paper) over its own value head. Embeddings, MLP, layer norms
and the LM head are HF's GPT-2 modules and weight names. `c_attn` keeps its name but projects to
[Q_1..Q_M, K_1..K_M, V_1..V_H]; a stock GPT-2 checkpoint is converted on load (its first M heads become the
global Q/K heads). The math lives in `attention_fish.py`; the GPT-2 stack (blocks, cache, heads, stock loading) is
`modeling_decoder.py`, shared with MGK-GPT2.
Imports: torch, transformers and siblings only (remote code).
"""

import torch
from torch import nn
from transformers.generation import GenerationMixin
from transformers.pytorch_utils import Conv1D

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
from .config_checks import check_int_range  # noqa: F401
from .configuration_fish import FiSHConfigMixin  # noqa: F401
from .configuration_fish_gpt2 import FiSHGPT2Config
from .modeling_common import cached_length, mask_for_cached_keys, wants_attentions
from .modeling_decoder import (
    STOCK_C_ATTN,
    DecoderLMHeadMixin,
    DecoderModelMixin,
    DecoderPreTrainedModel,
    DecoderSequenceClassificationMixin,
    attention_scaling,
    cache_update,
)
from .modeling_fish import FiSHAttentionCore, init_fish_weights
from .modeling_heads import CausalLMHeadMixin  # noqa: F401
from .modeling_warm_start import head_index
from .transformers_compat import init  # noqa: F401


class FiSHGPT2Attention(FiSHAttentionCore):
    """Causal self-attention: softmax (H heads, the baseline) or FiSH (M global Q/K heads, H local value heads).

    The KV cache holds what the next tokens need: the M global keys and the H values."""

    def __init__(self, config: FiSHGPT2Config, layer_idx=None):
        head_dim = config.attention_head_size
        num_qk_heads = config.n_head if config.attention_type == "softmax" else config.num_global_heads
        super().__init__(config, config.n_head, num_qk_heads, head_dim,
                         attention_scaling(config, layer_idx, head_dim), config.attn_pdrop)
        self.layer_idx = layer_idx
        self.split = (self.num_qk_heads * self.head_dim, self.num_qk_heads * self.head_dim,
                      self.num_heads * self.head_dim)
        self.c_attn = Conv1D(sum(self.split), config.n_embd)
        self.c_proj = Conv1D(config.n_embd, self.num_heads * self.head_dim)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def _heads(self, x, n_heads):
        return x.view(*x.shape[:-1], n_heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden_states, past_key_values=None, attention_mask=None, **kwargs):
        """attention_mask: None, bool (B, S_past + N) (True = real token) or a caller's whole (B, 1, N, S) mask (see
        `attention_mask_from`)."""
        query, key, value = self.c_attn(hidden_states).split(self.split, dim=-1)
        query, key = self._heads(query, self.num_qk_heads), self._heads(key, self.num_qk_heads)
        value = self._heads(value, self.num_heads)
        if past_key_values is not None:
            past = cached_length(past_key_values, self.layer_idx)
            key, value = cache_update(past_key_values, self.layer_idx, key, value)
            attention_mask = mask_for_cached_keys(attention_mask, True, past, query.shape[-2], key.shape[-2],
                                                  key.device)
        out, weights = self.attend(query, key, value, attention_mask, wants_attentions(self.config, kwargs))
        out = out.transpose(1, 2).reshape(*hidden_states.shape[:-1], self.num_heads * self.head_dim)
        return self.resid_dropout(self.c_proj(out)), weights


class FiSHGPT2PreTrainedModel(DecoderPreTrainedModel):
    """`from_pretrained` of a stock GPT-2 checkpoint (model_type "gpt2") with FiSH heads asked for converts it: its
    embeddings, MLPs, norms, values and output projections are copied; the global Q/K heads are its first M
    query/key heads, or the heads listed in `keep_heads` (one list for every layer, or one list per layer; M =
    num_global_heads, or the lists' length when that is not given)."""

    config_class = FiSHGPT2Config
    config: FiSHGPT2Config
    attention_class = FiSHGPT2Attention
    _auto_map = {
        "AutoModel": "FiSHGPT2Model",
        "AutoModelForCausalLM": "FiSHGPT2LMHeadModel",
        "AutoModelForSequenceClassification": "FiSHGPT2ForSequenceClassification",
    }
    # Our fields that GPT2Config lacks: the rest of the keywords go to the stock class's own from_pretrained.
    _family_fields = ("attention_type", "num_global_heads", "head_dim", "fish_noise_init", "fish_mixing_init")
    _head_count = "num_global_heads"
    _new_parameters = (".attn.mixing", ".attn.noise_std")
    _kept_heads_note = "as the global query/key heads (every value head kept)"
    _kept_heads_condition = ", attention_type other than 'softmax'"

    def _init_family_weights(self, module):
        init_fish_weights(self, module)

    @classmethod
    def _converts_stock(cls, kwargs):
        return kwargs.get("attention_type", "fish") != "softmax"

    @classmethod
    def _default_head_count(cls, stock_heads):
        return FiSHGPT2Config().num_global_heads

    @classmethod
    def _convert_stock_state(cls, state, config, kept, stock_dim):
        """Conv1D c_attn (in, out), out = [Q | K | V]: keep the chosen heads' Q and K (the global heads), every V."""
        d = config.n_embd
        out = {}
        for name, tensor in state.items():
            match = STOCK_C_ATTN.search(name)
            if match:
                qk = head_index(kept[int(match.group(1))], stock_dim, tensor.device)
                tensor = torch.cat([tensor[..., qk], tensor[..., d + qk], tensor[..., 2 * d:]], dim=-1)
            out[name] = tensor
        return out


class FiSHGPT2Model(DecoderModelMixin, FiSHGPT2PreTrainedModel):
    pass


class FiSHGPT2LMHeadModel(DecoderLMHeadMixin, FiSHGPT2PreTrainedModel, GenerationMixin):
    base_model_class = FiSHGPT2Model


class FiSHGPT2ForSequenceClassification(DecoderSequenceClassificationMixin, FiSHGPT2PreTrainedModel):
    base_model_class = FiSHGPT2Model


__all__ = [
    "FiSHGPT2PreTrainedModel",
    "FiSHGPT2Model",
    "FiSHGPT2LMHeadModel",
    "FiSHGPT2ForSequenceClassification",
]
