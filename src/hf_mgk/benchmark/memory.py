"""The memory of the attention paths that hold N x S numbers, against SDPA: for each path (PATHS), the peak bytes
torch's CPU allocator holds during one attention call (forward + backward for a training path, a forward under
no_grad for an evaluation one; `measure.allocated_peaks`) at each length, SDPA's in the same mode, and the growth per
doubling of N: about 4 where a path holds N x S numbers, about 2 where its memory is O(N).

    python -m hf_mgk.benchmark.memory                       # N = 512 and 1024, B = 1, 4 heads of 64, M = 2
    python -m hf_mgk.benchmark.memory --lengths 256 512 1024 --heads 8 --paths "MGK hard, dense" "NPRF, band"

Every path runs on the CPU in float32 with its backend named (not the backend rule), on random inputs: MGK / MLK
with H heads and M keys, FiSH with H local heads mixed from M global ones (causal, as in FiSH-GPT2), NPRF
bidirectional with T5 buckets (32 / 128) and m random features. Memory does not depend on the machine's speed, so one
run is enough; in bfloat16 / float16 the N x S tensors of the dense paths take half the bytes (the EM M-step's stay
float32). docs/usage.md ("Limits and memory") has the table and when each path runs."""

import argparse
import sys
from types import SimpleNamespace

import torch
from tqdm.auto import tqdm  # a dependency of transformers

from . import measure
from .attention import FISH_NOISY, _leaf
from .nprf import growth_per_doubling, nprf_attention_step

TRAIN, EVAL = "fwd+bwd", "fwd, no grad"


def _call_step(call, train, grad):
    """The step of one call: forward + backward with `grad` upstream, or a forward under no_grad."""
    if not train:
        def step():
            with torch.no_grad():
                call()
        return step

    def step():
        out = call()
        (out[0] if isinstance(out, tuple) else out).backward(grad)
    return step


def sdpa_step(a, n, train, causal):
    """SDPA with a.heads heads of a.head_dim: the baseline of every path in the same mode."""
    g = measure.generator()
    q, k, v, grad = (_leaf((a.batch, a.heads, n, a.head_dim), g, train and i < 3) for i in range(4))
    return _call_step(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal), train,
                      grad)


def mgk_step(a, n, train, *, backend, e_step="soft", causal=False, weights=False, mlk=False, m_step=False, **kw):
    """One MGK (or MLK) call with a.heads heads, a.keys keys per position; `m_step`: the EM prior's M-step
    (mgk_responsibilities, which runs under no_grad once per layer in every training forward with mgk_prior="em")."""
    from hf_mgk import attention_mgk as am

    g = measure.generator()
    q, v, grad = (_leaf((a.batch, a.heads, n, a.head_dim), g, train and i < 2) for i in range(3))
    keys = _leaf((a.batch, a.heads, a.keys, n, a.head_dim), g, train)
    variances = [a.head_dim ** 0.5 * (1 + 2 * r) for r in range(a.keys)]
    prior = torch.log_softmax(torch.zeros(a.heads, a.keys), -1)
    if m_step:
        return lambda: am.mgk_responsibilities(q, keys, variances=variances, log_prior=prior, is_causal=causal)
    if mlk:
        def call():
            return am.mlk_attention(q, keys, v, log_prior=prior, is_causal=causal, return_weights=weights,
                                    backend=backend)
    else:
        def call():
            return am.mgk_attention(q, keys, v, variances=variances, log_prior=prior, e_step=e_step,
                                    is_causal=causal, return_weights=weights, backend=backend, **kw)
    return _call_step(call, train, grad)


def fish_step(a, n, train, *, kind, backend, dropout_p=0.0, **kw):
    """One causal FiSH call: a.heads local heads mixed from a.keys global ones, sigma = 0.1 for the noisy types
    (in training), the mixing as the model initialises it."""
    from hf_mgk import attention_fish as af

    g = measure.generator()
    q, k = (_leaf((a.batch, a.keys, n, a.head_dim), g, train) for _ in range(2))
    v = _leaf((a.batch, a.heads, n, a.head_dim), g, train)
    grad = _leaf((a.batch, a.heads, n, a.head_dim), g, False)
    if kind.endswith("gfish"):
        mixing = af.make_gfish_mixing(a.keys, a.heads).requires_grad_(train)
    else:
        mixing = torch.full((a.keys, 1 if kind == "mish" else a.heads), 1.0 / a.keys, requires_grad=train)
    noise = torch.full((a.keys,), 0.1, requires_grad=True) if train and kind in FISH_NOISY else None
    return _call_step(lambda: af.fish_attention(q, k, v, mixing, noise_std=noise, is_causal=True, backend=backend,
                                                dropout_p=dropout_p, generator=g, **kw), train, grad)


def nprf_step(a, n, train, *, backend):
    """One bidirectional NPRF call (T5 buckets; benchmark.nprf's step) with a.heads heads and a.features features."""
    return nprf_attention_step(backend, n, False, a.batch,
                               size={"heads": a.heads, "head_dim": a.head_dim, "features": a.features})


# name -> (mode, causal, step builder (args, N, train) -> step). The name says the backend; docs/usage.md ("Limits
# and memory") says when each one runs and how to avoid the N x S ones.
PATHS = {
    "MGK soft, blocked": (TRAIN, False, lambda a, n, t: mgk_step(a, n, t, backend="blocked")),
    "MGK soft, blocked, keep_bytes=0": (TRAIN, False, lambda a, n, t: mgk_step(a, n, t, backend="blocked",
                                                                               keep_bytes=0)),
    "MGK soft, blocked, eval": (EVAL, False, lambda a, n, t: mgk_step(a, n, t, backend="blocked")),
    "MGK soft, SDPA-aug": (TRAIN, False, lambda a, n, t: mgk_step(a, n, t, backend="sdpa")),
    "MGK soft, SDPA-aug, causal": (TRAIN, True, lambda a, n, t: mgk_step(a, n, t, backend="sdpa", causal=True)),
    "MGK hard, dense": (TRAIN, False, lambda a, n, t: mgk_step(a, n, t, backend="dense", e_step="hard")),
    "MGK soft, dense, weights": (EVAL, False, lambda a, n, t: mgk_step(a, n, t, backend="dense", weights=True)),
    "MGK EM prior, M-step": (EVAL, False, lambda a, n, t: mgk_step(a, n, t, backend=None, m_step=True)),
    "MLK, dense, weights": (EVAL, False, lambda a, n, t: mgk_step(a, n, t, backend="dense", mlk=True,
                                                                  weights=True)),
    "MLK, linear, causal": (TRAIN, True, lambda a, n, t: mgk_step(a, n, t, backend="linear", mlk=True,
                                                                  causal=True)),
    "hard_fish, fused, eval": (EVAL, True, lambda a, n, t: fish_step(a, n, t, kind="hard_fish", backend="fused")),
    "hard_fish, recomputed": (TRAIN, True, lambda a, n, t: fish_step(a, n, t, kind="hard_fish",
                                                                     backend="recomputed")),
    "hard_fish, recomputed, keep_bytes=0": (TRAIN, True, lambda a, n, t: fish_step(
        a, n, t, kind="hard_fish", backend="recomputed", keep_bytes=0)),
    "fish, recomputed, keep_bytes=0": (TRAIN, True, lambda a, n, t: fish_step(a, n, t, kind="fish",
                                                                              backend="recomputed", keep_bytes=0)),
    "hard_fish, blocked, dropout 0.1": (TRAIN, True, lambda a, n, t: fish_step(a, n, t, kind="hard_fish",
                                                                               backend="blocked", dropout_p=0.1)),
    "NPRF, explicit": (TRAIN, False, lambda a, n, t: nprf_step(a, n, t, backend="explicit")),
    "NPRF, band": (TRAIN, False, lambda a, n, t: nprf_step(a, n, t, backend="band")),
    "NPRF, FFT": (TRAIN, False, lambda a, n, t: nprf_step(a, n, t, backend="fft")),
}


def measure_paths(paths, lengths, a):
    """{(path, N): peak bytes} of every path of `paths` and of SDPA in each mode they use ("SDPA, <mode>[,
    causal]"), from one `measure.allocated_peaks` pass."""
    names = {}
    for path in paths:
        mode, causal, build = PATHS[path]
        train = mode == TRAIN
        names[path] = (lambda n, build=build, train=train: (lambda: build(a, n, train)))
        names[sdpa_name(path)] = (lambda n, train=train, causal=causal: (lambda: sdpa_step(a, n, train, causal)))
    cases = [(name, n) for n in lengths for name in names]
    # A bar on stderr (the table is stdout), advanced as each case is measured: the default run takes minutes.
    makers = tqdm([names[name](n) for name, n in cases], desc="peak memory", unit="case", file=sys.stderr)
    # No warm-up call: it changed no peak of these paths (measured), and the FFT path's calls take seconds.
    peaks = measure.allocated_peaks(makers, warm_up=False)
    return dict(zip(cases, peaks))


def sdpa_name(path):
    """The SDPA baseline of a path: SDPA in the path's mode, causal where the path is."""
    mode, causal, _ = PATHS[path]
    return f"SDPA, {mode}" + (", causal" if causal else "")


def print_table(paths, lengths, peaks, a):
    mib = lambda b: f"{b / 2**20:.2f}"  # noqa: E731
    print(f"\n## Peak memory of one attention call, torch's CPU allocator (B={a.batch}, H={a.heads} heads of "
          f"{a.head_dim}, M={a.keys} keys / global heads, m={a.features} NPRF features, float32, torch "
          f"{torch.__version__}); x per doubling: peak(2N) / peak(N), about 4 for N x S, about 2 for O(N)")
    head = [f"N={n} MiB" for n in lengths] + ["x per doubling"] + [f"SDPA N={n} MiB" for n in lengths]
    print("| path | mode | " + " | ".join(head) + f" | x SDPA at N={lengths[-1]} |")
    print("|---|---|" + "---:|" * (len(head) + 1))
    for path in paths:
        own = {n: peaks[(path, n)] for n in lengths}
        base = {n: peaks[(sdpa_name(path), n)] for n in lengths}
        growth = ", ".join(f"{g:.2f}" for *_, g in growth_per_doubling(own)) if all(own.values()) else "-"
        cells = [mib(own[n]) for n in lengths] + [growth] + [mib(base[n]) for n in lengths]
        ratio = f"{own[lengths[-1]] / base[lengths[-1]]:.1f}" if base[lengths[-1]] else "-"
        print(f"| {path} | {PATHS[path][0]}{', causal' if PATHS[path][1] else ''} | " + " | ".join(cells)
              + f" | {ratio} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 1024], help="N = S (default: %(default)s)")
    p.add_argument("--heads", type=int, default=4, help="H of every path and of SDPA (default: %(default)s)")
    p.add_argument("--keys", type=int, default=2, help="MGK's keys / FiSH's global heads M (default: %(default)s)")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--features", type=int, default=64, help="NPRF's random features m (default: %(default)s)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS), metavar="PATH",
                   help="the paths to measure (default: all): " + "; ".join(PATHS))
    args = p.parse_args(argv)
    lengths = sorted(set(args.lengths))
    if len(lengths) < 2:
        p.error("--lengths: give at least two different lengths (the growth is between them)")
    torch.set_num_threads(args.threads)
    a = SimpleNamespace(**{k: getattr(args, k) for k in ("heads", "keys", "head_dim", "features", "batch")})
    peaks = measure_paths(args.paths, lengths, a)
    print_table(args.paths, lengths, peaks, a)
    return peaks


if __name__ == "__main__":
    main()
