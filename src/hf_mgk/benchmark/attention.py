"""The attention alone, forward + backward of one call on random inputs (in --dtype), against SDPA: MGK's paths with
H/2 heads against SDPA with H heads (after the mgk family's models), and each FiSH type with H local heads mixed
from M global ones against causal SDPA with H heads (after the fish family's). Each (path, N) is measured in its own
child (`measure_mgk_attention`, `measure_fish_attention`: time, FLOPs, peak memory); with --interleave one more child
per N times every path and SDPA together, their steps alternating (`measure_alone_interleaved`), and its times
replace the separate ones. A path is a name for one call of the package's attention function with its arguments
(MGK_PATHS, FISH_PATHS; the backend is one of them: "auto" the package's rule, which on a CUDA GPU with Triton takes
the Triton kernels for the calls they cover; on a GPU also "eager", the rule without them)."""

import json

import torch

from . import measure
from .counting import flop_counter_mode
from .models import BERT_SIZE, FISH_TYPES, GPT2_SIZE, compute_dtype
from .tables import format_ms


# ------------------------------------------------------------------ shared by both tables
def measure_alone(step, repeats):
    """In the child: median fwd+bwd seconds of `step` and FlopCounterMode's count of the (untimed) warm-up step."""
    def counted():
        with flop_counter_mode() as fc:
            step()
        return fc.get_total_flops()

    result, flops = measure.timed(step, repeats, counted)
    result["flops"] = flops
    result["chosen"] = chosen()
    return result


def chosen():
    """What backend="auto" chose in this process by timing (attention_autotune), kind -> backend."""
    from hf_mgk import attention_autotune

    return dict(attention_autotune._CHOSEN)


def _leaf(shape, g, requires_grad=True):
    """A random input in --dtype (drawn in float32 first, so every dtype sees the same numbers, rounded)."""
    return torch.randn(*shape, generator=g).to(compute_dtype()).requires_grad_(requires_grad)


def measure_alone_interleaved(kind, paths, shape, repeats, threads):
    """In the child (--interleave): the steps of every path ("sdpa" among them) of one table ("mgk" or "fish",
    `shape` the step builder's arguments after the path) built in this one process, each warmed up by
    `measure_alone` (its FLOPs; its peak memory, per path on a GPU, where the peak statistics are reset for each),
    then `repeats` rounds of one step of each in turn. One dict per path: the median seconds, flops, peak_mib, or
    the error of a path that cannot run here."""
    torch.set_num_threads(threads)
    steps, results = [], []
    for path in paths:
        try:
            step = STEP_BUILDERS[kind](path, *shape)
            results.append(measure_alone(step, 0))
            steps.append(step)
        except Exception as err:  # noqa: BLE001 (reported in the table, like a failed child)
            results.append({"error": str(err).splitlines()[0][:120]})
            steps.append(None)
    for result, seconds in zip(results, measure.alternate(steps, repeats)):
        if seconds is not None:
            result["seconds"] = seconds
    return {"rows": results}


def alone_rows(kind, paths, shape_of, lengths, args, child, child_args):
    """{(path, N): result} of an attention-alone table. Each (path, N) in its own child (`child` with
    `child_args(path, N)`: time, FLOPs, the peak memory the step adds), unless --interleave: then one child per N
    times every path and SDPA alternating (`measure_alone_interleaved`), whose times replace the separate ones; on a
    GPU that child's per-path peaks and FLOPs are used as they are (no separate children), on the CPU, whose peak is
    the process's, the separate children still give memory and FLOPs."""
    every = ["sdpa", *paths]
    rows = {}
    if not (args.interleave and args.device == "cuda"):
        rows = {(p, n): measure.call_child(child, child_args(p, n)) for n in lengths for p in every}
    if args.interleave:
        for n in lengths:
            together = measure.call_child("measure_alone_interleaved",
                                          [kind, every, shape_of(n), args.repeats, args.threads])
            for path, got in zip(every, together.get("rows") or [together] * len(every)):
                row = rows.setdefault((path, n), dict(got))
                if "seconds" in got and "error" not in got:
                    row["seconds"] = got["seconds"]
                elif "error" not in row:
                    row["error"] = f"interleaved timing: {got.get('error', 'failed')}"
    return rows


def print_alone_rows(lengths, paths, rows, extra=lambda path, n, r, base: []):
    """The attention-alone tables' rows: N, SDPA ms, path, ms, x SDPA, `extra`'s cells, x counted FLOPs, peak MiB;
    a row that could not be measured says why. Then what backend="auto" chose by timing, where it timed."""
    for n in lengths:
        base = rows[("sdpa", n)]
        for p in paths:
            r = rows[(p, n)]
            if "error" in r or "error" in base:
                print(f"| {n} | | {p} | {r.get('error', base.get('error'))} |" + " |" * (3 + len(extra(p, n, {}, {}))))
                continue
            cells = [format_ms(base["seconds"]), p, format_ms(r["seconds"]), f"{r['seconds'] / base['seconds']:.2f}",
                     *extra(p, n, r, base), f"{r['flops'] / base['flops']:.2f}", f"{r['peak_mib']:.0f}"]
            print(f"| {n} | " + " | ".join(cells) + " |")
    choices = {}
    for r in rows.values():  # each measured row carries its process's choices (measure_alone)
        choices.update(r.get("chosen") or {})
    if choices:
        print("\nbackend='auto' timed the Triton kernels against the eager path on each kind's first call and runs:")
        for kind in sorted(choices):
            print(f"- {kind}: {choices[kind]}")


def model_cells(static_json, static_name, paths):
    """The static cost model's column (--static: a JSON of `python -m hf_mgk.benchmark.static --json`): for a row on
    the Triton kernels (backend "triton" named, the last item of its `paths` entry), the model's forward + backward
    figure for the path `static_name(row)`, per pair and softmax head against flash attention: what the row's
    "x SDPA" measures, as a lower bound. Empty without --static."""
    figures = {}
    if static_json:
        with open(static_json) as f:
            figures = {name: v["both"] for name, v in json.load(f)["summary"].items()}

    def cells(p):
        if not static_json:
            return []
        name = static_name(p) if paths[p][-1] == "triton" else None
        return [f"{figures[name]:.2f}" if name in figures else ""]
    cells.header = " model (static) |" if static_json else ""
    cells.rule = "---:|" if static_json else ""
    return cells


# ------------------------------------------------------------------ MGK attention alone
# The baseline's H heads of size D against MGK's H/2 heads with M keys, forward + backward of one attention call
# on random (B, heads, N, D) inputs (the MGK model's attention type and E-step choose the path, as in the model).
MGK_PATHS = {  # name -> (function, e_step, M, backend); "SDPA-aug" is the augmented-key SDPA path the CPU rule
    # replaced
    "MGK soft": ("mgk", "soft", 2, "auto"), "sMGK soft": ("smgk", "soft", 2, "auto"),
    "MGK hard": ("mgk", "hard", 2, "auto"), "sMGK hard": ("smgk", "hard", 2, "auto"),
    "MGK soft, SDPA-aug": ("mgk", "soft", 2, "sdpa"),
}
# On a GPU "auto" runs what timing on the first call of a kind found faster (attention_autotune): these rows show
# the Triton kernels and the eager path (the rule without them) beside it.
MGK_GPU_PATHS = {f"{name}, {backend}": (*MGK_PATHS[name][:3], backend)
                 for name in ("MGK soft", "sMGK soft", "MGK hard", "sMGK hard") for backend in ("triton", "eager")}
ALL_MGK_PATHS = {**MGK_PATHS, **MGK_GPU_PATHS}


def mgk_paths(device):
    """The MGK paths of the table on `device`."""
    return {**MGK_PATHS, **(MGK_GPU_PATHS if device == "cuda" else {})}


def mgk_paper_flops(path, heads, length, head_dim):
    """The papers' count (MGK App. B) of one layer's attention, multiply-adds of QK^T (or the M key products) and
    AV, for the baseline's `heads`: softmax 2 H N^2 D; MGK with H/2 heads (M + 1) H/2 N^2 D (M keys' scores, one
    value per position); sMGK (one key product for all M shifted keys) 2 H/2 N^2 D. path: "sdpa" or MGK_PATHS."""
    if path == "sdpa":
        return 2 * heads * length * length * head_dim
    kind, _, m, _ = ALL_MGK_PATHS[path]
    return (2 if kind == "smgk" else m + 1) * (heads // 2) * length * length * head_dim


def mgk_attention_step(path, heads, length, batch, head_dim, backend=None):
    """fwd+bwd of one attention call: SDPA with `heads` heads, or an MGK path with heads // 2 (`backend` in place of
    the path's own)."""
    from hf_mgk import attention_mgk as am

    g = measure.generator()
    if path == "sdpa":
        q, k, v = (_leaf((batch, heads, length, head_dim), g) for _ in range(3))
        grad = _leaf((batch, heads, length, head_dim), g, False)
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v).backward(grad)
    kind, e_step, m, own = ALL_MGK_PATHS[path]
    backend = backend or own
    h = heads // 2
    q, v = (_leaf((batch, h, length, head_dim), g) for _ in range(2))
    grad = _leaf((batch, h, length, head_dim), g, False)  # dense, as from the layers above
    if backend == "eager":  # the rule's choice without the Triton kernels
        backend = am.choose_backend(e_step=e_step, return_weights=False, device_type=q.device.type, dtype=q.dtype,
                                    autocast=False, tracing=False, mask=None)
    variances = [head_dim ** 0.5 * (1 + 2 * r) for r in range(m)]
    prior = torch.log_softmax(torch.zeros(h, m), -1).requires_grad_(e_step == "soft")  # the hard E-step ignores pi
    if kind == "smgk":
        key = _leaf((batch, h, length, head_dim), g)
        shift = (0.1 * torch.randn(h, m, head_dim, generator=g)).to(q.dtype).requires_grad_()
        return lambda: am.smgk_attention(q, key, shift, v, variances=variances, log_prior=prior,
                                         e_step=e_step, backend=backend).backward(grad)
    keys = _leaf((batch, h, m, length, head_dim), g)
    return lambda: am.mgk_attention(q, keys, v, variances=variances, log_prior=prior, e_step=e_step,
                                    backend=backend).backward(grad)


def measure_mgk_attention(path, heads, length, batch, head_dim, repeats, threads):
    """In the child: `measure_alone` of one MGK path (or SDPA)."""
    torch.set_num_threads(threads)
    return measure_alone(mgk_attention_step(path, heads, length, batch, head_dim), repeats)


def run_mgk_attention(args, spec):
    """The attention alone, fwd+bwd: each MGK path with H/2 heads against SDPA with H, time and FLOP ratios."""
    heads, head_dim, batch = args.heads, BERT_SIZE["hidden_size"] // args.heads, args.batch
    paths = list(mgk_paths(args.device))
    rows = alone_rows("mgk", paths, lambda n: [heads, n, batch, head_dim], spec["lengths"], args,
                      "measure_mgk_attention", lambda p, n: [p, heads, n, batch, head_dim, args.repeats, args.threads])
    print(f"\n## mgk: attention alone, forward + backward (B={batch}, D={head_dim}, no mask, {args.dtype}): MGK "
          f"paths with {heads // 2} heads, M=2, against SDPA with {heads}; x = time / SDPA's"
          + ("; the steps of each N alternating in one process" if args.interleave else ""))
    print("'x paper FLOPs': the papers' count (App. B) of the attention products, forward (softmax 2 H N^2 D, MGK "
          "(M + 1) H/2 N^2 D, sMGK 2 H/2 N^2 D); the target is 1.1 times it. 'x counted FLOPs': FlopCounterMode on "
          "the timed step, forward + backward (SDPA by PyTorch's formula: QK^T, AV and 4 backward products).")
    model = model_cells(getattr(args, "static", None), lambda p: "{} {}".format(*ALL_MGK_PATHS[p][:2]), ALL_MGK_PATHS)
    print("| N | SDPA ms | path | ms | x SDPA |" + model.header + " x paper FLOPs | target (1.1x) | x counted FLOPs "
          "| peak MiB |")
    print("|---:|---:|---|---:|---:|" + model.rule + "---:|---:|---:|---:|")

    def paper_cells(p, n, r, base):
        paper = mgk_paper_flops(p, heads, n, head_dim) / mgk_paper_flops("sdpa", heads, n, head_dim)
        return [*model(p), f"{paper:.2f}", f"{1.1 * paper:.3f}"]

    print_alone_rows(spec["lengths"], paths, rows, paper_cells)


# ------------------------------------------------------------------ FiSH attention alone
# Causal (as in GPT-2), forward + backward of one attention call: SDPA with H heads against each FiSH type with H
# local heads mixed from M global ones, on the path the model's rule picks ("auto").
FISH_NOISY = ("fish", "mish", "gfish")  # the types with training noise (FiSHGPT2Config.is_noisy)
FISH_PATHS = {kind: (kind, "auto") for kind in FISH_TYPES}  # name -> (attention type, backend)
FISH_GPU_PATHS = {f"{kind}, {backend}": (kind, backend) for kind in FISH_TYPES  # on a GPU, beside "auto"
                  for backend in ("triton", "eager")}


def fish_paths(device, types):
    """The FiSH paths of the table on `device` for the attention types `types`."""
    paths = {**FISH_PATHS, **(FISH_GPU_PATHS if device == "cuda" else {})}
    return [p for p in paths if paths[p][0] in types]


def fish_attention_step(path, heads, m, length, batch, head_dim, backend=None):
    """fwd+bwd of one causal attention call: SDPA with `heads` heads, or a FiSH path (FISH_PATHS) with `heads` local
    and `m` global heads, its mixing as the model initialises it and sigma = 0.1 for the noisy types (`backend` in
    place of the path's own)."""
    from hf_mgk import attention_fish as af

    g = measure.generator()
    grad = _leaf((batch, heads, length, head_dim), g, False)
    if path == "sdpa":
        q, k, v = (_leaf((batch, heads, length, head_dim), g) for _ in range(3))
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
    kind, own = {**FISH_PATHS, **FISH_GPU_PATHS}[path]
    backend = backend or own
    q, k = (_leaf((batch, m, length, head_dim), g) for _ in range(2))
    v = _leaf((batch, heads, length, head_dim), g)
    if kind.endswith("gfish"):
        mixing = af.make_gfish_mixing(m, heads)
    else:
        mixing = torch.full((m, 1 if kind == "mish" else heads), 1.0 / m, requires_grad=True)
    noise = torch.full((m,), 0.1, requires_grad=True) if kind in FISH_NOISY else None
    if backend == "eager":  # the rule's choice without the Triton kernels
        backend = af.choose_backend(
            mixing=af._mixing_kind(mixing), noise=noise is not None, dropout=False, return_weights=False,
            device_type=q.device.type, dtype=q.dtype, autocast=False, requires_grad=True, tracing=False)
    return lambda: af.fish_attention(q, k, v, mixing, noise_std=noise, is_causal=True, backend=backend).backward(grad)


def measure_fish_attention(path, heads, m, length, batch, head_dim, repeats, threads):
    """In the child: `measure_alone` of one FiSH path (or SDPA)."""
    torch.set_num_threads(threads)
    return measure_alone(fish_attention_step(path, heads, m, length, batch, head_dim), repeats)


def run_fish_attention(args, spec):
    """The attention alone, fwd+bwd, causal: each FiSH type on the path its rule picks against SDPA."""
    heads, m, batch = args.heads, args.global_heads, args.batch
    head_dim = GPT2_SIZE["n_embd"] // heads
    lengths = args.lengths or [512, 1024]
    paths = fish_paths(args.device, args.fish_types or FISH_TYPES)
    rows = alone_rows("fish", paths, lambda n: [heads, m, n, batch, head_dim], lengths, args,
                      "measure_fish_attention",
                      lambda p, n: [p, heads, m, n, batch, head_dim, args.repeats, args.threads])
    print(f"\n## fish: attention alone, causal, forward + backward (B={batch}, D={head_dim}, {args.dtype}): each "
          f"FiSH type with {heads} local heads mixed from {m} global ones, on the path its rule picks, against SDPA "
          f"with {heads} heads; x = time / SDPA's. 'x counted FLOPs': FlopCounterMode on the step (SDPA by "
          "PyTorch's formula)." + (" The steps of each N alternate in one process." if args.interleave else ""))
    every = {**FISH_PATHS, **FISH_GPU_PATHS}
    model = model_cells(getattr(args, "static", None), lambda p: every[p][0], {p: (*every[p][:1], every[p][-1]) for p in every})
    print("| N | SDPA ms | path | ms | x SDPA |" + model.header + " x counted FLOPs | peak MiB |")
    print("|---:|---:|---|---:|---:|" + model.rule + "---:|---:|")
    print_alone_rows(lengths, paths, rows, lambda p, n, r, base: model(p))


# The step builders `measure_alone_interleaved` names by table.
STEP_BUILDERS = {"mgk": mgk_attention_step, "fish": fish_attention_step}
