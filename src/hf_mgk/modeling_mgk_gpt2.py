"""GPT-2 with Mixture-of-Gaussian-Keys attention as an ordinary HF model: the MGK paper's causal language modeling.

Nguyen et al., "Improving Transformers with Probabilistic Attention Keys" (ICML 2022, arXiv:2110.08678): every
key position carries M keys k_j1..k_jM, and query i attends to position j with weight proportional to
sum_r pi_r N(q_i | k_jr, sigma_r^2 I) (Eq. 7; soft E-step) or its largest term (hard E-step), j <= i. Option A
(`mgk`, `mlk`) projects the M keys separately, option B (`smgk`, `smlk`) shifts one key by learned b_r (Sec. 2.3);
`mlk` / `smlk` are the mixtures of linear keys (Sec. 2.4).

The GPT-2 stack (blocks, cache, heads, stock loading) is `modeling_decoder.py`, shared with FiSH-GPT2; the MGK glue
(prior, lagged EM, kernel choice) is `modeling_mgk.py`, shared with MGK-BERT; the math is `attention_mgk.py`.
Weight names are GPT-2's: `c_attn` projects to [Q | K | V] as in GPT-2 (so `attention_type="softmax"` is GPT-2
itself), option A adds `attn.extra_keys.{r}` (keys 2..M), option B `attn.key_shift`.
Imports torch, transformers and siblings only (remote code)."""

import torch
from torch import nn
from transformers.generation import GenerationMixin
from transformers.pytorch_utils import Conv1D

# transformers 5.8 and 5.9 copy, from a local folder, only the siblings the model file itself imports: so it
# names every sibling its siblings import, too.
from .attention_autotune import choose  # noqa: F401
from .attention_blocks import row_blocks  # noqa: F401
from .attention_mgk_blocked import mgk_blocked  # noqa: F401
from .attention_mgk_triton import mgk_triton  # noqa: F401
from .attention_triton import available  # noqa: F401
from .attention_masks import allowed_pairs  # noqa: F401
from .attention_mgk import mgk_attention  # noqa: F401
from .config_checks import check_int_range  # noqa: F401
from .configuration_mgk import MGKConfigMixin  # noqa: F401
from .configuration_mgk_gpt2 import MGKGPT2Config
from .modeling_common import cached_length, mask_for_cached_keys, wants_attentions
from .modeling_decoder import (
    STOCK_C_ATTN,
    STOCK_C_PROJ,
    DecoderLMHeadMixin,
    DecoderModelMixin,
    DecoderPreTrainedModel,
    DecoderSequenceClassificationMixin,
    attention_scaling,
    cache_update,
)
from .modeling_heads import CausalLMHeadMixin  # noqa: F401
from .modeling_mgk import SEPARATE_KEY_TYPES, MGKAttentionCore, extra_key_start, init_mgk_weights, plain_projections
from .modeling_warm_start import head_index
from .transformers_compat import init  # noqa: F401


class MGKGPT2Attention(MGKAttentionCore):
    """Causal self-attention: softmax (GPT-2's, the baseline) or MGK with M keys per position.

    The KV cache holds what later tokens need of a position: its value and its keys in their stored form (option
    A: the M keys, side by side in one head of width M * D; option B: the one key, the shifts being weights)."""

    def __init__(self, config: MGKGPT2Config, layer_idx=None):
        super().__init__(config, config.n_head, config.attention_head_size, True, config.attn_pdrop)
        self.layer_idx = layer_idx
        self.scaling = attention_scaling(config, layer_idx, self.head_dim)  # the softmax baseline's
        inner = self.num_heads * self.head_dim
        self.c_attn = Conv1D(3 * inner, config.n_embd)
        if self.has_extra_keys:
            self.extra_keys = nn.ModuleList(Conv1D(inner, config.n_embd) for _ in range(self.num_keys - 1))
        self.c_proj = Conv1D(config.n_embd, inner)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def first_key_module(self):
        return self.c_attn

    def first_key_parameters(self):
        inner = self.num_heads * self.head_dim
        return self.c_attn.weight[:, inner:2 * inner], self.c_attn.bias[inner:2 * inner]

    def _heads(self, x):
        return x.view(*x.shape[:-1], -1, self.head_dim).transpose(1, 2)

    def _project(self, hidden_states):
        """query (B, H, N, D), keys in their stored form, value (B, H, N, D)."""
        inner = self.num_heads * self.head_dim
        if not self.has_extra_keys:
            query, key, value = self.c_attn(hidden_states).split(inner, dim=-1)
            return self._heads(query), self._heads(key), self._heads(value)
        if plain_projections(self.c_attn, *self.extra_keys):
            # One matmul for Q, V and the M keys, the keys last so that they come out as one (B, N, M, H, D) block.
            w, b = self.c_attn.weight, self.c_attn.bias
            weight = torch.cat([w[:, :inner], w[:, 2 * inner:], w[:, inner:2 * inner]]
                               + [k.weight for k in self.extra_keys], dim=1)
            bias = torch.cat([b[:inner], b[2 * inner:], b[inner:2 * inner]] + [k.bias for k in self.extra_keys])
            projected = torch.addmm(bias, hidden_states.reshape(-1, hidden_states.shape[-1]), weight)
            query, value, keys = projected.view(*hidden_states.shape[:-1], -1).split(
                [inner, inner, self.num_keys * inner], dim=-1)
        else:  # a wrapped projection (LoRA, a hook) runs its own forward
            query, key, value = self.c_attn(hidden_states).split(inner, dim=-1)
            keys = torch.cat([key] + [k(hidden_states) for k in self.extra_keys], dim=-1)
        # view with the traced sizes, not unflatten: torch.jit.trace (TorchScript ONNX export) keeps unflatten's
        # output sizes as constants, which froze the batch size of the exported graph
        keys = keys.view(*keys.shape[:-1], self.num_keys, self.num_heads, self.head_dim).permute(0, 3, 2, 1, 4)
        return self._heads(query), keys, self._heads(value)

    def forward(self, hidden_states, past_key_values=None, attention_mask=None, **kwargs):
        """attention_mask: None, bool (B, S_past + N) (True = real token) or a caller's whole (B, 1, N, S) mask (see
        `attention_mask_from`)."""
        query, keys, value = self._project(hidden_states)
        if past_key_values is not None:
            past = cached_length(past_key_values, self.layer_idx)
            option_a = self.has_extra_keys
            stored = keys.permute(0, 1, 3, 2, 4).flatten(-2) if option_a else keys  # (B, H, N, M * D)
            stored, value = cache_update(past_key_values, self.layer_idx, stored, value)
            if option_a:  # (view, as in _project: traced sizes stay symbolic)
                stored = stored.view(*stored.shape[:-1], self.num_keys, self.head_dim).permute(0, 1, 3, 2, 4)
            keys = stored
            attention_mask = mask_for_cached_keys(attention_mask, True, past, query.shape[-2], value.shape[-2],
                                                  value.device)
        out, weights = self.attend(query, keys, value, attention_mask, wants_attentions(self.config, kwargs),
                                   scale=self.scaling)
        out = out.transpose(1, 2).reshape(*hidden_states.shape[:-1], self.num_heads * self.head_dim)
        return self.resid_dropout(self.c_proj(out)), weights


class MGKGPT2PreTrainedModel(DecoderPreTrainedModel):
    """`from_pretrained` of a stock GPT-2 checkpoint (model_type "gpt2") converts it: everything is copied, with
    its first `n_head` heads (default: all) or those listed in `keep_heads` (one list for every layer, or one list
    per layer) kept at the checkpoint's head size: their query/key/value columns of `c_attn` and rows of
    `attn.c_proj`. Option A's extra keys start from the kept key heads plus small noise, option B's shifts from
    zero for the first key and small noise for the others. `attention_type="softmax"` with all heads is GPT-2."""

    config_class = MGKGPT2Config
    config: MGKGPT2Config
    attention_class = MGKGPT2Attention
    _auto_map = {
        "AutoModel": "MGKGPT2Model",
        "AutoModelForCausalLM": "MGKGPT2LMHeadModel",
        "AutoModelForSequenceClassification": "MGKGPT2ForSequenceClassification",
    }
    # Our fields that GPT2Config lacks, and the head count that the conversion decides.
    _family_fields = ("attention_type", "num_keys", "e_step", "mgk_prior", "mgk_variances", "head_dim", "n_head")
    _head_count = "n_head"
    _new_parameters = (".attn.key_shift", ".attn.prior")
    _kept_heads_note = "(their query/key/value columns of attn.c_attn and rows of attn.c_proj; the others dropped)"

    def _init_family_weights(self, module):
        init_mgk_weights(self, module)

    @classmethod
    def _convert_stock_state(cls, state, config, kept, stock_dim):
        d, inner = config.n_embd, config.n_head * config.attention_head_size
        extra = config.num_keys - 1 if config.attention_type in SEPARATE_KEY_TYPES else 0
        out = {}
        for name, tensor in state.items():
            c_attn = STOCK_C_ATTN.search(name)
            layer = c_attn or STOCK_C_PROJ.search(name)
            if layer:
                index = head_index(kept[int(layer.group(1))], stock_dim, tensor.device)
            if c_attn:  # (in, [Q | K | V]) -> the kept heads of each
                tensor = torch.cat([tensor[..., index], tensor[..., d + index], tensor[..., 2 * d + index]], dim=-1)
                key = tensor[..., inner:2 * inner]
                is_weight = name.endswith("weight")
                for r in range(extra):
                    start = extra_key_start(key, config.initializer_range) if is_weight else key.clone()
                    out[name.replace("attn.c_attn.", f"attn.extra_keys.{r}.")] = start
            elif layer:  # c_proj.weight (H * D, n_embd): the kept heads' rows
                tensor = tensor[index]
            out[name] = tensor
        return out


class MGKGPT2Model(DecoderModelMixin, MGKGPT2PreTrainedModel):
    pass


class MGKGPT2LMHeadModel(DecoderLMHeadMixin, MGKGPT2PreTrainedModel, GenerationMixin):
    base_model_class = MGKGPT2Model


class MGKGPT2ForSequenceClassification(DecoderSequenceClassificationMixin, MGKGPT2PreTrainedModel):
    base_model_class = MGKGPT2Model


__all__ = [
    "MGKGPT2PreTrainedModel",
    "MGKGPT2Model",
    "MGKGPT2LMHeadModel",
    "MGKGPT2ForSequenceClassification",
]
