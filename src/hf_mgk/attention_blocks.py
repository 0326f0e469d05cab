"""The plumbing the exact kernels share besides masks: blocks of query rows (how a kernel walks an N x S attention
matrix without holding all of it) and named backends (which exact path runs a call).

Torch only; this file travels next to the remote-code model files.
"""

import logging

import torch

from .attention_autotune import measured_here
from .attention_triton import platform_refusal

__all__ = ["RETIRED_BACKENDS", "autocast_enabled", "records_grad", "resolve_backend", "row_blocks"]

# Backends that existed once and were removed: asking for one by name says so, instead of "unknown backend".
RETIRED_BACKENDS = {
    "compiled": "it was removed (its torch.compile / inductor kernels were measured slower than the exact "
                "eager paths on every CPU and GPU shape timed; hf-mgk's docs/benchmarks/kernel-notes.md"
                "#compiled-path-retired)",
}


def row_blocks(n, s, is_causal, block_rows, keep_empty=False):
    """(rows, end, lo) per block of `block_rows` query rows, in order: keys :end are all the block's rows may see
    (causal: query i sees j <= i + s - n, bottom-right aligned), and columns lo:end are hidden from some of them
    (the block's diagonal tile; lo = end when none is).

    Causal with n > s, the first rows see no key at all: their blocks are left out (their output is zero), or with
    `keep_empty` kept with one column (end = 1, hidden from every row), so that every row belongs to a block."""
    for start in range(0, n, block_rows):
        stop = min(n, start + block_rows)
        if not is_causal:
            yield slice(start, stop), s, s
            continue
        end = min(s, stop + s - n)
        if end <= 0 and not keep_empty:
            continue
        end = max(1, end)
        yield slice(start, stop), end, min(end, max(0, start + s - n + 1))


def records_grad(*tensors):
    """Whether autograd records a call on these inputs (None and non-tensors skipped): grad mode on and one needs a
    gradient."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def autocast_enabled(device_type):
    """Whether autocast is on for this device type; False for a device type autocast does not know (e.g. "meta",
    where shapes are traced without data)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:
        return False


logger = logging.getLogger(__name__)
_FALLBACKS_SAID = set()


def _say_fallback(why, path):
    """Log, once per reason, that the Triton kernels refused a call and `path` runs it instead."""
    if why in _FALLBACKS_SAID:
        return
    _FALLBACKS_SAID.add(why)
    logger.info("the Triton kernels do not run this attention call: %s; it runs on the %r path instead (said "
                "once per reason)", why, path)


def resolve_backend(backend, auto, refusals, device_type=None, timed=None):
    """The backend a kernel runs: `auto` (its rule's choice) for backend="auto", else `backend` itself.

    refusals: every backend name -> None where it can run the call, else why it cannot. An unknown name, or one
    that cannot run the call, is a ValueError naming it and the allowed ones (a retired one also says why it is
    gone: RETIRED_BACKENDS). On a CUDA `device_type`, "auto" taking a torch path where the Triton kernels are
    installed and switched on but refuse the call (tracing / export, the weights, a 4-D mask, ...) says so once
    per reason, at INFO on this module's logger. Not inside a torch.compile trace: a logging call there breaks
    the graph (fullgraph=True fails), and dynamo replays no call from an inlined function after the graph.

    timed: None, or a function that returns the kernels' or the eager path's name, whichever was timed faster for
    this kind of call (attention_autotune.timed): "auto" asks it, instead of taking the rule's answer, on a GPU
    where the kernels can run the call."""
    if backend == "auto":
        why = refusals.get("triton")
        if timed is not None and why is None and measured_here(device_type):
            return timed()
        # what refuses the kernels in the whole process (not installed, too old, ROCm, switched off) is said once
        # by attention_triton.available, or not at all
        if (device_type == "cuda" and auto != "triton" and why is not None and why != platform_refusal()
                and not why.startswith("HF_MGK_TRITON=0") and not torch.compiler.is_compiling()):
            _say_fallback(why, auto)
        return auto
    allowed = ", ".join(repr(name) for name in ("auto", *refusals))
    if backend in RETIRED_BACKENDS:
        raise ValueError(f"backend {backend!r} no longer exists: {RETIRED_BACKENDS[backend]}; the backends are "
                         f"{allowed}")
    if backend not in refusals:
        raise ValueError(f"unknown backend {backend!r}; allowed: {allowed}")
    if refusals[backend] is not None:
        raise ValueError(f"backend {backend!r} cannot run this call: {refusals[backend]} (allowed: {allowed})")
    return backend
