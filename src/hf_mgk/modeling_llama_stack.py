"""Llama's decoder stack with a pluggable causal self-attention, shared by MGK-Llama and FiSH-Llama (as
`modeling_decoder.py` is GPT-2's for MGK-GPT2 and FiSH-GPT2). The stack of Llama, Mistral, Qwen2, SmolLM and
TinyLlama checkpoints: rotary positions, grouped-query attention, RMSNorm, SwiGLU.

Llama's own modules are transformers': `LlamaRMSNorm`, `LlamaMLP`, `LlamaRotaryEmbedding` (every rope type the
installed release supports) and `apply_rotary_pos_emb`. Written once here: the decoder layers, the token
embeddings, the cache (dynamic and static), masks and positions, gradient checkpointing, `generate` support, the LM
and sequence-classification heads, and the conversion of a stock Llama checkpoint. Module and weight names are
stock Llama's (`model.embed_tokens`, `model.layers.{i}.self_attn.q_proj` / `k_proj` / `v_proj` / `o_proj`,
`.mlp.gate_proj` / `up_proj` / `down_proj`, `.input_layernorm`, `.post_attention_layernorm`, `model.norm`,
`lm_head`, `score`), so stock Llama weights load by name.

A family supplies:
- an attention class: `__init__(config, layer_idx)`, `forward(hidden_states, position_embeddings, past_key_values,
  attention_mask, **kwargs) -> (output (B, N, hidden_size) after o_proj, weights or None)`, rotating its queries
  and keys by `rotate` before the cache stores them; attention_mask as in `modeling_decoder.py`;
- a `LlamaStackPreTrainedModel` subclass naming its config class, its attention class and how a stock Llama
  checkpoint becomes its weights (`_convert_stock_state`, `_check_stock_shape` and the class attributes there);
- the model classes, each a mixin below plus that subclass.
Imports torch, transformers and siblings only (remote code)."""

import torch
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import PreTrainedModel
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from .modeling_common import AttentionImplementationMixin, AutoMapMixin, can_return_tuple, is_tracing
from .modeling_decoder import DecoderSequenceClassificationMixin, decoder_cache, run_decoder
from .modeling_heads import CausalLMHeadMixin
from .modeling_warm_start import WarmStartMixin, WarmStartPlan, converted_model, hub_kwargs
from .transformers_compat import PreTrainedConfig, TiedParametersCompat


def rotate(query, key, position_embeddings):
    """query (B, Hq, N, D) and key (B, Hk, N, D) rotated by the positions' (cos, sin) (B, N, D), as Llama rotates
    its queries and keys (any head counts: the rotation is the same for every head)."""
    cos, sin = position_embeddings
    return apply_rotary_pos_emb(query, key, cos, sin)


def expand_groups(x, num_heads):
    """(B, Hkv, ...) -> (B, num_heads, ...): each key/value head repeated for the group of query heads it serves
    (grouped-query attention: query head h reads key/value head h // (num_heads / Hkv))."""
    groups = num_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


class LlamaStackDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config, attention_class, layer_idx):
        super().__init__()
        self.self_attn = attention_class(config, layer_idx=layer_idx)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    @property
    def self_attention(self):
        """The family's attention module (run_layers calls its per-training-forward hook)."""
        return self.self_attn

    def forward(self, hidden_states, past_key_values=None, attention_mask=None, position_embeddings=None, **kwargs):
        attn_output, weights = self.self_attn(self.input_layernorm(hidden_states), position_embeddings,
                                              past_key_values, attention_mask, **kwargs)
        hidden_states = hidden_states + attn_output
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states)), weights


class LlamaStackPreTrainedModel(WarmStartMixin, AutoMapMixin, AttentionImplementationMixin, TiedParametersCompat,
                                PreTrainedModel):
    """What both Llama families share: Llama's initialisation and loading rules, and the warm start from a stock
    Llama checkpoint (model_type "llama") converted to the family (`WarmStartMixin`'s protocol).

    Class attributes of a family: `config_class`; `attention_class`; `_family_fields` (its config fields that
    `LlamaConfig` lacks); `_new_parameters` (name fragments of its weights that no Llama checkpoint holds)."""

    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LlamaStackDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _stock_llama_class = "LlamaModel"  # the stock class with the same head, which loads a stock checkpoint for us
    attention_class = None
    _family_fields = ()
    _new_parameters = ()
    # Fields of the checkpoint's shape that a conversion keeps: asked for with another value, they are an error.
    _stock_shape_fields = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                           "num_hidden_layers", "intermediate_size", "vocab_size")

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)  # Linear, Embedding, RMSNorm and the rotary frequencies, as stock Llama's
        self._init_family_weights(module)

    def _init_family_weights(self, module):
        """The family's own weights (after Llama's rules)."""

    @classmethod
    def _convert_stock_state(cls, state, config, stock_config):
        """The family's state dict from a stock Llama one."""
        raise NotImplementedError

    @classmethod
    def _check_stock_shape(cls, config, checkpoint):
        """A ValueError naming the field when the family's config cannot take the checkpoint's heads."""

    @classmethod
    def _warm_start_plan(cls, path, keep_heads, kwargs):
        """A stock Llama checkpoint (model_type "llama") is converted to this family (see `_convert_stock_state`);
        anything else loads as HF loads it. Config fields (attention_type=..., ...) may be passed as keywords;
        `dtype` is honoured."""
        checkpoint = {}
        if path is not None:
            checkpoint, _ = PreTrainedConfig.get_config_dict(path, **hub_kwargs(kwargs))
        if checkpoint.get("model_type") != "llama":
            return None
        if keep_heads is not None:
            raise ValueError(f"keep_heads is not supported when {cls.__name__} converts a Llama checkpoint: every "
                             "head is kept")
        for name in cls._stock_shape_fields:
            if name in kwargs and checkpoint.get(name) is not None and kwargs[name] != checkpoint[name]:
                raise ValueError(f"cannot convert a Llama checkpoint with {name}={checkpoint[name]} into "
                                 f"{name}={kwargs[name]}: a conversion keeps the checkpoint's shape")
        heads = checkpoint.get("num_attention_heads", 32)
        head_dim = checkpoint.get("head_dim") or checkpoint.get("hidden_size", 4096) // heads
        layers = checkpoint.get("num_hidden_layers", 32)
        return WarmStartPlan([list(range(heads))] * layers, heads, head_dim, checkpoint)

    @classmethod
    def _warm_start_load(cls, path, args, plan, kwargs):
        """Load the checkpoint with the stock class of the same head (so HF drops, keeps or initialises head weights
        exactly as it does between stock Llama heads), then convert its weights into `cls`."""
        import transformers

        family_kwargs = {k: kwargs[k] for k in cls._family_fields if k in kwargs}
        stock_kwargs = {k: v for k, v in kwargs.items() if k not in cls._family_fields}
        stock, info = getattr(transformers, cls._stock_llama_class).from_pretrained(path, *args,
                                                                                     output_loading_info=True,
                                                                                     **stock_kwargs)
        keep = set(transformers.LlamaConfig().to_dict()) - {"model_type", "architectures", "auto_map",
                                                           "_name_or_path", "transformers_version"}
        base = {k: v for k, v in stock.config.to_dict().items() if k in keep}
        config = cls.config_class(**{**base, **family_kwargs})
        cls._check_stock_shape(config, stock.config)
        model, missing = converted_model(cls, config, stock,
                                         lambda state: cls._convert_stock_state(state, config, stock.config))
        # As HF reports it: the family's own parameters are not in the checkpoint.
        return model, dict(info, missing_keys=set(info["missing_keys"]) | set(missing))


class LlamaStackModelMixin:
    """Llama's base model (`model`): token embeddings, decoder layers with the family's attention, final RMSNorm,
    rotary position embeddings."""

    def __init__(self, config):
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(LlamaStackDecoderLayer(config, self.attention_class, layer_idx=i)
                                    for i in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, new_embeddings):
        self.embed_tokens = new_embeddings

    @can_return_tuple
    def forward(self, input_ids=None, past_key_values=None, attention_mask=None, position_ids=None,
                inputs_embeds=None, use_cache=None, output_hidden_states=None, token_type_ids=None, **kwargs):
        """attention_mask covers the cached and the new tokens (batch, past + new), as `generate()` passes it.
        With left padding, pass position_ids (generate() derives them from the mask). token_type_ids: Llama has
        no token types; all zeros (what a tokenizer of one segment gives) are accepted and change nothing."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if token_type_ids is not None and not is_tracing() and bool(token_type_ids.any()):
            raise ValueError(f"{type(self).__name__} has no token type embeddings: token_type_ids must be None or "
                             "all zeros (a second segment cannot be told apart)")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        use_cache, past_key_values, past = decoder_cache(self, past_key_values, use_cache)
        if position_ids is None:
            position_ids = torch.arange(past, past + inputs_embeds.shape[1], device=inputs_embeds.device)[None]
        return run_decoder(self, self.layers, self.norm, inputs_embeds, past_key_values, past, attention_mask,
                           use_cache, output_hidden_states,
                           position_embeddings=self.rotary_emb(inputs_embeds, position_ids), **kwargs)


class LlamaStackForCausalLMMixin(CausalLMHeadMixin):
    """Llama's LM head on the family's base model (`base_model_class`), tied to the token embeddings when the config
    says so (`tie_word_embeddings`)."""

    _stock_llama_class = "LlamaForCausalLM"
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    base_model_class = None

    def __init__(self, config):
        super().__init__(config)
        self.model = self.base_model_class(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()


class LlamaStackForSequenceClassificationMixin(DecoderSequenceClassificationMixin):
    """Llama's sequence classification: `score` on the last real token."""

    _stock_llama_class = "LlamaForSequenceClassification"


__all__ = [
    "LlamaStackDecoderLayer",
    "LlamaStackForCausalLMMixin",
    "LlamaStackForSequenceClassificationMixin",
    "LlamaStackModelMixin",
    "LlamaStackPreTrainedModel",
    "expand_groups",
    "rotate",
]
