"""The benchmark's MGK attention-alone table (hf_mgk.benchmark.attention): the papers' FLOP formula, what
FlopCounterMode counts on the blocked paths (the products the formula needs, no M*S augmented keys), and one
in-process run of the table at a tiny length. No timed assertion: the machine is shared and noisy."""

import argparse
import contextlib
import io

import pytest
import torch

from hf_mgk import attention_mgk as am
from hf_mgk.benchmark import attention as bench
from hf_mgk.benchmark import measure
from hf_mgk.benchmark.counting import flop_counter_mode

from conftest import children_in_process


def test_paper_formula_is_the_issue_count():
    """16 N^2 D for 8 softmax heads, 12 N^2 D for MGK with 4 heads and M = 2, 8 N^2 D for sMGK."""
    n, d = 512, 64
    assert bench.mgk_paper_flops("sdpa", 8, n, d) == 16 * n * n * d
    assert bench.mgk_paper_flops("MGK soft", 8, n, d) == bench.mgk_paper_flops("MGK hard", 8, n, d) == 12 * n * n * d
    assert bench.mgk_paper_flops("sMGK soft", 8, n, d) == 8 * n * n * d


def test_paper_formula_counts_the_dense_form():
    """FlopCounterMode (2 per multiply-add) on the N x N x M matmul form, forward: exactly twice the formula."""
    b, heads, n, d = 1, 8, 12, 16
    q, v = torch.randn(b, heads // 2, n, d), torch.randn(b, heads // 2, n, d)
    keys = torch.randn(b, heads // 2, 2, n, d)
    with torch.no_grad(), flop_counter_mode() as fc:
        am.mgk_attention(q, keys, v, variances=[4.0, 12.0], backend="dense")
    assert fc.get_total_flops() == 2 * bench.mgk_paper_flops("MGK soft", heads, n, d)


@pytest.mark.parametrize("path", ["MGK soft", "sMGK soft", "MGK hard", "sMGK hard"])
def test_blocked_paths_pay_what_the_formula_needs(path):
    """Counted on the blocked path, forward: R score products of width D + 2 (R = M keys for MGK, 1 for sMGK)
    and one value product; forward + backward (probabilities kept): besides, dV and dq, dk (D each, M of them
    for MGK) and dS' (Dv + 1). Per (query, key) pair and head, x 2 FLOPs. sMGK adds terms linear in N: the
    shifts' products with the keys (b_r . k_j), forward, and four such products for the gradients of q, k, b."""
    b, heads, n, d = 1, 8, 40, 16
    kind, _, m, _ = bench.MGK_PATHS[path]
    r = 1 if kind == "smgk" else m
    per_pair_fwd = r * (d + 2) + d
    per_pair_bwd = d + (d + 1) + 2 * r * d
    pairs = b * (heads // 2) * n * n
    linear = 2 * b * (heads // 2) * n * m * d if kind == "smgk" else 0
    step = bench.mgk_attention_step(path, heads, n, b, d)
    with flop_counter_mode() as fc:
        step()
    assert fc.get_total_flops() == 2 * pairs * (per_pair_fwd + per_pair_bwd) + 5 * linear
    with torch.no_grad(), flop_counter_mode() as fc:
        g = torch.Generator().manual_seed(0)
        q, v = torch.randn(b, heads // 2, n, d, generator=g), torch.randn(b, heads // 2, n, d, generator=g)
        if kind == "smgk":
            am.smgk_attention(q, torch.randn(b, heads // 2, n, d), torch.randn(heads // 2, m, d), v,
                              variances=[4.0, 12.0], e_step=bench.MGK_PATHS[path][1])
        else:
            am.mgk_attention(q, torch.randn(b, heads // 2, m, n, d), v, variances=[4.0, 12.0],
                             e_step=bench.MGK_PATHS[path][1])
    assert fc.get_total_flops() == 2 * pairs * per_pair_fwd + linear
    # within the 2 augmented columns of the formula: (R (D + 2) + D) / ((R + 1) D)
    assert (fc.get_total_flops() - linear) / (2 * bench.mgk_paper_flops(path, heads, n, d)) == pytest.approx(
        (r * (d + 2) + d) / ((r + 1) * d))


@pytest.mark.parametrize("path", ["sdpa", *bench.MGK_PATHS])
def test_attention_step_gives_gradients(path):
    step = bench.mgk_attention_step(path, 4, 24, 2, 8)
    step()
    leaves = [c.cell_contents for c in step.__closure__ if isinstance(c.cell_contents, torch.Tensor)
              and c.cell_contents.requires_grad]
    assert leaves and all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves)


def test_attention_table_in_process(monkeypatch):
    calls = []
    threads = torch.get_num_threads()
    monkeypatch.setattr(measure, "call_child", children_in_process(calls))
    monkeypatch.setattr("sys.argv", ["benchmark.py", "--heads", "8", "--repeats", "1", "--threads", str(threads)])
    args = argparse.Namespace(heads=8, batch=1, repeats=1, threads=threads, device="cpu", dtype="fp32",
                              interleave=False)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench.run_mgk_attention(args, {"lengths": [32]})
    torch.set_num_threads(threads)
    lines = out.getvalue().splitlines()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| 32 |")]
    assert "| N | SDPA ms | path | ms | x SDPA | x paper FLOPs | target (1.1x) | x counted FLOPs | peak MiB |" in lines
    assert [r[2] for r in rows] == list(bench.MGK_PATHS) and all(len(r) == 9 for r in rows)
    assert {c[1][0] for c in calls} == {"sdpa", *bench.MGK_PATHS}
    for r in rows:
        ms, base_ms, ratio = float(r[3]), float(r[1]), float(r[4])
        assert abs(ratio - ms / base_ms) <= 0.005 + 0.011 * ms / base_ms
        assert float(r[6]) == pytest.approx(1.1 * float(r[5]), abs=2e-3)
    paper = {r[2]: float(r[5]) for r in rows}
    assert paper == {"MGK soft": 0.75, "sMGK soft": 0.5, "MGK hard": 0.75, "sMGK hard": 0.5,
                     "MGK soft, SDPA-aug": 0.75}
