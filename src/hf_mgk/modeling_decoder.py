"""The GPT-2 stack with a pluggable causal self-attention, shared by FiSH-GPT2 and MGK-GPT2 (as
`modeling_encoder.py` is for the BERT/RoBERTa families).

Written once here: GPT-2's blocks (ln_1, attn, ln_2, mlp), token and position embeddings, the KV cache (dynamic and
static), position and mask handling, gradient checkpointing, `generate` support, the LM and sequence-classification
heads, GPT-2's weight initialisation, and the conversion of a stock GPT-2 checkpoint (with a choice of heads).
Module and weight names are GPT-2's (`transformer.h.{i}.attn.c_attn`, `.attn.c_proj`, `.mlp.c_fc`, `lm_head`,
`score`), so stock GPT-2 weights load by name.

A family supplies:
- an attention class: `__init__(config, layer_idx)`, `forward(hidden_states, past_key_values, attention_mask,
  **kwargs) -> (output (B, N, n_embd) after its output projection, weights or None)`, storing its keys and values
  with `cache_update`; attention_mask is None, bool (B, S) (True = real token) or a caller's whole (B, 1, N, S)
  mask; an optional `begin_training_forward()` runs once per training forward of the model before the layers;
- a `DecoderPreTrainedModel` subclass naming its config class, the attention class, and how a stock GPT-2
  checkpoint becomes its weights (`_convert_stock_state` and the class attributes documented there);
- the model classes, each a mixin below plus that subclass.
Imports torch, transformers and siblings only (remote code)."""

import math
import re

import torch
from torch import nn
from transformers.cache_utils import DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, SequenceClassifierOutputWithPast
from transformers.modeling_utils import PreTrainedModel
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
from transformers.pytorch_utils import Conv1D

from .modeling_common import (
    AttentionImplementationMixin,
    AutoMapMixin,
    attention_mask_from,
    can_return_tuple,
    check_sequence_length,
    classification_loss,
    is_checkpointing,
    is_tracing,
    output_requested,
    parent_of,
    resolve_use_cache,
    run_layers,
)
from .modeling_heads import CausalLMHeadMixin
from .modeling_warm_start import WarmStartMixin, WarmStartPlan, converted_model, hub_kwargs, resolve_keep_heads
from .transformers_compat import PreTrainedConfig, TiedParametersCompat, init


def cache_update(cache, layer_idx, key, value):
    """Store this step's keys (B, Hk, N, Dk) and values (B, Hv, N, Dv) in `cache`; return all keys and values so far.

    A static cache (one that allocates its slots up front, `is_compileable`) gives keys and values one head count
    and one head size: when they differ (FiSH's M key heads and H value heads, MGK's M keys per position), both
    travel as one head of width max(Hk * Dk, Hv * Dv), zero-padded. Other caches keep them as they are."""
    if key.shape[1::2] == value.shape[1::2] or not getattr(cache, "is_compileable", False):
        return cache.update(key, value, layer_idx)
    (hk, dk), (hv, dv) = key.shape[1::2], value.shape[1::2]
    width = max(hk * dk, hv * dv)

    def pack(x):  # (B, heads, N, D) -> (B, 1, N, width)
        x = x.transpose(1, 2).flatten(2)
        return nn.functional.pad(x, (0, width - x.shape[-1]))[:, None]

    def unpack(x, heads, size):  # (B, 1, S, width) -> (B, heads, S, size)
        return x[:, 0, :, :heads * size].unflatten(-1, (heads, size)).transpose(1, 2)

    key, value = cache.update(pack(key), pack(value), layer_idx)
    return unpack(key, hk, dk), unpack(value, hv, dv)


def attention_scaling(config, layer_idx, head_dim):
    """GPT-2's softmax score scale: 1/sqrt(D) unless `scale_attn_weights=False`, divided by the layer's number
    with `scale_attn_by_inverse_layer_idx`."""
    scaling = head_dim**-0.5 if config.scale_attn_weights else 1.0
    if config.scale_attn_by_inverse_layer_idx:
        scaling /= float(layer_idx + 1)
    return scaling


def decoder_cache(model, past_key_values, use_cache):
    """(use_cache as the model resolves it, the cache: the one given, or a new DynamicCache when one is wanted,
    the number of positions it holds)."""
    use_cache = resolve_use_cache(model, use_cache)
    if use_cache and past_key_values is None:
        past_key_values = DynamicCache(config=model.config)
    past = past_key_values.get_seq_length() if past_key_values is not None else 0
    return use_cache, past_key_values, past


def run_decoder(model, layers, final_norm, hidden_states, past_key_values, past, attention_mask, use_cache,
                output_hidden_states, **kwargs):
    """A decoder stack (GPT-2's, Llama's) from its embedded input: the layers, with the mask of the cached and new
    keys and no cache under gradient checkpointing in training, then the final norm. The hidden states asked for
    end with the normed one, as stock GPT-2's and Llama's do. kwargs go to every layer."""
    batch, length = hidden_states.shape[:2]
    static = getattr(past_key_values, "is_compileable", False)  # its keys: every slot, not past + length
    mask = attention_mask_from(attention_mask, batch, length, None if static else past + length)
    cache = past_key_values if not (model.training and is_checkpointing(model)) else None
    output_hidden_states = output_requested(model.config, "output_hidden_states", output_hidden_states)
    hidden_states, all_hidden, attentions = run_layers(layers, hidden_states, cache, mask,
                                                       output_hidden_states=output_hidden_states, **kwargs)
    hidden_states = final_norm(hidden_states)
    if all_hidden is not None:
        all_hidden = all_hidden[:-1] + (hidden_states,)
    return BaseModelOutputWithPast(last_hidden_state=hidden_states,
                                   past_key_values=past_key_values if use_cache else None,
                                   hidden_states=all_hidden, attentions=attentions)


class DecoderBlock(GradientCheckpointingLayer):
    def __init__(self, config, attention_class, layer_idx=None):
        super().__init__()
        inner = config.n_inner if config.n_inner is not None else 4 * config.n_embd
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = attention_class(config, layer_idx=layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = GPT2MLP(inner, config)

    @property
    def self_attention(self):
        """The family's attention module (run_layers calls its per-training-forward hook)."""
        return self.attn

    def forward(self, hidden_states, past_key_values=None, attention_mask=None, **kwargs):
        attn_output, weights = self.attn(self.ln_1(hidden_states), past_key_values, attention_mask, **kwargs)
        hidden_states = hidden_states + attn_output
        return hidden_states + self.mlp(self.ln_2(hidden_states)), weights


# A stock GPT-2 layer's fused projection (in, 3 * n_embd) = [Q | K | V] and output projection (n_embd, n_embd).
STOCK_C_ATTN = re.compile(r"(?:^|\.)h\.(\d+)\.attn\.c_attn\.(weight|bias)$")
STOCK_C_PROJ = re.compile(r"(?:^|\.)h\.(\d+)\.attn\.c_proj\.weight$")


class DecoderPreTrainedModel(WarmStartMixin, AutoMapMixin, AttentionImplementationMixin, TiedParametersCompat,
                             PreTrainedModel):
    """What every decoder family shares: GPT-2's initialisation and loading rules, and the warm start from a stock
    GPT-2 checkpoint (model_type "gpt2") converted to the family (`WarmStartMixin`'s protocol, the hooks below).

    Class attributes of a family: `config_class`; `attention_class`; `_family_fields` (its config fields that
    `GPT2Config` lacks, plus any GPT-2 field that the conversion decides, such as the head count); `_head_count`
    (the config field that counts the checkpoint heads kept per layer); `_new_parameters` (name fragments of its
    weights that no GPT-2 checkpoint holds); `_kept_heads_note` (what the kept heads became, for the log)."""

    base_model_prefix = "transformer"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DecoderBlock"]
    _skip_keys_device_placement = ["past_key_values"]
    _keys_to_ignore_on_load_unexpected = [r"attn\.bias", r"attn\.masked_bias"]  # old GPT-2 checkpoints' buffers
    _stock_gpt2_class = "GPT2Model"  # the stock class with the same head, which loads a stock checkpoint for us
    attention_class = None
    _family_fields = ()
    _head_count = None
    _new_parameters = ()
    _kept_heads_condition = ""  # when a stock checkpoint is converted, in words, for the keep_heads error

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, Conv1D):
            std = self.config.initializer_range
            parent = parent_of(self, module)
            if module is getattr(parent, "c_proj", None) and isinstance(parent_of(self, parent), DecoderBlock):
                # GPT-2's scaled init of the residual projections (attention and MLP): 1/sqrt(2 * n_layer).
                std = std / math.sqrt(2 * self.config.n_layer)
            init.normal_(module.weight, mean=0.0, std=std)
            init.zeros_(module.bias)
        self._init_family_weights(module)

    def _init_family_weights(self, module):
        """The family's own weights (after GPT-2's rules above)."""

    @classmethod
    def _converts_stock(cls, kwargs):
        """Whether `from_pretrained` of a stock GPT-2 checkpoint with these keywords converts it (else HF loads it
        by name)."""
        return True

    @classmethod
    def _default_head_count(cls, stock_heads):
        """The heads kept per layer when neither the count nor `keep_heads` is given."""
        return stock_heads

    @classmethod
    def _convert_stock_state(cls, state, config, kept, stock_dim):
        """The family's state dict from a stock GPT-2 one (kept: the checkpoint heads kept, per layer)."""
        raise NotImplementedError

    @classmethod
    def _warm_start_plan(cls, path, keep_heads, kwargs):
        """A stock GPT-2 checkpoint (model_type "gpt2") is converted to this family (see `_convert_stock_state`),
        keeping its first heads or those listed in `keep_heads`; anything else loads as HF loads it. Config
        fields (attention_type=..., ...) may be passed as keywords; `dtype` is honoured."""
        checkpoint = {}  # None: no checkpoint to read (weights from `state_dict=`, config from `config=`)
        if path is not None:
            checkpoint, _ = PreTrainedConfig.get_config_dict(path, **hub_kwargs(kwargs))
        if checkpoint.get("model_type") != "gpt2" or not cls._converts_stock(kwargs):
            if keep_heads is not None:
                raise ValueError(
                    f"keep_heads chooses which heads of a stock GPT-2 checkpoint {cls.__name__} keeps; it applies "
                    f"only when converting one (model_type 'gpt2'{cls._kept_heads_condition})"
                )
            return None
        if "num_attention_heads" in kwargs:  # GPT-2's attribute name for n_head, as users may spell it
            kwargs["n_head"] = kwargs.pop("num_attention_heads")
        n_layer = checkpoint.get("n_layer", 12)  # the checkpoint's (GPT-2 defaults)
        n_head, d = checkpoint.get("n_head", 12), checkpoint.get("n_embd", 768)
        count = kwargs.get(cls._head_count)
        if count is None and keep_heads is None:
            count = cls._default_head_count(n_head)
        kept = resolve_keep_heads(keep_heads, n_layer, n_head, count, cls._head_count)  # before reading weights
        return WarmStartPlan(kept, n_head, d // n_head, checkpoint)

    @classmethod
    def _warm_start_load(cls, path, args, plan, kwargs):
        """Load the checkpoint with the stock class of the same head (so HF drops, keeps or initialises head weights
        exactly as it does between stock GPT-2 heads), then convert its weights into `cls`."""
        import transformers

        family_kwargs = {k: kwargs[k] for k in cls._family_fields if k in kwargs}
        stock_kwargs = {k: v for k, v in kwargs.items() if k not in cls._family_fields}
        family_kwargs[cls._head_count] = len(plan.kept[0])
        if cls._head_count == "n_head" and len(plan.kept[0]) != plan.available:
            family_kwargs.setdefault("head_dim", plan.head_dim)  # fewer heads keep their size, as in the encoders
        stock, info = getattr(transformers, cls._stock_gpt2_class).from_pretrained(path, output_loading_info=True,
                                                                                    **stock_kwargs)
        keep = set(transformers.GPT2Config().to_dict()) - {"model_type", "architectures", "auto_map", "_name_or_path",
                                                           "transformers_version"}  # the fields (a dataclass only on v5)
        base = {k: v for k, v in stock.config.to_dict().items() if k in keep}
        config = cls.config_class(**{**base, **family_kwargs})
        d = plan.checkpoint.get("n_embd", 768)
        if config.attention_head_size != plan.head_dim or config.n_embd != d:
            raise ValueError(
                f"cannot convert a GPT-2 checkpoint with heads of size {plan.head_dim} and n_embd={d} "
                f"into head_dim={config.attention_head_size}, n_embd={config.n_embd}: keep the checkpoint's head size "
                "and width"
            )
        model, missing = converted_model(cls, config, stock,
                                         lambda state: cls._convert_stock_state(state, config, plan.kept,
                                                                                plan.head_dim))
        # As HF reports it: the family's own parameters are not in the checkpoint.
        return model, dict(info, missing_keys=set(info["missing_keys"]) | set(missing))


class DecoderModelMixin:
    """GPT-2's base model (`transformer`): embeddings, blocks with the family's attention, final layer norm."""

    def __init__(self, config):
        super().__init__(config)
        if config.add_cross_attention:
            raise ValueError(f"{type(self).__name__} has no cross-attention: add_cross_attention must be False")
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(DecoderBlock(config, self.attention_class, layer_idx=i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.post_init()

    def get_input_embeddings(self):
        return self.wte

    def set_input_embeddings(self, new_embeddings):
        self.wte = new_embeddings

    @can_return_tuple
    def forward(self, input_ids=None, past_key_values=None, attention_mask=None, token_type_ids=None,
                position_ids=None, inputs_embeds=None, use_cache=None, output_hidden_states=None, **kwargs):
        """attention_mask covers the cached and the new tokens (batch, past + new), as `generate()` passes it.
        With left padding, pass position_ids (generate() derives them from the mask)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.wte(input_ids)
        length = inputs_embeds.shape[1]
        use_cache, past_key_values, past = decoder_cache(self, past_key_values, use_cache)
        if position_ids is None:
            check_sequence_length(past + length, self.config.n_positions, "n_positions")
            position_ids = torch.arange(past, past + length, device=inputs_embeds.device)[None]
        elif not is_tracing() and int(position_ids.max()) >= self.config.n_positions:
            check_sequence_length(int(position_ids.max()) + 1, self.config.n_positions, "n_positions")
        hidden_states = inputs_embeds + self.wpe(position_ids)
        if token_type_ids is not None:
            hidden_states = hidden_states + self.wte(token_type_ids)
        return run_decoder(self, self.h, self.ln_f, self.drop(hidden_states), past_key_values, past, attention_mask,
                           use_cache, output_hidden_states, **kwargs)


class DecoderLMHeadMixin(CausalLMHeadMixin):
    """GPT-2's LM head on the family's base model (`base_model_class`), tied to the token embeddings."""

    _stock_gpt2_class = "GPT2LMHeadModel"
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}
    base_model_class = None

    def __init__(self, config):
        super().__init__(config)
        # transformers names the loss from the class name ("...ForCausalLM"), which these lack; Trainer counts a
        # causal LM's num_items_in_batch over the shifted labels only when the loss type says so.
        self.loss_type = "ForCausalLM"
        self.transformer = self.base_model_class(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()


class DecoderSequenceClassificationMixin:
    """A decoder's sequence classification (GPT-2's, Llama's): `score` on the last real token of the base model
    (`base_model_class`, set as the attribute `base_model_prefix` names)."""

    _stock_gpt2_class = "GPT2ForSequenceClassification"
    base_model_class = None

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        setattr(self, self.base_model_prefix, self.base_model_class(config))
        self.score = nn.Linear(self.base_model.get_input_embeddings().embedding_dim, config.num_labels, bias=False)
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids=None, past_key_values=None, attention_mask=None, token_type_ids=None,
                position_ids=None, inputs_embeds=None, labels=None, use_cache=None, **kwargs):
        """Classifies from the last real token (GPT-2's rule: the rightmost token that is not padding)."""
        outputs = self.base_model(input_ids, past_key_values=past_key_values, attention_mask=attention_mask,
                                  token_type_ids=token_type_ids, position_ids=position_ids,
                                  inputs_embeds=inputs_embeds, use_cache=use_cache, return_dict=True, **kwargs)
        logits = self.score(outputs.last_hidden_state)
        batch = logits.shape[0]
        if attention_mask is not None and attention_mask.dim() == 2:
            positions = torch.arange(attention_mask.shape[-1], device=logits.device)
            last = (positions * attention_mask.to(logits.device).long()).argmax(-1)
            last = last - (attention_mask.shape[-1] - logits.shape[1])  # the mask may cover cached tokens
        elif input_ids is not None and self.config.pad_token_id is not None:
            positions = torch.arange(input_ids.shape[-1], device=logits.device)
            last = (positions * (input_ids != self.config.pad_token_id).long()).argmax(-1)
        elif batch == 1:
            last = torch.full((1,), logits.shape[1] - 1, device=logits.device)
        else:
            raise ValueError("Cannot find the last token of each row: pass attention_mask or set pad_token_id")
        pooled = logits[torch.arange(batch, device=logits.device), last]
        loss = None
        if labels is not None:
            loss = classification_loss(self.config, pooled, labels, kwargs.get("num_items_in_batch"))
        return SequenceClassifierOutputWithPast(loss=loss, logits=pooled, past_key_values=outputs.past_key_values,
                                                hidden_states=outputs.hidden_states, attentions=outputs.attentions)


__all__ = [
    "DecoderBlock",
    "DecoderLMHeadMixin",
    "DecoderModelMixin",
    "DecoderPreTrainedModel",
    "DecoderSequenceClassificationMixin",
    "STOCK_C_ATTN",
    "STOCK_C_PROJ",
    "attention_scaling",
    "cache_update",
    "decoder_cache",
    "run_decoder",
]
