"""The measured choice of backend="auto" on a GPU: the Triton kernels or the eager torch path, whichever runs a kind
of call faster there, found by timing both once (as torch.backends.cudnn.benchmark does for convolutions).

The kernels are exact, but whether they beat the eager path depends on the GPU, the shapes and the library versions,
and a user runs on GPUs nobody here could time. So the first call of a kind (`kind_of`: family, variant, dtype,
shapes, masks, causal, dropout, whether gradients are needed, the GPU) runs each arm on inputs of that call's shape,
forward and, where gradients are needed, backward, and keeps the faster one:

* for the process (a dict), and in a cache file per GPU under HF_MGK_CACHE (default ~/.cache/hf_mgk), keyed by the
  GPU, torch, Triton and this code's version, so the next process skips the timing;
* agreed between the ranks of a job: the first rank to know a choice publishes it in the process group's key-value
  store and every rank takes the published one, so a run stays reproducible. Not a collective broadcast: ranks
  that see different shapes (dynamic padding) reach a kind at different steps or never, and a collective inside the
  attention would wait for them forever;
* logged once per kind at INFO.

A kernel launch that fails for resources (shared memory, registers: Triton's OutOfResources) on the user's GPU makes
its arm lose, with one warning, instead of failing the training. HF_MGK_AUTOTUNE=0 turns the timing off: the eager
path runs. Nothing is timed while tracing or compiling (the kernels are refused there anyway) or while a CUDA graph
is being captured (the eager path runs, unrecorded).

Lengths and the batch are rounded up to a power of two in a kind, so that dynamic padding does not time every new
length; the timing runs at the first call's own shape.

Torch only (this file travels next to remote-code model files).
"""

import hashlib
import json
import logging
import os
import tempfile
import time
import warnings

import torch

from .attention_triton import env_switch, triton

__all__ = ["CACHE_ENV", "choose", "kind_of", "measured_here", "switched_on", "timed", "trial"]

logger = logging.getLogger(__name__)

CACHE_ENV = "HF_MGK_CACHE"
# Where the timing applies: the kernels' own device. Tests add "cpu" (Triton's interpreter) with a fake clock.
MEASURED_DEVICES = ("cuda",)
# Timed runs per arm after one warm-up run (which compiles the kernels); the fastest counts.
REPEATS = 3
clock = time.perf_counter  # replaced by a fake clock in the tests

_CHOSEN = {}          # kind text -> backend, for this process
_FILES = {}           # cache file path -> its choices, read once
_WARNED = set()


def measured_here(device_type):
    """Whether `auto` times the kernels on this device type (MEASURED_DEVICES, read at each call)."""
    return device_type in MEASURED_DEVICES


def switched_on():
    """HF_MGK_AUTOTUNE: on by default; off, backend="auto" keeps the eager path wherever it would time the kernels."""
    return env_switch("HF_MGK_AUTOTUNE", "no timing: the eager path runs where auto would time the Triton kernels")


def _bucket(n):
    return 1 << max(int(n) - 1, 0).bit_length()


def kind_of(family, *, dtype, batch, lengths, grads, **facts):
    """The text that names a kind of call: `family` (e.g. "mgk soft"), the dtype, the batch and the (query, key)
    `lengths` rounded up to powers of two, whether gradients are needed, and the other `facts` (heads, head sizes,
    masks, causal, dropout, ...) as they are, sorted by name."""
    n, s = lengths
    parts = [family, str(dtype).replace("torch.", ""), f"B<={_bucket(batch)} N<={_bucket(n)} S<={_bucket(s)}",
             "fwd+bwd" if grads else "fwd"]
    return " ".join(parts + [f"{name}={facts[name]}" for name in sorted(facts)])


_NAMES = {}


def _device_name(device):
    key = (device.type, device.index)
    if key not in _NAMES:
        _NAMES[key] = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return _NAMES[key]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _code_version():
    """This code's version: hf-mgk's where it is installed, and a digest of the attention files next to this one
    (a checkpoint's copy of them may differ from the installed package's)."""
    folder = os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.startswith("attention_") and name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read())
    try:
        from importlib.metadata import version
        package = version("hf-mgk")
    except Exception:  # a checkpoint's copy, without the package
        package = "none"
    return f"{package}+{digest.hexdigest()[:12]}"


def cache_key(device):
    """What a cache file holds for: the GPU, torch, Triton and this code's version."""
    return {"device": _device_name(device), "torch": torch.__version__,
            "triton": getattr(triton, "__version__", "none"), "code": _code_version()}


def cache_file(device):
    """The cache file of `device`'s choices: one file per `cache_key`, under $HF_MGK_CACHE/autotune."""
    key = cache_key(device)
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "hf_mgk")
    slug = "".join(c if c.isalnum() else "-" for c in key["device"]).strip("-").lower()
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(root, "autotune", f"{slug}-{digest}.json"), key


def _read(path, key):
    if path not in _FILES:
        choices = {}
        try:
            with open(path) as f:
                held = json.load(f)
            if held.get("key") == key and isinstance(held.get("choices"), dict):
                choices = held["choices"]
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError) as error:  # unreadable: timed again, and rewritten
            _warn_once(("cache", path), f"hf_mgk: cannot read the timing cache {path} ({error}); timing again")
        _FILES[path] = choices
    return _FILES[path]


def _write(path, key, kind, entry):
    """Add one choice to the cache file: read again (another process may have added some), merged, replaced whole
    (a temporary file renamed: a reader never sees half a file). A folder that cannot be written keeps the choice
    for this process only."""
    _FILES.pop(path, None)
    choices = {**_read(path, key), kind: entry}
    _FILES[path] = choices
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".autotune-", dir=os.path.dirname(path))
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "choices": choices}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as error:
        logger.debug("hf_mgk: cannot write the timing cache %s: %s", path, error)


def _warn_once(what, message):
    if what not in _WARNED:
        _WARNED.add(what)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def _resource_failure(error):
    """Whether a launch failed for the GPU's resources (Triton's OutOfResources: shared memory, registers)."""
    return type(error).__name__ == "OutOfResources" or "out of resource" in str(error).lower()


def _time(run, name, device):
    """The fastest of REPEATS runs of arm `name` after a warm-up (seconds); inf where its launch fails for
    resources (one warning) or, for the eager arm, memory."""
    try:
        run(name)
        _sync(device)
        best = float("inf")
        for _ in range(REPEATS):
            start = clock()
            run(name)
            _sync(device)
            best = min(best, clock() - start)
        return best
    except Exception as error:  # noqa: BLE001 - only the failures below make an arm lose; the rest propagate
        if name == "triton" and _resource_failure(error):
            _warn_once(("resources", name), f"hf_mgk: the Triton kernels cannot run on this GPU ({error}); the "
                       "eager path runs instead")
            return float("inf")
        if isinstance(error, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
            return float("inf")
        raise


def _store():
    """The default process group's key-value store where a job of several ranks runs, else None."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - a group without a store: each rank keeps its own choice
        return None


def _published(store, kind):
    key = "hf_mgk/autotune/" + hashlib.sha256(kind.encode()).hexdigest()
    if store is None or not store.check([key]):
        return key, None
    return key, store.get(key).decode()


def choose(kind, eager, run, device):
    """The backend a call of `kind` runs on `device` with backend="auto", where the Triton kernels can run it:
    "triton" or `eager` (the eager path's backend name). run(name) runs the call once on backend `name` (`trial`).
    Module docstring: the timing, the cache, the ranks' agreement, the off switch."""
    if not switched_on():
        return eager
    kind = f"{kind} on {_device_name(device)}"
    if kind in _CHOSEN:
        return _CHOSEN[kind]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return eager  # nothing may be timed (or synchronised) inside a CUDA graph's capture
    store = _store()
    store_key, choice = _published(store, kind)
    how = "the choice another rank published"
    if choice is None:
        path, key = cache_file(device)
        entry = _read(path, key).get(kind)
        how = f"the timing cache {path}"
        if entry is None or entry.get("backend") not in ("triton", eager):
            seconds = {name: _time(run, name, device) for name in ("triton", eager)}
            best = min(seconds, key=seconds.get)
            entry = {"backend": best, "seconds": {name: (t if t != float("inf") else None)
                                                  for name, t in seconds.items()}}
            _write(path, key, kind, entry)
            how = "timing " + ", ".join(f"{name} {t * 1e3:.3g} ms" for name, t in seconds.items())
        choice = entry["backend"]
        if store is not None:  # the first rank to publish wins; every rank takes what it published
            choice = store.compare_set(store_key, "", choice).decode()
    _CHOSEN[kind] = choice
    logger.info("hf_mgk: backend='auto' runs %r for %s, from %s (said once per kind)", choice, kind, how)
    return choice


def trial(call, tensors, grads, device, modules=()):
    """A `run` for `choose`: run(name) calls call(name, *inputs) once, on `tensors` detached (leaves that require
    grad as the originals do: the user's graph is not touched) and, with `grads`, takes the gradients of every input
    and of `modules`' parameters that require one (torch.autograd.grad: nothing accumulates in a .grad). Under a
    forked random state, so timing does not move the user's random numbers (dropout, noise)."""
    def run(name):
        inputs = [t.detach().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t for t in tensors]
        devices = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            out = call(name, *inputs)
            if grads:
                wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
                wrt += [p for m in modules for p in m.parameters() if p.requires_grad]
                torch.autograd.grad(out, wrt, torch.ones_like(out), allow_unused=True)
        return out
    return run


def timed(family, call, tensors, device, modules=(), **kind):
    """What `attention_blocks.resolve_backend` calls where backend="auto" may time the kernels: a function of the
    eager backend's name that returns `choose`'s answer for this call. call(name, *tensors) runs it on backend
    `name`; `kind`: kind_of's dtype, batch, lengths, sizes and facts. Gradients are timed where autograd records the
    call (an input or a module parameter that requires grad, grad mode on)."""
    def measured(eager):
        params = [p for m in modules for p in m.parameters()]
        grads = torch.is_grad_enabled() and any(
            t.requires_grad for t in (*tensors, *params) if isinstance(t, torch.Tensor))
        return choose(kind_of(family, grads=grads, **kind), eager, trial(call, tensors, grads, device, modules),
                      device)
    return measured
