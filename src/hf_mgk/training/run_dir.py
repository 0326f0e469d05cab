"""The run directory: a run's identity (refusing a folder that holds another run), resume from its last complete
checkpoint, `--overwrite_output_dir` (Trainer's checkpoints only), the results files and `hf_mgk_run.json`."""

import json
import logging
import os
import shutil
import sys

import transformers
from transformers.trainer_utils import get_last_checkpoint

from ..folders import checkpoint_folders, refuse_holding_inputs, sha256_file, trainer_checkpoints
from .arguments import launched
from .data import perplexity
from .models import _package

logger = logging.getLogger("hf_mgk.training")


RUN_FILE = "hf_mgk_run.json"


# What Trainer.save_metrics writes: <split>_results.json, and all_results.json, which it reads and updates (so an
# earlier run's would carry that run's metrics into the new one's).
RESULTS_FILES = ("all_results.json", "train_results.json", "eval_results.json", "predict_results.json")


def incomplete_checkpoint(folder):
    """Why a Trainer checkpoint cannot be resumed from, or None. Trainer writes trainer_state.json last, so a run
    killed while saving leaves it missing or cut short."""
    try:
        with open(os.path.join(folder, "trainer_state.json"), encoding="utf-8") as f:
            json.load(f)
    except FileNotFoundError:
        return "it has no trainer_state.json"
    except (ValueError, UnicodeDecodeError):  # json.JSONDecodeError is a ValueError
        return "its trainer_state.json is cut short"
    return None


def run_identity(script, model_args, data_args, **extra):
    """What makes two runs the same run: resuming one with another's checkpoint would silently mix them."""
    fields = ("model_name_or_path", "model_type", "config_overrides", "attention_overrides", "keep_heads",
              "config_name")
    data_fields = ("dataset_name", "dataset_config_name", "train_file", "validation_file")
    identity = {"script": script, **{k: getattr(model_args, k) for k in fields},
                **{k: getattr(data_args, k, None) for k in data_fields}, **extra}
    if model_args.family is not None:  # only when given: runs recorded before --family existed stay the same run
        identity["family"] = model_args.family
    for key in ("train_file", "validation_file"):
        if identity[key] is not None:
            identity[key] = os.path.abspath(identity[key])
    return identity


def prepare_output_dir(training_args, identity):
    """Decide where training starts, before anything is written: returns the checkpoint to resume from or None.

    - `--resume_from_checkpoint PATH` resumes from PATH;
    - a folder with checkpoints of the same run (same `hf_mgk_run.json`) resumes from the last one;
    - a folder holding another run, or files but no checkpoint, is refused unless `--overwrite_output_dir`,
      which deletes Trainer's checkpoints in it (`folders.trainer_checkpoints`: not a user's `checkpoint-notes/`,
      nor one that is an input of this run) and starts anew."""
    out = training_args.output_dir
    if training_args.resume_from_checkpoint is not None:
        if not os.path.isdir(training_args.resume_from_checkpoint):
            raise ValueError(f"--resume_from_checkpoint {training_args.resume_from_checkpoint} is not a folder")
        problem = incomplete_checkpoint(training_args.resume_from_checkpoint)
        if problem is not None:
            raise ValueError(f"--resume_from_checkpoint {training_args.resume_from_checkpoint} is incomplete "
                             f"({problem}): its saving did not finish; resume from an earlier checkpoint")
        return training_args.resume_from_checkpoint
    if not training_args.do_train or not os.path.isdir(out) or not os.listdir(out):
        return None
    if training_args.overwrite_output_dir:
        if training_args.process_index == 0:
            checkpoints = trainer_checkpoints(out)
            inputs = {f"--{key}": identity.get(key) for key in ("model_name_or_path", "config_name", "train_file",
                                                                "validation_file")}
            for checkpoint in checkpoints:  # all checked before any is deleted
                refuse_holding_inputs(checkpoint, inputs, option="--overwrite_output_dir would delete the checkpoint")
            for checkpoint in checkpoints:
                shutil.rmtree(checkpoint)
        return None
    saved = read_run_identity(out)
    if saved is not None and saved != identity:
        changed = sorted(k for k in set(saved) | set(identity) if saved.get(k) != identity.get(k))
        details = "; ".join(f"{k}: {saved.get(k)!r} there, {identity.get(k)!r} now" for k in changed)
        raise ValueError(f"--output_dir {out} holds a different run ({details}). Use another --output_dir, or "
                         "--overwrite_output_dir to replace that run")
    last = get_last_checkpoint(out)
    if last is None:
        if saved is None:
            raise ValueError(f"--output_dir {out} exists and is not empty, and holds no checkpoint of this run. Use "
                             "another --output_dir, or --overwrite_output_dir to train into it anyway")
        return None  # the same run finished (or stopped before its first checkpoint): train again from the start
    problem = incomplete_checkpoint(last)
    if problem is not None:  # the run was killed while saving it: Trainer would fail on a missing file
        earlier = [c for c in checkpoint_folders(out) if c != last and incomplete_checkpoint(c) is None]
        advice = (f"resume from the one before with --resume_from_checkpoint {earlier[-1]} (or delete {last})"
                  if earlier else "no earlier checkpoint is complete: start anew with --overwrite_output_dir")
        raise ValueError(f"--output_dir {out}: its last checkpoint {last} is incomplete ({problem}; the run stopped "
                         f"while saving it): {advice}")
    logger.info("resuming from %s (pass --overwrite_output_dir to start anew)", last)
    return last


def read_run_identity(folder):
    record = _read_run_file(folder)
    return None if record is None else record["identity"]


def write_run_info(training_args, identity, **info):
    """`hf_mgk_run.json`: the run's identity (checked on resume) and facts the model card uses. Called as training
    starts, which also starts the run's results anew: results files of an earlier run (or of this run's model
    before this training) are removed, and none is recorded as this run's yet (`save_metrics` records them)."""
    if training_args.process_index != 0:
        return
    out = training_args.output_dir
    os.makedirs(out, exist_ok=True)
    import torch

    stale = [name for name in RESULTS_FILES if os.path.isfile(os.path.join(out, name))]
    for name in stale:
        os.remove(os.path.join(out, name))
    if stale:
        logger.info("removed %s of the earlier training in %s: a run's results are its own", ", ".join(stale), out)
    path = os.path.join(out, RUN_FILE)
    previous = _read_run_file(out) or {}
    record = {**previous, "identity": identity, **info, "results": {}, "hf_mgk_version": _package().__version__,
              "transformers_version": transformers.__version__, "torch_version": torch.__version__}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2, sort_keys=True)


def _read_run_file(folder):
    path = os.path.join(folder, RUN_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save_metrics(trainer, split, metrics):
    """`trainer.save_metrics`, then the hashes of the files it wrote go into hf_mgk_run.json when they measure
    this run's model: one trained by this process, or the run's saved model evaluated in its own folder. Publish
    shows only recorded results (`recorded_results`), never an earlier run's or another model's."""
    trainer.save_metrics(split, metrics)
    out = trainer.args.output_dir
    source = getattr(trainer.model, "name_or_path", None)
    this_run = trainer.state.global_step > 0 or (bool(source) and os.path.realpath(source) == os.path.realpath(out))
    record = _read_run_file(out)
    if not trainer.is_world_process_zero() or not this_run or record is None:
        return
    written = (f"{split}_results.json", "all_results.json")
    record.setdefault("results", {}).update({name: sha256_file(os.path.join(out, name)) for name in written})
    with open(os.path.join(out, RUN_FILE), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2, sort_keys=True)


def recorded_results(folder):
    """({file name: its metrics} of the results files in `folder` that its hf_mgk_run.json records as this run's,
    [names of the other results files there]). A file is the run's only if its content hash is the one recorded
    when the scripts wrote it: an earlier run's file, another model's evaluation or an edited file is not."""
    recorded = (_read_run_file(folder) or {}).get("results") or {}
    own, other = {}, []
    for name in RESULTS_FILES:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        if recorded.get(name) == sha256_file(path):
            with open(path, encoding="utf-8") as f:
                own[name] = json.load(f)
        else:
            other.append(name)
    return own, other


def train_and_save(trainer, checkpoint, n_train):
    """Train (resuming from `checkpoint`), save the model and tokenizer, write train_results.json."""
    result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model()
    metrics = {**result.metrics, "train_samples": n_train}
    trainer.log_metrics("train", metrics)
    save_metrics(trainer, "train", metrics)
    trainer.save_state()
    return metrics


def evaluate_and_save(trainer, dataset, n_samples, prefix="eval", with_perplexity=False, **extra):
    """Evaluate, add `<prefix>_samples` (and any `extra` metrics, prefixed), write <prefix>_results.json.

    with_perplexity: add "perplexity" = exp(<prefix>_loss) (inf on overflow), upstream's key for language models."""
    metrics = trainer.evaluate(eval_dataset=dataset, metric_key_prefix=prefix)
    metrics[f"{prefix}_samples"] = n_samples
    if with_perplexity:
        metrics["perplexity"] = perplexity(metrics[f"{prefix}_loss"])
    metrics.update({f"{prefix}_{k}": v for k, v in extra.items()})
    trainer.log_metrics(prefix, metrics)
    save_metrics(trainer, prefix, metrics)
    return metrics


# The process groups close_distributed() took down, kept for the rest of the process: see there.
_KEPT_GROUPS = []
# Set by run_script: this process is a script's command, whose rank may leave at the end of its main().
_LEAVE_WHEN_DONE = False


def _leave():
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def close_distributed():
    """The end of a script's main() under a launcher, once every file is written: all ranks meet at a barrier, and
    the process group is taken down. A rank run by `run_script` (a script's command) then leaves at once, by
    os._exit(0) after flushing its logs and output, from inside main(): no frame is torn down after this.

    Why (a rank that had saved its work hung about once in 25 torchrun launches, the main thread in
    ~ProcessGroupGloo): gloo's worker thread destroys each finished work (here the barrier's, which holds earlier
    allgathers' tensors) after the caller's wait has returned, and freeing a tensor's Python object needs the GIL.
    When main()'s frame is torn down, its locals free the DDP model's Reducer, which drops the last reference to
    the process group; the group's destructor runs in the main thread holding the GIL and waits for the worker's
    lock, while the worker waits for the GIL: a deadlock (the same as in the interpreter's own teardown). So
    the groups are also kept alive here for the rest of the process (their destructor never runs in a frame's
    teardown; a caller of main() that goes on under a launcher is safe too), and a script's rank does not tear
    down main()'s frame or the interpreter at all."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        _KEPT_GROUPS.append(torch.distributed.group.WORLD)  # the default group, which DDP uses
        torch.distributed.destroy_process_group()
    if _LEAVE_WHEN_DONE and launched():
        _leave()


def run_script(main):
    """A training script's command: main(), which ends with close_distributed(); under a launcher (torchrun,
    accelerate) the rank leaves there, without tearing down main()'s frame or the interpreter (see
    close_distributed), and here too if main() did not call it. Alone, or on an exception (its traceback printed
    and a non-zero status, as usual), the process ends as any Python program."""
    global _LEAVE_WHEN_DONE
    _LEAVE_WHEN_DONE = True
    main()
    if launched():
        _leave()


__all__ = ["RUN_FILE", "RESULTS_FILES", "incomplete_checkpoint", "run_identity", "prepare_output_dir", "read_run_identity",
           "write_run_info", "save_metrics", "recorded_results", "train_and_save", "evaluate_and_save", "close_distributed",
           "run_script"]
