"""Export: a Hub-ready folder (safetensors weights, config with the full `auto_map`, the code files, the tokenizer,
the model card) from a model or from a training script's --output_dir, written so that nothing a user put there
is lost, and checked to load without hf_mgk (`remote_code.check_remote_code`)."""

import hashlib
import json
import os
import re
import shutil
import tempfile

import torch

from ..folders import refuse_holding_inputs, sha256_file
from .card import PIPELINES, auto_class_of, card_metrics, family_model, model_card
from .remote_code import CHECK_TEXT, check_remote_code, clean_python

DEFAULT_REVISION = "v1"


# Beside the exported files, never uploaded: which run the folder holds, so re-exporting the same run may replace
# it while another run's export (or any other files) is refused unless overwrite is asked for.
EXPORT_MARKER = ".hf_mgk_export.json"


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

    A non-empty folder is refused unless `overwrite=True`, which replaces all of its contents. The model may be
    wrapped for training (DDP, FSDP, DeepSpeed, torch.compile): the folder holds the model inside. A peft model is
    saved with its adapters merged into a copy of the weights: a checkpoint that loads without peft (peft's own
    `save_pretrained` saves the adapter alone). A model sharded by FSDP2 is gathered first, which takes every rank:
    call this on each (as Trainer's save), and rank 0 writes the folder."""
    model = family_model(model, merged=True)
    state = _gathered_state_dict(model)
    if state is not None and torch.distributed.get_rank() != 0:
        return folder

    def write(tmp):
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        _write_text(os.path.join(tmp, "README.md"), model_card(model))

    _write_fresh(folder, write, overwrite=overwrite)
    return folder


def _gathered_state_dict(model):
    """None, or for a model whose parameters FSDP2 has sharded (DTensors) its whole state dict on rank 0's CPU,
    gathered from every rank as Trainer gathers it (a collective)."""
    from torch.distributed.tensor import DTensor

    if not any(isinstance(p, DTensor) for p in model.parameters()):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


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
    from ..training import RUN_FILE, recorded_results

    info = _read_json(os.path.join(run_dir, RUN_FILE)) or {}
    own, ignored = recorded_results(run_dir)
    results = own.get("all_results.json")
    if results is None:
        results = {**own.get("eval_results.json", {}), **own.get("train_results.json", {})}
    state = _read_json(os.path.join(run_dir, "trainer_state.json")) or {}
    return {**info, "results": results, "ignored_results": ignored, "global_step": state.get("global_step")}


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


__all__ = ["DEFAULT_REVISION", "EXPORT_MARKER", "save_for_hub", "read_run", "export_run"]
