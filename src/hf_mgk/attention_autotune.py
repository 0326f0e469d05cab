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

The kernels were never run on most GPUs they meet, so the trial also verifies them: before timing, each arm runs the
call once with its random parts off (no noise, no dropout: the deterministic function both arms compute), and the
kernels' output and every gradient must agree with the eager path's within the dtype's tolerance (`TOLERANCES`).
Kernels that disagree, or whose arm raises anything (a compile or launch error, Triton's OutOfResources), lose,
with one warning naming the kind and the error; if both arms fail, the eager path runs and raises its own error, as
it would without the kernels. A later call of a kind that chose the kernels whose launch fails (a new
specialisation that does not compile) runs the eager path instead, with one warning, and the kind keeps the eager
path from then on (`fall_back`). HF_MGK_AUTOTUNE=0 turns the timing off: the eager path runs. Nothing is timed while
tracing or compiling (the kernels are refused there anyway) or while a CUDA graph is being captured (the eager path
runs, unrecorded).

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

__all__ = ["CACHE_ENV", "TOLERANCES", "choose", "disagreement", "fall_back", "kind_of", "measured_here",
           "relative_errors", "switched_on", "timed", "trial"]

logger = logging.getLogger(__name__)

CACHE_ENV = "HF_MGK_CACHE"
# Where the timing applies: the kernels' own device. Tests add "cpu" (Triton's interpreter) with a fake clock.
MEASURED_DEVICES = ("cuda",)
# Timed runs per arm after one warm-up run (which compiles the kernels); the fastest counts.
REPEATS = 3
clock = time.perf_counter  # replaced by a fake clock in the tests

# The largest difference the kernels' output and gradients may have from the eager path's, relative to the largest
# magnitude of the output, or of all the gradients (a gradient that is exactly 0, such as a bias a softmax ignores,
# comes out as rounding of the size of the others), by the call's dtype: a few times each precision's error of an
# attention call in either path (in half precision the hard E-step's maximum can flip between keys that tie to
# rounding: 5e-2 measured in bfloat16 on a 37-token call), far below what a wrong kernel gives.
TOLERANCES = {torch.float32: 1e-3, torch.bfloat16: 1e-1, torch.float16: 2e-2}

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


def _lost(kind, name, error):
    """An arm that raised: the kernels' arm loses, with one warning (any error: resources, a compile or launch
    error, ...), and so does the eager arm that ran out of GPU memory. None where the error is the eager path's own:
    the caller runs the eager path, which raises it."""
    if name == "triton":
        what = "cannot run on this GPU" if _resource_failure(error) else "failed"
        _warn_once(("triton", what, type(error).__name__),
                   f"hf_mgk: the Triton kernels {what} ({type(error).__name__}: {error}) on {kind}; the eager path "
                   "runs instead")
        return True
    if isinstance(error, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()
        return True
    return None


def _time(run, name, device):
    """The fastest of REPEATS runs of arm `name` after a warm-up (seconds)."""
    run(name)
    _sync(device)
    best = float("inf")
    for _ in range(REPEATS):
        start = clock()
        run(name)
        _sync(device)
        best = min(best, clock() - start)
    return best


def relative_errors(got, want):
    """The largest differences of `got` (the kernels' (output, gradients)) from `want` (the eager path's): the
    output's relative to the output's largest magnitude, then each gradient's relative to the largest magnitude of
    all the gradients (one that is exactly 0, such as a bias a softmax ignores, comes out as rounding of the others'
    size). NaN on one side only, or a gradient on one side only, counts as infinite."""
    def scale(tensors):
        return max((t.detach().abs().nan_to_num(0.0).max().item() for t in tensors
                    if t is not None and t.numel()), default=0.0)

    def error(g, w, size):
        if g is None or w is None:
            return 0.0 if g is w else float("inf")
        g, w = g.detach().double(), w.detach().double()
        both = torch.isnan(g) & torch.isnan(w)
        diff = torch.where(both, torch.zeros_like(g), (g - w).abs()).nan_to_num(float("inf"))
        return (diff.max().item() if diff.numel() else 0.0) / max(size, 1e-30)

    (out, grads), (ref, ref_grads) = got, want
    if len(grads) != len(ref_grads):
        return [float("inf")]
    largest = scale(ref_grads)
    return [error(out, ref, scale([ref]))] + [error(g, w, largest) for g, w in zip(grads, ref_grads)]


def disagreement(got, want, dtype):
    """The largest of `relative_errors` as a multiple of TOLERANCES[dtype]: at most 1, the arms agree."""
    return max(relative_errors(got, want)) / TOLERANCES.get(dtype, TOLERANCES[torch.float32])


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


def _each_arm(kind, eager, step):
    """{name: step(name)} for the kernels' arm and the eager path's, an arm that raised and lost (`_lost`) left out;
    None where the eager path's own error stands (the call runs it, which raises). torch's control flow passes."""
    done = {}
    for name in ("triton", eager):
        try:
            done[name] = step(name)
        except Exception as error:  # noqa: BLE001 - which arm failed decides: see _lost
            if _control_flow(error):
                raise
            if not _lost(kind, name, error):
                return None
    return done


def _decide(kind, eager, run, device, dtype):
    """(backend, cache entry) for a kind timed here: each arm verified on the call's deterministic part, then timed
    (module docstring). The entry is None where the eager path itself failed: the call runs it, which raises, and
    nothing is kept for the kind."""
    checked = _each_arm(kind, eager, lambda name: run(name, exact=True))
    if checked is None:
        return eager, None
    if eager not in checked:  # out of memory: the kernels run, verified against nothing
        return "triton", {"backend": "triton", "reason": "the eager path ran out of memory"}
    if "triton" not in checked:
        return eager, {"backend": eager, "reason": "the kernels failed"}
    off = disagreement(checked["triton"], checked[eager], dtype)
    if not off <= 1.0:
        _warn_once(("disagree", kind), f"hf_mgk: the Triton kernels disagree with the eager path on {kind}: their "
                   f"largest error is {off:.3g} times the {str(dtype).replace('torch.', '')} tolerance; the eager "
                   "path runs instead")
        return eager, {"backend": eager, "reason": f"the kernels disagree ({off:.3g} x the tolerance)"}
    seconds = _each_arm(kind, eager, lambda name: _time(run, name, device))
    if seconds is None:
        return eager, None
    seconds = {name: seconds.get(name, float("inf")) for name in ("triton", eager)}
    best = min(seconds, key=lambda name: (seconds[name], name != eager))  # both lost: the eager path
    return best, {"backend": best, "seconds": {name: (t if t != float("inf") else None)
                                               for name, t in seconds.items()}, "agreement": round(off, 4)}


def choose(kind, eager, run, device, dtype=None):
    """The backend a call of `kind` runs on `device` with backend="auto", where the Triton kernels can run it:
    "triton" or `eager` (the eager path's backend name). run(name, exact) runs the call once on backend `name`
    (`trial`), exact: with its random parts off. A choice held for the kind (by this process, the cache file or
    another rank) is taken only where it is one of the two this call can run. Module docstring: the verification,
    the timing, the cache, the ranks' agreement, the off switch."""
    if not switched_on():
        return eager
    kind = f"{kind} on {_device_name(device)}"
    if _CHOSEN.get(kind) in ("triton", eager):
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
            choice, entry = _decide(kind, eager, run, device, dtype)
            if entry is None:
                return choice
            _write(path, key, kind, entry)
            how = entry.get("reason") or "timing " + ", ".join(
                f"{name} {t * 1e3:.3g} ms" if t is not None else f"{name} failed"
                for name, t in entry["seconds"].items())
        choice = entry["backend"]
        if store is not None:  # the first rank to publish wins; every rank takes what it published
            choice = store.compare_set(store_key, "", choice).decode()
    if choice not in ("triton", eager):  # another rank's eager path, which this call cannot run
        how, choice = f"{how} ({choice!r}, which cannot run this call here)", eager
    _CHOSEN[kind] = choice
    logger.info("hf_mgk: backend='auto' runs %r for %s, from %s (said once per kind)", choice, kind, how)
    return choice


def _control_flow(error):
    """Whether `error` is torch's way of steering the call rather than a failure: activation checkpointing stops a
    recomputation (non-reentrant) by raising from inside the forward once it has the tensors it needs."""
    return type(error).__module__.startswith("torch.utils.checkpoint")


def fall_back(measured, error):
    """The eager backend a call runs after the kernels `measured` chose (`timed`) raised `error` at launch (a new
    specialisation of a chosen kind that does not compile, ...): one warning, and the kind keeps the eager path for
    the rest of the process. An error of kernels asked for by name, not chosen by `auto`, is the caller's, and
    torch's control flow (`_control_flow`) is not an error: both raised."""
    if measured is None or measured.chosen != "triton" or _control_flow(error):
        raise error
    _CHOSEN[measured.kind] = measured.eager
    _warn_once(("fallback", measured.kind), f"hf_mgk: the Triton kernels failed ({type(error).__name__}: {error}) "
               f"on {measured.kind}; the eager path runs it from now on")
    return measured.eager


def trial(call, tensors, grads, device, modules=()):
    """A `run` for `choose`: run(name, exact) calls call(name, *inputs, exact=exact) once, on `tensors` detached
    (leaves that require grad as the originals do: the user's graph is not touched) and, with `grads`, takes the
    gradients of every input and of `modules`' parameters that require one (torch.autograd.grad, for a fixed random
    cotangent: nothing accumulates in a .grad). Returns (output, gradients). Under a forked random state, so the
    trial does not move the user's random numbers (dropout, noise)."""
    def run(name, exact=False):
        inputs = [t.detach().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t for t in tensors]
        devices = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        # Saved-tensor hooks of its own: inside activation checkpointing (non-reentrant: transformers'
        # gradient_checkpointing) the checkpoint's hooks would count the trial's tensors as the layer's and stop or
        # fail its recomputation; only the innermost hooks apply.
        with torch.random.fork_rng(devices=devices), torch.autograd.graph.saved_tensors_hooks(_same, _same):
            out = call(name, *inputs, exact=exact)
            found = ()
            if grads:
                wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
                wrt += [p for m in modules for p in m.parameters() if p.requires_grad]
                cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(
                    out.device, out.dtype)  # both arms differentiate the same one
                found = torch.autograd.grad(out, wrt, cotangent, allow_unused=True)
        return out, found
    return run


def _same(tensor):
    return tensor


class Measured:
    """What `attention_blocks.resolve_backend` calls where backend="auto" may time the kernels: measured(eager)
    returns `choose`'s answer for this call (eager: the eager backend's name) and remembers it (`kind`, `eager`,
    `chosen`) for `fall_back`."""

    def __init__(self, family, call, tensors, device, modules, kind):
        self.family, self.call, self.tensors, self.device, self.modules, self.facts = (
            family, call, tensors, device, modules, kind)
        self.kind = self.eager = self.chosen = None

    def __call__(self, eager):
        params = [p for m in self.modules for p in m.parameters()]
        grads = torch.is_grad_enabled() and any(
            t.requires_grad for t in (*self.tensors, *params) if isinstance(t, torch.Tensor))
        autocast = _autocast_state(self.device.type)
        dtype = getattr(torch, autocast) if autocast != "off" else self.facts["dtype"]  # what the arms compute in
        kind = kind_of(self.family, grads=grads, **self.facts, autocast=autocast,
                       matmul=torch.get_float32_matmul_precision())
        self.eager, self.kind = eager, f"{kind} on {_device_name(self.device)}"
        self.chosen = choose(kind, eager, trial(self.call, self.tensors, grads, self.device, self.modules),
                             self.device, dtype)
        return self.chosen


def _autocast_state(device_type):
    """"off", or the dtype autocast runs this device type's matmuls in."""
    try:
        if torch.is_autocast_enabled(device_type):
            return str(torch.get_autocast_dtype(device_type)).replace("torch.", "")
    except (RuntimeError, AttributeError):  # a device type autocast does not know
        pass
    return "off"


def timed(family, call, tensors, device, modules=(), **kind):
    """The `Measured` of a call: call(name, *tensors, exact) runs it on backend `name` (exact: its noise and dropout
    off); `kind`: kind_of's dtype, batch, lengths, sizes and facts, to which the autocast state and
    torch.get_float32_matmul_precision() are added. Gradients are timed and compared where autograd records the call
    (an input or a module parameter that requires grad, grad mode on)."""
    return Measured(family, call, tensors, device, modules, kind)
