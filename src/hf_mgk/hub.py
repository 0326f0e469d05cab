"""Publishing: a Hub-ready folder (safetensors weights, config with the full `auto_map`, the code files, the
tokenizer, a model card with the run's own metrics), its upload, and the proof that it loads with
`trust_remote_code=True` alone — in a process, or a whole virtualenv, where `hf_mgk` cannot be imported."""

import hashlib
import json
import math
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
import textwrap

import torch
import transformers

from .families import FAMILIES
from .folders import refuse_holding_inputs, sha256_file

DEFAULT_REVISION = "v1"
# Beside the exported files, never uploaded: which run the folder holds, so re-exporting the same run may replace
# it while another run's export (or any other files) is refused unless overwrite is asked for.
EXPORT_MARKER = ".hf_mgk_export.json"

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
# The sample the remote-code check runs (short enough for any position limit).
CHECK_TEXT = "The quick brown fox jumps over the lazy dog."

# Run first in the child process: any `import hf_mgk` fails, so the folder's own code files must suffice.
_BLOCK_PACKAGE = textwrap.dedent(
    """
    import importlib.abc, sys
    class _NoHfMgk(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "hf_mgk" or name.startswith("hf_mgk."):
                raise ModuleNotFoundError("hf_mgk is deliberately unavailable in this process")
            return None
    sys.meta_path.insert(0, _NoHfMgk())
    """
)


# ---------------------------------------------------------------------------------------------------- folders


def _write_fresh(folder, write, overwrite=False, replace=None):
    """Give `folder` the files `write(tmp)` creates in a temporary sibling folder.

    A non-empty folder is refused unless `overwrite` or `replace`. With `overwrite` every old file goes (no stale
    card or code file of an earlier export survives beside the new ones). With `replace`, the relative paths of
    an earlier export's own files, only those go: every other file is the user's and stays, and a new file takes
    the place of an old one of the same name. The old contents are removed only once `write` has succeeded, so a
    failed export leaves the folder as it was."""
    folder = os.path.abspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise FileExistsError(f"{folder} exists and is not a folder")
    if os.path.isdir(folder) and os.listdir(folder) and not overwrite and replace is None:
        raise FileExistsError(f"{folder} exists and is not empty; pass overwrite=True to replace its contents")
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".hf_mgk-export-", dir=parent)
    try:
        result = write(tmp)
        os.makedirs(folder, exist_ok=True)
        if replace is None:
            old = [os.path.join(folder, name) for name in os.listdir(folder)]
        else:  # never outside the folder, whatever a (hand-edited) marker lists
            old = [os.path.join(folder, rel) for rel in replace if not _outside(rel)]
        for path in old:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)
        for rel in _relative_files(tmp):
            os.makedirs(os.path.dirname(os.path.join(folder, rel)), exist_ok=True)
            os.replace(os.path.join(tmp, rel), os.path.join(folder, rel))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def _outside(rel):
    return os.path.isabs(rel) or os.path.normpath(rel).split(os.sep)[0] == ".."


def _relative_files(folder):
    """Every file under `folder`, as sorted '/'-separated relative paths."""
    return sorted(os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
                  for root, _, names in os.walk(folder) for name in names)


def save_for_hub(model, folder, tokenizer=None, overwrite=False):
    """`save_pretrained` (safetensors + code files + full `auto_map`) into `folder`, plus the tokenizer and a
    README.md model card saying how to load it (no metrics: `export_run` publishes a training run with them).

    A non-empty folder is refused unless `overwrite=True`, which replaces all of its contents."""

    def write(tmp):
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        _write_text(os.path.join(tmp, "README.md"), model_card(model))

    _write_fresh(folder, write, overwrite=overwrite)
    return folder


def _write_text(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _read_json(path):
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# ------------------------------------------------------------------------------------------------ training runs


def read_run(run_dir):
    """What the card needs from a training script's --output_dir: `hf_mgk_run.json` (identity, task, dataset,
    base_model, family, versions; any key may be missing), the metrics of all_results.json (else eval_ and
    train_results.json together) under "results", and the number of optimizer steps under "global_step".

    Only results files that hf_mgk_run.json records as this run's are read (`training.recorded_results`); the
    names of the others (an earlier run's, another model's evaluation, an edited file) are under
    "ignored_results"."""
    from .training import RUN_FILE, recorded_results

    info = _read_json(os.path.join(run_dir, RUN_FILE)) or {}
    own, ignored = recorded_results(run_dir)
    results = own.get("all_results.json")
    if results is None:
        results = {**own.get("eval_results.json", {}), **own.get("train_results.json", {})}
    state = _read_json(os.path.join(run_dir, "trainer_state.json")) or {}
    return {**info, "results": results, "ignored_results": ignored, "global_step": state.get("global_step")}


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


def auto_class_of(model):
    """The Auto class that loads `model`'s own class (AutoModel for a base model)."""
    return next((a for a, name in model._auto_map.items() if name == type(model).__name__), "AutoModel")


def _template(family):
    """(front matter dict, body) of the family's card template, shipped inside the package."""
    from huggingface_hub import metadata_load

    path = os.path.join(os.path.dirname(__file__), "model_cards", f"{family}.md")
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

    run: `read_run(run_dir)`, or None for a model that comes from no recorded run."""
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


# ------------------------------------------------------------------------------------------------------- export


def _load_run_model(run_dir):
    """The run's model through hf_mgk's own class (named in config.json `architectures`), refusing weights
    that do not fit it exactly."""
    import hf_mgk
    from transformers import PreTrainedModel

    config = _read_json(os.path.join(run_dir, "config.json"))
    if config is None:
        raise ValueError(f"{run_dir} holds no saved model (no config.json): give the --output_dir of a finished "
                         "training run (or one of its checkpoint-* folders)")
    arch = (config.get("architectures") or [None])[0]
    cls = getattr(hf_mgk, arch, None) if arch else None
    if not (isinstance(cls, type) and issubclass(cls, PreTrainedModel)):
        raise ValueError(f"{run_dir}/config.json names the architecture {arch!r}, which is not an hf-mgk model")
    model, info = cls.from_pretrained(run_dir, dtype="auto", output_loading_info=True)
    problems = "; ".join(f"{k.replace('_', ' ')}: {', '.join(sorted(map(str, v))[:5])}"
                         for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys")
                         and v)
    if problems:
        raise ValueError(f"the weights in {run_dir} do not fit {arch} of this hf-mgk version ({problems})")
    return model.eval()


def _load_tokenizer(run_dir):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(run_dir)
    except (OSError, ValueError) as err:
        raise ValueError(f"{run_dir} holds no tokenizer that AutoTokenizer can load ({err}); the training "
                         "scripts save one beside the model") from err


def _first_output(out):
    return next(v for v in out.values() if torch.is_tensor(v) and v.dim() > 1)


def export_run(run_dir, folder, repo_id=None, revision=DEFAULT_REVISION, overwrite=False, check=True):
    """Write the Hub-ready folder of a training run (a training script's --output_dir) and return a summary.

    The model is loaded from `run_dir` through hf_mgk's class and saved again with `save_pretrained` rather than
    copied: the weights stay bit for bit, but the config's `auto_map` and the code files come from this hf-mgk
    (every Auto class of the family, every file the model imports), the weights are checked to fit that code
    exactly, only safetensors are written, and nothing of the trainer (optimizer states, checkpoints, logs)
    goes along. The folder gets: model.safetensors, config.json (+ generation_config.json for LMs), the code
    files, the tokenizer files and README.md, the model card of `model_card` (snippet pinned to `revision`,
    `repo_id` in it; "ORG/NAME" when None).

    `folder` may not be, or contain, the run or the current directory. An earlier export of this same run there
    is updated: its own files are replaced, files the user added are kept (summary "kept_files"), and a card the
    user edited is kept (summary "kept_card") as long as the card this export would write is the one the edit
    started from; if the run's card has changed since, FileExistsError, and nothing is written. A non-empty
    folder holding anything else is refused. `overwrite=True` removes all old files instead. With `check`, the
    new folder is loaded in a virtualenv without hf_mgk (`clean_python`) through its Auto class with
    `trust_remote_code=True`, and its outputs on a sample must equal the run's model (else AssertionError, and
    `folder` is left as it was)."""
    run_dir, folder = os.path.realpath(run_dir), os.path.realpath(folder)
    if not os.path.isdir(run_dir):
        raise ValueError(f"the run folder {run_dir} does not exist")
    refuse_holding_inputs(folder, {"the run folder": run_dir}, option="the export folder")
    if revision is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", revision):
        raise ValueError(f"revision tag {revision!r}: use letters, digits, '.', '_' and '-' (e.g. v1)")
    run = read_run(run_dir)
    marker = {"run_dir": run_dir, "identity": run.get("identity")}
    previous = _read_json(os.path.join(folder, EXPORT_MARKER)) if os.path.isdir(folder) else None
    same_run = previous is not None and {key: previous.get(key) for key in marker} == marker
    if os.path.isdir(folder) and os.listdir(folder) and not same_run and not overwrite:
        held = (f"the export of another run ({previous.get('run_dir')})" if previous
                else "files that are not an export of this run")
        raise FileExistsError(f"{folder} holds {held}; choose another folder, or pass overwrite=True "
                              "(publish.py --overwrite) to replace all of its contents")
    model = _load_run_model(run_dir)
    tokenizer = _load_tokenizer(run_dir)
    auto = auto_class_of(model)
    card = model_card(model, run, repo_id, revision)
    card_sha256 = hashlib.sha256(card.encode("utf-8")).hexdigest()
    update = same_run and not overwrite
    kept_card = update and _keep_edited_card(folder, previous, card_sha256)

    def write(tmp):
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if not kept_card:
            _write_text(os.path.join(tmp, "README.md"), card)
        # What this export wrote: a later export of the same run replaces these and keeps every other file.
        files = sorted(set(_relative_files(tmp)) | {"README.md"})
        _write_text(os.path.join(tmp, EXPORT_MARKER), json.dumps(
            {**marker, "files": files, "card_sha256": card_sha256}, indent=2, sort_keys=True))
        if check:
            inputs = dict(tokenizer(CHECK_TEXT, return_tensors="pt"))
            with torch.no_grad():
                reference = _first_output(model(**inputs))
            check_remote_code(tmp, inputs, auto_class=auto, reference=reference, python=clean_python())
        return files

    replace = None
    if update:  # a marker that lists no files (older hf-mgk): the new files replace their namesakes only
        replace = [rel for rel in previous.get("files") or [] if not (kept_card and rel == "README.md")]
    files = _write_fresh(folder, write, overwrite=True, replace=replace)
    kept = [rel for rel in _relative_files(folder) if rel not in files and rel != EXPORT_MARKER]
    return {"folder": folder, "model_class": type(model).__name__, "auto_class": auto,
            "pipeline_tag": PIPELINES[auto][0], "metrics": card_metrics(run["results"]), "checked": check,
            "kept_files": kept, "kept_card": kept_card, "ignored_results": run["ignored_results"]}


def _keep_edited_card(folder, previous, card_sha256):
    """Whether the README.md of an earlier export of this run is an edit of the card to keep: it differs from
    the card that export wrote (the marker's hash), and the new card is that same card. An edited card that
    the new one would replace (the run's metrics, the tag or the repo id changed) is refused, never replaced
    silently."""
    path = os.path.join(folder, "README.md")
    if not os.path.isfile(path):
        return False
    now = sha256_file(path)
    if now in (previous.get("card_sha256"), card_sha256):  # not edited, or already the new card
        return False
    if previous.get("card_sha256") == card_sha256:
        return True
    raise FileExistsError(
        f"{path} was edited after it was exported, and the card of this export differs from the one you edited "
        "(the run's metrics, --revision_tag or --hub_model_id changed): nothing was written. Copy your edits, "
        "then pass --overwrite (overwrite=True) to replace the folder's contents with the new export, or export "
        "into another --output_dir")


# ------------------------------------------------------------------------------------------------------- upload


def upload_plan(folder):
    """[(path in the repo, size in bytes)] of every file `push_folder` uploads: all files under `folder` but the
    export marker, sorted. The dry run prints this very list."""
    return [(rel, os.path.getsize(os.path.join(folder, rel))) for rel in _relative_files(folder)
            if rel != EXPORT_MARKER]


def network_errors():
    """The exceptions that mean "the Hub cannot be reached": HF_HUB_OFFLINE=1 raises OfflineModeIsEnabled (a
    ConnectionError); a failed connection or timeout raises the HTTP client's TransportError (httpx in
    huggingface_hub 1.x, its httpx2 fork later)."""
    import importlib

    errors = [ConnectionError, TimeoutError]
    for module in ("httpx", "httpx2"):
        try:
            errors.append(importlib.import_module(module).TransportError)
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def push_folder(folder, repo_id, revision=DEFAULT_REVISION, private=False, token=None, commit_message=None,
                api=None):
    """Upload the files of `upload_plan(folder)` to the model repo `repo_id` (created if missing) in one commit,
    then tag that commit `revision`, the revision the card's snippet pins. Returns the commit's CommitInfo.

    A tag that already exists is refused before anything is uploaded (the card would pin another commit).
    Files already in the repo that the folder lacks are left there."""
    from huggingface_hub import CommitOperationAdd, HfApi

    api = api or HfApi(token=token)
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    tags = {ref.name: ref.target_commit for ref in api.list_repo_refs(repo_id).tags}
    if revision in tags:
        raise ValueError(f"{repo_id} already has a tag {revision!r} (commit {tags[revision]}); the card pins "
                         f"revision={revision!r}, so choose a new tag (publish.py --revision_tag)")
    operations = [CommitOperationAdd(path_in_repo=rel, path_or_fileobj=os.path.join(folder, rel))
                  for rel, _ in upload_plan(folder)]
    commit = api.create_commit(repo_id, operations=operations, repo_type="model",
                               commit_message=commit_message or f"Upload {repo_id.split('/')[-1]} ({revision})")
    api.create_tag(repo_id, tag=revision, revision=commit.oid, repo_type="model",
                   tag_message="Published with hf-mgk; the model card pins this tag")
    return commit


# ------------------------------------------------------------------------------------- loading without hf_mgk


def _is_package_entry(name):
    """hf_mgk's own entries of site-packages: the package, its dist-info, an editable install's .pth / finder."""
    return "hf_mgk" in name.lower().replace("-", "_")


def clean_python(transformers_version=None, root=None):
    """The python of a virtualenv that has every package of this environment except hf_mgk.

    Built once (`python -m venv --without-pip`, then a symlink to each entry of this environment's
    site-packages but hf_mgk's own, editable-install hooks included) and kept under `root` (default: the
    temporary folder) in a folder whose name changes with the installed packages and the version asked for.

    transformers_version: None keeps this environment's transformers; a version ("4.57.6") installs that one
    from PyPI into the virtualenv instead (`pip install --no-deps --target`), with the requirements it has that
    this environment's packages do not meet (e.g. huggingface_hub<1.0 for 4.57), found from the installed
    metadata until none is missing; every other package is this environment's. This is how a published folder
    is checked against the transformers releases its users may have.

    Raises RuntimeError if the virtualenv cannot be made or pip fails, if hf_mgk is importable there, or if
    torch / transformers (of the version asked for) are not."""
    sites = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
    entries = sorted((p, name) for p in dict.fromkeys(sites) for name in os.listdir(p)
                     if not _is_package_entry(name) and name != "__pycache__")
    key = hashlib.sha256(repr((sys.executable, sys.version, entries, transformers_version)).encode()).hexdigest()[:12]
    label = "" if transformers_version is None else f"tf-{transformers_version}-"
    root = os.path.abspath(root or tempfile.gettempdir())
    home = os.path.join(root, f"hf-mgk-clean-venv-{label}{key}")
    bindir = "Scripts" if os.name == "nt" else "bin"
    python = os.path.join(home, bindir, "python")
    os.makedirs(root, exist_ok=True)
    _remove_stale_envs(root, label, home)
    if os.path.isfile(python):
        return python
    tmp = tempfile.mkdtemp(prefix=os.path.basename(home) + ".", dir=root)
    try:
        made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp], capture_output=True, text=True)
        if made.returncode != 0:
            raise RuntimeError(f"could not create a virtualenv with `{sys.executable} -m venv`:\n{made.stderr[-2000:]}")
        ask = [os.path.join(tmp, bindir, "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        target = subprocess.run(ask, check=True, capture_output=True, text=True).stdout.strip()
        replaced = set() if transformers_version is None else _install_release(transformers_version, target)
        for path, name in entries:
            if name not in replaced and not os.path.exists(os.path.join(target, name)):
                os.symlink(os.path.join(path, name), os.path.join(target, name))
        expected = transformers_version or _installed_version("transformers")
        probe = ("import importlib.util, torch, transformers\n"
                 "spec = importlib.util.find_spec('hf_mgk')\n"
                 "assert spec is None, f'hf_mgk is importable from {spec.origin}'\n"
                 f"assert transformers.__version__ == {expected!r}, transformers.__version__\n")
        proc = subprocess.run([ask[0], "-c", probe], cwd=tmp, capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        if proc.returncode != 0:
            raise RuntimeError(f"the virtualenv without hf_mgk is not usable:\n{proc.stderr[-2000:]}")
        try:
            os.rename(tmp, home)
        except OSError:  # another process built it meanwhile
            if not os.path.isfile(python):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return python


def _remove_stale_envs(root, label, keep):
    """Remove the virtualenvs made under `root` by this interpreter for the same transformers (`label`) but other
    installed packages: their key will not come again, and each holds a pip-installed release (~50 MB)."""
    pattern = re.compile(rf"hf-mgk-clean-venv-{re.escape(label)}[0-9a-f]{{12}}")
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if not pattern.fullmatch(name) or path == keep:
            continue
        try:
            with open(os.path.join(path, "pyvenv.cfg"), encoding="utf-8") as f:
                ours = f"command = {sys.executable} -m venv" in f.read()
        except OSError:
            continue
        if ours:
            shutil.rmtree(path, ignore_errors=True)


def _installed_version(name):
    import importlib.metadata

    return importlib.metadata.version(name)


def _install_release(transformers_version, target):
    """Install transformers==`transformers_version` into `target`, then each requirement of what is in `target`
    that neither `target` nor this environment meets, until none is left. Returns this environment's
    site-packages entries (packages, dist-infos) of the distributions installed in `target`: they must not be
    linked beside them (two dist-infos of one package, or the old package shadowing the new one)."""
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    def installed(path=None):
        dists = importlib.metadata.distributions(**({"path": [path]} if path else {}))
        return {canonicalize_name(d.metadata["Name"]): d for d in dists}

    here = installed()
    wanted = [f"transformers=={transformers_version}"]
    for _ in range(10):
        if not wanted:
            break
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--target", target, *wanted]
        proc = subprocess.run(pip, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"could not install {' '.join(wanted)} from PyPI (`pip install --target`):\n"
                               f"{proc.stderr[-2000:]}")
        there = installed(target)
        wanted = []
        for dist in there.values():
            for line in dist.requires or ():
                req = Requirement(line)
                if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                    continue
                name = canonicalize_name(req.name)
                have = there.get(name) or here.get(name)
                if have is None or not req.specifier.contains(have.version, prereleases=True):
                    if name in there:
                        raise RuntimeError(f"{dist.metadata['Name']} needs {req}, but {name} {have.version} was "
                                           "installed for another requirement")
                    wanted.append(str(req))
        wanted = sorted(set(wanted))
    else:
        raise RuntimeError(f"the requirements of transformers=={transformers_version} did not settle: {wanted}")
    replaced = set()
    for name in there:
        if name in here:  # its RECORD lists the dist-info folder's files too
            replaced |= {p.parts[0] for p in here[name].files or ()}
    return replaced


def run_without_package(code, cwd, timeout=600, python=None):
    """Run Python `code` in a fresh interpreter where `hf_mgk` cannot be imported; return its last stdout line
    parsed as JSON. Raises RuntimeError with the child's stderr if it fails.

    python: None runs this interpreter with `import hf_mgk` blocked; `clean_python()` runs a virtualenv that
    does not have the package at all."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("HF_MODULES_CACHE", os.path.join(cwd, ".hf_modules"))
    # The parent's thread count: a matmul split over another number of threads sums in another order.
    threads = f"import sys, torch\ntorch.set_num_threads({torch.get_num_threads()})\n"
    block = _BLOCK_PACKAGE if python is None else ""
    script = block + threads + textwrap.dedent(code) + "\nassert 'hf_mgk' not in sys.modules\n"
    proc = subprocess.run([python or sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the check process failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_remote_code(folder, inputs, auto_class="AutoModel", reference=None, python=None):
    """Load `folder` through `transformers.<auto_class>` with `trust_remote_code=True` in a process without
    hf_mgk (`python`: see `run_without_package`), run it on `inputs` (a dict of tensors), and return its first
    output as a tensor. If `reference` (a tensor) is given, raise AssertionError unless the outputs agree to
    float32 round-off."""
    # `auto_class` is written into the code the child runs: only a name of one of transformers' Auto classes may
    # go there, never arbitrary text (e.g. "AutoModel; import os; ...").
    if not (isinstance(auto_class, str) and re.fullmatch(r"Auto[A-Za-z]+", auto_class)
            and hasattr(transformers, auto_class)):
        raise ValueError(f"auto_class must name one of transformers' Auto classes (e.g. 'AutoModel', "
                         f"'AutoModelForMaskedLM'); got {auto_class!r}")
    folder = os.path.abspath(folder)
    with tempfile.TemporaryDirectory() as work:
        torch.save(inputs, os.path.join(work, "inputs.pt"))
        result = run_without_package(
            f"""
            import json, torch, transformers
            inputs = torch.load("inputs.pt")
            model = transformers.{auto_class}.from_pretrained({folder!r}, trust_remote_code=True, dtype="auto")
            model.eval()
            with torch.no_grad():
                out = model(**inputs)
            first = next(v for v in out.values() if torch.is_tensor(v) and v.dim() > 1)
            torch.save(first, "output.pt")
            print(json.dumps({{"module": type(model).__module__}}))
            """,
            cwd=work,
            python=python,
        )
        if not result["module"].startswith("transformers_modules"):
            raise AssertionError(f"{auto_class} did not load the folder's own code: {result['module']}")
        output = torch.load(os.path.join(work, "output.pt"))
    if reference is not None:
        assert_same_outputs(output, reference, "remote-code outputs")
    return output


def assert_same_outputs(output, reference, what="outputs"):
    """Raise AssertionError unless `output` equals `reference` up to float32 round-off.

    Not bit for bit across processes: MKL picks its matmul kernel by buffer alignment, so another process can
    sum in another order (seen: 1.2e-6 on a logit of 0.017 from terms of size ~1). Round-off is relative to the
    size of the terms summed, not of the result, hence the bound on the output's largest magnitude: a wrong
    weight or a missing mask moves outputs by orders of magnitude more."""
    output, reference = torch.as_tensor(output), torch.as_tensor(reference)
    if output.shape != reference.shape:
        raise AssertionError(f"{what} differ in shape: {tuple(output.shape)} vs {tuple(reference.shape)}")
    err = (output - reference).abs().max().item()
    bound = 1e-5 * reference.abs().max().item() + 1e-6
    if not err <= bound:  # also catches NaN
        raise AssertionError(f"{what} differ: max abs diff {err:.3e} > {bound:.3e} (float32 round-off)")
