"""scripts/gpu_check.sh fails when one of its steps fails: run on the CPU against a stand-in interpreter (PYTHON)
that answers the script's calls as a GPU machine would, with the step chosen failing."""

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

STUB = r"""#!/usr/bin/env bash
echo "$* BLOCKS=${HF_MGK_TRITON_BLOCKS:-} CACHE=${HF_MGK_CACHE:-}" >> "$STUB_LOG"
case "$*" in
    "-c import hf_mgk") exit 0 ;;
    *torch.cuda.is_available*) exit "${STUB_CUDA:-0}" ;;
    *get_device_capability*) echo "${STUB_TARGET-90}"; exit 0 ;;
    "-m hf_mgk.benchmark.static"*) echo "static table"; echo '{"summary": {}}' > "$6"; exit "${STUB_STATIC:-0}" ;;
    *"import torch, triton"*) echo "torch stub triton stub A GPU"; exit 0 ;;
    "-c import xdist") exit 1 ;;
    "-m pytest"*) echo "3 passed"; exit "${STUB_PYTEST:-0}" ;;
    "-m hf_mgk.benchmark.tune"*) echo "HF_MGK_TRITON_BLOCKS=mgk:w64=64x32"; exit "${STUB_TUNE:-0}" ;;
    "-m hf_mgk.benchmark.agreement"*) echo "agreement table"; exit "${STUB_AGREEMENT:-0}" ;;
    "scripts/benchmark.py --family fish"*) exit "${STUB_FISH:-0}" ;;
    "scripts/benchmark.py"*) exit 0 ;;
esac
echo "stub: unexpected call $*" >&2
exit 3
"""


def run_check(tmp_path, *args, **statuses):
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    log = tmp_path / "calls.txt"
    env = {**os.environ, "PYTHON": str(stub), "STUB_LOG": str(log), **{k: str(v) for k, v in statuses.items()}}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "out"), *args], env=env,
                          capture_output=True, text=True, timeout=60)
    return proc, log.read_text().splitlines() if log.exists() else []


def test_all_steps_passing_exits_0_and_runs_every_step(tmp_path):
    proc, calls = run_check(tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    assert any(c.startswith(f"-m hf_mgk.benchmark.static --target 90 --json {out}/static.json") for c in calls)
    tables = [c for c in calls if c.startswith("scripts/benchmark.py --family")]
    assert len(tables) == 2
    # the attention tables run with the tuning's blocks, the model's figures, and auto timing afresh into OUT
    assert all(f"--static {out}/static.json BLOCKS=mgk:w64=64x32 CACHE={out}/autotune-cache" in c for c in tables)
    assert "static table" in proc.stdout
    # the kernels against the eager path, per path and dtype, at a length ending inside a block, into OUT
    assert any(c.startswith("-m hf_mgk.benchmark.agreement --device cuda --lengths 1000") for c in calls)
    assert "agreement table" in proc.stdout and (out / "agreement.txt").read_text() == "agreement table\n"


def test_a_gpu_the_model_has_no_target_for_runs_the_tables_without_it(tmp_path):
    proc, calls = run_check(tmp_path, STUB_TARGET="")
    assert proc.returncode == 0, proc.stderr
    assert not any("hf_mgk.benchmark.static" in c for c in calls)
    tables = [c for c in calls if c.startswith("scripts/benchmark.py --family")]
    assert len(tables) == 2 and not any("--static" in c for c in tables)


@pytest.mark.parametrize("failing, named", [({"STUB_PYTEST": 1}, "pytest"), ({"STUB_TUNE": 124}, "tune"),
                                            ({"STUB_AGREEMENT": 1}, "agreement"),
                                            ({"STUB_FISH": 2}, "attention_fish"), ({"STUB_STATIC": 1}, "static")])
def test_a_failing_step_fails_the_check_and_the_rest_still_run(tmp_path, failing, named):
    proc, calls = run_check(tmp_path, **failing)
    assert proc.returncode == 1
    assert f"gpu_check: FAILED: {named}" in proc.stderr
    assert sum(c.startswith("scripts/benchmark.py --family") for c in calls) == 2  # the steps after it ran


def test_the_models_mode_fails_with_its_step(tmp_path):
    proc, calls = run_check(tmp_path, "models", STUB_FISH=1)
    assert proc.returncode == 1 and "gpu_check: FAILED: models_fish" in proc.stderr
    assert sum(c.startswith("scripts/benchmark.py --family") for c in calls) == 3
    assert run_check(tmp_path, "models")[0].returncode == 0


def test_no_gpu_stops_at_once(tmp_path):
    proc, calls = run_check(tmp_path, STUB_CUDA=1)
    assert proc.returncode == 1 and "no CUDA GPU here" in proc.stderr
    assert not any(c.startswith("-m pytest") for c in calls)
