"""The kernels compile with the oldest Triton the package allows (attention_triton.MIN_TRITON, pyproject's
`triton>=`) as with the installed one: every kernel (MGK's forward, dq and dK / dV; FiSH's forward, backward and
noise, linear and network), with dropout, causal, padding and noise, for sm_90 and sm_80, without a GPU. The oldest
is installed once from PyPI under .compat/triton-<version> (`pip install --target`, no dependencies) and put first
on the compiling process's path; the compile script is tests/test_triton_offsets.py's."""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

from hf_mgk import attention_triton as at  # noqa: E402
from test_triton_offsets import _LARGE, _SCRIPT  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
OLDEST = ".".join(map(str, at.MIN_TRITON)) + ".0"


def test_pyproject_allows_what_the_kernels_accept():
    text = (ROOT / "pyproject.toml").read_text()
    [floor] = re.findall(r'"triton>=([\d.]+)', text)
    assert tuple(int(x) for x in floor.split(".")) == at.MIN_TRITON


def _oldest_triton():
    """The folder holding triton==OLDEST, installed once under .compat/."""
    folder = ROOT / ".compat" / f"triton-{OLDEST}"
    if not (folder / "triton" / "__init__.py").is_file():
        tmp = folder.with_name(folder.name + ".partial")
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp),
                               f"triton=={OLDEST}"], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        os.replace(tmp, folder)
    return folder


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("which", ["oldest", "installed"])
@pytest.mark.parametrize("capability", [90, 80])
def test_every_kernel_compiles_with_the_oldest_and_the_installed_triton(tmp_path, which, capability):
    path, script = tmp_path / "ttir.json", tmp_path / "compile.py"  # @triton.jit reads its source from a file
    script.write_text(textwrap.dedent(_SCRIPT))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    first = [str(_oldest_triton())] if which == "oldest" else []
    env["PYTHONPATH"] = os.pathsep.join(first + [str(ROOT / "src")] + env.get("PYTHONPATH", "").split(os.pathsep))
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # compiled afresh by this Triton
    done = subprocess.run([sys.executable, str(script), str(path), str(capability)], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = json.loads(path.read_text())
    import triton
    assert compiled.pop("triton") == (OLDEST if which == "oldest" else triton.__version__)
    assert set(compiled) == set(_LARGE) and all("tt.func" in ttir for ttir in compiled.values())
