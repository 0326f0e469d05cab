"""HF glue shared by the model families: masks, input checks, losses that stay exact under accumulation.

Imports torch only: this file travels next to the remote-code model files."""

import functools

import torch
import torch.nn.functional as F


def padding_mask_from(attention_mask, shape):
    """The (B, S) bool key mask (True = real token) from a tokenizer's 0/1 `attention_mask`; None if nothing is padded.

    The attention functions take this 2-D form; a 3-D/4-D mask would be silently misread, so it is refused."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != tuple(shape):
        raise ValueError(
            f"attention_mask must be a (batch, sequence_length) padding mask of shape {tuple(shape)} with 1 for real "
            f"tokens and 0 for padding; got shape {tuple(attention_mask.shape)}"
        )
    mask = attention_mask.bool()
    return None if bool(mask.all()) else mask


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


def can_return_tuple(forward):
    """`return_dict=False` (the forward's keyword, else the config's `return_dict`) gives the output as a tuple of
    its fields that are not None, as every HF model does."""

    @functools.wraps(forward)
    def wrapper(self, *args, return_dict=None, **kwargs):
        output = forward(self, *args, **kwargs)
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        return output if return_dict else output.to_tuple()

    return wrapper


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
    every block when the blocks returned them (None otherwise)."""
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


class AutoMapMixin:
    """Makes `save_pretrained` write a Hub-ready folder for `trust_remote_code=True`.

    HF's `register_for_auto_class` records one Auto class per saved model; a published checkpoint should load
    through every Auto class its family supports, so the whole map (`_auto_map`: Auto class -> class name in
    this model's module) goes into `config.auto_map`, and the code files are always copied beside the weights."""

    _auto_map: dict = {}

    def save_pretrained(self, save_directory, *args, **kwargs):
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


def softmax_attention(query, key, value, attention_mask, is_causal, dropout_p, scale, return_weights):
    """Stock scaled dot-product attention, the baseline of every family, with our mask convention.

    attention_mask: bool (B, S), True = real token, or None. Causal masks are bottom-right aligned: with a KV
    cache the N queries are the last N of the S positions. Returns (output, weights or None); the explicit form,
    as HF's eager path, runs only when the weights are asked for."""
    n, s = query.shape[-2], key.shape[-2]
    allowed = attention_mask[:, None, None, :] if attention_mask is not None else None
    if is_causal and not (allowed is None and n == s and not return_weights):
        causal = torch.ones(n, s, dtype=torch.bool, device=query.device).tril(diagonal=s - n)
        allowed = causal if allowed is None else allowed & causal
    if not return_weights:
        plain_causal = is_causal and allowed is None
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, dropout_p=dropout_p,
                                             is_causal=plain_causal, scale=scale)
        return out, None
    scores = torch.matmul(query, key.transpose(-1, -2)) * (query.shape[-1] ** -0.5 if scale is None else scale)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(F.dropout(weights, p=dropout_p), value), weights
