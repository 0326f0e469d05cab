"""MGK / sMGK backends against the literal Eq. 7 reference (hf_mgk.reference): the blocked path (outputs and every
gradient, soft and hard E-steps, M = 1, 2, 3, padding, causal masks, blocks that do not divide N, probabilities kept
or recomputed for backward, rows far in the Gaussian tail, rows that see no key, dropout, gradcheck), every named
backend, and the backend rule. tests/test_attention_mgk.py checks that reference against Eq. 7 written out one query
at a time (tests/eq7.py)."""

import math

import pytest
import torch

import eq7
from conftest import assert_close
from hf_mgk import attention_mgk as am
from hf_mgk.attention_blocks import row_blocks
from hf_mgk.attention_mgk import BACKENDS, choose_backend, mgk_attention, smgk_attention
from hf_mgk.reference import mgk_attention_reference, smgk_attention_reference

B, H, D, DV = 2, 3, 8, 5


def _variances(m):
    return [math.sqrt(D) * (1 + 2 * r) for r in range(m)]


def _inputs(n, s, m, shared, dtype=torch.float32, scale=1.0):
    """query, the key tensors (keys (B,H,M,S,D), or key (B,H,S,D) and shifts (H,M,D)), value, log prior, mask."""
    q = scale * torch.randn(B, H, n, D, dtype=dtype)
    if shared:
        keys = [scale * torch.randn(B, H, s, D, dtype=dtype), 0.5 * torch.randn(H, m, D, dtype=dtype)]
    else:
        keys = [scale * torch.randn(B, H, m, s, D, dtype=dtype)]
    v = torch.randn(B, H, s, DV, dtype=dtype)
    lp = torch.log_softmax(torch.randn(H, m, dtype=dtype), -1)
    mask = torch.ones(B, s, dtype=torch.bool)
    mask[1, s - 3:] = False
    return [t.requires_grad_() for t in [q, *keys, v, lp]] + [mask]


def _call(fn, tensors, shared, **kw):
    """The output of the fast function (fn = mgk_attention; sMGK: smgk_attention) or the reference
    (fn = mgk_attention_reference; sMGK: smgk_attention_reference)."""
    if shared:
        q, key, shift, v, lp = tensors
        fn = smgk_attention_reference if fn is mgk_attention_reference else smgk_attention
        return fn(q, key, shift, v, log_prior=lp, **kw)
    q, keys, v, lp = tensors
    return fn(q, keys, v, log_prior=lp, **kw)


def _grads(out, tensors, seed=1):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
    return torch.autograd.grad(out, tensors, g, allow_unused=True)


def _check_against_reference(tensors, shared, e_step, fast=None, **kw):
    """fp32 output and q / key / shift / value gradients against the fp32 reference (rtol 1e-5); the log-prior
    gradient against the reference in float64: sum_r d/dlog pi_r = 0 exactly, so it is a sum of cancelling terms
    on which the fp32 reference itself is off by up to ~2e-5 (measured); both are compared to float64.
    fast: keyword arguments for the fast function only (backend, block sizes)."""
    names = ["q", "key", "shift", "v", "log_prior"] if shared else ["q", "keys", "v", "log_prior"]
    kw = dict(kw, e_step=e_step)
    out = _call(mgk_attention, tensors, shared, **kw, **(fast or {}))
    ref = _call(mgk_attention_reference, tensors, shared, **kw)
    assert_close(out, ref, msg="output")
    fast_grads, ref_grads = _grads(out, tensors), _grads(ref, tensors)
    t64 = [t.detach().double().requires_grad_() for t in tensors]
    ref64 = _call(mgk_attention_reference, t64, shared, **kw)
    ref64_grads = _grads(ref64, t64)
    for name, gf, gr, g64 in zip(names, fast_grads, ref_grads, ref64_grads, strict=True):
        if name == "log_prior":
            if e_step == "hard":
                assert gf is None or gf.abs().max() == 0  # pi plays no role in the hard E-step
                continue
            if tensors[-1].shape[1] == 1:  # one key: log pi_1 is a constant shift, its gradient is 0
                assert gf.abs().max() < 1e-5 * fast_grads[0].abs().max()
                continue
            assert_close(gf.double(), g64, msg=f"grad {name} (vs float64 reference)")
        else:
            assert_close(gf, gr, msg=f"grad {name}")
    return out


CASES = [  # (N, S, causal, padded, block rows)
    (9, 9, False, False, 4), (13, 13, False, True, 5), (9, 9, True, False, 4), (13, 13, True, True, 3),
    (5, 11, True, True, 2), (7, 7, True, True, 128), (130, 130, False, True, 128), (130, 130, True, False, 64),
]


# M = 2 on every case; M = 1 and 3 on two of them
MATRIX = [(2, *case) for case in CASES] + [(m, *CASES[i]) for m in (1, 3) for i in (1, 3)]


@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
@pytest.mark.parametrize("e_step", ["soft", "hard"])
@pytest.mark.parametrize("m,n,s,causal,padded,rows", MATRIX)
def test_blocked_path_matches_reference(shared, e_step, m, n, s, causal, padded, rows):
    *tensors, mask = _inputs(n, s, m, shared)
    _check_against_reference(tensors, shared, e_step, fast=dict(backend="blocked", block_rows=rows),
                             variances=_variances(m), attention_mask=mask if padded else None, is_causal=causal)


@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
@pytest.mark.parametrize("e_step", ["soft", "hard"])
def test_recomputed_backward_matches_reference(shared, e_step):
    """Above keep_bytes the block probabilities are recomputed in backward instead of kept."""
    *tensors, mask = _inputs(11, 11, 2, shared)
    _check_against_reference(tensors, shared, e_step, fast=dict(keep_bytes=0, block_rows=4), variances=_variances(2),
                             attention_mask=mask, is_causal=True)


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
@pytest.mark.parametrize("e_step", ["soft", "hard"])
def test_rows_far_in_the_tail_are_shifted(keep, shared, e_step):
    """Queries far from every key: each of their log-kernel terms is below -103, where float32 exp is exactly 0,
    so the unshifted sum is 0 and the block must be redone with its rows' maxima subtracted. Compared with the
    reference in float64: the exponents are -150 to -500 here and float32 resolves them only to 1e-5 to 3e-5, which is then
    the relative error of any float32 evaluation (the float32 reference's too)."""
    fast = dict(block_rows=4, keep_bytes=am.KEEP_BYTES if keep else 0)
    *tensors, mask = _inputs(9, 9, 2, shared)
    with torch.no_grad():
        tensors[0][:, :, 4:] += 18.0  # rows 4..8 (blocks 2 and 3) far away, rows 0..3 not
    q, keys = tensors[0], (eq7.shifted_keys(tensors[1], tensors[2]) if shared else tensors[1])
    log_kernel = am._log_kernel(q.detach(), keys.detach(), torch.tensor(_variances(2)), None)
    assert log_kernel[:, :, :, 4:].amax() < -103 and log_kernel[:, :, :, :4].amax(dim=(2, 4)).min() > -20
    kw = dict(variances=_variances(2), e_step=e_step, attention_mask=mask)
    t64 = [t.detach().double().requires_grad_() for t in tensors]
    expected = _call(mgk_attention_reference, t64, shared, **kw)
    out = _call(mgk_attention, tensors, shared, **kw, **fast)
    assert_close(out.double(), expected, rtol=2e-4, atol=0, msg="output")
    grads = _grads(out, tensors[:-1])
    for gf, ge in zip(grads, _grads(expected, t64[:-1])):
        assert_close(gf.double(), ge, rtol=2e-4, atol=0)
    unshifted = _call(mgk_attention, tensors, shared, **kw, **fast, min_row_sum=0.0)  # never shifted: those rows are 0
    assert unshifted[:, :, 4:].abs().max() == 0 and expected[:, :, 4:].abs().max() > 0.1


@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
@pytest.mark.parametrize("e_step", ["soft", "hard"])
def test_rows_that_see_no_key_give_zero(shared, e_step):
    """Bottom-right causal with N > S (rows 0..N-S-1 see no key) and a sequence of padding only: zero output, as
    SDPA gives; the other rows as the reference, and finite gradients."""
    *tensors, _ = _inputs(7, 4, 2, shared)
    mask = torch.ones(B, 4, dtype=torch.bool)
    mask[1] = False
    out = _call(mgk_attention, tensors, shared, variances=_variances(2), e_step=e_step, is_causal=True,
                attention_mask=mask)
    ref = _call(mgk_attention_reference, tensors, shared, variances=_variances(2), e_step=e_step, is_causal=True,
                attention_mask=mask)
    assert out[:, :, :3].abs().max() == 0 and out[1].abs().max() == 0
    assert_close(out[0, :, 3:], ref[0, :, 3:])
    assert all(g is None or torch.isfinite(g).all() for g in _grads(out, tensors))


@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
def test_hard_e_step_ties_share_the_gradient(shared):
    """Two identical keys (equal shifts / equal key tensors, equal variances): torch.amax's backward splits the
    gradient between them, and so does the blocked path."""
    *tensors, mask = _inputs(6, 6, 2, shared)
    with torch.no_grad():
        if shared:
            tensors[2][:, 1] = tensors[2][:, 0]
        else:
            tensors[1][:, :, 1] = tensors[1][:, :, 0]
    _check_against_reference(tensors, shared, "hard", variances=[3.0, 3.0], attention_mask=mask)


@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
def test_training_and_evaluation_compute_the_same_numbers(shared):
    """With or without autograd the CPU float32 call takes the same path: bit for bit the same output."""
    *tensors, mask = _inputs(10, 10, 2, shared)
    kw = dict(variances=_variances(2), attention_mask=mask)
    with torch.no_grad():
        evaluated = _call(mgk_attention, tensors, shared, **kw)
    assert torch.equal(_call(mgk_attention, tensors, shared, **kw), evaluated)


def _dropout_masks(seed, n, s, causal, p, rows):
    """The masks the blocked path draws: one seed from the global generator, then per block of rows (in order)
    uniform numbers of shape (B, H, rows, keys the block sees), kept where >= p, scaled by 1 / (1 - p)."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**62, ())))
    mask = torch.zeros(B, H, n, s)
    for block, end, _ in row_blocks(n, s, causal, rows):
        u = torch.rand((B, H, block.stop - block.start, end), generator=gen)
        mask[:, :, block, :end] = (u >= p).float() / (1 - p)
    return mask


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
@pytest.mark.parametrize("e_step", ["soft", "hard"])
def test_dropout_drops_the_mixture_weights(keep, shared, e_step):
    """Dropout acts on a_ij (the mixture's attention weight, as F.dropout on the reference's weights would), and
    backward (kept or recomputed) redraws the same masks: output and gradients equal the reference's weights
    times those masks, times V."""
    fast = dict(block_rows=4, keep_bytes=am.KEEP_BYTES if keep else 0)
    n, p = 10, 0.3
    *tensors, pad = _inputs(n, n, 2, shared)
    kw = dict(variances=_variances(2), e_step=e_step, attention_mask=pad, is_causal=True)
    torch.manual_seed(7)
    out = _call(mgk_attention, tensors, shared, dropout_p=p, **kw, **fast)
    mask = _dropout_masks(7, n, n, True, p, 4)
    assert 0 < (mask == 0).float().mean() < 0.6
    _, weights = _call(mgk_attention_reference, tensors, shared, return_weights=True, **kw)
    expected = torch.matmul(weights * mask, tensors[-2])
    assert_close(out, expected, msg="output")
    names = ["q", "key", "shift", "v"] if shared else ["q", "keys", "v"]
    for name, gf, ge in zip(names, _grads(out, tensors[:-1]), _grads(expected, tensors[:-1])):
        assert_close(gf, ge, msg=f"grad {name}")


@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
@pytest.mark.parametrize("e_step", ["soft", "hard"])
@pytest.mark.parametrize("keep", [True, False])
def test_gradcheck_float64(shared, e_step, keep):
    fast = dict(block_rows=3, keep_bytes=am.KEEP_BYTES if keep else 0)
    g = torch.Generator().manual_seed(0)
    b, h, n, m, d = 1, 2, 5, 2, 3
    q = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    keys = [torch.randn(b, h, n, d, generator=g, dtype=torch.float64),
            torch.randn(h, m, d, generator=g, dtype=torch.float64)] if shared else [
        torch.randn(b, h, m, n, d, generator=g, dtype=torch.float64)]
    v = torch.randn(b, h, n, 2, generator=g, dtype=torch.float64)
    lp = torch.log_softmax(torch.randn(h, m, generator=g, dtype=torch.float64), -1)
    mask = torch.tensor([[True, True, True, True, False]])
    inputs = [t.requires_grad_() for t in [q, *keys, v] + ([lp] if e_step == "soft" else [])]

    def fn(*args):
        args = list(args) + ([] if e_step == "soft" else [lp])
        return _call(mgk_attention, args, shared, variances=[1.5, 4.0], e_step=e_step, attention_mask=mask,
                     is_causal=True, **fast)

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_smgk_attention_equals_mgk_with_shifted_keys_on_every_path():
    *tensors, mask = _inputs(8, 8, 2, True)
    q, key, shift, v, lp = tensors
    kw = dict(variances=_variances(2), log_prior=lp, attention_mask=mask, is_causal=True)
    keys = eq7.shifted_keys(key, shift)
    assert_close(smgk_attention(q, key, shift, v, **kw), mgk_attention(q, keys, v, **kw))
    out, w = smgk_attention(q, key, shift, v, return_weights=True, **kw)  # the dense form
    assert_close(out, mgk_attention_reference(q, keys, v, **kw))
    assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # SDPA over the augmented keys
        half = smgk_attention(q, key, shift, v, **kw)
    assert_close(half.float(), mgk_attention_reference(q, keys, v, **kw), rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
@pytest.mark.parametrize("e_step,backend", [(e, b) for e in ("soft", "hard") for b in BACKENDS  # SDPA: soft only;
                                            if (e, b) != ("hard", "sdpa") and b != "triton"])  # triton: its own file
@pytest.mark.parametrize("n,s,causal,padded", [(9, 9, False, True), (9, 9, True, True), (4, 9, True, False)])
def test_every_backend_matches_reference(shared, e_step, backend, n, s, causal, padded):
    """Every named backend (the augmented-key SDPA path is the one used on accelerators, in half precision and
    under autocast; dense also hands out the weights), outputs and gradients."""
    *tensors, mask = _inputs(n, s, 2, shared)
    _check_against_reference(tensors, shared, e_step, fast=dict(backend=backend), variances=_variances(2),
                             attention_mask=mask if padded else None, is_causal=causal)


MGK_RULE = [  # facts of a call -> the backend backend="auto" takes
    (dict(), "blocked"),
    (dict(dtype=torch.float64, mask="padding"), "blocked"),
    (dict(e_step="hard"), "blocked"),
    (dict(return_weights=True), "dense"),
    (dict(mask="pairs"), "sdpa"),
    (dict(mask="pairs", e_step="hard"), "dense"),
    (dict(dtype=torch.bfloat16), "sdpa"),
    (dict(autocast=True), "sdpa"),
    (dict(autocast=True, e_step="hard"), "dense"),
    (dict(tracing=True), "sdpa"),
    (dict(device_type="cuda"), "sdpa"),
    (dict(device_type="cuda", e_step="hard"), "dense"),
    (dict(device_type="cuda", return_weights=True), "dense"),
    # with Triton installed: CUDA calls the kernels cover, never the CPU
    (dict(device_type="cuda", triton=True), "triton"),
    (dict(device_type="cuda", triton=True, e_step="hard"), "triton"),
    (dict(device_type="cuda", triton=True, dtype=torch.bfloat16, autocast=True), "triton"),
    (dict(device_type="cuda", triton=True, dtype=torch.float16, mask="padding"), "triton"),
    (dict(device_type="cuda", triton=True, return_weights=True), "dense"),
    (dict(device_type="cuda", triton=True, mask="pairs"), "sdpa"),
    (dict(device_type="cuda", triton=True, tracing=True, e_step="hard"), "dense"),
    (dict(device_type="cuda", triton=True, variance_grad=True), "sdpa"),
    (dict(device_type="cuda", triton=True, head_size=256), "sdpa"),
    (dict(device_type="cuda", triton=True, dtype=torch.float64), "sdpa"),
    (dict(triton=True), "blocked"),
    (dict(triton=True, dtype=torch.bfloat16), "sdpa"),
]


@pytest.mark.parametrize("facts,expected", MGK_RULE)
def test_backend_rule(facts, expected):
    call = dict(e_step="soft", return_weights=False, device_type="cpu", dtype=torch.float32, autocast=False,
                tracing=False, mask=None, triton=False, head_size=64, variance_grad=False)
    assert choose_backend(**{**call, **facts}) == expected


@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
def test_auto_is_the_backend_the_rule_names(shared):
    """backend="auto" computes bit for bit what the backend `choose_backend` names computes."""
    *tensors, mask = _inputs(7, 7, 2, shared)
    four = torch.ones(1, 1, 7, 7, dtype=torch.bool).tril()
    for kw, expected in [(dict(attention_mask=mask), "blocked"), (dict(attention_mask=four), "sdpa"),
                         (dict(attention_mask=four, e_step="hard"), "dense")]:
        kw = dict(kw, variances=_variances(2))
        assert torch.equal(_call(mgk_attention, tensors, shared, **kw),
                           _call(mgk_attention, tensors, shared, backend=expected, **kw)), expected


def test_backend_errors_name_the_allowed_ones():
    q, keys, v, lp, mask = _inputs(5, 5, 2, False)
    kw = dict(variances=_variances(2), log_prior=lp)
    with pytest.raises(ValueError, match=r"unknown backend 'flash'; allowed: 'auto', 'dense', 'sdpa', 'blocked'"):
        mgk_attention(q, keys, v, backend="flash", **kw)
    with pytest.raises(ValueError, match=r"backend 'sdpa' cannot run this call: the hard E-step \(allowed: 'auto'"):
        mgk_attention(q, keys, v, backend="sdpa", e_step="hard", **kw)
    with pytest.raises(ValueError, match=r"backend 'blocked' cannot run this call: return_weights"):
        mgk_attention(q, keys, v, backend="blocked", return_weights=True, **kw)
    with pytest.raises(ValueError, match=r"backend 'blocked' cannot run this call: a whole 4-D mask"):
        mgk_attention(q, keys, v, backend="blocked", attention_mask=torch.ones(1, 1, 5, 5, dtype=torch.bool), **kw)
    with pytest.raises(ValueError, match=r"backend 'blocked' cannot run this call: half precision"):
        mgk_attention(q.bfloat16(), keys.bfloat16(), v.bfloat16(), backend="blocked", **kw)


def test_smgk_attention_rejects_bad_shapes():
    *tensors, _ = _inputs(4, 4, 2, True)
    q, key, shift, v, _ = tensors
    with pytest.raises(ValueError, match="`key` must be"):
        smgk_attention(q, key[:, :, :, :3], shift, v, variances=_variances(2))
    with pytest.raises(ValueError, match="`key_shift` must be"):
        smgk_attention(q, key, shift[:2], v, variances=_variances(2))
    with pytest.raises(ValueError, match="one sigma"):
        smgk_attention(q, key, shift, v, variances=[1.0])


@pytest.mark.parametrize("device,d,dv,width", [("cpu", 64, 64, 66), ("meta", 64, 64, 72), ("meta", 30, 30, 32),
                                               ("meta", 32, 40, 40), ("cpu", 32, 40, 40)])
def test_sdpa_path_pads_its_width_to_a_multiple_of_8_off_the_cpu(monkeypatch, device, d, dv, width):
    """The augmented-key SDPA path (the fallback where Triton is absent) builds q, k and v at one width, D + 2 or
    Dv; off the CPU rounded up to a multiple of 8 so that the GPU's fused SDPA kernels take it (zeros: no dot product
    changes). The meta device stands in for a GPU: the shapes SDPA is handed are what is checked."""
    import torch.nn.functional as F

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.shape[-1], k.shape[-1], v.shape[-1]))
        return real(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    q = torch.randn(1, 2, 5, d, device=device)
    out = mgk_attention(q, torch.randn(1, 2, 2, 5, d, device=device), torch.randn(1, 2, 5, dv, device=device),
                        variances=[1.0, 2.0], backend="sdpa")
    assert seen == [(width, width, width)] and out.shape == (1, 2, 5, dv)
