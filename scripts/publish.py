"""Publish a training run on the Hugging Face Hub, in one command.

    python scripts/publish.py --run_dir outputs/mrpc --hub_model_id me/mgk-bert-mrpc --push_to_hub

From the --output_dir of run_mlm.py / run_clm.py / run_glue.py / run_qa.py this writes a Hub-ready folder
(`hf_mgk.hub.export_run`): model.safetensors, config.json with the full `auto_map`, the model's code files, the
tokenizer, and README.md, the family's model card filled with the run's metrics and metadata, whose loading
snippet pins `revision=<--revision_tag>`. It then checks that the folder loads with `trust_remote_code=True` in
a virtualenv without hf_mgk and gives the run's outputs, and with --push_to_hub uploads it in one commit and
tags that commit with --revision_tag. --dry_run lists the files the upload would send and sends nothing."""

import argparse
import os

from hf_mgk import hub


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[-1])
    parser.add_argument("--run_dir", required=True, help=(
        "The --output_dir of a finished training run (or one of its checkpoint-* folders): the saved model, "
        "tokenizer, *_results.json and hf_mgk_run.json."))
    parser.add_argument("--output_dir", default=None, help=(
        "The Hub-ready folder to write (default: <run_dir>/hub). An earlier export of the same run there is "
        "updated: its files are replaced, files you added there are kept (and uploaded), and a README.md card you "
        "edited is kept, or refused if the run's card changed since. A folder holding anything else is refused "
        "unless --overwrite."))
    parser.add_argument("--overwrite", action="store_true", help=(
        "Replace the contents of a non-empty --output_dir (another run's export, other files, an edited card): all "
        "of its old files are removed."))
    parser.add_argument("--hub_model_id", default=None, help=(
        "The model repo, 'user/name' or 'org/name': written in the card's loading snippet (ORG/NAME without it), "
        "and where --push_to_hub uploads (required with --push_to_hub)."))
    parser.add_argument("--revision_tag", default=hub.DEFAULT_REVISION, help=(
        "The git tag put on the upload's commit; the card's snippet pins revision=<this tag>, so users get "
        "exactly this upload. Refused if the repo already has the tag. Default: %(default)s."))
    parser.add_argument("--push_to_hub", action="store_true", help=(
        "Upload the folder to --hub_model_id (created if missing) with huggingface_hub, then tag the commit."))
    parser.add_argument("--private", action="store_true", help="Create the repo as private (if it does not exist).")
    parser.add_argument("--token", default=None, help=(
        "A Hub token with write access (default: the one `hf auth login` stored, or $HF_TOKEN)."))
    parser.add_argument("--dry_run", action="store_true", help=(
        "Write the folder and print exactly the files the upload would send, with their sizes; upload nothing "
        "and contact no server."))
    parser.add_argument("--check_remote_code", dest="check_remote_code", action="store_true", default=True, help=(
        "On by default: load the written folder through its Auto class with trust_remote_code=True in a "
        "virtualenv without hf_mgk, and require its outputs on a sample to equal the run's model's."))
    parser.add_argument("--no_check_remote_code", dest="check_remote_code", action="store_false",
                        help="Skip that check (faster).")
    args = parser.parse_args(argv)
    if args.push_to_hub and not args.hub_model_id:
        parser.error("--push_to_hub needs --hub_model_id (the repo to upload to, e.g. me/mgk-bert-mrpc)")
    if args.hub_model_id and not hub.is_hub_id(args.hub_model_id):
        parser.error(f"--hub_model_id {args.hub_model_id!r} is not a Hub repo id like 'user/name'")
    return args


def main(argv=None):
    """Returns {"folder", "files": upload_plan, "export": export_run's summary, "commit": CommitInfo or None}."""
    args = parse_args(argv)
    folder = os.path.abspath(args.output_dir or os.path.join(args.run_dir, "hub"))
    try:
        export = hub.export_run(args.run_dir, folder, repo_id=args.hub_model_id, revision=args.revision_tag,
                                overwrite=args.overwrite, check=args.check_remote_code)
    except (ValueError, FileExistsError) as err:
        raise SystemExit(f"publish.py: {err}") from None
    except (AssertionError, RuntimeError) as err:  # the remote-code check failed or could not run
        raise SystemExit(f"publish.py: the check of the exported folder failed, so {folder} was left as it was "
                         f"(--no_check_remote_code skips the check): {err}") from None
    print(f"wrote {folder}: {export['model_class']} ({export['pipeline_tag']}), card pinned to "
          f"revision={args.revision_tag!r}")
    if export["ignored_results"]:
        print(f"left out of the card: {', '.join(export['ignored_results'])} in {args.run_dir}, which its "
              "hf_mgk_run.json does not record as this run's (an earlier run's, another model's evaluation, an "
              "edited file, or one written by an hf-mgk that did not record results yet)")
    if export["kept_card"]:
        print("kept your edited README.md (the card this export would write is the one you edited); --overwrite "
              "replaces it")
    if export["kept_files"]:
        print(f"kept {len(export['kept_files'])} files that the export does not write (they are part of the "
              f"upload; --overwrite removes them): {', '.join(export['kept_files'])}")
    if export["checked"]:
        print(f"checked: transformers.{export['auto_class']}.from_pretrained(..., trust_remote_code=True) in a "
              "virtualenv without hf_mgk gives the run's outputs")
    plan = hub.upload_plan(folder)
    result = {"folder": folder, "files": plan, "export": export, "commit": None}
    target = args.hub_model_id or "<--hub_model_id>"
    if args.dry_run:
        total = sum(size for _, size in plan)
        print(f"dry run: would upload {len(plan)} files ({total:,} bytes) to {target}, then tag the commit "
              f"{args.revision_tag!r}; nothing was uploaded")
        for rel, size in plan:
            print(f"{size:>14,}  {rel}")
        return result
    upload_later = (f"upload it later with this same command, or with `hf upload {target} {folder} . --exclude "
                    f"{hub.EXPORT_MARKER}` then `hf repos tag create {target} {args.revision_tag}`")
    if not args.push_to_hub:
        print(f"the folder is ready; {upload_later.replace('this same command', '--push_to_hub')}")
        return result
    try:
        result["commit"] = hub.push_folder(folder, args.hub_model_id, args.revision_tag, private=args.private,
                                           token=args.token)
    except hub.network_errors() as err:
        raise SystemExit(f"publish.py: the Hugging Face Hub is unreachable ({type(err).__name__}: {err}); nothing "
                         f"was uploaded. The folder {folder} is ready: {upload_later}") from None
    except (ValueError, OSError) as err:  # HfHubHTTPError (401, 403, 404...) is an OSError
        raise SystemExit(f"publish.py: the upload to {args.hub_model_id} failed: {err}. The folder {folder} is "
                         f"ready: {upload_later}") from None
    print(f"uploaded {len(plan)} files to https://huggingface.co/{args.hub_model_id} (commit "
          f"{result['commit'].oid}), tagged {args.revision_tag!r}")
    return result


if __name__ == "__main__":
    main()
