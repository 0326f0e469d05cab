"""The compiled MGK / sMGK path (torch.compile, `backend="compiled"`) against the plain references: outputs and
gradients, masks, dropout, graphs compiled over varying lengths, and every way compiling can fail falling back to
an exact eager computation with one warning."""

import warnings

import pytest
import torch
from torch.testing import assert_close

from hf_mgk import attention_compile
from hf_mgk.attention_mgk import choose_backend, mgk_attention, smgk_attention
from hf_mgk.reference import mgk_attention_reference
from test_attention_mgk_fast import _call, _check_against_reference, _inputs, _variances

pytestmark = pytest.mark.slow  # every new graph compiles C++ (seconds each)

SMALL_BLOCKS = 2**10  # bytes of scores per block: several blocks of rows per call, so block edges are exercised


@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
@pytest.mark.parametrize("e_step", ["soft", "hard"])
@pytest.mark.parametrize("m,n,s,causal,padded,block_bytes", [
    (2, 9, 9, False, True, SMALL_BLOCKS), (2, 13, 13, True, True, SMALL_BLOCKS), (2, 5, 11, True, False, 2**26),
    (3, 11, 6, True, True, SMALL_BLOCKS), (1, 7, 7, False, True, 2**26)])
def test_compiled_matches_reference(shared, e_step, m, n, s, causal, padded, block_bytes):
    """float32, every operand's gradient; causal with N > S has rows that see no key (zero output)."""
    *tensors, mask = _inputs(n, s, m, shared)
    _check_against_reference(tensors, shared, e_step, fast=dict(backend="compiled", compiled_block_bytes=block_bytes),
                             variances=_variances(m), attention_mask=mask if padded else None, is_causal=causal)


@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
def test_compiled_float64_is_exact(shared):
    *tensors, mask = _inputs(10, 10, 2, shared, dtype=torch.float64)
    kw = dict(variances=_variances(2), attention_mask=mask, is_causal=True)
    out = _call(mgk_attention, tensors, shared, backend="compiled", compiled_block_bytes=SMALL_BLOCKS, **kw)
    ref = _call(mgk_attention_reference, tensors, shared, **kw)
    assert_close(out, ref, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(out, tensors, torch.ones_like(out))
    ref_grads = torch.autograd.grad(ref, tensors, torch.ones_like(ref))
    for g, r in zip(grads, ref_grads, strict=True):
        assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_compiled_dropout_drops_weights_and_backward_sees_the_same_mask():
    """With the identity as V the output is the dropped weights themselves: each either 0 or a_ij / (1 - p), about
    p of them 0; and gradcheck (which reruns the forward under one seed) holds the backward to that forward."""
    n = s = 24
    p = 0.3
    q = torch.randn(1, 2, n, 8, dtype=torch.float64)
    keys = torch.randn(1, 2, 2, s, 8, dtype=torch.float64)
    eye = torch.eye(s, dtype=torch.float64).expand(1, 2, s, s)
    kw = dict(variances=[4.0, 12.0], is_causal=True)
    torch.manual_seed(0)
    out = mgk_attention(q, keys, eye, backend="compiled", dropout_p=p, **kw)
    weights = mgk_attention_reference(q, keys, eye, **kw)
    kept = out != 0
    assert_close(out[kept], weights[kept] / (1 - p))
    visible = weights > 0
    dropped = (visible & ~kept).sum() / visible.sum()
    assert 0.2 < float(dropped) < 0.4, float(dropped)

    q, keys = q[..., :6, :].requires_grad_(), keys[..., :7, :].requires_grad_()
    v = torch.randn(1, 2, 7, 3, dtype=torch.float64, requires_grad=True)

    def dropped_out(q, keys, v):
        torch.manual_seed(1)  # the same masks on every call of gradcheck
        return mgk_attention(q, keys, v, backend="compiled", dropout_p=p, **kw)

    assert not torch.equal(dropped_out(q, keys, v), mgk_attention(q, keys, v, backend="blocked", **kw))
    assert torch.autograd.gradcheck(dropped_out, (q, keys, v))


def test_lengths_do_not_add_graphs(fresh):
    """Dynamic shapes: after the first lengths, new lengths (padding, generation) reuse the compiled graphs (counted
    from a fresh start: the cases above compile many graphs of their own)."""
    kw = dict(variances=_variances(2), is_causal=True, backend="compiled")

    def step(n, s):
        *tensors, mask = _inputs(n, s, 2, False)
        out = _call(mgk_attention, tensors, False, attention_mask=mask, **kw)
        out.sum().backward()

    def graphs():
        return attention_compile.compile_count("mgk_forward"), attention_compile.compile_count("mgk_backward")

    step(8, 8)
    step(12, 12)
    before = graphs()
    for n, s in [(5, 5), (17, 17), (33, 33), (3, 20), (64, 64), (2, 9)]:
        step(n, s)
    assert graphs() == before
    # one query (generation): a size of 1 is specialised, so at most one more graph per kernel, then no more
    step(1, 40)
    once = graphs()
    assert once[0] <= before[0] + 1 and once[1] <= before[1] + 1, (before, once)
    step(1, 41)
    step(1, 7)
    assert graphs() == once
    assert attention_compile.compile_failed("mgk_forward", "cpu") is None


def test_compiled_is_not_chosen_inside_an_outer_trace_or_where_it_cannot_run():
    facts = dict(e_step="soft", return_weights=False, device_type="cpu", dtype=torch.float32, autocast=False,
                 tracing=False, mask=None)
    *tensors, mask = _inputs(5, 5, 2, False)
    q, keys, v, lp = tensors
    with pytest.raises(ValueError, match="backend 'compiled' cannot run this call: return_weights"):
        mgk_attention(q, keys, v, variances=_variances(2), backend="compiled", return_weights=True)
    with pytest.raises(ValueError, match="backend 'compiled' cannot run this call: a whole 4-D mask"):
        mgk_attention(q, keys, v, variances=_variances(2), backend="compiled",
                      attention_mask=torch.ones(1, 1, 5, 5, dtype=torch.bool))
    assert choose_backend(**dict(facts, tracing=True)) != "compiled"


def test_smgk_compiled_shares_one_product():
    """sMGK through the compiled path equals MGK with the shifted keys (one q.k serves every key)."""
    *tensors, mask = _inputs(9, 9, 2, True)
    q, key, shift, v, lp = tensors
    kw = dict(variances=_variances(2), log_prior=lp, attention_mask=mask, backend="compiled")
    assert_close(smgk_attention(q, key, shift, v, **kw),
                 mgk_attention(q, key[:, :, None] + shift[None, :, :, None, :], v, **kw))


@pytest.fixture
def fresh():
    """No compiled kernel and no recorded failure before the test, and none left after it for the next tests."""
    attention_compile.reset()
    torch.compiler.reset()  # dynamo's graphs too: the recompile limit counts them
    yield
    attention_compile.reset()
    torch.compiler.reset()


def test_turned_off_by_the_environment(monkeypatch):
    """HF_MGK_COMPILE=0: backend="compiled" warns once and computes with the eager rule's path."""
    monkeypatch.setenv(attention_compile.ENV, "0")
    *tensors, mask = _inputs(6, 6, 2, True)
    kw = dict(variances=_variances(2), attention_mask=mask)
    with pytest.warns(RuntimeWarning, match="cannot run on cpu: turned off by HF_MGK_COMPILE=0"):
        out = _call(mgk_attention, tensors, True, backend="compiled", **kw)
    assert torch.equal(out, _call(mgk_attention, tensors, True, backend="blocked", **kw))
    assert attention_compile.why_not_compiled("cpu").startswith("turned off")


def test_no_compiler_falls_back(monkeypatch):
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CXX", raising=False)
    assert attention_compile.why_not_compiled("cpu") == "no C++ compiler found (inductor builds C++ for the CPU)"
    *tensors, mask = _inputs(6, 6, 2, False)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler found"):
        out = _call(mgk_attention, tensors, False, backend="compiled", variances=_variances(2))
    assert_close(out, _call(mgk_attention_reference, tensors, False, variances=_variances(2)))


def test_a_function_that_cannot_compile_runs_eagerly_with_one_warning(fresh):

    def reads_a_value(x):  # Python control flow on a tensor's value: no whole graph, which the kernels need
        return x * 6.0 if bool(x.sum() > 5) else x

    x = torch.arange(4.0)
    with pytest.warns(RuntimeWarning, match="the compiled unsupported kernel failed on cpu"):
        assert torch.equal(attention_compile.run("unsupported", reads_a_value, x), x * 6.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: later calls go straight to the eager function
        assert torch.equal(attention_compile.run("unsupported", reads_a_value, x), x * 6.0)
    assert attention_compile.compile_failed("unsupported", "cpu") is not None
    assert attention_compile.why_not_compiled("cpu").startswith("a compiled kernel failed here before")


def test_the_recompile_limit_falls_back(monkeypatch, fresh):
    """Past RECOMPILE_LIMIT graphs a kernel stops compiling: an exact eager result, one warning, and the eager
    backends for later calls (auto no longer names 'compiled' here)."""
    monkeypatch.setattr(attention_compile, "RECOMPILE_LIMIT", 1)
    *t32, mask = _inputs(6, 6, 2, False)
    kw = dict(variances=_variances(2), attention_mask=mask)
    _call(mgk_attention, t32, False, backend="compiled", **kw)  # the one graph allowed
    t64 = [t.detach().double().requires_grad_() for t in t32]
    with pytest.warns(RuntimeWarning, match="the compiled mgk_forward kernel failed on cpu"):
        out = _call(mgk_attention, t64, False, backend="compiled", **kw)  # float64: a second graph
    assert_close(out, _call(mgk_attention_reference, t64, False, **kw), rtol=1e-12, atol=1e-12)
    assert "failed here before" in attention_compile.why_not_compiled("cpu")
    with pytest.warns(RuntimeWarning, match="cannot run on cpu: a compiled kernel failed here before"):
        out = _call(mgk_attention, t32, False, backend="compiled", **kw)
    assert torch.equal(out, _call(mgk_attention, t32, False, backend="blocked", **kw))
