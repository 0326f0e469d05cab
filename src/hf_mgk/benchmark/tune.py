"""One tuning pass of the Triton kernels' block sizes: each candidate (BLOCK_M, BLOCK_N) timed on the attention-alone
step of each family (forward + backward, the triton backend), the candidates' steps alternating in this one process
(the kernels read HF_MGK_TRITON_BLOCKS at each call: attention_triton.tuned_blocks), the median per candidate. Prints
a table per family and, last, the line to export so that later runs take the fastest:

    python -m hf_mgk.benchmark.tune --device cuda --dtype bf16            # B = 8, N = 4096, D = 64, 4 candidates
    HF_MGK_TRITON_BLOCKS=mgk:w64=64x64,fish:w128=64x32                     # (its last line)

Each entry names the shape class it was timed at (attention_triton.shape_class: the padded width of a program's
rows); the kernels take it for calls of that class only, and keep their defaults elsewhere. The defaults are timed
as a candidate too ("default": the launches the kernels pick untuned, which for FiSH differ per pass and in warps,
attention_fish_triton.launch_configs); where they are the fastest, the line names nothing for that family.

A candidate the GPU cannot run (too many registers or too much shared memory) is reported and skipped."""

import argparse
import os

import torch

from .. import attention_triton
from . import measure, models
from .attention import fish_attention_step, mgk_attention_step

# Each candidate compiles the kernels anew (seconds each), so few: the defaults' neighbours.
CANDIDATES = ((64, 64), (64, 32), (32, 64), (128, 64))
# What each family's candidates are timed on: the attention-alone tables' first path, with the triton backend.
FAMILY_STEPS = {
    "mgk": lambda a: mgk_attention_step("MGK soft", a.heads, a.length, a.batch, a.head_dim, backend="triton"),
    "fish": lambda a: fish_attention_step("fish", a.heads, a.global_heads, a.length, a.batch, a.head_dim,
                                          backend="triton"),
}


def shape_key(family, a):
    """"family:class", the entry's name for the shape the candidates are timed at."""
    num_global = a.global_heads if family == "fish" else 1
    return f"{family}:{attention_triton.shape_class(a.head_dim, num_global)}"


def _with_blocks(key, blocks, fn):
    """fn() with HF_MGK_TRITON_BLOCKS naming `blocks` for `key` ("family:class"; the rest of the variable kept), or
    naming nothing for it (blocks None: the defaults)."""
    before = os.environ.get("HF_MGK_TRITON_BLOCKS")
    others = [item for item in (before or "").split(",") if item and not item.strip().startswith(key + "=")]
    mine = [] if blocks is None else [f"{key}={blocks[0]}x{blocks[1]}"]
    os.environ["HF_MGK_TRITON_BLOCKS"] = ",".join(others + mine)
    try:
        return fn()
    finally:
        if before is None:
            del os.environ["HF_MGK_TRITON_BLOCKS"]
        else:
            os.environ["HF_MGK_TRITON_BLOCKS"] = before


def tune(key, make_step, candidates, repeats):
    """{candidate: median seconds, or the reason it cannot run}: each candidate's step warmed up (compiled), then
    `repeats` rounds of one step per candidate in turn."""
    step = make_step()
    results, runnable = {}, []
    for blocks in candidates:
        try:
            _with_blocks(key, blocks, step)
            runnable.append(blocks)
        except Exception as err:  # noqa: BLE001 (e.g. triton's OutOfResources: reported, not fatal)
            results[blocks] = str(err).splitlines()[0][:100]
    steps = [lambda blocks=blocks: _with_blocks(key, blocks, step) for blocks in runnable]
    results.update(zip(runnable, measure.alternate(steps, repeats)))
    return results


def best(results):
    """The fastest candidate of `tune`'s results: blocks, or None where the defaults are (or none ran)."""
    timed = {blocks: t for blocks, t in results.items() if isinstance(t, float)}
    return min(timed, key=timed.get) if timed else None


def _label(blocks):
    return "default" if blocks is None else f"{blocks[0]}x{blocks[1]}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--dtype", choices=sorted(models.DTYPES), default="bf16")
    p.add_argument("--families", nargs="*", choices=sorted(FAMILY_STEPS), default=sorted(FAMILY_STEPS))
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=8, help="SDPA's heads H (MGK runs H/2, FiSH H local heads)")
    p.add_argument("--global-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--candidates", nargs="*", default=[f"{m}x{n}" for m, n in CANDIDATES],
                   help="BLOCK_MxBLOCK_N pairs (default: %(default)s)")
    args = p.parse_args(argv)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            p.error("--device cuda: CUDA is not available here")
        torch.set_default_device("cuda")
    models.DTYPE = args.dtype
    candidates = [None] + [tuple(int(x) for x in c.split("x")) for c in args.candidates]  # None: the defaults
    chosen = []
    for family in args.families:
        key = shape_key(family, args)
        results = tune(key, lambda: FAMILY_STEPS[family](args), candidates, args.repeats)
        print(f"\n## {family}: Triton block sizes, forward + backward (B={args.batch}, N={args.length}, "
              f"D={args.head_dim}, {args.dtype}, {args.device}), median of {args.repeats} alternating rounds")
        print("| BLOCK_M x BLOCK_N | ms |")
        print("|---|---:|")
        for blocks, t in results.items():
            print(f"| {_label(blocks)} | {t * 1e3:.3f} |" if isinstance(t, float) else f"| {_label(blocks)} | {t} |")
        fastest = best(results)
        if fastest is not None:
            chosen.append(f"{key}={fastest[0]}x{fastest[1]}")
    print("\nHF_MGK_TRITON_BLOCKS=" + ",".join(chosen))
    return chosen


if __name__ == "__main__":
    main()
