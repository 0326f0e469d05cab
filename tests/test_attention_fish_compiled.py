"""The compiled FiSH path (`backend="compiled"`) against the plain reference: its functions run eagerly (fast tier)
and compiled (slow), every FiSH type, padding, causal, several blocks of rows, dropout; the in-kernel noise
(`counter_normal`) and its distribution; graphs over varying lengths; refusals and the fallback."""

import math

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from hf_mgk import attention_compile
from hf_mgk import attention_fish as AF
from hf_mgk.reference import fish_attention_reference
from test_attention_fish import VARIANTS, assert_grads_rel, assert_rel, make_case

B, M, H = 2, 2, 3
SMALL_BLOCKS = 2**8  # bytes of scores per block: blocks of 1-3 rows here, so block edges are exercised


def compiled_and_reference(variant, N, S, causal, pad, block_bytes, dtype=torch.float32, dropout_p=0.0):
    """(out, grads) of the compiled path and of the reference given the compiled path's noise."""
    args, kwargs, leaves = make_case(variant, N=N, S=S, pad=pad)
    if dtype != torch.float32:
        leaves = [t.detach().to(dtype).requires_grad_() for t in leaves]
        mixing = args[3]
        if isinstance(mixing, nn.Module):
            mixing = mixing.to(dtype)
            leaves[3:3 + len(list(mixing.parameters()))] = list(mixing.parameters())
        else:
            mixing = leaves[3]
        args = (*leaves[:3], mixing)
        if "noise_std" in kwargs:
            kwargs = dict(kwargs, noise_std=leaves[-1])
    results = []
    for fn in ("compiled", "reference"):
        for t in leaves:
            t.grad = None
        if fn == "compiled":
            out = AF.fish_attention(*args, **kwargs, is_causal=causal, backend="compiled", dropout_p=dropout_p,
                                    generator=torch.Generator().manual_seed(3), compiled_block_bytes=block_bytes)
        else:
            heads = M if isinstance(args[3], nn.Module) else H
            seed = attention_compile.draw_seed(torch.Generator().manual_seed(3), "cpu")
            noise = AF.compiled_noise(seed, B, heads, N, S, dtype)
            out = fish_attention_reference(*args, **kwargs, is_causal=causal, noise=noise)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=dtype)
        (out * weights).sum().backward()
        results.append((out.detach(), [t.grad.clone() for t in leaves]))
    return results


@pytest.fixture
def eager(monkeypatch):
    """The compiled path's functions run eagerly (attention_compile.run without compiling): the same math, fast."""
    monkeypatch.setattr(attention_compile, "compile_enabled", lambda: False)
    monkeypatch.setattr(attention_compile, "why_not_compiled", lambda device: None)  # still taken by name


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("N,S,causal,pad", [(6, 6, False, True), (6, 6, True, True), (3, 7, True, True),
                                           (7, 4, True, False), (1, 5, True, True)])
def test_compiled_functions_match_reference(eager, variant, N, S, causal, pad):
    """Outputs and every gradient (q, k, v, p or the network, sigma) against the reference fed the same noise; N > S
    causal has rows that see no key (zero output); several blocks of rows per call."""
    (out, grads), (ref, ref_grads) = compiled_and_reference(variant, N, S, causal, pad, SMALL_BLOCKS)
    assert_rel(out, ref)
    assert_grads_rel(grads, ref_grads)


@pytest.mark.parametrize("variant", ["fish", "mish_noise", "gfish"])
def test_compiled_functions_float64_are_exact(eager, variant):
    (out, grads), (ref, ref_grads) = compiled_and_reference(variant, 9, 9, True, True, SMALL_BLOCKS, torch.float64)
    assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for g, r in zip(grads, ref_grads, strict=True):
        assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_noise_does_not_depend_on_the_blocks(eager):
    """The noise of a pair is a function of (seed, its position in the whole tensor): the same output whatever the
    block size, and another seed gives another output."""
    args, kwargs, _ = make_case("fish", N=8, S=8, pad=True)
    outs = [AF.fish_attention(*args, **kwargs, is_causal=True, backend="compiled", compiled_block_bytes=size,
                              generator=torch.Generator().manual_seed(seed))
            for size, seed in ((2**8, 1), (2**26, 1), (2**26, 2))]
    assert_close(outs[0], outs[1], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(outs[1], outs[2])


def test_counter_normal_is_a_standard_normal():
    """Moments, tails and independence of 2**20 numbers (standard errors ~1e-3): mean 0, variance 1, skew 0,
    kurtosis 3, P(|z| > 3) as the normal's; neighbours and two seeds uncorrelated; the same (seed, index) the same
    number; indices past 2**32 are other numbers."""
    index = torch.arange(2**20)
    z = attention_compile.counter_normal(torch.tensor(11), index).double()
    assert abs(z.mean()) < 5e-3 and abs(z.var() - 1) < 1e-2
    assert abs((z**3).mean()) < 2e-2 and abs((z**4).mean() - 3) < 5e-2
    tail = 2 * (1 - 0.5 * (1 + math.erf(3 / math.sqrt(2))))
    assert abs((z.abs() > 3).double().mean() - tail) < 5 * math.sqrt(tail / 2**20)
    assert abs((z[1:] * z[:-1]).mean()) < 5e-3
    other = attention_compile.counter_normal(torch.tensor(12), index).double()
    assert abs((z * other).mean()) < 5e-3
    assert torch.equal(attention_compile.counter_normal(torch.tensor(11), index[::7]).double(), z[::7])
    far = attention_compile.counter_normal(torch.tensor(11), index[:4096] + 2**32).double()
    assert abs((far * z[:4096]).mean()) < 0.1 and not torch.equal(far, z[:4096])


def test_compiled_dropout_drops_weights(eager):
    """With the identity as V the output is the dropped weights: each 0 or w / (1 - p), about p of them 0, the
    mask independent per local head also for MiSH (whose heads share one matrix)."""
    n = s = 24
    p = 0.3
    q, k = torch.randn(1, M, n, 4, dtype=torch.float64), torch.randn(1, M, s, 4, dtype=torch.float64)
    eye = torch.eye(s, dtype=torch.float64).expand(1, H, s, s)
    mixing = torch.randn(M, 1, dtype=torch.float64)
    torch.manual_seed(0)
    out = AF.fish_attention(q, k, eye, mixing, is_causal=True, backend="compiled", dropout_p=p)
    weights = fish_attention_reference(q, k, eye, mixing, is_causal=True)
    kept = out != 0
    assert_close(out[kept], weights[kept] / (1 - p))
    visible = weights > 0
    dropped = (visible & ~kept).sum() / visible.sum()
    assert 0.2 < float(dropped) < 0.4, float(dropped)
    assert not torch.equal(kept[:, 0], kept[:, 1])


def test_compiled_refusals_and_the_fallback(monkeypatch):
    args, kwargs, _ = make_case("fish", pad=True)
    with pytest.raises(ValueError, match="backend 'compiled' cannot run this call: return_weights"):
        AF.fish_attention(*args, backend="compiled", return_weights=True)
    with pytest.raises(ValueError, match="backend 'compiled' cannot run this call: a whole 4-D mask"):
        AF.fish_attention(*args, backend="compiled", attention_mask=torch.ones(1, 1, 6, 6, dtype=torch.bool))
    other = nn.Sequential(nn.Linear(M, H), nn.Tanh(), nn.Linear(H, H))
    with pytest.raises(ValueError, match="backend 'compiled' cannot run this call: a mixing network other"):
        AF.fish_attention(*args[:3], other, backend="compiled")
    facts = dict(mixing="heads", noise=True, dropout=False, return_weights=False, device_type="cpu",
                 dtype=torch.float32, autocast=False, requires_grad=True, tracing=False)
    assert all(AF.choose_backend(**dict(facts, **change)) != "compiled"
               for change in ({}, {"tracing": True}, {"device_type": "cuda"}, {"mixing": "gfish"}))
    monkeypatch.setenv(attention_compile.ENV, "0")
    monkeypatch.setattr(attention_compile, "_warned", set())  # warned once per process: maybe by an earlier test
    with pytest.warns(RuntimeWarning, match="cannot run on cpu: turned off by HF_MGK_COMPILE=0"):
        out = AF.fish_attention(*args, **kwargs, backend="compiled", generator=torch.Generator().manual_seed(1))
    assert torch.equal(out, AF.fish_attention(*args, **kwargs, generator=torch.Generator().manual_seed(1)))


# ------------------------------------------------------------------------------------------------ compiled

@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("N,S,causal,pad", [(9, 9, True, True), (7, 4, True, True), (5, 8, False, True)])
def test_compiled_matches_reference(variant, N, S, causal, pad):
    """float32 through torch.compile: outputs and every gradient (module docstring)."""
    (out, grads), (ref, ref_grads) = compiled_and_reference(variant, N, S, causal, pad, SMALL_BLOCKS)
    assert_rel(out, ref)
    assert_grads_rel(grads, ref_grads)
    assert attention_compile.compile_failed("fish_forward", "cpu") is None
    assert attention_compile.compile_count("fish_forward") > 0 and attention_compile.compile_count("fish_backward") > 0


@pytest.mark.slow
def test_compiled_float64_is_exact():
    (out, grads), (ref, ref_grads) = compiled_and_reference("gfish", 10, 10, True, True, SMALL_BLOCKS, torch.float64)
    assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for g, r in zip(grads, ref_grads, strict=True):
        assert_close(g, r, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_compiled_dropout_backward_sees_the_same_mask():
    """gradcheck reruns the forward under one seed: the backward holds to that forward's dropout mask and noise."""
    q = torch.randn(1, M, 6, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, M, 7, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, H, 7, 3, dtype=torch.float64, requires_grad=True)
    p = torch.randn(M, H, dtype=torch.float64, requires_grad=True)
    sigma = torch.rand(M, dtype=torch.float64, requires_grad=True)

    def dropped_out(q, k, v, p, sigma):
        torch.manual_seed(1)  # the same masks and noise seed on every call of gradcheck
        return AF.fish_attention(q, k, v, p, noise_std=sigma, is_causal=True, backend="compiled", dropout_p=0.3)

    assert torch.autograd.gradcheck(dropped_out, (q, k, v, p, sigma))


@pytest.mark.slow
def test_lengths_do_not_add_graphs():
    """Dynamic shapes: after the first lengths, new lengths (padding, generation) reuse the compiled graphs."""
    attention_compile.reset()
    torch.compiler.reset()

    def step(n, s):
        args, kwargs, _ = make_case("gfish", N=n, S=s, pad=True)
        AF.fish_attention(*args, **kwargs, is_causal=True, backend="compiled").sum().backward()

    def graphs():
        return attention_compile.compile_count("fish_forward"), attention_compile.compile_count("fish_backward")

    try:
        # Bounded, not one graph: dynamo guards on whether N == S, and the backward took one more graph between 33
        # and 64 keys (measured), then none up to 130. So: few graphs over many lengths, none for the last ones.
        for n, s in [(8, 8), (3, 20), (64, 64), (12, 12), (5, 5), (17, 17), (33, 33)]:
            step(n, s)
        before = graphs()
        assert before[0] <= 3 and before[1] <= 4, before
        for n, s in [(48, 48), (100, 100), (7, 90), (20, 20)]:
            step(n, s)
        assert graphs() == before
        step(1, 40)  # one query: a size of 1 is specialised, at most one more graph per kernel, then no more
        once = graphs()
        assert once[0] <= before[0] + 1 and once[1] <= before[1] + 1, (before, once)
        step(1, 41)
        assert graphs() == once
    finally:
        attention_compile.reset()
        torch.compiler.reset()
