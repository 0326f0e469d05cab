"""The model card: pure functions of the model and the run's recorded numbers (no file is read or written here).

`card_data` gives the Hub metadata (pipeline tag, base model, datasets, the model-index of the run's own metrics),
`model_card` the README.md text: the family's template (hf_mgk/model_cards/<family>.md) filled with the run's
summary, its results and the configuration, and a snippet that loads it with transformers alone."""

import copy
import math
import os
import re

from torch import nn
from transformers import PreTrainedModel

from ..families import FAMILIES
from ..modeling_common import own_class

# Auto class of the exported model -> the Hub's pipeline tag and a task name for the model-index.
PIPELINES = {
    "AutoModelForMaskedLM": ("fill-mask", "Masked language modeling"),
    "AutoModelForCausalLM": ("text-generation", "Causal language modeling"),
    "AutoModelForSequenceClassification": ("text-classification", "Text classification"),
    "AutoModelForTokenClassification": ("token-classification", "Token classification"),
    "AutoModelForQuestionAnswering": ("question-answering", "Extractive question answering"),
    "AutoModel": ("feature-extraction", "Feature extraction"),
}


ATTENTION_FIELDS = ("attention_type", "num_keys", "e_step", "mgk_prior", "mgk_variances", "num_global_heads",
                    "fish_noise_init", "normalize_qk", "use_rpe", "num_random_features", "rpe_num_buckets",
                    "use_absolute_positions", "head_dim")


# Keys of *_results.json that are bookkeeping, not a measure of the model (squad_v2 adds counts and thresholds).
_NOT_METRICS = {"runtime", "samples_per_second", "steps_per_second", "samples", "epoch", "loss",
                "model_preparation_time", "jit_compilation_time"}


# Metric ids of the Hub (hf.co/metrics) where the scripts' key differs.
_METRIC_IDS = {"pearson": "pearsonr", "exact": "exact_match"}


# One short example per head; the model card's snippet ends with it.
_EXAMPLES = {
    "AutoModelForMaskedLM": [
        'inputs = tokenizer(f"Paris is the {tokenizer.mask_token} of France.", return_tensors="pt")',
        "logits = model(**inputs).logits",
        "masked = inputs.input_ids[0] == tokenizer.mask_token_id",
        "print(tokenizer.decode(logits[0, masked].argmax(-1)))"],
    "AutoModelForCausalLM": [
        'inputs = tokenizer("Once upon a time", return_tensors="pt")',
        "print(tokenizer.decode(model.generate(**inputs, max_new_tokens=20)[0]))"],
    "AutoModelForSequenceClassification": [
        'logits = model(**tokenizer("A sentence to classify.", return_tensors="pt")).logits',
        "print(model.config.id2label[logits.argmax(-1).item()])"],
    "AutoModelForQuestionAnswering": [
        'inputs = tokenizer("Who wrote Hamlet?", "Hamlet is a tragedy by Shakespeare.", return_tensors="pt")',
        "out = model(**inputs)",
        "start, end = out.start_logits.argmax(), out.end_logits.argmax()",
        "print(tokenizer.decode(inputs.input_ids[0, start:end + 1]))"],
}


def card_metrics(results):
    """[(name, split, value)]: the evaluation metrics among a run's results, in their order.

    Keys `eval_<name>` (and `perplexity`, which upstream's run_mlm / run_clm write unprefixed); `<name>_mm` is
    MNLI's mismatched validation set. Timings, sample counts, the loss, squad_v2's counts (`*total`) and
    thresholds (`*_thresh`) are not metrics of the model."""
    out, seen = [], set()
    for key, value in results.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if key.startswith("eval_"):
            name = key[len("eval_"):]
        elif key == "perplexity":
            name = key
        else:
            continue
        split = "validation"
        if name.endswith("_mm"):
            name, split = name[:-len("_mm")], "validation_mismatched"
        if name in _NOT_METRICS or name.endswith("total") or name.endswith("_thresh") or (name, split) in seen:
            continue
        seen.add((name, split))
        out.append((name, split, value))
    return out


def is_hub_id(name):
    """A Hub repo id (`bert-base-uncased`, `org/name`), not a local path: only those may go in card metadata."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not name or os.path.exists(name):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _hub_dataset(run):
    """The run's dataset as a Hub dataset id, or None for local files."""
    name = (run.get("identity") or {}).get("dataset_name")  # run_glue.py --task_name records nyu-mll/glue
    return name if name and is_hub_id(name) else None


def _dataset_name(run):
    identity = run.get("identity") or {}
    if run.get("dataset"):
        return str(run["dataset"])
    if identity.get("dataset_name"):
        return "/".join(filter(None, [identity["dataset_name"], identity.get("dataset_config_name")]))
    files = [os.path.basename(identity[k]) for k in ("train_file", "validation_file") if identity.get(k)]
    return "local files " + ", ".join(files) if files else None


# ------------------------------------------------------------------------------------------------- model cards


def family_model(model, merged=False):
    """The hf-mgk model inside whatever wraps it for training: the `.module` of DDP, FSDP1 and a DeepSpeed engine,
    torch.compile's `_orig_mod`, a peft model's base model. FSDP2 wraps by subclassing: that model is one already
    (see `own_class`). A peft model's base holds the adapter layers in place of its projections; `merged=True` gives
    a copy with the adapters merged into the weights instead (peft's `merge_and_unload`), the model passed in left
    as it is."""
    given = model
    while not isinstance(model, PreTrainedModel):
        if hasattr(model, "merge_and_unload"):  # peft
            model = copy.deepcopy(model).merge_and_unload() if merged else model.get_base_model()
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        elif isinstance(getattr(model, "module", None), nn.Module):
            model = model.module
        else:
            break
    if not isinstance(model, PreTrainedModel) or not hasattr(model, "_auto_map"):
        raise TypeError(f"expected an hf-mgk model (or one wrapped by DDP, FSDP, DeepSpeed, torch.compile or peft), "
                        f"got a {type(given).__name__}")
    return model


def auto_class_of(model):
    """The Auto class that loads `model`'s own class (AutoModel for a base model)."""
    model = family_model(model)
    return next((a for a, name in model._auto_map.items() if name == own_class(model).__name__), "AutoModel")


def _template(family):
    """(front matter dict, body) of the family's card template, shipped inside the package."""
    from huggingface_hub import metadata_load

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "model_cards", f"{family}.md")
    if not os.path.isfile(path):
        raise ValueError(f"no model card template for model_type {family!r} (looked for {path})")
    with open(path, encoding="utf-8") as f:
        body = f.read().split("---\n", 2)[2]
    return metadata_load(path) or {}, body.lstrip("\n")


def _fill(template, values):
    """Replace every `{{name}}`; a placeholder without a value is an error, not text left in a published card."""

    def value(match):
        if match.group(1) not in values:
            raise KeyError(f"model card template: no value for {{{{{match.group(1)}}}}}")
        return values[match.group(1)]

    return re.sub(r"\{\{(\w+)\}\}", value, template)


# The transformers releases the code files of a published checkpoint are tested on (tests/test_compat.py).
TESTED_TRANSFORMERS = "4.57 or any 5.x release from 5.0 to 5.23"


def usage_snippet(auto, repo_id, revision=None):
    """Python that loads the model from the Hub with transformers alone, pinned to `revision`, after a line
    saying which transformers releases it is tested on."""
    pin = f', revision="{revision}"' if revision else ""
    lines = [f"from transformers import {auto}, AutoTokenizer",
             f'model = {auto}.from_pretrained("{repo_id}"{pin}, trust_remote_code=True)',
             # The tokenizer reads config.json too, whose auto_map names custom code: without the flag it asks.
             f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}"{pin}, trust_remote_code=True)',
             *_EXAMPLES.get(auto, [])]
    needs = f"Needs only `torch` and `transformers` ({TESTED_TRANSFORMERS}; tested with torch 2.13).\n\n"
    return needs + "```python\n" + "\n".join(lines) + "\n```\n"


def _summary(model, run):
    config = model.config
    family = config.model_type
    n_params = sum(p.numel() for p in model.parameters())
    auto = auto_class_of(model)
    text = (f"{PIPELINES[auto][1]} with **{FAMILIES[family].title if family in FAMILIES else family}** (`model_type: {family}`, "
            f"`attention_type: {getattr(config, 'attention_type', '?')}`), {n_params / 1e6:.2f}M parameters")
    if run is None:
        return text + "."
    identity = run.get("identity") or {}
    base, start = run.get("base_model"), identity.get("model_name_or_path")
    if base:
        origin = (f"warm-started from [{base}](https://huggingface.co/{base})" if is_hub_id(base)
                  else f"warm-started from the checkpoint `{os.path.basename(os.path.normpath(base))}`")
    elif start:
        origin = f"continued from the hf-mgk checkpoint `{os.path.basename(os.path.normpath(start))}`"
    elif identity:
        origin = "trained from scratch"
    else:  # no hf_mgk_run.json: nothing is known of how it was trained
        origin = "from a training run"
    data = _dataset_name(run)
    versions = ", ".join(f"{name} {run[key]}" for name, key in (
        ("hf-mgk", "hf_mgk_version"), ("transformers", "transformers_version"), ("torch", "torch_version"))
        if run.get(key))
    script = f" by `{identity['script']}`" if identity.get("script") else ""
    return (f"{text}, {origin}{script}" + (f" on {data}" if data else "")
            + (f" ({versions})" if versions else "") + ".")


def _results_section(run):
    if run is None:
        return "No training run was recorded with this folder."
    results = run.get("results") or {}
    metrics = card_metrics(results)
    facts = [f"{label}: {results[key]:g}" for label, key in (("training examples", "train_samples"),
                                                             ("epochs", "epoch"), ("final training loss",
                                                                                   "train_loss"))
             if isinstance(results.get(key), (int, float))]
    if run.get("global_step"):
        facts.insert(0, f"optimizer steps: {run['global_step']}")
    parts = []
    if facts:
        parts.append("Training: " + "; ".join(facts) + ".")
    if metrics:
        data = _dataset_name(run) or "the evaluation data"
        rows = "\n".join(f"| {name} | {split} | {value:.6g} |" for name, split, value in metrics)
        parts.append(f"Measured at the end of training on {data} (the numbers of the run's all_results.json):\n\n"
                     f"| metric | split | value |\n|---|---|---:|\n{rows}")
    else:
        parts.append("No evaluation results were recorded for this run.")
    return "\n\n".join(parts)


def _configuration_table(config):
    rows = "\n".join(f"| `{k}` | `{getattr(config, k)}` |" for k in ATTENTION_FIELDS if hasattr(config, k))
    return f"| setting | value |\n|---|---|\n{rows}"


def card_data(model, run=None, repo_id=None):
    """The card's metadata (`huggingface_hub.ModelCardData`): library, pipeline tag, tags, license, datasets,
    base_model (a warm start from a Hub checkpoint only) and a `model-index` with the run's metrics."""
    from huggingface_hub import EvalResult, ModelCardData

    model = family_model(model)
    config = model.config
    meta, _ = _template(config.model_type)
    pipeline, task_name = PIPELINES[auto_class_of(model)]
    tags = ["custom_code", "hf-mgk", config.model_type]
    if getattr(config, "attention_type", None):
        tags.append(config.attention_type)
    tags += [t for t in meta.pop("tags", []) if t not in tags]
    run = run or {}
    dataset = _hub_dataset(run)
    dataset_config = (run.get("identity") or {}).get("dataset_config_name")
    eval_results = [
        EvalResult(task_type=pipeline, task_name=task_name, dataset_type=dataset or "local",
                   dataset_name=_dataset_name(run) or "local files", dataset_config=dataset_config,
                   dataset_split=split, metric_type=_METRIC_IDS.get(name, name), metric_name=name,
                   metric_value=value)
        for name, split, value in card_metrics(run.get("results") or {}) if math.isfinite(value)]
    base = run.get("base_model")
    return ModelCardData(
        library_name="transformers", pipeline_tag=pipeline, tags=tags, datasets=[dataset] if dataset else None,
        base_model=base if base and is_hub_id(base) else None,
        model_name=(repo_id or "ORG/NAME").split("/")[-1], eval_results=eval_results or None, **meta)


def model_card(model, run=None, repo_id=None, revision=None):
    """README.md for the Hub: YAML metadata (`card_data`), then the family's text (model_cards/<family>.md)
    with the run's summary, a loading snippet pinned to `revision`, the attention settings and the metrics.

    run: `read_run(run_dir)`, or None for a model that comes from no recorded run. The model may be wrapped (see
    `family_model`)."""
    model = family_model(model)
    config = model.config
    _, body = _template(config.model_type)
    name = (repo_id or "ORG/NAME").split("/")[-1]
    text = _fill(body, {
        "model_name": name,
        "summary": _summary(model, run),
        "usage": usage_snippet(auto_class_of(model), repo_id or "ORG/NAME", revision),
        "configuration": _configuration_table(config),
        "results": _results_section(run),
    })
    return f"---\n{card_data(model, run, repo_id).to_yaml()}\n---\n{text}"


__all__ = ["PIPELINES", "ATTENTION_FIELDS", "card_metrics", "is_hub_id", "family_model", "auto_class_of",
           "TESTED_TRANSFORMERS", "usage_snippet", "card_data", "model_card"]
