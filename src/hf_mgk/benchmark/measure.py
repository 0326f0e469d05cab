"""Measurement: each case in a fresh child process (`call_child`), a step's time (median of synchronised calls
after a warm-up) and the memory it adds, a whole model's step with its FLOPs (`measure`), and the models of a
family timed together with their steps alternating (`measure_interleaved`, for --interleave).

`call_child` is looked up on this module when it is called (`measure.call_child` from the other modules), so a
test can run every child in its own process by replacing it here."""

import contextlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from . import counting, models

DEVICE = "cpu"  # main() sets it from --device; call_child hands it to the child


def generator():
    """A seeded generator on the device the child computes on."""
    return torch.Generator(device=torch.get_default_device()).manual_seed(0)


def on_cuda():
    """Whether the child computes on the GPU (the child's entry point sets the default device there for --device
    cuda)."""
    return torch.get_default_device().type == "cuda"


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def timed(step, repeats, warm_up=None):
    """A warm-up call (`warm_up`, default `step`; the peak memory it adds is the memory figure), then the median
    of `repeats` calls of `step`, synchronised on a GPU. Returns ({seconds, peak_mib}, the warm-up's return)."""
    if on_cuda():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _rss_bytes()
    warm = (warm_up or step)()
    if on_cuda():
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    times = [step_seconds(step) for _ in range(repeats)]
    return {"seconds": statistics.median(times) if times else None, "peak_mib": max(peak, 0) / 2**20}, warm


def allocated_peaks(makers, warm_up=True):
    """The CPU peak of each step, to the byte, all in this process: for each `make` of `makers` (called outside the
    measurement, returning a step), the most bytes torch's CPU allocator held during one call of that step above
    what it held when the call began. `timed`'s figure is the process's peak RSS, which a process cannot reset
    (one measurement per child) and which pages and malloc arenas blur at a few MiB; this one reads the running
    total (`total_allocated`) of the allocation events that torch's profiler records with profile_memory, in one
    profiler session for all steps, each inside its own record_function. Memory that libraries take outside torch's
    allocator (oneDNN, FFT plans) is not counted. With `warm_up`, each step's first call (one-time allocations) is
    a separate step from `make` run before the measured one, outside the measurement. `makers` is iterated once,
    in order: a tqdm bar over it shows each step as it is measured (hf_mgk.benchmark.memory's progress)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile, record_function

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _without_kineto_usdt_lines():
        prof.__enter__()
    try:
        for i, make in enumerate(makers):
            if warm_up:
                make()()
            step = make()
            with record_function(f"hf_mgk.allocated_peaks.{i}"):
                step()
            del step
    finally:
        with _without_kineto_usdt_lines():
            prof.__exit__(*sys.exc_info())
    peaks = [0] * len(makers)
    for node in _nodes(prof.profiler.kineto_results.experimental_event_tree()):
        if not node.name.startswith("hf_mgk.allocated_peaks."):
            continue
        # every allocation and free under the step's record_function, its backward included
        events = [(e.start_time_ns, e.extra_fields.alloc_size, e.extra_fields.total_allocated)
                  for e in _nodes(node.children) if e.tag == _EventType.Allocation]
        if events:
            events.sort()
            start = events[0][2] - events[0][1]  # the running total before the step's first event
            peaks[int(node.name.rsplit(".", 1)[1])] = max(0, max(total for *_, total in events) - start)
    return peaks


@contextlib.contextmanager
def _without_kineto_usdt_lines():
    """Drops the `USDT:<time> ... SyncActivityProfilerHandler.cpp:52] profiler_start` (and `profiler_stop`) lines
    that libkineto, torch's profiler, writes from C++ to fd 2 when a session starts and stops: markers for tracing
    tools, not messages. They are logged above its ERROR level, so KINETO_LOG_LEVEL cannot hide them without hiding
    its errors too; instead fd 2 goes to a file around those two calls only (the measured steps print as usual) and
    every other line is passed on."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            os.write(2, b"".join(line for line in caught if not line.startswith(b"USDT:")))


def _nodes(roots):
    """Every node of a profiler event tree under `roots`, roots included."""
    stack = list(roots)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


def step_seconds(step):
    """Seconds of one call of `step`, synchronised on a GPU."""
    start = time.perf_counter()
    step()
    if on_cuda():
        torch.cuda.synchronize()
    return time.perf_counter() - start


# ------------------------------------------------------------------ in the child: the whole models
def measure(kind, overrides, length, batch, repeats, threads, detail=False, mode="train"):
    """Runs in the child: median step seconds (None with repeats = 0), peak added MiB, parameter count and
    FlopCounterMode's counts (count_flops; with `detail`, FiSH's flop_report), taken on the (untimed) warm-up step
    of `model_step`."""
    torch.set_num_threads(threads)
    model, ids, step = models.model_step(kind, overrides, length, batch, mode)
    params = sum(p.numel() for p in model.parameters())
    # warm-up: allocations, kernel selection; and the step FlopCounterMode counts (untimed)
    attention = models.BUILDERS[kind][9]
    warm_up = (lambda: counting.flop_report(model, ids, step)) if detail else (
        lambda: counting.count_flops(model, ids, step, attention))
    result, counts = timed(step, repeats, warm_up)
    result["params"] = params
    result.update(counts)
    return result


def measure_interleaved(cases, length, batch, repeats, threads, mode):
    """Runs in the child (--interleave): every case's `model_step` built in this one process and warmed up, then
    `repeats` rounds that each time one step of every case in turn; the median seconds per case, in order. The
    cases' steps alternate, so the baseline and each model are timed under the same machine state (load, clock),
    where separate children are timed minutes apart."""
    torch.set_num_threads(threads)
    steps = [models.model_step(kind, overrides, length, batch, mode)[2] for kind, overrides in cases]
    for step in steps:
        step()
    return {"seconds": alternate(steps, repeats)}


def alternate(steps, repeats):
    """`repeats` rounds of one call of each step in turn (None: left out); the median seconds per step, in order
    (None for one left out or with no round)."""
    times = [[] for _ in steps]
    for _ in range(repeats):
        for step, took in zip(steps, times):
            if step is not None:
                took.append(step_seconds(step))
    return [statistics.median(took) if took else None for took in times]


# ------------------------------------------------------------------ in the parent: the children
def child_command(name, call_args):
    """The command line of a child that runs CHILD_FUNCTIONS[name](*call_args) (hf_mgk.benchmark.cli) and prints
    its result as JSON: the benchmark's own entry point, with what the child is to compute on and in."""
    return [sys.executable, "-m", "hf_mgk.benchmark", "--_child", json.dumps([name, call_args]), "--_dtype",
            models.DTYPE, "--_device", DEVICE]


def call_child(name, call_args):
    """Run CHILD_FUNCTIONS[name](*call_args) in a fresh interpreter (clean memory peak); its result dict."""
    proc = subprocess.run(child_command(name, call_args), capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1][:120] if proc.stderr.strip() else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_child(kind, overrides, length, args, detail=False, mode="train", repeats=None):
    return call_child("measure", [kind, overrides, length, args.batch, args.repeats if repeats is None else repeats,
                                  args.threads, detail, mode])


def run_cases(spec, length, args, mode):
    """{(case, length): result} of every case of a family at one length: each case's own child (memory, FLOPs,
    parameters; and its time unless --interleave), then with --interleave one child that times all of them
    alternating (`measure_interleaved`), whose times replace the separate ones."""
    repeats = args.repeats if length <= spec.get("repeat_up_to", math.inf) else 1
    detail = spec.get("flop_detail", False) and mode == "train"
    results = {(case, length): run_child(kind, overrides, length, args, detail, mode, 0 if args.interleave else repeats)
               for case, (kind, overrides) in spec["cases"].items()}
    if args.interleave:
        together = call_child("measure_interleaved", [list(spec["cases"].values()), length, args.batch, repeats,
                                                      args.threads, mode])
        for case, seconds in zip(spec["cases"], together.get("seconds") or [None] * len(spec["cases"])):
            result = results[(case, length)] = {**results[(case, length)], "seconds": seconds}
            if "error" in together and "error" not in result:
                result["error"] = f"interleaved timing: {together['error']}"
    return results
