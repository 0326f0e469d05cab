"""Modules with one job each: no Python file of the package or its commands grows past 600 lines. A file
that would is split by job (the attention modules: the public function, the backend rule and the small paths in
one file, each large exact path in a sibling `attention_<family>_<path>.py`)."""

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAX_LINES = 600
FILES = sorted(p for folder in ("src", "scripts") for p in (ROOT / folder).rglob("*.py"))


def test_the_tree_has_files_to_check():
    names = {p.name for p in FILES}
    assert {"attention_mgk.py", "attention_fish.py", "benchmark.py", "reproduce.py"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_python_file_passes_600_lines(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (> {MAX_LINES}): split it by job"
