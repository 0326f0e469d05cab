"""Warm starts from a checkpoint with more attention heads than the model: choose the heads, slice their weights.

The MGK paper's smaller models (App. B: e.g. 6 MGK heads in place of BERT's 12) start from a stock checkpoint;
silently re-initialising Q/K/V and the output projection would throw the pretrained attention away. Here the
kept heads are the first H' of the checkpoint or a given list (`keep_heads`), their query/key/value rows and the
matching columns of the output projection are copied, the head size stays the checkpoint's, and what was kept
is logged and returned in `loading_info["kept_heads"]`. One protocol (`WarmStartMixin`) for both stacks: the
BERT/RoBERTa encoder families select heads of a checkpoint of their own stack (`HeadSelectionMixin`); the GPT-2
families convert a stock GPT-2 checkpoint (modeling_decoder's hooks).
Imports torch, transformers and siblings only (remote code).
"""

import copy
import operator
import re
from dataclasses import dataclass, field

import torch
from transformers.utils import logging

from .config_checks import check_int_range
from .modeling_common import gathered
from .transformers_compat import PreTrainedConfig

# Under transformers' logger: formatted like its load report, and silenced by the same `set_verbosity_*` calls.
logger = logging.get_logger(f"transformers.{__name__}")


def hub_kwargs(kwargs):
    """The `from_pretrained` keywords that say where a checkpoint's files come from."""
    keys = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")
    return {k: kwargs[k] for k in keys if k in kwargs}


def single_device(device_map):
    """The one device `device_map` names, or None; a converted model is built whole, so no splitting."""
    if device_map is None:
        return None
    one = device_map.get("") if isinstance(device_map, dict) and list(device_map) == [""] else device_map
    try:
        return torch.device(one)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"device_map={device_map!r} is not supported when converting a checkpoint's heads: give one device "
            "(device_map='cpu', 'cuda:0', ...), or convert, save_pretrained, and load the saved folder with it"
        ) from None


def evenly_spaced_heads(available, count):
    """`count` of `available` heads spread evenly (head i * available // count): one from each group of adjacent
    heads rather than the first ones (6 of 12: 0, 2, ..., 10). The default choice of the quickstart and of the
    reproduction's warm start, so both prune to the same heads."""
    check_int_range("count", count, 1, available)
    return [i * available // count for i in range(count)]


def resolve_keep_heads(keep_heads, num_layers, available, count=None, count_name="num_attention_heads"):
    """Per-layer lists of the checkpoint heads to keep, validated.

    keep_heads: None (the first `count` heads), one list of head indices used in every layer, or a list of
    `num_layers` lists (one per layer, e.g. heads ranked by importance per layer). Order is kept: new head i
    is checkpoint head keep_heads[i]. `count`: the heads per layer asked for (`count_name` in the config);
    None = the length of the lists. Raises ValueError naming `keep_heads` on anything else."""
    if count is not None:
        check_int_range(count_name, count, 1)
    if keep_heads is None:
        if count > available:
            raise ValueError(f"{count_name}={count} is more than the checkpoint's {available} heads per layer")
        return [list(range(count)) for _ in range(num_layers)]
    if hasattr(keep_heads, "tolist"):  # a tensor or array of indices, e.g. from argsort of importance scores
        keep_heads = keep_heads.tolist()
    if not isinstance(keep_heads, (list, tuple)) or not keep_heads:
        raise ValueError(f"keep_heads must be a non-empty list of head indices (or one list per layer); got {keep_heads!r}")
    per_layer = all(isinstance(h, (list, tuple)) for h in keep_heads)
    if per_layer and len(keep_heads) != num_layers:
        raise ValueError(
            f"keep_heads has {len(keep_heads)} lists but the checkpoint has {num_layers} layers: give one list per "
            "layer, or a single list of head indices used in every layer"
        )
    lists = list(keep_heads) if per_layer else [keep_heads] * num_layers
    count = len(lists[0]) if count is None else count
    resolved = []
    for layer, heads in enumerate(lists):
        where = f" (layer {layer})" if per_layer else ""
        try:
            if any(isinstance(h, bool) for h in heads):
                raise TypeError
            heads = [operator.index(h) for h in heads]
        except TypeError:
            raise ValueError(f"keep_heads{where} must hold integer head indices; got {heads!r}") from None
        if not heads:
            raise ValueError(f"keep_heads{where} is empty: keep at least one head")
        if len(heads) != count:
            raise ValueError(f"keep_heads{where} lists {len(heads)} heads but {count_name}={count} are asked for")
        if len(set(heads)) != len(heads):
            raise ValueError(f"keep_heads{where} names a head more than once: {heads}")
        outside = [h for h in heads if not 0 <= h < available]
        if outside:
            raise ValueError(
                f"keep_heads{where} has heads {outside} out of range: the checkpoint has {available} heads per layer "
                f"(0 .. {available - 1})"
            )
        resolved.append(heads)
    return resolved


def head_index(heads, head_dim, device=None):
    """Positions of the given heads' blocks in a dimension laid out as [head 0 | head 1 | ...] of `head_dim` each."""
    heads = torch.as_tensor(heads, dtype=torch.long, device=device)
    return (heads[:, None] * head_dim + torch.arange(head_dim, device=device)).reshape(-1)


def report_kept_heads(model_name, path, kept, available, what):
    """Log which heads were kept (a warning: the model differs from the checkpoint in a way the user chose)."""
    if all(h == kept[0] for h in kept):
        heads = f"heads {kept[0]} of {available} in each of the {len(kept)} layers"
    else:
        heads = "; ".join(f"layer {i}: heads {h} of {available}" for i, h in enumerate(kept))
    logger.warning(f"{model_name}.from_pretrained({str(path)!r}) kept {heads} {what}")


# State-dict names (regex, matched at the end of a name after a dot) of the tensors laid out by head, mapped to
# (dimension holding the heads, True when each head is a block of head_dim entries there / False when one entry).
ENCODER_HEAD_TENSORS = {
    r"attention\.self\.(query|key|value)\.(weight|bias)": (0, True),
    r"attention\.output\.dense\.weight": (1, True),  # its input is the concatenated heads
}
_LAYER = re.compile(r"(?:^|\.)encoder\.layer\.(\d+)\.")


def converted_model(cls, config, stock, convert):
    """A new `cls` model of `config` holding `convert(stock.state_dict())`, the stock model's weights converted,
    and the family's own parameters (those the conversion does not give, matching `cls._new_parameters`)
    initialised by the family's rules. Returns (model, the names of those parameters).

    The new model's random start is overwritten by the conversion but for the family's own parameters, which are
    drawn again after it, in module order: so they follow the RNG as the caller left it, not how the model was
    built (inside DeepSpeed ZeRO-3's zero.Init each layer draws as it is built and partitioned). Under ZeRO-3 both
    models are partitioned: they are gathered while converted."""
    cuda = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        model = cls._from_config(config, dtype=stock.dtype)  # stock.dtype: the `dtype` asked for, or "auto"'s
    with gathered(stock.parameters()):
        state = convert(stock.state_dict())
    with gathered(model.parameters(), modifier_rank=0):
        missing, unexpected = model.load_state_dict(state, strict=False)
        for name, tensor in model.state_dict(keep_vars=True).items():
            if name in state:  # as HF marks what it loads: the family's init below leaves these as they are
                tensor._is_hf_initialized = True
        owners = {name.rpartition(".")[0] for name in missing}
        for name, module in model.named_modules():
            if name in owners:
                model._init_family_weights(module)
    if unexpected or any(not any(s in k for s in cls._new_parameters) for k in missing):
        raise RuntimeError(f"{cls.__name__}'s conversion left unexpected {unexpected} / missing {missing} weights")
    model.tie_weights()
    return model, missing


@dataclass
class WarmStartPlan:
    """What a conversion keeps, decided from the checkpoint's config before any weight is read."""

    kept: list  # the checkpoint heads kept, one list per layer (new head i = checkpoint head kept[layer][i])
    available: int  # the checkpoint's heads per layer
    head_dim: int  # the checkpoint's head size, which the kept heads keep
    checkpoint: dict = field(default_factory=dict)  # the checkpoint's config.json, as read


class WarmStartMixin:
    """One `from_pretrained` protocol for every family that converts a checkpoint, with a choice of its heads.

    `from_pretrained(path, ..., keep_heads=None, ...)` asks the family two things:
    - `_warm_start_plan(path, keep_heads, kwargs)`: a `WarmStartPlan` when the checkpoint is to be converted
      (read from its config alone, so a bad `keep_heads` fails before any weight is read), or None: HF's
      `from_pretrained` unchanged. It may rename keywords in `kwargs` (the family's spelling of a field);
    - `_warm_start_load(path, args, plan, kwargs)`: the converted model and HF's loading info for it.
    Then, for every family alike: `device_map` as one device, eval mode, the kept heads logged (when they are
    not all of the checkpoint's, in order; `_kept_heads_note` says what they became) and returned as
    loading_info["kept_heads"] with output_loading_info=True."""

    _kept_heads_note = ""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, keep_heads=None, **kwargs):
        plan = cls._warm_start_plan(pretrained_model_name_or_path, keep_heads, kwargs)
        if plan is None:
            return cls._hf_from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        output_loading_info = kwargs.pop("output_loading_info", False)
        device = single_device(kwargs.pop("device_map", None))
        model, info = cls._warm_start_load(pretrained_model_name_or_path, args, plan, kwargs)
        model = (model if device is None else model.to(device)).eval()
        if any(heads != list(range(plan.available)) for heads in plan.kept):  # every head kept: nothing to say
            report_kept_heads(cls.__name__, pretrained_model_name_or_path, plan.kept, plan.available,
                              cls._kept_heads_note)
        info["kept_heads"] = plan.kept
        return (model, info) if output_loading_info else model

    @classmethod
    def _hf_from_pretrained(cls, *args, **kwargs):
        """HF's `from_pretrained` of `cls`, for the hooks' own loading of a checkpoint as it is."""
        return super(WarmStartMixin, cls).from_pretrained(*args, **kwargs)

    @classmethod
    def _warm_start_plan(cls, path, keep_heads, kwargs):
        raise NotImplementedError

    @classmethod
    def _warm_start_load(cls, path, args, plan, kwargs):
        raise NotImplementedError


class HeadSelectionMixin(WarmStartMixin):
    """The warm start of the BERT/RoBERTa encoder families: head selection from a checkpoint of the same stack.

    `from_pretrained(path, num_attention_heads=H', keep_heads=None, ...)` on a checkpoint whose model_type is the
    stock one (`_stock_model_type`) or this family's, with H' fewer than the checkpoint's heads (or with
    `keep_heads` given): the checkpoint is loaded as today at its own head count, then the kept heads' slices of
    every tensor in `_head_tensors` are copied into a model with H' heads of the checkpoint's size (head_dim).
    Everything else, including the initialisation of weights the checkpoint lacks, is what loading at full
    size gave. Other calls are HF's `from_pretrained` unchanged."""

    _stock_model_type: str = None
    _head_tensors = ENCODER_HEAD_TENSORS
    _kept_heads_note = "(their query/key/value rows and attention.output.dense columns; the other heads dropped)"

    @classmethod
    def _warm_start_load(cls, path, args, plan, kwargs):
        full_kwargs = dict(kwargs, output_loading_info=True)
        given = kwargs.get("config")
        if isinstance(given, PreTrainedConfig):
            full_kwargs["config"] = copy.deepcopy(given)
            full_kwargs["config"].num_attention_heads, full_kwargs["config"].head_dim = plan.available, plan.head_dim
        else:
            full_kwargs.update(num_attention_heads=plan.available, head_dim=plan.head_dim)
        full, info = cls._hf_from_pretrained(path, *args, **full_kwargs)  # at the checkpoint's head count

        config = copy.deepcopy(full.config)
        config.num_attention_heads, config.head_dim = len(plan.kept[0]), plan.head_dim
        model = cls._from_config(config, dtype=full.dtype)
        fresh = set(info["missing_keys"])  # initialised, not loaded: any slice of them is an initialisation too
        # strict: a per-head tensor missing from `_head_tensors` would fail here on its shape, not load silently
        model.load_state_dict(cls._slice_heads(full.state_dict(), plan.kept, plan.head_dim, fresh))
        if model.can_generate():
            model.generation_config = full.generation_config
        return model, info

    @classmethod
    def _warm_start_plan(cls, path, keep_heads, kwargs):
        """The plan when heads are to be selected, else None."""
        given = kwargs.get("config")
        given = given if isinstance(given, PreTrainedConfig) else None
        count = given.num_attention_heads if given is not None else kwargs.get("num_attention_heads")
        if keep_heads is None and count is None:
            return None
        checkpoint = None
        if path is not None:
            checkpoint, _ = PreTrainedConfig.get_config_dict(path, **hub_kwargs(kwargs))
        if checkpoint is None or checkpoint.get("model_type") not in (cls._stock_model_type, cls.config_class.model_type):
            if keep_heads is None:
                return None
            found = "no checkpoint" if checkpoint is None else f"a {checkpoint.get('model_type')!r} checkpoint"
            raise ValueError(
                f"keep_heads selects heads of a {cls._stock_model_type!r} or {cls.config_class.model_type!r} "
                f"checkpoint; {cls.__name__}.from_pretrained was given {found}"
            )
        ckpt = cls.config_class.from_dict(checkpoint)  # fills the fields config.json leaves at their defaults
        available, head_dim = ckpt.num_attention_heads, ckpt.attention_head_size
        if given is not None and count == available:
            count = None  # the checkpoint's own config (as Auto classes pass it): the count comes from keep_heads
        if keep_heads is None and (count is None or count == available):
            return None  # the checkpoint's heads: unchanged loading (more heads fail in resolve_keep_heads below)
        asked_dim = given.head_dim if given is not None else kwargs.get("head_dim")
        if asked_dim is not None and asked_dim != head_dim:
            raise ValueError(
                f"head_dim={asked_dim} differs from the checkpoint's head size {head_dim}: keeping a subset of its "
                "heads keeps their size (leave head_dim unset)"
            )
        kept = resolve_keep_heads(keep_heads, ckpt.num_hidden_layers, available, count)
        return WarmStartPlan(kept, available, head_dim, checkpoint)

    @classmethod
    def _slice_heads(cls, state, kept, head_dim, fresh=()):
        patterns = [(re.compile(rf"(?:^|\.){p}$"), where) for p, where in cls._head_tensors.items()]
        out = {}
        for name, tensor in state.items():
            for pattern, (dim, blocks) in patterns:
                if pattern.search(name):
                    layer = _LAYER.search(name)
                    if layer is not None:
                        heads = kept[int(layer.group(1))]
                    elif name in fresh or all(h == kept[0] for h in kept):
                        heads = kept[0]
                    else:  # one tensor for every layer (NPRF's relative-position table): one choice of heads
                        raise ValueError(
                            f"keep_heads gives different heads per layer, but {name} is shared by all layers and "
                            "holds one entry per head: give one list of heads for every layer"
                        )
                    index = head_index(heads, head_dim if blocks else 1, tensor.device)
                    tensor = tensor.index_select(dim, index)
                    break
            out[name] = tensor
        return out
