"""Nothing a user saved is lost: quickstart, publish, `python -m hf_mgk` and `--overwrite_output_dir`
remove or replace only what they themselves wrote. Every test plants the user's files first and compares each of
them byte for byte after the command."""

import json
import os
import subprocess
import sys

import pytest

from conftest import assert_kept, plant

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import quickstart  # noqa: E402

pytestmark = pytest.mark.slow  # the writing commands end to end on planted folders

TINY = ["--adapt_steps", "2", "--finetune_steps", "3", "--max_train_samples", "48", "--max_eval_samples", "40",
        "--max_seq_length", "32", "--batch_size", "8"]


USER_FILES = {"notes.md": b"# my notes\n", "images/plot.png": bytes(range(256)) * 3,
              "checkpoint-notes/ideas.txt": b"try lr 3e-5\n"}


@pytest.fixture
def no_training(monkeypatch):
    """quickstart stops where it would start training: these tests are about what it does to the folder."""
    def stop(*args, **kwargs):
        raise RuntimeError("training would start here")

    monkeypatch.setattr(quickstart, "run_arm", stop)


# ------------------------------------------------------------------------------------------------- quickstart


@pytest.mark.parametrize("where", ["adapt_files", "model_name_or_path"])
def test_quickstart_refuses_an_output_folder_holding_its_inputs(where, tmp_path, capsys, no_training):
    out = tmp_path / "out"
    user = plant(out, {**USER_FILES, "texts/plays.txt": b"To be, or not to be\n" * 50,
                       "model/config.json": b'{"model_type": "bert"}'})
    option = {"adapt_files": ["--adapt_files", str(out / "texts" / "plays.txt")],
              "model_name_or_path": ["--model_name_or_path", str(out / "model")]}[where]
    with pytest.raises(SystemExit):
        quickstart.main(TINY + option + ["--output_dir", str(out), "--overwrite"])
    err = capsys.readouterr().err
    assert f"--output_dir {out}, which contains --{where}" in err and "choose another folder" in err
    assert_kept(out, user)


def test_quickstart_refuses_the_current_directory(tmp_path, monkeypatch, capsys, no_training):
    user = plant(tmp_path, {**USER_FILES, "src/pkg/__init__.py": b"x = 1\n"})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        quickstart.main(TINY + ["--output_dir", ".", "--overwrite"])
    assert "is the current directory" in capsys.readouterr().err
    assert_kept(tmp_path, user)


def test_quickstart_overwrite_removes_only_what_an_earlier_quickstart_wrote(tmp_path, no_training):
    out = tmp_path / "out"
    earlier = ["data", "mgk", "softmax", "hub", "summary.json"]
    plant(out, {"data/train.csv": b"old", "mgk/finetune/eval_results.json": b"{}", "softmax/adapt/x": b"old",
                "hub/README.md": b"old card", "summary.json": b"{}"})
    (out / quickstart.RECORD).write_text(json.dumps({"written": earlier}))
    user = plant(out, USER_FILES)
    with pytest.raises(RuntimeError, match="training would start"):
        quickstart.main(TINY + ["--output_dir", str(out), "--overwrite"])
    assert_kept(out, user)
    assert not (out / "mgk").exists() and not (out / "hub").exists() and not (out / "summary.json").exists()
    assert not (out / "data" / "train.csv").read_bytes() == b"old"  # the data were written anew
    # What a user has where quickstart would write is theirs: refused, nothing removed.
    (out / quickstart.RECORD).unlink()
    user = plant(out, {"hub/my_card.md": b"mine"})
    with pytest.raises(SystemExit, match="holds data, hub, which no earlier quickstart recorded"):
        quickstart.main(TINY + ["--output_dir", str(out), "--overwrite"])
    assert_kept(out, {**USER_FILES, **user})


def test_one_guard_for_every_script(tmp_path, monkeypatch):
    """publish (hub.export_run) and quickstart share folders.refuse_holding_inputs."""
    from hf_mgk import folders

    (tmp_path / "run").mkdir()
    folders.refuse_holding_inputs(tmp_path / "out", {"--x": str(tmp_path / "run")})  # a sibling is fine
    with pytest.raises(ValueError, match=r"is --x"):
        folders.refuse_holding_inputs(tmp_path / "run", {"--x": str(tmp_path / "run")})
    folders.refuse_holding_inputs(tmp_path / "gpt2", {"--x": "gpt2"})  # a Hub name, not a file here
    monkeypatch.chdir(tmp_path / "run")
    with pytest.raises(ValueError, match="contains the current directory"):
        folders.refuse_holding_inputs(tmp_path, {})


# ------------------------------------------------------------------------------------------ python -m hf_mgk


def test_bundled_data_commands_refuse_existing_files_unless_overwrite(tmp_path):
    from hf_mgk.__main__ import main

    notes = plant(tmp_path, {"notes.txt": b"my notes, not a play\n"})
    proc = subprocess.run([sys.executable, "-m", "hf_mgk", "shakespeare", str(tmp_path / "notes.txt"), "1"],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and f"{tmp_path / 'notes.txt'} already exists" in proc.stderr
    assert "--overwrite" in proc.stderr and proc.stdout == ""
    assert_kept(tmp_path, notes)
    reviews = plant(tmp_path, {"reviews/train.csv": b"sentence,label\nmine,positive\n"})
    with pytest.raises(SystemExit, match=r"movie-reviews: .*train\.csv already exists; nothing was written"):
        main(["movie-reviews", str(tmp_path / "reviews")])
    assert_kept(tmp_path, reviews)
    assert not (tmp_path / "reviews" / "validation.csv").exists()
    # --overwrite (anywhere on the line) replaces them.
    main(["movie-reviews", "--overwrite", str(tmp_path / "reviews")])
    assert (tmp_path / "reviews" / "train.csv").read_bytes() != reviews["reviews/train.csv"]
    main(["shakespeare", str(tmp_path / "notes.txt"), "1", "--overwrite"])
    assert (tmp_path / "notes.txt").stat().st_size > 100_000
