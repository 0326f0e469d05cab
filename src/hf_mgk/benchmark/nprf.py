"""NPRF attention alone, forward + backward of one call on random inputs: each exact path against SDPA,
bidirectional and causal, per length, with the time's growth per doubling of N and the crossover (the nprf
family's tables before its whole models). Each (path, N) is measured in its own child (`measure_attention`)."""

import math

import torch

from . import measure
from .models import NPRF_ATTN
from .tables import format_ms

NPRF_PATHS = ("explicit", "fft", "band")


def nprf_attention_step(path, length, causal, batch, size=None):
    """fwd+bwd of one attention call on random (B, H, N, D) inputs: SDPA or one exact NPRF path; `size` in place
    of NPRF_ATTN's heads, head_dim, features where it names them."""
    from hf_mgk import attention_nprf as an

    h, d, m = ({**NPRF_ATTN, **(size or {})}[k] for k in ("heads", "head_dim", "features"))
    q, k, v = (torch.randn(batch, h, length, d, requires_grad=True) for _ in range(3))
    # A dense upstream gradient, as from the layers above (`.sum().backward()` would pass a stride-0 one, which
    # makes bmm's backward copy it matrix by matrix).
    grad = torch.randn(batch, h, length, d)
    if path == "sdpa":
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(grad)
    table = torch.zeros(h, 32, requires_grad=True)  # T5 buckets, the model's defaults (32 buckets, distance 128)
    w = an.t5_constant_distance(not causal, 32, 128)
    features = an.draw_features(m, d, measure.generator())

    def step():
        bias = an.rpe_bias_from_buckets(table, length, bidirectional=not causal, max_distance=128)
        an.nprf_attention(q, k, v, bias, features, max_distance=w, is_causal=causal, backend=path).backward(grad)
    return step


def nprf_explicit_fits(length, batch):
    """The explicit path keeps several B*H*N*N float32 tensors for backward: skip it where that passes ~8 GiB."""
    return 6 * batch * NPRF_ATTN["heads"] * length * length * 4 < 8 * 2**30


def measure_attention(path, length, causal, batch, repeats, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    return measure.timed(nprf_attention_step(path, length, causal, batch), repeats)[0]


def growth_per_doubling(seconds):
    """{N: seconds} -> [(N1, N2, factor)] for consecutive measured lengths: the time's factor per doubling of N,
    (t(N2) / t(N1)) ** (1 / log2(N2 / N1)), which is t(2N) / t(N) when N2 = 2 N1."""
    ns = sorted(seconds)
    return [(a, b, (seconds[b] / seconds[a]) ** (1 / math.log2(b / a))) for a, b in zip(ns, ns[1:])]


def stays_ahead_from(seconds, baseline):
    """The smallest N (of those measured in both {N: seconds}) from which `seconds` is below `baseline` at that N
    and at every larger one; None if it is not ahead at the largest."""
    start = None
    for n in sorted(set(seconds) & set(baseline), reverse=True):
        if seconds[n] >= baseline[n]:
            break
        start = n
    return start


def run_nprf(args):
    """Attention fwd+bwd per path and length, growth per doubling and the crossover (the whole models follow in
    main's loop). Lengths above 4096 are timed once (a single 16k SDPA step takes tens of seconds here)."""
    lengths = args.lengths or [512, 1024, 2048, 4096, 8192, 16384]
    batch = args.batch
    for causal in (False, True):
        rows = {}
        for length in lengths:
            for path in ("sdpa",) + NPRF_PATHS:
                if path == "explicit" and not nprf_explicit_fits(length, batch):
                    rows[(path, length)] = {"error": "skipped (N^2 memory)"}
                    continue
                repeats = args.repeats if length <= 4096 else 1
                rows[(path, length)] = measure.call_child("measure_attention", [path, length, causal, batch, repeats,
                                                                                 args.threads])
        title = ("causal" if causal else "bidirectional") + " attention, fwd+bwd"
        print(f"\n## nprf: {title} (B={batch}, H={NPRF_ATTN['heads']}, D={NPRF_ATTN['head_dim']}, "
              f"m={NPRF_ATTN['features']}, T5 buckets 32/128); ratio = time / SDPA's")
        print("| N | SDPA ms | " + " | ".join(f"{p} ms | x SDPA | MiB" for p in NPRF_PATHS) + " | SDPA MiB |")
        print("|---:|---:|" + "---:|---:|---:|" * len(NPRF_PATHS) + "---:|")
        for length in lengths:
            s = rows[("sdpa", length)]
            cells = []
            for p in NPRF_PATHS:
                r = rows[(p, length)]
                if "error" in r or "error" in s:
                    cells.append(f"{r.get('error', '')} | | ")
                else:
                    cells.append(f"{format_ms(r['seconds'])} | {r['seconds'] / s['seconds']:.2f} | "
                                 f"{r['peak_mib']:.0f}")
            sdpa_ms = format_ms(s["seconds"]) if "error" not in s else s["error"]
            print(f"| {length} | {sdpa_ms} | " + " | ".join(cells) + f" | {s.get('peak_mib', 0):.0f} |")
        seconds = {p: {n: rows[(p, n)]["seconds"] for n in lengths if "error" not in rows[(p, n)]}
                   for p in ("sdpa",) + NPRF_PATHS}
        print("\ngrowth per doubling of N (time(2N) / time(N); per doubling where measured lengths skip one):")
        for p, t in seconds.items():
            print(f"  {p}: " + ", ".join(f"{a}->{b} {g:.2f}" for a, b, g in growth_per_doubling(t)))
        fastest = {n: min(seconds[p][n] for p in NPRF_PATHS if n in seconds[p])
                   for n in lengths if any(n in seconds[p] for p in NPRF_PATHS)}
        print(f"crossover: the smallest N from which a path is faster than SDPA at every larger measured N as well "
              f"(lengths tried {lengths}):")
        for name, t in [("fastest exact NPRF path", fastest)] + [(p, seconds[p]) for p in NPRF_PATHS]:
            n = stays_ahead_from(t, seconds["sdpa"])
            print(f"  {name}: " + (f"from N = {n}" if n is not None else "never stays ahead (not faster at the "
                                   "largest N measured for both)"))
