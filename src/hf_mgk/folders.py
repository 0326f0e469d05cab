"""What a script may delete in a folder it writes to: never one of its own inputs, the current directory, or a
file the user put there. Shared by publish (hub.export_run), quickstart and the training scripts."""

import hashlib
import os
import re

# Trainer's checkpoint folders: `checkpoint-<global step>` (transformers.trainer_utils.PREFIX_CHECKPOINT_DIR).
_CHECKPOINT = re.compile(r"checkpoint-\d+")


def refuse_holding_inputs(folder, inputs, option="--output_dir"):
    """Raise ValueError if `folder` is, or contains, the current directory or an existing path of `inputs`
    ({description: path or list of paths}, e.g. {"--train_file": "data/train.txt"}): clearing it would delete
    them. Paths that do not exist (Hub names such as `gpt2`) are not files of this machine and are skipped."""
    folder = os.path.realpath(folder)
    named = [("the current directory", os.getcwd())]
    for what, paths in inputs.items():
        for path in paths if isinstance(paths, (list, tuple)) else [paths]:
            if path and os.path.exists(path):
                named.append((what, path))
    for what, path in named:
        if os.path.commonpath([folder, os.path.realpath(path)]) == folder:
            relation = "is" if os.path.realpath(path) == folder else "contains"
            raise ValueError(f"{option} {folder}, which {relation} {what} ({path}): clearing it would delete "
                             f"{'it' if relation == 'is' else 'that'}; choose another folder")


def checkpoint_folders(folder):
    """The `checkpoint-<step>` folders of `folder`, oldest (lowest step) first, complete or not."""
    if not os.path.isdir(folder):
        return []
    steps = {int(name[len("checkpoint-"):]): os.path.join(folder, name) for name in os.listdir(folder)
             if _CHECKPOINT.fullmatch(name) and os.path.isdir(os.path.join(folder, name))}
    return [steps[s] for s in sorted(steps)]


def trainer_checkpoints(folder):
    """The checkpoints Trainer wrote in `folder`: `checkpoint-<step>` folders holding a trainer_state.json, oldest
    first. A folder that merely starts with `checkpoint-` (a user's `checkpoint-notes/`) is not one."""
    return [c for c in checkpoint_folders(folder) if os.path.isfile(os.path.join(c, "trainer_state.json"))]


def sha256_file(path):
    """The file's SHA-256 (hex): how a script recognises, later, the very file it wrote."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()
