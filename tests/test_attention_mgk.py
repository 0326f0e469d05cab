"""The MGK / MLK math: every fast path against the literal Eq. 7 / Sec. 2.4 reference (hf_mgk.reference), that
reference against the formulas written out one query at a time (tests/eq7.py), masks, EM statistics; MLK's backends
and its backend rule."""

import math

import pytest
import torch

import eq7
from conftest import assert_close
from hf_mgk import mgk_attention, mlk_attention
from hf_mgk.attention_mgk import MLK_BACKENDS, choose_mlk_backend, mgk_responsibilities
from hf_mgk.reference import mgk_attention_reference, mlk_attention_reference

B, H, M, D = 2, 3, 2, 8


def _inputs(n, s=None, m=M, dv=D, dtype=torch.float32, requires_grad=True):
    s = s or n
    q = torch.randn(B, H, n, D, dtype=dtype)
    k = torch.randn(B, H, m, s, D, dtype=dtype)
    v = torch.randn(B, H, s, dv, dtype=dtype)
    log_prior = torch.log_softmax(torch.randn(H, m, dtype=dtype), -1)
    mask = torch.ones(B, s, dtype=torch.bool)
    mask[1, s - 3:] = False
    return [t.requires_grad_(requires_grad) for t in (q, k, v, log_prior)] + [mask]


def _variances(m=M):
    return [math.sqrt(D) * (1 + 2 * r) for r in range(m)]


def _grads(out, tensors):
    torch.manual_seed(1)
    g = torch.randn_like(out)
    return torch.autograd.grad(out, tensors, g, allow_unused=True)


CASES = [  # (N, S, causal, padded)
    (7, 7, False, False), (7, 7, False, True), (9, 9, True, False), (9, 9, True, True), (3, 9, True, True),
]


@pytest.mark.parametrize("e_step", ["soft", "hard"])
@pytest.mark.parametrize("n,s,causal,padded", CASES)
@pytest.mark.parametrize("return_weights", [False, True])
def test_mgk_fast_paths_match_reference(e_step, n, s, causal, padded, return_weights):
    q, k, v, lp, mask = _inputs(n, s)
    kw = dict(variances=_variances(), log_prior=lp, e_step=e_step, attention_mask=mask if padded else None,
              is_causal=causal)
    fast = mgk_attention(q, k, v, return_weights=return_weights, **kw)
    ref = mgk_attention_reference(q, k, v, **kw)
    fast_out = fast[0] if return_weights else fast
    assert_close(fast_out, ref, msg="output")
    for gf, gr, name in zip(_grads(fast_out, (q, k, v, lp)), _grads(ref, (q, k, v, lp)), "q k v log_prior".split()):
        if e_step == "hard" and name == "log_prior":
            assert gf is None and gr is None  # the hard E-step ignores pi (Remark 3)
            continue
        assert_close(gf, gr, msg=f"grad {name}")


def test_mgk_sdpa_handles_value_wider_than_augmented_keys():
    q, k, v, lp, mask = _inputs(6, dv=D + 5)
    kw = dict(variances=_variances(), log_prior=lp, attention_mask=mask)
    assert_close(mgk_attention(q, k, v, **kw), mgk_attention_reference(q, k, v, **kw))


def test_mgk_equals_explicit_mixture_formula():
    """Independent check of the default path: Eq. 7 written out with Gaussian densities' log terms (tests/eq7.py),
    every query of every head."""
    q, k, v, lp, _ = _inputs(5, requires_grad=False)
    var = _variances()
    out, w = mgk_attention(q, k, v, variances=var, log_prior=lp, return_weights=True)
    expected_out, expected = eq7.mgk(q, k, v, variances=var, log_prior=lp)
    assert_close(w, expected)
    assert_close(out, expected_out)


@pytest.mark.parametrize("e_step", ["soft", "hard"])
@pytest.mark.parametrize("n,s,causal,padded", CASES)
@pytest.mark.parametrize("m,shared,prior", [(2, False, True), (2, False, False), (1, False, True), (3, True, True)])
def test_reference_is_eq7_written_out(e_step, n, s, causal, padded, m, shared, prior):
    """The package's mgk_attention_reference (what tests/test_attention_mgk_fast.py checks the blocked / sMGK / SDPA
    paths against) is Eq. 7 as tests/eq7.py writes it out: output, weights and gradients, both E-steps, with and
    without a prior, M = 1, 2, 3, option A keys and sMGK shifted keys, padding, causal (N < S too)."""
    q = torch.randn(B, H, n, D, dtype=torch.float64, requires_grad=True)
    if shared:
        key = torch.randn(B, H, s, D, dtype=torch.float64, requires_grad=True)
        shift = (0.5 * torch.randn(H, m, D, dtype=torch.float64)).requires_grad_()
        leaves, keys = [q, key, shift], eq7.shifted_keys(key, shift)
    else:
        keys = torch.randn(B, H, m, s, D, dtype=torch.float64, requires_grad=True)
        leaves = [q, keys]
    v = torch.randn(B, H, s, D, dtype=torch.float64, requires_grad=True)
    lp = torch.log_softmax(torch.randn(H, m, dtype=torch.float64), -1).requires_grad_() if prior else None
    mask = torch.ones(B, s, dtype=torch.bool)
    mask[1, s - 3:] = False
    kw = dict(variances=_variances(m), log_prior=lp, e_step=e_step, attention_mask=mask if padded else None,
              is_causal=causal)
    out, w = mgk_attention_reference(q, keys, v, return_weights=True, **kw)
    expected_out, expected = eq7.mgk(q, keys, v, **kw)
    assert_close(w, expected, rtol=1e-12, atol=1e-12, msg="weights")
    assert_close(out, expected_out, rtol=1e-12, atol=1e-12, msg="output")
    leaves += [v] + ([lp] if prior and e_step == "soft" else [])
    for g, r in zip(_grads(out, leaves), _grads(expected_out, leaves), strict=True):
        assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_uniform_prior_equals_no_prior():
    q, k, v, _, mask = _inputs(6, requires_grad=False)
    uniform = torch.full((H, M), math.log(1 / M))
    a = mgk_attention(q, k, v, variances=_variances(), log_prior=uniform, attention_mask=mask)
    b = mgk_attention(q, k, v, variances=_variances(), log_prior=None, attention_mask=mask)
    assert_close(a, b)


@pytest.mark.parametrize("fn", ["mgk", "mlk"])
def test_padded_keys_contribute_nothing_and_no_causal_leak(fn):
    q, k, v, lp, mask = _inputs(8, requires_grad=False)
    call = (lambda *a, **kw: mgk_attention(*a, variances=_variances(), **kw)) if fn == "mgk" else mlk_attention
    base = call(q, k, v, log_prior=lp, attention_mask=mask)
    k2, v2 = k.clone(), v.clone()
    k2[1, :, :, -3:] += 100.0
    v2[1, :, -3:] = -50.0
    changed = call(q, k2, v2, log_prior=lp, attention_mask=mask)
    assert_close(changed, base, msg="padded keys leak")
    causal = call(q, k, v, log_prior=lp, is_causal=True)
    k3, v3 = k.clone(), v.clone()
    k3[:, :, :, 5:] = torch.randn_like(k3[:, :, :, 5:])
    v3[:, :, 5:] = torch.randn_like(v3[:, :, 5:])
    later_changed = call(q, k3, v3, log_prior=lp, is_causal=True)
    assert_close(later_changed[:, :, :5], causal[:, :, :5], msg="causal leak")
    assert (later_changed[:, :, 5:] - causal[:, :, 5:]).abs().max() > 1e-3  # the change is visible later on


def test_weights_are_a_distribution_over_real_keys():
    q, k, v, lp, mask = _inputs(7, requires_grad=False)
    _, w = mgk_attention(q, k, v, variances=_variances(), log_prior=lp, attention_mask=mask, is_causal=True,
                         return_weights=True)
    assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    assert w[1, :, :, -3:].abs().max() == 0
    assert torch.triu(w, diagonal=1).abs().max() == 0


@pytest.mark.parametrize("n,s,causal,padded", CASES)
def test_mlk_fast_path_matches_reference(n, s, causal, padded):
    q, k, v, lp, mask = _inputs(n, s)
    kw = dict(log_prior=lp, attention_mask=mask if padded else None, is_causal=causal)
    fast, ref = mlk_attention(q, k, v, **kw), mlk_attention_reference(q, k, v, **kw)
    assert_close(fast, ref)
    for gf, gr in zip(_grads(fast, (q, k, v, lp)), _grads(ref, (q, k, v, lp))):
        assert_close(gf, gr)


@pytest.mark.parametrize("backend", MLK_BACKENDS)
@pytest.mark.parametrize("n,s,causal,padded", CASES)
def test_every_mlk_backend_matches_reference(backend, n, s, causal, padded):
    q, k, v, lp, mask = _inputs(n, s)
    kw = dict(log_prior=lp, attention_mask=mask if padded else None, is_causal=causal)
    fast, ref = mlk_attention(q, k, v, backend=backend, **kw), mlk_attention_reference(q, k, v, **kw)
    assert_close(fast, ref)
    for gf, gr in zip(_grads(fast, (q, k, v, lp)), _grads(ref, (q, k, v, lp))):
        assert_close(gf, gr)


MLK_RULE = [  # (return_weights, mask, is_causal, tracing) -> backend
    ((False, None, False, False), "linear"), ((False, "padding", True, False), "linear"),
    ((True, None, False, False), "dense"), ((False, "pairs", False, False), "dense"),
    ((False, None, True, True), "dense"), ((False, "padding", False, True), "linear"),
]


@pytest.mark.parametrize("facts,expected", MLK_RULE)
def test_mlk_backend_rule(facts, expected):
    return_weights, mask, is_causal, tracing = facts
    assert choose_mlk_backend(return_weights=return_weights, mask=mask, is_causal=is_causal,
                              tracing=tracing) == expected


def test_mlk_auto_is_the_backend_the_rule_names():
    q, k, v, lp, mask = _inputs(9, requires_grad=False)
    four = torch.ones(B, 1, 9, 9, dtype=torch.bool).tril()
    for kw, expected in [(dict(attention_mask=mask, is_causal=True), "linear"), (dict(attention_mask=four), "dense")]:
        assert torch.equal(mlk_attention(q, k, v, log_prior=lp, **kw), mlk_attention(q, k, v, log_prior=lp,
                                                                                         backend=expected, **kw))


def test_mlk_backend_errors_name_the_allowed_ones():
    q, k, v, lp, _ = _inputs(5, requires_grad=False)
    with pytest.raises(ValueError, match=r"unknown backend 'chunked'; allowed: 'auto', 'dense', 'linear'"):
        mlk_attention(q, k, v, backend="chunked")
    with pytest.raises(ValueError, match=r"backend 'linear' cannot run this call: return_weights.*'dense'"):
        mlk_attention(q, k, v, backend="linear", return_weights=True)


def test_mlk_matches_written_out_formula():
    """Sec. 2.4 written out one query at a time (tests/eq7.py), every query of every head."""
    q, k, v, lp, _ = _inputs(4, requires_grad=False)
    assert_close(mlk_attention(q, k, v, log_prior=lp), eq7.mlk(q, k, v, log_prior=lp)[0])


def test_m_step_responsibilities():
    """pi_r = mean over valid (i, j) of gamma_ijr (Eq. 8), checked by brute force."""
    q, k, _, lp, mask = _inputs(5, requires_grad=False)
    var = _variances()
    pi = mgk_responsibilities(q, k, variances=var, log_prior=lp, attention_mask=mask)
    assert pi.shape == (H, M)
    assert_close(pi.sum(-1), torch.ones(H))
    h = 1
    acc, count = torch.zeros(M), 0
    for b in range(B):
        for i in range(5):
            for j in range(5):
                if not mask[b, j]:
                    continue
                logits = torch.stack([lp[h, r] - (q[b, h, i] - k[b, h, r, j]).pow(2).sum() / (2 * var[r])
                                      for r in range(M)])
                acc += torch.softmax(logits, 0)
                count += 1
    assert_close(pi[h], acc / count)


def test_m_step_leaves_out_non_finite_pairs():
    """A NaN query (one position of one row) removes exactly its pairs from the mean; no finite pair: NaN."""
    q, k, _, lp, mask = _inputs(5, requires_grad=False)
    var = _variances()
    bad = q.clone()
    bad[0, :, 2] = float("nan")
    pi = mgk_responsibilities(bad, k, variances=var, log_prior=lp, attention_mask=mask)
    log_gamma = torch.log_softmax(lp[None, :, :, None, None] - (q[:, :, None, :, None] - k[:, :, :, None]).pow(2).sum(-1)
                                  / (2 * torch.tensor(var)[None, None, :, None, None]), dim=2)  # (B, H, M, N, S)
    used = mask[:, None, None, None, :].expand(B, 1, 1, 5, 5).clone()
    used[0, :, :, 2] = False
    expected = (log_gamma.exp() * used).sum((0, 3, 4)) / used.sum((0, 3, 4))
    assert torch.isfinite(pi).all()
    assert_close(pi, expected)
    bad[:] = float("nan")
    assert torch.isnan(mgk_responsibilities(bad, k, variances=var, log_prior=lp)).all()


def test_bad_arguments_raise_clear_errors():
    q, k, v, lp, _ = _inputs(4, requires_grad=False)
    with pytest.raises(ValueError, match="e_step"):
        mgk_attention(q, k, v, variances=_variances(), e_step="medium")
    with pytest.raises(ValueError, match="one sigma"):
        mgk_attention(q, k, v, variances=[1.0])
    with pytest.raises(ValueError, match="positive"):
        mgk_attention(q, k, v, variances=[1.0, -2.0])
    with pytest.raises(ValueError, match="keys"):
        mgk_attention(q, k[:, :, 0], v, variances=_variances())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_stays_finite(dtype):
    q, k, v, lp, mask = _inputs(16, requires_grad=False)
    with torch.autocast("cpu", dtype=dtype):
        for e_step in ("soft", "hard"):
            out = mgk_attention(q * 4, k * 4, v, variances=_variances(), log_prior=lp, e_step=e_step,
                                attention_mask=mask, is_causal=True)
            assert torch.isfinite(out.float()).all()
        assert torch.isfinite(mlk_attention(q, k, v, log_prior=lp, attention_mask=mask).float()).all()


def _mlk_long_inputs(n, dtype):
    """Queries and keys around +1, so phi = elu + 1 is ~2 per entry: the normaliser phi(q)^T Z is ~4 * D * N,
    past float16's largest value (65504) from N = 512 with D = 32."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, n, 32) + 1, torch.randn(2, 2, 2, n, 32) + 1
    v = torch.randn(2, 2, n, 32)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n - 100:] = False
    return [t.to(dtype) for t in (q, k, v)], torch.log_softmax(torch.randn(2, 2), -1), mask


@pytest.mark.parametrize("n", [1024, 2048])
@pytest.mark.parametrize("dtype,rtol", [(torch.float16, 2e-3), (torch.bfloat16, 8e-3)])
@pytest.mark.parametrize("causal", [False, True])
def test_mlk_half_precision_matches_float32(n, dtype, rtol, causal):
    """Half inputs: the sums run in float32, so the output is the float64 result up to its own rounding (before:
    float16 overflowed to outputs of exactly 0, relative error ~1)."""
    (q, k, v), lp, mask = _mlk_long_inputs(n, dtype)
    expected = mlk_attention(q.double(), k.double(), v.double(), log_prior=lp.double(), attention_mask=mask,
                             is_causal=causal)
    out = mlk_attention(q, k, v, log_prior=lp, attention_mask=mask, is_causal=causal)
    assert out.dtype == dtype
    assert_close(out.double(), expected, rtol=rtol, atol=0)
    if n == 1024:  # the explicit N x S form (output_attentions) too
        out, weights = mlk_attention(q, k, v, log_prior=lp, attention_mask=mask, is_causal=causal,
                                     return_weights=True)
        assert out.dtype == weights.dtype == dtype
        assert_close(out.double(), expected, rtol=rtol, atol=0)
        assert_close(weights.double().sum(-1), torch.ones(2, 2, n, dtype=torch.float64), rtol=rtol, atol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_mlk_under_autocast_is_the_float32_result(causal):
    (q, k, v), lp, mask = _mlk_long_inputs(1024, torch.float32)
    expected = mlk_attention(q, k, v, log_prior=lp, attention_mask=mask, is_causal=causal)
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", dtype=dtype):
            out = mlk_attention(q, k, v, log_prior=lp, attention_mask=mask, is_causal=causal)
        assert_close(out, expected, rtol=1e-5, atol=0, msg=str(dtype))
