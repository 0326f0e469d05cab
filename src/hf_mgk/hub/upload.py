"""Upload: an exported folder to the Hub at a revision (its files only: the export's marker stays local)."""

import os

from .card import model_card
from .export import DEFAULT_REVISION, EXPORT_MARKER, _relative_files, read_run

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


def push_to_hub_at_end(trainer):
    """--push_to_hub of a training script: the run's last upload, after evaluation, as upstream's example scripts
    end theirs. It sends the output folder (model, tokenizer, results) with README.md the family's model card, as
    scripts/publish.py writes it (`model_card`): the task, the dataset, the base model and the metrics this run
    recorded (`read_run`), in place of Trainer's generic draft. Trainer's own flow is kept (its uploads at each
    save, on rank 0 only); only the card it writes before this push is the family's. Nothing happens without
    --push_to_hub. It lives here, beside the card and the run record, so that `training` never imports `hub`."""
    if not trainer.args.push_to_hub:
        return None

    def family_card(**_):  # Trainer.push_to_hub writes its card through this, on rank 0, before the upload
        run = read_run(trainer.args.output_dir)
        text = model_card(trainer.model, run, repo_id=trainer.hub_model_id)
        with open(os.path.join(trainer.args.output_dir, "README.md"), "w", encoding="utf-8") as f:
            f.write(text)

    trainer.create_model_card = family_card
    return trainer.push_to_hub(commit_message="End of training")


__all__ = ["upload_plan", "network_errors", "push_folder", "push_to_hub_at_end"]
