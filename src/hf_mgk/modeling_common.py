"""HF glue shared by the model families: masks, input checks, the softmax baseline, losses that stay exact under
accumulation.

Imports torch, transformers and siblings only: this file travels next to the remote-code model files."""

import contextlib
import warnings

import torch
import torch.nn.functional as F
from transformers import masking_utils
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
# return_dict=False -> the output's tuple (the forward's keyword, else the config's): transformers' own decorator,
# the same code in every release the travelling files support (4.57 to 5.23); re-exported for the modeling files.
from transformers.utils.generic import can_return_tuple  # noqa: F401

from .attention_masks import allowed_pairs, is_tracing, masked_scores


def attention_mask_from(attention_mask, batch, query_length, key_length=None):
    """The mask the attention functions take, from any form a stock model takes.

    - (batch, key_length), a tokenizer's 0/1 padding mask: bool (B, S), True = real token; None when nothing is
      padded (only outside tracing, so that an exported graph keeps the mask input whatever its example was);
    - (batch, query_length, key_length) or (batch or 1, 1, query_length, key_length), a custom mask: returned 4-D,
      bool (True = may attend; 0/1 integers count as bool) or floating (additive: 0 = attend, a large negative
      value such as the dtype's minimum = do not). It is the whole mask: it replaces the causal mask, as in
      stock models.
    key_length: the number of keys, None where the cache decides it (a static cache's length)."""
    if attention_mask is None:
        return None
    shape = tuple(attention_mask.shape)
    if attention_mask.dim() == 2:
        if shape != (batch, key_length) and not (key_length is None and shape[0] == batch):
            raise ValueError(
                f"a 2-D attention_mask is a (batch, sequence_length) padding mask of shape {(batch, key_length)} "
                f"with 1 for real tokens and 0 for padding; got shape {shape}"
            )
        mask = attention_mask.bool()
        return mask if is_tracing() or not bool(mask.all()) else None
    if attention_mask.dim() == 3:
        attention_mask = attention_mask[:, None]
    if (attention_mask.dim() != 4 or attention_mask.shape[0] not in (1, batch) or attention_mask.shape[1] != 1
            or attention_mask.shape[2] != query_length
            or (key_length is not None and attention_mask.shape[3] != key_length)):
        keys = "key_length" if key_length is None else key_length
        raise ValueError(
            f"attention_mask must be a (batch, sequence_length) padding mask, or a custom mask of shape "
            f"(batch, query_length, key_length) or (batch, 1, query_length, key_length) = ({batch}, 1, "
            f"{query_length}, {keys}); got shape {shape}"
        )
    return attention_mask if attention_mask.is_floating_point() else attention_mask.bool()


def is_full_mask(mask):
    """Whether `mask` (from `attention_mask_from`) is a caller's 4-D mask, which already says which keys each query
    sees (causality included)."""
    return mask is not None and mask.dim() == 4


def cached_length(cache, layer_idx):
    """How many positions `cache` holds for this layer before this step's update. (A static cache counts them in a
    tensor that its update increments in place: this is a copy.)"""
    past = cache.get_seq_length(layer_idx)
    return past.clone() if isinstance(past, torch.Tensor) else past


def mask_for_cached_keys(mask, is_causal, past, query_length, key_length, device):
    """The mask for the keys a cache update returned. A static cache returns every slot it has, the unfilled ones
    (zeros) too: then a padding mask (or none) becomes the 4-D mask a stock model builds for it, query i (at
    position past + i) seeing the real keys j <= past + i (j < past + N when not causal). `generate()` passes
    that 4-D mask itself. (A static cache counts `past` in a tensor: in a trace, where its value may not be read,
    the mask is built whatever it is.)"""
    if is_full_mask(mask):
        return mask
    if not (is_tracing() and isinstance(past, torch.Tensor)) and key_length == past + query_length:
        return mask  # every key is a filled one
    key_pos = torch.arange(key_length, device=device)
    last = past + (torch.arange(query_length, device=device) if is_causal else query_length - 1)
    allowed = key_pos <= torch.as_tensor(last, device=device).reshape(-1, 1)  # (N or 1, S)
    if mask is not None:
        allowed = allowed & F.pad(mask, (0, key_length - mask.shape[-1]))[:, None, :]
    return allowed.reshape(-1, 1, *allowed.shape[-2:])


def check_sequence_length(length, max_positions, field="max_position_embeddings", why=None):
    """Absolute position embeddings stop at `max_positions`: say so, in the config's own terms, instead of an
    index error. `field`: the config's name for the limit (GPT-2: n_positions); `why`: how `max_positions`
    follows from the config when it is not that field's value (RoBERTa reserves positions for padding)."""
    if length > max_positions:
        raise ValueError(
            f"Sequence length {length} exceeds this model's absolute position embeddings: at most {max_positions} "
            f"tokens ({why or f'{field}={max_positions}'}); truncate the input "
            "(tokenizer(..., truncation=True, max_length=...))"
        )


def output_requested(config, name, value):
    """Whether an optional output (`name`: "output_attentions", "output_hidden_states") is asked for: `value`, the
    forward's keyword, or else the config's flag."""
    return bool(getattr(config, name, False) if value is None else value)


def wants_attentions(config, kwargs):
    """Whether the caller asked for attention matrices (as a forward kwarg, or through the config)."""
    return output_requested(config, "output_attentions", kwargs.get("output_attentions"))


def is_checkpointing(model):
    """Whether activation (gradient) checkpointing is on: `gradient_checkpointing_enable()` sets this flag on the
    layers."""
    return any(getattr(module, "gradient_checkpointing", False) for module in model.modules())


def resolve_use_cache(model, use_cache):
    """As HF models: the config's `use_cache` unless given, and no cache in training under activation
    checkpointing (the recomputation in backward would write it a second time)."""
    if use_cache is None:
        use_cache = getattr(model.config, "use_cache", False)
    return bool(use_cache) and not (model.training and is_checkpointing(model))


def parent_of(model, module):
    """The module of `model` that holds `module` as a direct child (None if none does).

    For `_init_weights` rules about a child's tensors (GPT-2's scaled residual projections, MGK's extra keys):
    they are applied when the child itself is initialised, looking up its parent from there, because
    transformers >= 5.20 calls a custom-code model's `_init_weights` only on the modules that own tensors
    directly, and the parent may own none."""
    for parent in model.modules():
        if any(child is module for child in parent.children()):
            return parent
    return None


def run_layers(layers, hidden_states, *args, output_hidden_states=False, **kwargs):
    """Run the blocks in turn; each returns (hidden_states, attention weights or None). Returns the last hidden
    state, the hidden states (the input, then each block's output) when asked for, and the attention weights of
    every block when the blocks returned them (None otherwise).

    The one place of the per-training-forward hook: in training, each block's attention (`block.self_attention`)
    that defines `begin_training_forward()` gets it once per forward of the model, before any block runs (MGK's
    lagged EM prior, NPRF's feature redraw). Not inside the blocks: gradient checkpointing runs a block's forward
    a second time during backward."""
    for layer in layers:
        if layer.training:
            hook = getattr(layer.self_attention, "begin_training_forward", None)
            if hook is not None:
                hook()
    all_hidden = [hidden_states] if output_hidden_states else None
    all_weights = []
    for layer in layers:
        hidden_states, weights = layer(hidden_states, *args, **kwargs)
        if all_hidden is not None:
            all_hidden.append(hidden_states)
        if weights is not None:
            all_weights.append(weights)
    return hidden_states, all_hidden and tuple(all_hidden), tuple(all_weights) if all_weights else None


def classification_loss(config, logits, labels, num_items_in_batch=None):
    """BERT's sequence-classification loss (regression / single-label / multi-label, chosen as HF does).

    With `num_items_in_batch` (Trainer's count of label entries over the accumulated batch and all processes),
    the loss is this batch's sum divided by that count, so accumulation and DDP give the full-batch mean;
    otherwise it is the plain mean."""
    num_labels = config.num_labels
    if config.problem_type is None:
        if num_labels == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    labels = labels.to(logits.device)
    if config.problem_type == "regression":
        per_item = F.mse_loss(logits.view_as(labels) if num_labels == 1 else logits, labels.to(logits.dtype),
                              reduction="none")
    elif config.problem_type == "single_label_classification":
        per_item = F.cross_entropy(logits.view(-1, num_labels), labels.view(-1), reduction="none")
        per_item = per_item[labels.view(-1) != -100]
    else:
        per_item = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="none")
    if num_items_in_batch is None:
        return per_item.mean()
    return per_item.sum() / torch.as_tensor(num_items_in_batch, device=per_item.device, dtype=per_item.dtype)


def gathered(parameters, modifier_rank=None):
    """A context in which `parameters` are whole: DeepSpeed ZeRO-3 partitions a model built inside zero.Init (a
    from_pretrained or from_config under `--deepspeed` at stage 3), each rank holding a slice of each weight and an
    empty tensor in its place; gathered here by its `GatheredParameters` (read-only, or with `modifier_rank` the
    rank whose writes every rank takes when the context ends), left as they are elsewhere."""
    parameters = list(parameters)
    if not any(hasattr(p, "ds_id") for p in parameters):
        return contextlib.nullcontext()
    import deepspeed  # only a ZeRO-3 model has partitioned parameters

    return deepspeed.zero.GatheredParameters(parameters, modifier_rank=modifier_rank)


def own_class(model):
    """The model's own class: the class itself, or under a subclass torch made to wrap it (FSDP2's `fully_shard`
    turns a model into an `FSDP<Class>` defined in torch's module) the class it wraps."""
    return next(c for c in type(model).__mro__ if not c.__module__.startswith("torch."))


class AutoMapMixin:
    """Makes `save_pretrained` write a Hub-ready folder for `trust_remote_code=True`.

    HF's `register_for_auto_class` records one Auto class per saved model; a published checkpoint should load
    through every Auto class its family supports, so the whole map (`_auto_map`: Auto class -> class name in
    this model's module) goes into `config.auto_map`, and the code files are always copied beside the weights.

    A model torch has wrapped by subclassing (FSDP2's `fully_shard` makes it an `FSDP<Class>` defined in torch's
    own module) saves as the family's class it wraps: the map, the Auto registration and the code files HF copies
    all come from the model's class, and torch's would make a folder that loads nowhere."""

    _auto_map: dict = {}

    def save_pretrained(self, save_directory, *args, **kwargs):
        own = own_class(self)
        if own is not type(self):
            wrapped = type(self)
            self.__class__ = own  # for the save only: the wrapper's hooks live on the instance, untouched
            try:
                return self.save_pretrained(save_directory, *args, **kwargs)
            finally:
                self.__class__ = wrapped
        module = type(self).__module__.rsplit(".", 1)[-1]
        config_cls = type(self.config)
        self.config.auto_map = {
            "AutoConfig": f"{config_cls.__module__.rsplit('.', 1)[-1]}.{config_cls.__name__}",
            **{auto: f"{module}.{name}" for auto, name in self._auto_map.items()},
        }
        # HF copies the code files only for classes registered for an Auto class (`is_remote_code()`).
        self.config._auto_class = "AutoConfig"
        if type(self)._auto_class is None:
            own = [auto for auto, name in self._auto_map.items() if name == type(self).__name__]
            type(self).register_for_auto_class(own[0] if own else "AutoModel")
        return super().save_pretrained(save_directory, *args, **kwargs)


def softmax_attention(module, query, key, value, attention_mask, *, dropout_p=0.0, scale=None, return_weights=False):
    """Stock scaled dot-product attention, the baseline of every family, run the way `module.config.
    _attn_implementation` names, as in stock models: "eager" the explicit form, "sdpa" (the default) torch's fused
    kernel, any other name the function registered under it in transformers' AttentionInterface (flash or flex
    attention, a kernel from the Hub, your own), given the mask in the form its AttentionMaskInterface entry makes.

    query (B, H, N, D), key / value (B, H, S, D); attention_mask: see `attention_masks.allowed_pairs`;
    `module.is_causal` says whether the attention is causal. Returns (output (B, H, N, D), weights or None).
    Weights, when asked for, come from the explicit form whatever the implementation (the fallback stock models of
    transformers 4 made)."""
    implementation = getattr(module.config, "_attn_implementation", None) or "sdpa"
    is_causal = module.is_causal and not is_full_mask(attention_mask)
    n, s = query.shape[-2], key.shape[-2]
    if implementation not in ("eager", "sdpa") and not return_weights:
        return _interface_attention(implementation, module, query, key, value, attention_mask, is_causal, dropout_p,
                                    scale), None
    allowed = None
    if return_weights or implementation == "eager" or attention_mask is not None or n != s:
        allowed = allowed_pairs(attention_mask, is_causal, n, s, query.device)
    if not (return_weights or implementation == "eager"):
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, dropout_p=dropout_p,
                                             is_causal=is_causal and allowed is None, scale=scale)
        return out, None
    scores = torch.matmul(query, key.transpose(-1, -2)) * (query.shape[-1] ** -0.5 if scale is None else scale)
    weights = torch.softmax(masked_scores(scores, allowed), dim=-1)
    return torch.matmul(F.dropout(weights, p=dropout_p), value), weights


def _interface_attention(implementation, module, query, key, value, attention_mask, is_causal, dropout_p, scale):
    """Softmax attention by the function transformers' AttentionInterface holds for `implementation`, with the
    mask in the form its AttentionMaskInterface entry (the mask builder stock models use with it) makes: flash
    attention a (B, S) padding mask, flex attention a BlockMask (a caller's additive mask as it is), eager an
    additive (B, 1, N, S) mask, sdpa and the rest a bool one."""
    if implementation not in ALL_ATTENTION_FUNCTIONS:
        raise ValueError(f"attn_implementation={implementation!r} is not registered in transformers' "
                         f"AttentionInterface (registered: {sorted(ALL_ATTENTION_FUNCTIONS)})")
    builder = masking_utils.ALL_MASK_ATTENTION_FUNCTIONS.get(implementation)
    if builder is None:
        raise ValueError(
            f"attn_implementation={implementation!r} has no mask builder in transformers' AttentionMaskInterface, so "
            "it would get no mask: register one too, e.g. AttentionMaskInterface.register(name, sdpa_mask)")
    n, s = query.shape[-2], key.shape[-2]
    if builder is masking_utils.flash_attention_mask:
        if is_full_mask(attention_mask):
            raise ValueError(f"attn_implementation={implementation!r} takes only a (batch, sequence_length) padding "
                             "mask, not a 3-D / 4-D one: use 'sdpa' or 'eager' for custom masks")
        mask = attention_mask
    else:
        mask = allowed_pairs(attention_mask, is_causal, n, s, query.device)
        if mask is not None:  # one row per query, as the mask builders make it (flex attention indexes it so)
            mask = mask.expand(query.shape[0], 1, n, s)
        if mask is not None and builder is masking_utils.flex_attention_mask and mask.dtype == torch.bool:
            mask = _block_mask(mask)  # (an additive mask goes as it is: flex attention adds it to the scores)
        elif mask is not None and builder is masking_utils.eager_mask:
            mask = masked_scores(torch.zeros((), dtype=query.dtype, device=query.device), mask)
        is_causal = is_causal and mask is None
    out, _ = ALL_ATTENTION_FUNCTIONS[implementation](module, query, key, value, mask, dropout=dropout_p,
                                                     scaling=scale, is_causal=is_causal)
    return out.transpose(1, 2)  # the interface's output is (B, N, H, D)


def _block_mask(allowed):
    """Flex attention's BlockMask for a bool (B, 1, N, S) mask, as stock models give it."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(lambda b, h, q, kv: allowed[b, 0, q, kv], allowed.shape[0], None, allowed.shape[2],
                             allowed.shape[3], device=allowed.device)


_NOTED_TYPES = set()


class _SoftmaxOnly:
    """A `_supports_sdpa`-style flag that tells the truth for each model: only the softmax baseline runs through
    transformers' attention implementations; the other attention types compute their own kernel. (The class itself
    answers True: its softmax models do.)"""

    def __get__(self, model, owner=None):
        if model is None:
            return True
        config = model.__dict__.get("config")
        return getattr(config, "attention_type", "softmax") == "softmax"


class AttentionImplementationMixin:
    """`attn_implementation` as stock models take it, for what it applies to.

    attention_type="softmax" runs through transformers' attention implementations (eager, sdpa, flash, flex, the
    AttentionInterface), so it accepts and honours each of them. Every other attention type is its own kernel,
    chosen by `attention_type` and the input (see the attention functions), and returns its weights on every path:
    it runs as "eager" (so `config.output_attentions = True` works), and asking it for another implementation
    warns once that `attention_type` chooses its kernel."""

    _supports_sdpa = _SoftmaxOnly()
    _supports_flash_attn = _SoftmaxOnly()
    _supports_flex_attn = _SoftmaxOnly()

    @classmethod
    def _can_set_attn_implementation(cls):
        return True  # the attention modules read config._attn_implementation at every forward

    def get_correct_attn_implementation(self, requested_attention, is_init_check=False):
        attention_type = getattr(self.config, "attention_type", "softmax")
        if attention_type == "softmax":
            return super().get_correct_attn_implementation(requested_attention, is_init_check)
        if requested_attention not in (None, "eager") and (type(self).__name__, attention_type) not in _NOTED_TYPES:
            _NOTED_TYPES.add((type(self).__name__, attention_type))
            warnings.warn(
                f"{type(self).__name__}: attn_implementation={requested_attention!r} is not used: "
                f"attention_type={attention_type!r} chooses its own kernel (attn_implementation applies to "
                "attention_type='softmax' only); it runs as 'eager' and returns its attention weights on request",
                stacklevel=2)
        return "eager"
