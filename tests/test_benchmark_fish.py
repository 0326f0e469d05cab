"""The FLOP / parameter counting of the benchmark's fish family (hf_mgk.benchmark.counting) against App. D
(fishformer, App. D).

FlopCounterMode counts 2*m*n*k per product (m x k)(k x n) and no elementwise op; App. D counts (2k-1)*m*n plus
the noise add. So the counted attention-matrix part must be App. D's terms with 2k in place of 2k-1: that is
asserted exactly, so the benchmark's counted column measures what App. D describes, on the models' own layers.
"""


import argparse
import contextlib
import io

import pytest
import torch
import torch.nn.functional as F

from hf_mgk.benchmark import attention, counting, measure, models
from hf_mgk.flops import fish_cost

from conftest import children_in_process

D_X, H, M, D, LAYERS = 32, 4, 2, 8, 2
SIZE = dict(n_embd=D_X, n_layer=LAYERS, n_inner=64, vocab_size=50, bos_token_id=0, eos_token_id=0,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


@pytest.fixture(autouse=True)
def _tiny(monkeypatch):
    _use_size(monkeypatch, SIZE)


def _use_size(monkeypatch, size):
    for kind in ("gpt2", "fish_gpt2"):
        entry = list(models.BUILDERS[kind])
        entry[3] = size
        monkeypatch.setitem(models.BUILDERS, kind, tuple(entry))


def _model(attention_type):
    if attention_type == "softmax":
        return models.build("gpt2", {"n_head": H}, 16).train()
    return models.build("fish_gpt2", {"n_head": H, "head_dim": D, "num_global_heads": M,
                                     "attention_type": attention_type}, 16).train()


def _matmul_convention(attention_type, n):
    """App. D's attention-matrix part per layer, with 2k per product entry instead of 2k-1 and no adds."""
    if attention_type == "softmax":
        return 2 * n * D_X * 2 * H * D + 2 * H * n * n * D
    qk = 2 * n * D_X * 2 * M * D + 2 * M * n * n * D
    if attention_type in ("fish", "hard_fish"):
        return qk + 2 * H * M * n * n  # (H, M) @ (M, N*N)
    if attention_type == "mish":
        return qk + 2 * 1 * M * n * n
    return qk + 2 * M * H * n * n + 2 * H * H * n * n  # Linear(M, H), Linear(H, H)


@pytest.mark.parametrize("attention_type", ["softmax", "fish", "hard_fish", "mish", "gfish", "hard_gfish"])
def test_counted_attention_matrix_part_is_app_d_in_the_2mnk_convention(attention_type):
    model = _model(attention_type)
    batch, n = 2, 24
    counted = sum(counting.attention_matrix_flops(block.attn, batch, n) for block in model.h)
    assert counted == LAYERS * batch * _matmul_convention(attention_type, n)
    # parameters have no convention to differ in: counted on the modules == App. D (iii)/(iv)
    ref = fish_cost(D_X, H, M, D, n, variant="fish" if attention_type == "softmax" else attention_type)
    key = "mha_params" if attention_type == "softmax" else "fish_params"
    assert sum(counting.attention_matrix_params(block.attn) for block in model.h) == LAYERS * ref[key]
    assert counting.app_d(model.config, batch, n)["appd_params"] == LAYERS * ref[key]


def test_counted_ratio_tracks_app_d_at_the_benchmark_size(monkeypatch):
    """At the benchmark's own size (d=512, H=8, M=2, D=64) only QK^T grows with N^2 * D, so the fish/softmax
    ratio of the counted part tends to M/H + M/D (global scores + mixing) and agrees with App. D's ratio
    within 3% (the 2k vs 2k-1 convention, largest on the mixing: 2M vs 2M-1 per entry): the counted column
    and App. D's measure the same thing."""
    n, h, m = 4096, 8, 2
    size = {**models.GPT2_SIZE, "n_layer": 1}
    _use_size(monkeypatch, size)
    soft = models.build("gpt2", {"n_head": h}, 16)
    hard = models.build("fish_gpt2", {"n_head": h, "num_global_heads": m, "attention_type": "hard_fish"}, 16)
    c_soft = counting.attention_matrix_flops(soft.h[0].attn, 1, n)
    c_fish = counting.attention_matrix_flops(hard.h[0].attn, 1, n)
    d = size["n_embd"] // h
    assert c_fish / c_soft == pytest.approx(m / h + m / d, rel=0.05)
    d_soft = counting.app_d(soft.config, 1, n)["appd_flops"]
    d_fish = counting.app_d(hard.config, 1, n)["appd_flops"]
    assert c_fish / c_soft == pytest.approx(d_fish / d_soft, rel=0.03)


def test_cpu_sdpa_is_counted_on_the_causal_triangle():
    """Stock FlopCounterMode counts 0 for the CPU flash kernel; the benchmark's mapping counts QK^T and PV on
    the visible pairs, forward and backward."""
    n, d = 12, 4
    q = torch.randn(1, H, n, d, requires_grad=True)
    with torch.utils.flop_counter.FlopCounterMode(display=False) as stock:
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    visible = n * (n + 1) // 2
    with counting.flop_counter_mode() as fc:
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    if stock.get_total_flops() == 0:  # the CPU flash kernel ran (no PyTorch formula)
        assert fc.get_total_flops() == 2 * 2 * H * visible * d
    with counting.flop_counter_mode() as fc:
        F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    if stock.get_total_flops() == 0:
        full = (torch.utils.flop_counter.sdpa_flop_count(q.shape, q.shape, q.shape)
                + torch.utils.flop_counter.sdpa_backward_flop_count(q.shape, q.shape, q.shape, q.shape))
        assert fc.get_total_flops() == full // (n * n) * visible


def test_whole_model_counts():
    """count_flops on the real forward: the attention modules' share is exactly what differs between the
    models (the MLPs are the same), and forward + backward is about 3x the forward."""
    ids = torch.randint(0, SIZE["vocab_size"], (1, 64))
    soft = counting.flop_report(_model("softmax"), ids)
    fish = counting.flop_report(_model("hard_fish"), ids)
    for r in (soft, fish):
        assert 0 < r["flops_attn"] < r["flops_fwd"]
        assert 2.5 * r["flops_fwd"] <= r["flops_fwd_bwd"] <= 3.5 * r["flops_fwd"]
    assert soft["flops_fwd"] - soft["flops_attn"] == fish["flops_fwd"] - fish["flops_attn"]
    assert fish["params_score"] < soft["params_score"]


@pytest.mark.parametrize("path", ["sdpa", "hard_fish", "mish", "gfish"])
def test_fish_attention_step_gives_gradients(path):
    """The benchmark's step reaches every leaf: q, k, v, and the mixing and sigma where the type has them."""
    step = attention.fish_attention_step(path, 4, 2, 24, 2, 8)
    step()
    leaves = [c.cell_contents for c in step.__closure__ if isinstance(c.cell_contents, torch.Tensor)
              and c.cell_contents.requires_grad]
    expected = 3 if path == "sdpa" else 3 + (path != "gfish") + (path in attention.FISH_NOISY)
    assert len(leaves) == expected and all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves)


def test_fish_attention_table_in_process(monkeypatch):
    """Every FiSH type's row (the path its rule picks) beside SDPA, ratios from the printed times."""
    calls = []
    threads = torch.get_num_threads()
    monkeypatch.setattr(measure, "call_child", children_in_process(calls))
    args = argparse.Namespace(heads=4, global_heads=2, batch=1, repeats=1, threads=threads, lengths=[32],
                              fish_types=None, device="cpu", dtype="fp32", interleave=False)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        attention.run_fish_attention(args, {})
    torch.set_num_threads(threads)
    lines = out.getvalue().splitlines()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| 32 |")]
    assert "| N | SDPA ms | path | ms | x SDPA | x counted FLOPs | peak MiB |" in lines
    assert [r[2] for r in rows] == list(attention.FISH_PATHS) == list(models.FISH_TYPES)
    assert all(len(r) == 7 for r in rows)
    assert {c[1][0] for c in calls} == {"sdpa", *attention.FISH_PATHS}
    for r in rows:
        ms, base_ms, ratio = float(r[3]), float(r[1]), float(r[4])
        assert abs(ratio - ms / base_ms) <= 0.005 + 0.011 * ms / base_ms
        assert float(r[5]) > 0
