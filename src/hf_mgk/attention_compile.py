"""Fused kernels through torch.compile (inductor): one torch-only function per kernel, which inductor lowers to C++
with OpenMP on the CPU and to Triton on GPUs, fusing the element-wise passes (exp, masks, sums over keys) that
run as separate ops eagerly.

The kernels here are plain functions of torch ops; eager execution of the same function is exact too, so whatever
goes wrong with compiling (no C++ compiler, an op inductor cannot lower, the recompile limit) ends in the eager
function for that call, one warning saying why, and the eager backends for later calls (`compile_failed`). Shapes
are dynamic (one graph serves every length); each graph a kernel compiles is counted (`compile_count`).
`HF_MGK_COMPILE=0` in the environment turns the compiled path off.

Torch only: this file travels next to the remote-code model files.
"""

import importlib.util
import math
import os
import shutil
import time
import warnings

import torch

from .attention_blocks import row_blocks

__all__ = [
    "ENV", "RECOMPILE_LIMIT", "block_offsets", "compile_count", "compile_failed", "compile_seconds",
    "counter_normal", "draw_seed", "key_padding", "reset", "run", "usable", "value_backward",
    "warn_compile_unavailable", "why_not_compiled",
]

# The environment variable that turns the compiled path off ("0", "false", "off" or "no").
ENV = "HF_MGK_COMPILE"
# Graphs one kernel may compile (dtypes x devices x the kernel's static options x the sizes of 1 that dynamo
# specialises); past it: the eager fallback.
RECOMPILE_LIMIT = 64

_compiled = {}  # kernel name -> its torch.compile wrapper
_failed = {}  # (kernel name, device type) -> why it failed
_graphs = {}  # kernel name -> graphs compiled
_seconds = {}  # kernel name -> seconds spent in calls that compiled a graph
_warned = set()  # (reason, device type) already warned about


def compile_enabled():
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def why_not_compiled(device_type):
    """None where the compiled path can run on this device type, else why not (for the backend rules): turned off,
    no C++ compiler (inductor's CPU code), no Triton (its GPU code), another device, or an earlier failure here."""
    if not compile_enabled():
        return f"turned off by {ENV}={os.environ.get(ENV)}"
    if device_type == "cpu":
        if not any(shutil.which(c) for c in (os.environ.get("CXX"), "g++", "c++", "clang++") if c):
            return "no C++ compiler found (inductor builds C++ for the CPU)"
    elif device_type in ("cuda", "xpu"):
        if importlib.util.find_spec("triton") is None:
            return "Triton is not installed (inductor's GPU kernels)"
    else:
        return f"no inductor kernels for device {device_type!r}"
    failed = [why for (name, device), why in _failed.items() if device == device_type]
    return f"a compiled kernel failed here before ({failed[0]})" if failed else None


def warn_compile_unavailable(device_type):
    """One RuntimeWarning per device type and reason: the compiled path was asked for by name and cannot run."""
    why = why_not_compiled(device_type)
    if why is not None and (why, device_type) not in _warned:
        _warned.add((why, device_type))
        warnings.warn(f"hf-mgk: backend 'compiled' cannot run on {device_type}: {why}; using the eager path",
                      RuntimeWarning, stacklevel=3)


def usable(backend, device_type, eager):
    """`backend`, or where it is "compiled" and nothing can compile on `device_type` (turned off, no compiler, an
    earlier failure), one warning (`warn_compile_unavailable`) and `eager()`, the caller's rule's eager path."""
    if backend == "compiled" and why_not_compiled(device_type) is not None:
        warn_compile_unavailable(device_type)
        return eager()
    return backend


def reset():
    """Forget the kernels compiled and the failures recorded here (torch.compiler.reset() also drops the graphs)."""
    for table in (_compiled, _failed, _graphs, _seconds, _warned):
        table.clear()


def compile_failed(name, device_type):
    """Why kernel `name` failed to compile or run on `device_type`, or None."""
    return _failed.get((name, device_type))


def compile_count(name):
    """How many graphs kernel `name` has compiled in this process (dynamic shapes: lengths do not add graphs)."""
    return _graphs.get(name, 0)


def compile_seconds(name):
    """Seconds spent in the calls of kernel `name` that compiled a graph (compilation and that one call)."""
    return _seconds.get(name, 0.0)


def _in_dispatch_mode():
    """Whether a TorchDispatchMode (FlopCounterMode, a profiler's, ...) is watching every op: dynamo compiles no frame
    then, and the eager function gives the mode the ops it wants to see (not a failure)."""
    try:
        from torch.utils._python_dispatch import is_in_torch_dispatch_mode
    except ImportError:  # an older torch: compile, and fall back only if that fails
        return False
    return is_in_torch_dispatch_mode()


def _counting_backend(name):
    def backend(graph_module, example_inputs):
        _graphs[name] = _graphs.get(name, 0) + 1
        return torch._dynamo.lookup_backend("inductor")(graph_module, example_inputs)
    return backend


def run(name, function, *args):
    """`function(*args)` compiled (one wrapper per kernel name, dynamic shapes, the whole function one graph), or
    eagerly where compiling or running the compiled code fails: then once per kernel and device a RuntimeWarning
    says why, and `why_not_compiled` reports it, so the callers' rules choose their eager backends from then on."""
    device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
    if (name, device) in _failed or not compile_enabled() or _in_dispatch_mode():
        return function(*args)
    wrapper = _compiled.get(name)
    if wrapper is None:
        wrapper = _compiled[name] = torch.compile(function, backend=_counting_backend(name), dynamic=True,
                                                  fullgraph=True)
    graphs, start = _graphs.get(name, 0), time.perf_counter()
    try:
        # a limit of its own, and an error at it rather than dynamo's silent eager run (caught below)
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True):
            result = wrapper(*args)
    except Exception as err:  # noqa: BLE001 (a compiler error, an unsupported op, the recompile limit: all fall back)
        message = str(err).strip().splitlines()
        _failed[(name, device)] = why = f"{type(err).__name__}: {message[0] if message else ''}"[:300]
        warnings.warn(f"hf-mgk: the compiled {name} kernel failed on {device} ({why}); computing it eagerly, and "
                      f"with the eager backends from now on (set {ENV}=0 to skip compiling)", RuntimeWarning,
                      stacklevel=2)
        return function(*args)
    if _graphs.get(name, 0) != graphs:
        _seconds[name] = _seconds.get(name, 0.0) + time.perf_counter() - start
    return result


# ---------------------------------------------------------------------------------------------------------------
# Noise drawn inside a kernel. torch's random ops inside a compiled function give numbers that a separately
# compiled backward cannot draw again; a counter-based generator can: each number is a hash of (seed, its index
# in the whole tensor), so a backward (or a test) recomputes exactly the forward's noise from the seed, whatever
# the blocks, and nothing of the noise's size is kept. Plain integer and float ops, which inductor fuses into the
# kernel that uses the numbers.

_M32 = 0xFFFFFFFF


def _hash32(x):
    """A 32-bit integer hash (C. Wellons' "lowbias32" finaliser) of int64 tensors holding values in [0, 2**32):
    products wrap in int64 and keep their low 32 bits, which are all that is used."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def counter_normal(seed, index, dtype=torch.float32):
    """N(0, 1) numbers, one per element of `index` (int64, >= 0), from `seed` (an int64 tensor, 0-d): the same
    (seed, index) always gives the same number. Box-Muller on two 32-bit hashes of the index keyed by the seed
    (the second a hash of the first), so one 32-bit draw decides each number: 2**32 equally likely values whose
    distribution is the normal's (tested: moments, tails, neighbours uncorrelated)."""
    key = _hash32((_hash32((index >> 32) & _M32) + seed) & _M32)
    first = _hash32((index & _M32) ^ key)
    second = _hash32(first ^ 0x68E31DA4)
    # float32 at least (fast on GPUs; float64 for float64, so that a compiled kernel's log and cos, which may differ
    # from eager torch's by an ulp, stay 1e-16 apart there): u1 is in (0, 1], the log finite
    work = torch.promote_types(dtype, torch.float32)
    u1 = (first.to(work) + 0.5) * 2.0 ** -32
    u2 = second.to(work) * 2.0 ** -32
    return (torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)).to(dtype)


def draw_seed(generator, device):
    """A seed for counter_normal from `generator` (or torch's default generator), as an int64 0-d tensor on
    `device`: seeded runs give the same noise."""
    where = generator.device if generator is not None else "cpu"
    return torch.randint(0, 2**31 - 1, (), generator=generator, device=where, dtype=torch.int64).to(device)


def key_padding(attention_mask, batch, length, device):
    """The compiled kernels' key mask (B, S), True = a real key: every key where no mask is given."""
    if attention_mask is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    return attention_mask.bool()


def block_offsets(n, length, is_causal, block_rows, device):
    """(rows, end, offset) per block of query rows (`row_blocks`, every row in a block): a kernel's query i of the
    block sees keys j <= i + offset. offset is a 0-d tensor, not an int: dynamo would specialise the values 0 and
    1 (one more graph each); not causal, offset = length (every key)."""
    for rows, end, _ in row_blocks(n, length, is_causal, block_rows, keep_empty=True):
        yield rows, end, torch.tensor(rows.start + length - n if is_causal else length, device=device)


def value_backward(weights, value, dout, keep, dropout_p):
    """The part of a compiled backward every attention shares, out = dropout(weights) @ value: (d/dweights before
    dropout, d/dvalue). keep: the forward's dropout mask (bool) or None."""
    dw = torch.matmul(dout, value.transpose(-1, -2))
    if dropout_p > 0:
        scale = keep / (1.0 - dropout_p)
        return dw * scale, torch.matmul((weights * scale).transpose(-1, -2), dout)
    return dw, torch.matmul(weights.transpose(-1, -2), dout)
