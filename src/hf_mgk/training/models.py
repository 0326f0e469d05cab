"""The model factory of the training scripts: which family a run builds (a stock checkpoint warm-starts one, a
saved hf-mgk folder continues its own, --model_type starts a new one), its tokenizer, the model for a task, and
the sequence lengths its positions allow."""

import dataclasses
import logging
import os

import torch
from transformers import AutoConfig, AutoTokenizer

from ..families import FAMILIES, STOCK_FAMILIES, TASK_AUTO, TASK_NAMES, family_of_attention
from .arguments import parse_overrides

logger = logging.getLogger("hf_mgk.training")


def _package():
    import hf_mgk  # registers the families with the Auto classes

    return hf_mgk


def checkpoint_config(model_args):
    """The config dict of --model_name_or_path (or --config_name), without building a model; None when new."""
    from transformers import PreTrainedConfig

    source = model_args.model_name_or_path or model_args.config_name
    if source is None:
        return None
    kwargs = {k: v for k, v in model_args.hub_kwargs().items() if k != "trust_remote_code"}
    config_dict, _ = PreTrainedConfig.get_config_dict(source, **kwargs)
    return config_dict


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    """What a run builds, decided once: the arguments, the checkpoint's config.json (read once; None for a new
    model) and the family. The scripts pass it to `load_model` and `base_model` and read `family` /
    `checkpoint` from it."""

    model_args: object
    checkpoint: dict
    family: str

    @property
    def stock(self):
        """A stock BERT / GPT-2 / RoBERTa checkpoint (a warm start), not a saved hf-mgk folder."""
        return (self.checkpoint or {}).get("model_type") in STOCK_FAMILIES


def plan_model(model_args):
    """The ModelPlan of a run; errors name the option (a checkpoint of another kind, --family / --model_type that
    contradict it)."""
    config_dict = checkpoint_config(model_args)
    return ModelPlan(model_args, config_dict, _family(model_args, config_dict))


def family_of(model_args):
    """The hf-mgk family a run builds: an hf-mgk checkpoint's own, the one a stock checkpoint warm-starts (see
    `stock_family`), else --model_type."""
    return plan_model(model_args).family


def _family(model_args, config_dict):
    if config_dict is None:
        return model_args.model_type
    model_type = config_dict.get("model_type")
    source = model_args.model_name_or_path or model_args.config_name
    if model_type in STOCK_FAMILIES:
        family = stock_family(model_type, model_args)
    elif model_type in FAMILIES:
        family = model_type
        if model_args.family is not None and model_args.family != family:
            raise ValueError(f"--family {model_args.family} contradicts {source}, a saved {family} model; an hf-mgk "
                             "checkpoint continues as its own family (leave --family out)")
    else:
        raise ValueError(
            f"{source} is a {model_type!r} checkpoint; hf-mgk warm-starts from {', '.join(sorted(STOCK_FAMILIES))} "
            f"checkpoints and continues {', '.join(sorted(FAMILIES))} ones")
    if model_args.model_type is not None and model_args.model_type != family:
        hint = (f" (--family {model_args.model_type} chooses it for a stock {model_type!r} checkpoint)"
                if model_args.model_type in STOCK_FAMILIES.get(model_type, ()) else "")
        raise ValueError(f"--model_type {model_args.model_type} does not match the checkpoint, which gives "
                         f"{family}{hint}")
    return family


def stock_family(model_type, model_args):
    """The family a stock `model_type` checkpoint warm-starts: --family, else the only family of the
    --attention_overrides' attention_type among the checkpoint's, else the checkpoint's default."""
    families = STOCK_FAMILIES[model_type]
    if model_args.family is not None:
        if model_args.family not in families:
            raise ValueError(f"--family {model_args.family} cannot warm-start from a stock {model_type!r} checkpoint "
                             f"({model_args.model_name_or_path}); a {model_type!r} checkpoint warm-starts "
                             f"{' or '.join(families)}")
        return model_args.family
    attention = parse_overrides(model_args.attention_overrides, None, "--attention_overrides").get("attention_type")
    inferred = family_of_attention(model_type).get(attention)
    if inferred in families:
        return inferred
    if len(families) > 1:
        logger.info("a stock %s checkpoint warm-starts %s (the default; --family chooses among %s)", model_type,
                    families[0], ", ".join(families))
    return families[0]


def model_class(family, task):
    classes = FAMILIES[family].classes
    if task not in classes:
        tasks = ", ".join(TASK_NAMES[t] for t in classes if t in TASK_NAMES)
        raise ValueError(f"{family} has no model for {TASK_NAMES[task]}; it has: {tasks}")
    _package()  # registered with the Auto classes before any model is made
    return FAMILIES[family].auto_map[TASK_AUTO[task]]


def load_tokenizer(model_args):
    source = model_args.tokenizer_name or model_args.model_name_or_path
    if source is None:
        raise ValueError("a new model (--model_type) needs --tokenizer_name: training a tokenizer is not part of "
                         "these scripts")
    return AutoTokenizer.from_pretrained(source, use_fast=model_args.use_fast_tokenizer, **model_args.hub_kwargs())


def _start_deepspeed_on_the_ranks():
    """ZeRO-3 builds the model inside deepspeed.zero.Init, which counts the ranks through DeepSpeed's own
    communicator. accelerate starts that one on accelerators only: with --use_cpu the ranks' torch process group
    (gloo) exists, and DeepSpeed, not told of it, counted one rank and refused Trainer's batch size ("train_batch_size
    is not equal to micro_batch_per_gpu * gradient_acc_step * world_size"). Started here on that process group."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    if not (is_deepspeed_zero3_enabled() and torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    from deepspeed import comm

    if not comm.is_initialized():
        comm.init_distributed(dist_backend=torch.distributed.get_backend(), auto_mpi_discovery=False)


def load_model(plan, task, **config_kwargs):
    """The model for `task` ("mlm", "clm", "seq-cls", "qa") of a `plan_model` plan: warm-started or continued from
    --model_name_or_path, or new from --model_type / --config_name with --config_overrides.

    `config_kwargs`: what the task sets in the config (num_labels, is_decoder, ...). Returns the model."""
    model_args, family = plan.model_args, plan.family
    _start_deepspeed_on_the_ranks()
    cls = model_class(family, task)
    config_class = FAMILIES[family].config_class
    if model_args.model_name_or_path is not None:
        kwargs = {**parse_overrides(model_args.attention_overrides, config_class, "--attention_overrides"),
                  **config_kwargs}
        # Keywords of from_pretrained are set on the loaded config without its checks: run them here first.
        fields = {f.name for f in dataclasses.fields(config_class)} - {"model_type", "architectures", "auto_map"}
        saved = {k: v for k, v in plan.checkpoint.items() if k in fields}
        config_class(**{**saved, **kwargs})
        if model_args.keep_heads_list is not None:
            kwargs["keep_heads"] = model_args.keep_heads_list
        return cls.from_pretrained(model_args.model_name_or_path, **kwargs, **model_args.hub_kwargs())
    if model_args.config_name is not None:
        config = AutoConfig.from_pretrained(model_args.config_name, **config_kwargs, **model_args.hub_kwargs())
        if not isinstance(config, config_class):
            raise ValueError(f"--config_name {model_args.config_name} is not a {family} config")
    else:
        overrides = parse_overrides(model_args.config_overrides, config_class, "--config_overrides")
        config = config_class(**{**overrides, **config_kwargs})
    logger.info("training a new %s model from scratch: %s", family, config.to_json_string(use_diff=True))
    # as the Auto classes' from_config builds it: inside deepspeed.zero.Init under ZeRO-3, so that no rank holds
    # the whole model before DeepSpeed partitions it
    return cls._from_config(config)


def fit_vocabulary(model, tokenizer):
    """A new model's embeddings must cover the tokenizer (upstream resizes them the same way)."""
    size = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > size:
        model.resize_token_embeddings(len(tokenizer))


def base_model(plan):
    """The checkpoint a run started from, for the model card: a Hub name, or a local folder holding a stock
    checkpoint (a warm start: the card says so in words, never as Hub metadata); None for a new model or the
    continuation of a local hf-mgk folder."""
    path = plan.model_args.model_name_or_path
    if path is None:
        return None
    if not os.path.isdir(path):
        return path
    return path if plan.stock else None


# Language modelling: what run_mlm.py and run_clm.py share.


def new_model_kwargs(model_args, tokenizer):
    """A model from scratch takes the tokenizer's vocabulary size and padding id unless --config_overrides sets
    them: a config's defaults belong to its own family's tokenizer (NPRF-RoBERTa counts positions from its pad id,
    BERT's [PAD] is 0, Llama's vocabulary of 32000 is smaller than GPT-2's, whose pad id would not fit in it)."""
    if model_args.model_type is None or model_args.model_name_or_path or model_args.config_name:
        return {}
    config_class = FAMILIES[model_args.model_type].config_class
    overrides = parse_overrides(model_args.config_overrides, config_class, "--config_overrides")
    kwargs = {} if "vocab_size" in overrides else {"vocab_size": len(tokenizer)}
    if tokenizer.pad_token_id is not None and "pad_token_id" not in overrides:
        kwargs["pad_token_id"] = tokenizer.pad_token_id
    return kwargs


def position_limit(config):
    """(the longest input the model's absolute position table takes, why); (None, why) without such a table."""
    if getattr(config, "use_absolute_positions", True) is False:
        return None, "use_absolute_positions=False"
    if getattr(config, "rope_parameters", None) is not None or getattr(config, "rope_theta", None) is not None:
        return None, "rotary positions, no position table"  # (Llama's: max_position_embeddings is no limit)
    family = FAMILIES.get(config.model_type)
    if family is not None and family.positions_after_padding:  # fairseq positions start after the padding index
        offset = config.pad_token_id + 1
        return (config.max_position_embeddings - offset,
                f"max_position_embeddings={config.max_position_embeddings} minus RoBERTa's padding offset {offset}")
    name = "n_positions" if hasattr(config, "n_positions") else "max_position_embeddings"
    return getattr(config, name), f"{name}={getattr(config, name)}"


def sequence_length(requested, option, tokenizer, config):
    """`option` (--max_seq_length / --block_size) checked against the model's positions before any training.

    Not given: as upstream, the tokenizer's model_max_length capped at 1024, and here also at the model's limit.
    Given beyond the tokenizer's model_max_length: kept (with a warning) when the model takes it; upstream
    clamps to the tokenizer, which would cut NPRF-RoBERTa without absolute positions to 512."""
    limit, why = position_limit(config)
    if requested is None:
        length = min(1024, tokenizer.model_max_length, limit if limit is not None else 1024)
        if length < tokenizer.model_max_length:
            logger.warning("%s not given: using %d, the smallest of 1024, the tokenizer's model_max_length (%d) and "
                           "the model's limit (%s); pass %s to choose", option, length, tokenizer.model_max_length,
                           why if limit is None else f"{limit}: {why}", option)
        return length
    if limit is not None and requested > limit:
        raise ValueError(f"{option} {requested} is longer than the model's positions allow: at most {limit} "
                         f"({why}). Give {option} <= {limit}")
    if requested > tokenizer.model_max_length:
        logger.warning("%s %d is beyond the tokenizer's model_max_length (%d); using it, the model takes it (%s)",
                       option, requested, tokenizer.model_max_length, why)
    return requested


__all__ = ["checkpoint_config", "ModelPlan", "plan_model", "family_of", "stock_family", "model_class", "load_tokenizer",
           "load_model", "fit_vocabulary", "base_model", "new_model_kwargs", "position_limit", "sequence_length"]
