"""The attention alone, forward + backward of one call on random inputs, against SDPA: MGK's paths with H/2 heads
against SDPA with H heads (after the mgk family's models), and each FiSH type with H local heads mixed from M
global ones against causal SDPA with H heads (after the fish family's). Each (path, N) is measured in its own
child (`measure_mgk_attention`, `measure_fish_attention`); a path is a name for one call of the package's
attention function with its arguments (MGK_PATHS, FISH_PATHS: the backend is one of them)."""

import torch

from . import measure
from .counting import flop_counter_mode
from .models import BERT_SIZE, FISH_TYPES, GPT2_SIZE
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
    return result


def print_alone_rows(lengths, paths, rows, extra=lambda path, n, r, base: []):
    """The attention-alone tables' rows: N, SDPA ms, path, ms, x SDPA, `extra`'s cells, x counted FLOPs, peak MiB;
    a row that could not be measured says why."""
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


# ------------------------------------------------------------------ MGK attention alone
# The baseline's H heads of size D against MGK's H/2 heads with M keys, forward + backward of one attention call
# on random (B, heads, N, D) inputs (the MGK model's attention type and E-step choose the path, as in the model).
MGK_PATHS = {  # name -> (function, e_step, M, backend); "SDPA-aug" is the augmented-key SDPA path the CPU rule
    # replaced
    "MGK soft": ("mgk", "soft", 2, "auto"), "sMGK soft": ("smgk", "soft", 2, "auto"),
    "MGK hard": ("mgk", "hard", 2, "auto"), "sMGK hard": ("smgk", "hard", 2, "auto"),
    "MGK soft, SDPA-aug": ("mgk", "soft", 2, "sdpa"),
}


def mgk_paper_flops(path, heads, length, head_dim):
    """The papers' count (MGK App. B) of one layer's attention, multiply-adds of QK^T (or the M key products) and
    AV, for the baseline's `heads`: softmax 2 H N^2 D; MGK with H/2 heads (M + 1) H/2 N^2 D (M keys' scores, one
    value per position); sMGK (one key product for all M shifted keys) 2 H/2 N^2 D. path: "sdpa" or MGK_PATHS."""
    if path == "sdpa":
        return 2 * heads * length * length * head_dim
    kind, _, m, _ = MGK_PATHS[path]
    return (2 if kind == "smgk" else m + 1) * (heads // 2) * length * length * head_dim


def mgk_attention_step(path, heads, length, batch, head_dim):
    """fwd+bwd of one attention call: SDPA with `heads` heads, or an MGK path with heads // 2."""
    from hf_mgk import attention_mgk as am

    g = measure.generator()
    if path == "sdpa":
        q, k, v = (torch.randn(batch, heads, length, head_dim, generator=g, requires_grad=True) for _ in range(3))
        grad = torch.randn(batch, heads, length, head_dim, generator=g)
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v).backward(grad)
    kind, e_step, m, backend = MGK_PATHS[path]
    h = heads // 2
    q, v = (torch.randn(batch, h, length, head_dim, generator=g, requires_grad=True) for _ in range(2))
    grad = torch.randn(batch, h, length, head_dim, generator=g)  # dense, as from the layers above
    variances = [head_dim ** 0.5 * (1 + 2 * r) for r in range(m)]
    prior = torch.log_softmax(torch.zeros(h, m), -1).requires_grad_(e_step == "soft")  # the hard E-step ignores pi
    if kind == "smgk":
        key = torch.randn(batch, h, length, head_dim, generator=g, requires_grad=True)
        shift = (0.1 * torch.randn(h, m, head_dim, generator=g)).requires_grad_()
        return lambda: am.smgk_attention(q, key, shift, v, variances=variances, log_prior=prior,
                                         e_step=e_step, backend=backend).backward(grad)
    keys = torch.randn(batch, h, m, length, head_dim, generator=g, requires_grad=True)
    return lambda: am.mgk_attention(q, keys, v, variances=variances, log_prior=prior, e_step=e_step,
                                    backend=backend).backward(grad)


def measure_mgk_attention(path, heads, length, batch, head_dim, repeats, threads):
    """In the child: `measure_alone` of one MGK path (or SDPA)."""
    torch.set_num_threads(threads)
    return measure_alone(mgk_attention_step(path, heads, length, batch, head_dim), repeats)


def run_mgk_attention(args, spec):
    """The attention alone, fwd+bwd: each MGK path with H/2 heads against SDPA with H, time and FLOP ratios."""
    heads, head_dim, batch = args.heads, BERT_SIZE["hidden_size"] // args.heads, args.batch
    rows = {(p, n): measure.call_child("measure_mgk_attention",
                                       [p, heads, n, batch, head_dim, args.repeats, args.threads])
            for n in spec["lengths"] for p in ("sdpa", *MGK_PATHS)}
    print(f"\n## mgk: attention alone, forward + backward (B={batch}, D={head_dim}, no mask): MGK paths with "
          f"{heads // 2} heads, M=2, against SDPA with {heads}; x = time / SDPA's")
    print("'x paper FLOPs': the papers' count (App. B) of the attention products, forward (softmax 2 H N^2 D, MGK "
          "(M + 1) H/2 N^2 D, sMGK 2 H/2 N^2 D); the target is 1.1 times it. 'x counted FLOPs': FlopCounterMode on "
          "the timed step, forward + backward (SDPA by PyTorch's formula: QK^T, AV and 4 backward products).")
    print("| N | SDPA ms | path | ms | x SDPA | x paper FLOPs | target (1.1x) | x counted FLOPs | peak MiB |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")

    def paper_cells(p, n, r, base):
        paper = mgk_paper_flops(p, heads, n, head_dim) / mgk_paper_flops("sdpa", heads, n, head_dim)
        return [f"{paper:.2f}", f"{1.1 * paper:.3f}"]

    print_alone_rows(spec["lengths"], MGK_PATHS, rows, paper_cells)


# ------------------------------------------------------------------ FiSH attention alone
# Causal (as in GPT-2), forward + backward of one attention call: SDPA with H heads against each FiSH type with H
# local heads mixed from M global ones, on the path the model's rule picks ("auto").
FISH_NOISY = ("fish", "mish", "gfish")  # the types with training noise (FiSHGPT2Config.is_noisy)
FISH_PATHS = {kind: (kind, "auto") for kind in FISH_TYPES}  # name -> (attention type, backend)


def fish_attention_step(path, heads, m, length, batch, head_dim):
    """fwd+bwd of one causal attention call: SDPA with `heads` heads, or a FiSH path (FISH_PATHS) with `heads` local
    and `m` global heads, its mixing as the model initialises it and sigma = 0.1 for the noisy types."""
    from hf_mgk import attention_fish as af

    g = measure.generator()
    grad = torch.randn(batch, heads, length, head_dim, generator=g)
    if path == "sdpa":
        q, k, v = (torch.randn(batch, heads, length, head_dim, generator=g, requires_grad=True) for _ in range(3))
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
    kind, backend = FISH_PATHS[path]
    q, k = (torch.randn(batch, m, length, head_dim, generator=g, requires_grad=True) for _ in range(2))
    v = torch.randn(batch, heads, length, head_dim, generator=g, requires_grad=True)
    if kind.endswith("gfish"):
        mixing = af.make_gfish_mixing(m, heads)
    else:
        mixing = torch.full((m, 1 if kind == "mish" else heads), 1.0 / m, requires_grad=True)
    noise = torch.full((m,), 0.1, requires_grad=True) if kind in FISH_NOISY else None
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
    paths = [p for p in FISH_PATHS if FISH_PATHS[p][0] in (args.fish_types or FISH_TYPES)]
    rows = {(p, n): measure.call_child("measure_fish_attention", [p, heads, m, n, batch, head_dim, args.repeats,
                                                                  args.threads])
            for n in lengths for p in ("sdpa", *paths)}
    print(f"\n## fish: attention alone, causal, forward + backward (B={batch}, D={head_dim}): each FiSH type with "
          f"{heads} local heads mixed from {m} global ones, on the path its rule picks, against SDPA with "
          f"{heads} heads; x = time / SDPA's. 'x counted FLOPs': FlopCounterMode on the step (SDPA by PyTorch's "
          "formula).")
    print("| N | SDPA ms | path | ms | x SDPA | x counted FLOPs | peak MiB |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    print_alone_rows(lengths, paths, rows)
