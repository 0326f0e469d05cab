"""The Triton kernels against the eager path on this device: per path, dtype and length, the largest error of the
output and of each gradient, each relative to the largest magnitude of the output or of all the gradients, the worst
as a multiple of the tolerance backend="auto" verifies the kernels with before using them
(attention_autotune.TOLERANCES), beside each arm's forward + backward time. Both arms run on the same random inputs
with noise and dropout off (the function both compute exactly), a padding mask, causal for the decoders' types, at
lengths that end inside a block (1000) and that fill them (1024).

    python -m hf_mgk.benchmark.agreement --device cuda                 # every path, float32 / bf16 / fp16

A row whose worst error passes the tolerance says DISAGREES: auto would keep the eager path for that kind of call.
On the CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1 before torch is imported), for tests."""

import argparse
import statistics
import time

import torch

from .. import attention_autotune as autotune
from ..attention_fish import choose_backend as fish_choice
from ..attention_fish import fish_attention, make_gfish_mixing
from ..attention_mgk import choose_backend as mgk_choice
from ..attention_mgk import mgk_attention, smgk_attention

DTYPES = {"float32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MGK_PATHS = ("mgk soft", "mgk hard", "smgk soft", "smgk hard")
FISH_PATHS = ("hard_fish", "mish", "hard_gfish")
PATHS = MGK_PATHS + FISH_PATHS


def _case(path, batch, heads, length, head_dim, dtype, device, global_heads=2, num_keys=2):
    """(names of the leaves, a function of (backend, leaves) giving the output, the leaves, the eager backend's name)
    for one path: MGK / sMGK with `heads` heads of M keys, or FiSH with `global_heads` global and `heads` local."""
    g = torch.Generator().manual_seed(0)

    def leaf(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(device, dtype).requires_grad_()

    mask = torch.ones(batch, length, dtype=torch.bool, device=device)
    mask[-1, length - length // 5:] = False  # the last sequence padded
    if path in MGK_PATHS:
        family, e_step = path.split()
        variances = [head_dim ** 0.5 * (1 + 2 * r) for r in range(num_keys)]
        q, v = leaf(batch, heads, length, head_dim), leaf(batch, heads, length, head_dim)
        lp = torch.log_softmax(torch.randn(heads, num_keys, generator=g), -1).to(device, dtype).requires_grad_(
            e_step == "soft")
        kw = dict(variances=variances, e_step=e_step, attention_mask=mask)
        if family == "smgk":
            k, shift = leaf(batch, heads, length, head_dim), leaf(heads, num_keys, head_dim, scale=0.5)
            leaves, names = [q, k, shift, v], ["q", "key", "shift", "v"]
            run = lambda backend, x: smgk_attention(*x[:4], log_prior=lp, backend=backend, **kw)  # noqa: E731
        else:
            leaves, names = [q, leaf(batch, heads, num_keys, length, head_dim), v], ["q", "keys", "v"]
            run = lambda backend, x: mgk_attention(*x[:3], log_prior=lp, backend=backend, **kw)  # noqa: E731
        if e_step == "soft":
            leaves, names = leaves + [lp], names + ["log_prior"]
        eager = mgk_choice(e_step=e_step, return_weights=False, device_type=device, dtype=dtype, autocast=False,
                           tracing=False, mask="padding", head_size=head_dim, num_keys=num_keys, requires_grad=True)
        return names, run, leaves, eager
    q, k = leaf(batch, global_heads, length, head_dim), leaf(batch, global_heads, length, head_dim)
    v = leaf(batch, heads, length, head_dim)
    if path == "hard_gfish":
        torch.manual_seed(0)
        network = make_gfish_mixing(global_heads, heads).to(device, dtype)
        params, names = list(network.parameters()), ["q", "k", "v", "W1", "b1", "W2", "b2"]
        mixing, kind = lambda x: network, "gfish"
    else:
        columns = 1 if path == "mish" else heads
        params, names = [leaf(global_heads, columns)], ["q", "k", "v", "mixing"]
        mixing, kind = (lambda x: x[3]), "shared" if path == "mish" else "heads"
    run = lambda backend, x: fish_attention(*x[:3], mixing(x), attention_mask=mask, is_causal=True,  # noqa: E731
                                            backend=backend)
    eager = fish_choice(mixing=kind, noise=False, dropout=False, return_weights=False, device_type=device,
                        dtype=dtype, autocast=False, requires_grad=True, tracing=False, mask="padding",
                        head_size=head_dim, num_global=global_heads)
    return names, run, [q, k, v, *params], eager


def _run(run, backend, leaves):
    """(output, gradients) of one call for a fixed random cotangent (attention_autotune.trial's)."""
    out = run(backend, leaves)
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
    return out, torch.autograd.grad(out, leaves, cotangent)


def _ms(run, backend, leaves, device, repeats):
    times = []
    for _ in range(repeats + 1):  # the first compiles
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        _run(run, backend, leaves)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times[1:])


def agreement_rows(paths, dtypes, lengths, batch, heads, head_dim, device, repeats):
    """One row per (path, dtype, length), as each is measured: (path, dtype name, N, eager backend,
    [(name, error)], worst as a multiple of the tolerance, triton ms, eager ms)."""
    for path in paths:
        for dtype_name in dtypes:
            dtype = DTYPES[dtype_name]
            for n in lengths:
                names, run, leaves, eager = _case(path, batch, heads, n, head_dim, dtype, device)
                found = autotune.relative_errors(_run(run, "triton", leaves), _run(run, eager, leaves))
                worst = max(found) / autotune.TOLERANCES[dtype]
                times = [_ms(run, name, leaves, device, repeats) for name in ("triton", eager)] if repeats else [
                    float("nan")] * 2
                yield path, dtype_name, n, eager, list(zip(["out", *names], found)), worst, *times


def print_rows(rows):
    """The table, a row as soon as it is measured (a time-out keeps what was done); returns the rows."""
    print(f"{'path':<11} {'dtype':<7} {'N':>5} {'eager':<10} {'worst/tol':>9}  {'triton ms':>9} {'eager ms':>9}  "
          "largest relative errors (out: of the output's scale; gradients: of the largest gradient's)", flush=True)
    done = []
    for row in rows:
        path, dtype, n, eager, found, worst, t_ms, e_ms = row
        said = "  DISAGREES" if not worst <= 1.0 else ""
        cells = " ".join(f"{name}={err:.1e}" for name, err in found)
        print(f"{path:<11} {dtype:<7} {n:>5} {eager:<10} {worst:>9.3f}  {t_ms:>9.3f} {e_ms:>9.3f}  {cells}{said}",
              flush=True)
        done.append(row)
    return done


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--paths", nargs="*", choices=PATHS, default=list(PATHS))
    p.add_argument("--dtypes", nargs="*", choices=sorted(DTYPES), default=["float32", "bf16", "fp16"])
    p.add_argument("--lengths", type=int, nargs="*", default=[1000, 1024])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5, help="timed calls per arm (0: no timing)")
    args = p.parse_args(argv)
    return print_rows(agreement_rows(args.paths, args.dtypes, args.lengths, args.batch, args.heads, args.head_dim,
                                     args.device, args.repeats))


if __name__ == "__main__":
    main()
