"""NPRF + RPE attention (SPEC §3, §5): the three exact backends against the plain reference (hf_mgk.reference) and
against Eq. (10) itself; the backend rule."""

import math

import pytest
import torch

import hf_mgk.attention_nprf as nprf
from hf_mgk.attention_nprf import (
    BACKENDS,
    EXPLICIT_MAX_WEIGHTS,
    choose_backend,
    draw_features,
    nprf_attention,
    rpe_bias_from_buckets,
    t5_constant_distance,
    t5_relative_buckets,
)
from hf_mgk.reference import nprf_attention_reference

PATHS = BACKENDS


def make_inputs(B=2, H=2, N=150, D=8, Dv=6, m=8, bias_scale=2.0, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, N, D, generator=g, dtype=dtype)
    k = torch.randn(B, H, N, D, generator=g, dtype=dtype)
    v = torch.randn(B, H, N, Dv, generator=g, dtype=dtype)
    b = bias_scale * torch.randn(H, 2 * N - 1, generator=g, dtype=dtype)
    W = draw_features(m, D, g, dtype=dtype)
    return q, k, v, b, W


def padding_mask(B, N):
    """Row 0: right padding; row 1: left padding (causal: its first queries see no key at all)."""
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[0, N - N // 5:] = False
    mask[-1, : N // 7] = False
    mask[0, 3] = False  # a hole in the middle
    return mask


def attend(path, q, k, v, b, W, *, normalize=True, max_distance=None, mask=None, causal=False, weights=False, **fast):
    """nprf_attention on backend `path`, or the plain reference (path "reference"); fast: the kernel's keyword
    arguments (block sizes)."""
    kw = dict(normalize=normalize, max_distance=max_distance, attention_mask=mask, is_causal=causal,
              return_weights=weights)
    if path == "reference":
        return nprf_attention_reference(q, k, v, b, W, **kw)
    return nprf_attention(q, k, v, b, W, backend=path, **kw, **fast)


def with_grads(path, q, k, v, b, W, **kw):
    """Output and the gradients of a fixed random projection of it w.r.t. query, key, value, rpe_bias (if any)."""
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in (q, k, v, b)]
    z = attend(path, *leaves, W, **kw)
    cotangent = torch.randn(z.shape, generator=torch.Generator().manual_seed(1), dtype=z.dtype)
    grads = torch.autograd.grad((z * cotangent).sum(), [t for t in leaves if t is not None])
    return [z.detach(), *grads]


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def eq10(q, k, v, b, W, *, normalize=True, causal=False, mask=None):
    """Eq. (10) written out in float64, no shifts: φ(x) = exp(W x − ‖x‖²/2)/√m, c = exp(b)."""
    q, k, v, W = (t.double() for t in (q, k, v, W))
    if normalize:
        q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    m = W.shape[0]
    phi_q = torch.exp(q @ W.T - (q * q).sum(-1, keepdim=True) / 2) / math.sqrt(m)
    phi_k = torch.exp(k @ W.T - (k * k).sum(-1, keepdim=True) / 2) / math.sqrt(m)
    N, S = q.shape[-2], k.shape[-2]
    i, j = torch.arange(N)[:, None], torch.arange(S)[None, :]
    C = torch.ones(1, N, S, dtype=torch.float64) if b is None else torch.exp(b.double()[:, j - i + S - 1])
    if causal:
        C = C * (j <= i)
    if mask is not None:
        phi_k = phi_k * mask[:, None, :, None]
    A = (phi_q @ phi_k.transpose(-1, -2)) * C
    return (A @ v) / A.sum(-1, keepdim=True)


# --------------------------------------------------------------------------------------------------------------
# The backends against the reference: outputs and gradients, padding, both directions, N not a power of 2.

@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias,max_distance", [(True, None), (True, 9), (False, None)])
def test_every_backend_matches_reference(path, causal, bias, max_distance):
    q, k, v, b, W = make_inputs(N=70)
    b = b if bias else None
    if path == "band" and bias and max_distance is None:
        max_distance = 70  # a bias without a constant distance: the band as wide as the sequence
    kw = dict(max_distance=max_distance, mask=padding_mask(2, 70), causal=causal)
    ref = with_grads("reference", q, k, v, b, W, **kw)
    fast = with_grads(path, q, k, v, b, W, **kw, band_block=16)
    for got, want, name in zip(fast, ref, ("z", "dq", "dk", "dv", "db")):
        assert rel(got, want) <= 1e-4, name


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("max_distance", [None, 5, 40, 400])
def test_fft_matches_reference(causal, max_distance):
    q, k, v, b, W = make_inputs()
    mask = padding_mask(2, 150)
    kw = dict(max_distance=max_distance, mask=mask, causal=causal)
    ref = with_grads("reference", q, k, v, b, W, **kw)
    for got, want, name in zip(with_grads("fft", q, k, v, b, W, **kw), ref, ("z", "dq", "dk", "dv", "db")):
        assert rel(got, want) <= 1e-4, name


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("max_distance,block", [(1, 16), (5, 16), (17, 16), (18, 16), (40, 16), (70, 64), (400, 64)])
def test_band_matches_reference(causal, max_distance, block):
    # n = ⌈(w−1)/block⌉ neighbour blocks each side: 0 (w = 1), 1, 1 (the second neighbour starts at offset 17),
    # 2 (offset 17 < 18 in the second neighbour), 3, 2 (one far block each side at most), 7 (w > N: no far
    # blocks at all). N = 150 is not a multiple of the block.
    q, k, v, b, W = make_inputs()
    mask = padding_mask(2, 150)
    kw = dict(max_distance=max_distance, mask=mask, causal=causal)
    ref = with_grads("reference", q, k, v, b, W, **kw)
    for got, want, name in zip(with_grads("band", q, k, v, b, W, **kw, band_block=block), ref,
                               ("z", "dq", "dk", "dv", "db")):
        assert rel(got, want) <= 1e-4, name


@pytest.mark.parametrize("w", [1, 2, 20, 65, 91, 113, 128, 300])
def test_band_block_covers_the_band_evenly(w):
    P = nprf._band_block(w)
    n = -(-(w - 1) // P)
    if w - 1 <= nprf.BAND_BLOCK:
        assert P == nprf.BAND_BLOCK
    else:
        assert nprf.BAND_BLOCK // 2 <= P <= 3 * nprf.BAND_BLOCK // 2
        # n blocks reach every offset below w with fewer than n spare keys on each side.
        assert n * P >= w - 1 and n * P - (w - 1) < n


@pytest.mark.parametrize("causal", [False, True])
def test_band_with_its_own_block_matches_reference(causal):
    # The model's defaults: T5 buckets 32/128, w = 91 (P = 90) or 113 (P = 56).
    w = t5_constant_distance(not causal, 32, 128)
    q, k, v, _, W = make_inputs(N=400)
    b = rpe_bias_from_buckets(torch.randn(q.shape[1], 32), 400, bidirectional=not causal, max_distance=128)
    kw = dict(max_distance=w, mask=padding_mask(2, 400), causal=causal)
    ref = with_grads("reference", q, k, v, b, W, **kw)
    for got, want, name in zip(with_grads("band", q, k, v, b, W, **kw), ref, ("z", "dq", "dk", "dv", "db")):
        assert rel(got, want) <= 1e-4, name


def test_fft_in_many_chunks_matches_reference():
    # One (batch·head, feature) unit per chunk: the accumulation over chunks, forward and backward.
    q, k, v, b, W = make_inputs(N=40, m=3)
    for causal in (False, True):
        kw = dict(mask=padding_mask(2, 40), causal=causal)
        ref = with_grads("reference", q, k, v, b, W, **kw)
        for got, want in zip(with_grads("fft", q, k, v, b, W, **kw, fft_chunk_bytes=1), ref):
            assert rel(got, want) <= 1e-4


def test_fft_backward_passes_gradcheck():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.rand(2, r, 7, generator=g, dtype=torch.float64) for r in (3, 3, 2))
    c = torch.rand(2, 13, generator=g, dtype=torch.float64)
    leaves = [t.requires_grad_() for t in (q, k, v, c)]
    fft = lambda *t: nprf._ToeplitzFFT.apply(*t, nprf.FFT_CHUNK_BYTES)  # noqa: E731
    assert torch.autograd.gradcheck(fft, leaves, fast_mode=True)


@pytest.mark.parametrize("path", ["explicit", "reference"])
@pytest.mark.parametrize("causal", [False, True])
def test_explicit_is_eq10(path, causal):
    q, k, v, b, W = make_inputs(dtype=torch.float64)
    mask = padding_mask(2, 150)
    z = attend(path, q, k, v, b, W, mask=mask, causal=causal)
    want = eq10(q, k, v, b, W, causal=causal, mask=mask)
    has_key = (mask.cumsum(-1) > 0) if causal else mask.any(-1, keepdim=True).expand(-1, 150)
    rows = has_key[:, None, :, None].expand_as(z)
    assert rel(z[rows], want[rows]) <= 1e-10
    assert (z[~rows] == 0).all()  # queries without any valid key: z = 0, not NaN


def test_fft_stays_accurate_on_early_causal_rows():
    # FFT round-off is absolute: rows with few keys and small c (early causal rows) are where it shows. b spans
    # ~±8 nats here: a float32 FFT gave O(1) relative error on row 0, the float64 one ~1e-7.
    q, k, v, b, W = make_inputs(N=300, bias_scale=4.0)
    want = eq10(q, k, v, b, W, causal=True)
    z = attend("fft", q, k, v, b, W, causal=True)
    row_rel = (z - want).abs().amax(-1) / want.abs().amax(-1)
    assert row_rel.max() <= 1e-4


# --------------------------------------------------------------------------------------------------------------
# Masks: causal models never see later tokens, padded keys contribute nothing (SPEC §0).

@pytest.mark.parametrize("path", PATHS)
def test_no_causal_leak(path):
    q, k, v, b, W = make_inputs(N=100)
    t = 37
    md = 10 if path == "band" else None
    z = attend(path, q, k, v, b, W, causal=True, max_distance=md)
    q2, k2, v2, b2 = q.clone(), k.clone(), v.clone(), b.clone()
    q2[..., t + 1:, :] = 5 * torch.randn_like(q2[..., t + 1:, :])
    k2[..., t + 1:, :] = 5 * torch.randn_like(k2[..., t + 1:, :])
    v2[..., t + 1:, :] = 5 * torch.randn_like(v2[..., t + 1:, :])
    b2[:, 100:] = 20.0  # offsets j − i > 0: weights on future keys
    z2 = attend(path, q2, k2, v2, b2, W, causal=True, max_distance=md)
    assert rel(z2[..., : t + 1, :], z[..., : t + 1, :]) <= 1e-6
    assert rel(z2[..., t + 1:, :], z[..., t + 1:, :]) > 1e-2  # the change is visible where it may be
    # Without is_causal the same change reaches the early outputs: the check above can fail.
    z_bi = attend(path, q, k, v, b, W, max_distance=md)
    z2_bi = attend(path, q2, k2, v2, b2, W, max_distance=md)
    assert rel(z2_bi[..., : t + 1, :], z_bi[..., : t + 1, :]) > 1e-2


@pytest.mark.parametrize("path", ["explicit", "band"])
def test_no_causal_leak_through_the_unnormalised_feature_shift(path):
    # normalize=False: a later key equal to the row of W with the largest norm has the largest feature any key
    # can have (w·k − ‖k‖²/2 ≤ ‖w‖²/2). Were the keys' shift their max, it would rescale (and for long keys
    # underflow to 0/0) every earlier row. The FFT path is left out: its round-off is absolute, set by the
    # largest terms, and unnormalised keys of norm 9 next to that key span e^40 (see FFT_DTYPE).
    q, k, v, b, W = make_inputs(N=100)
    q, k = 0.3 * q, 9 * k / k.norm(dim=-1, keepdim=True)
    md = 10 if path == "band" else None
    z = attend(path, q, k, v, b, W, causal=True, normalize=False, max_distance=md)
    k2 = k.clone()
    k2[..., 60, :] = W[W.norm(dim=-1).argmax()]
    z2 = attend(path, q, k2, v, b, W, causal=True, normalize=False, max_distance=md)
    assert torch.isfinite(z).all() and torch.isfinite(z2).all()
    assert torch.equal(z2[..., :60, :], z[..., :60, :])
    assert rel(z2[..., 60:, :], z[..., 60:, :]) > 1e-2


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("normalize", [True, False])
def test_padded_keys_change_nothing(path, causal, normalize):
    q, k, v, b, W = make_inputs(N=90)
    if not normalize:
        q, k = 0.3 * q, 0.3 * k
    mask = padding_mask(2, 90)
    md = 10 if path == "band" else None
    kw = dict(mask=mask, causal=causal, normalize=normalize, max_distance=md)
    z = attend(path, q, k, v, b, W, **kw)
    pad = ~mask[:, None, :, None]
    k2 = torch.where(pad, k.std() * torch.randn_like(k), k)
    v2 = torch.where(pad, 100 * torch.randn_like(v), v)
    z2 = attend(path, q, k2, v2, b, W, **kw)
    assert rel(z2, z) <= 1e-6
    # The same change with every key marked valid does move the outputs.
    z3 = attend(path, q, k2, v2, b, W, **{**kw, "mask": None})
    assert rel(z3, z) > 1e-2


def test_no_valid_key_gives_zero_and_finite_gradients():
    q, k, v, b, W = make_inputs(B=1, N=50)
    mask = torch.zeros(1, 50, dtype=torch.bool)
    for path in PATHS:
        z, *grads = with_grads(path, q, k, v, b, W, mask=mask, max_distance=7 if path == "band" else None)
        assert (z == 0).all() and all(torch.isfinite(g).all() for g in grads)


# --------------------------------------------------------------------------------------------------------------
# The paper's ablations against their own formulas.

@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("causal", [False, True])
def test_no_rpe_is_plain_linear_attention(path, causal):
    q, k, v, _, W = make_inputs(N=100, dtype=torch.float64)
    mask = padding_mask(2, 100)
    z = attend(path, q, k, v, None, W, mask=mask, causal=causal, band_block=16)
    # φ(q̂_i)ᵀ Σ_j φ(k̂_j) v_jᵀ / φ(q̂_i)ᵀ Σ_j φ(k̂_j), the sums over j ≤ i when causal: prefix sums.
    m = W.shape[0]
    qh, kh = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    phi_q = torch.exp(qh @ W.T - 0.5) / math.sqrt(m)
    phi_k = torch.exp(kh @ W.T - 0.5) / math.sqrt(m) * mask[:, None, :, None]
    kv = phi_k[..., :, None] * v[..., None, :]  # (B, H, S, m, Dv)
    if causal:
        kv_sum, k_sum = kv.cumsum(2), phi_k.cumsum(2)
    else:
        kv_sum, k_sum = kv.sum(2, keepdim=True), phi_k.sum(2, keepdim=True)
    want = torch.einsum("bhnr,bhnre->bhne", phi_q, kv_sum.expand_as(kv)) / (phi_q * k_sum).sum(-1, keepdim=True)
    rows = torch.isfinite(want)
    assert rel(z[rows], want[rows]) <= 1e-10


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("causal", [False, True])
def test_unnormalized_prf_matches_its_formula(path, causal):
    N, w = 80, 6
    q, k, v, b, W = make_inputs(N=N, D=8, dtype=torch.float64)
    q, k = 0.7 * q, 0.7 * k  # ‖x‖ ~ 2: large enough to differ from the normalized form, small for exp
    b = b[:, torch.arange(-(N - 1), N).clamp(-w, w) + N - 1]  # constant beyond ±w, for the band path
    mask = padding_mask(2, N)
    z = attend(path, q, k, v, b, W, normalize=False, mask=mask, causal=causal, max_distance=w, band_block=8)
    want = eq10(q, k, v, b, W, normalize=False, causal=causal, mask=mask)
    rows = torch.isfinite(want)
    assert rel(z[rows], want[rows]) <= 1e-10
    assert rel(z[rows], eq10(q, k, v, b, W, causal=causal, mask=mask)[rows]) > 1e-2  # not the NPRF output


# --------------------------------------------------------------------------------------------------------------
# The attention matrix.

@pytest.mark.parametrize("causal", [False, True])
def test_return_weights(causal):
    q, k, v, b, W = make_inputs(N=60)
    mask = padding_mask(2, 60)
    z, A = nprf_attention(q, k, v, b, W, attention_mask=mask, is_causal=causal, return_weights=True)
    assert A.shape == (2, 2, 60, 60)
    has_key = (mask.cumsum(-1) > 0) if causal else mask.any(-1, keepdim=True).expand(-1, 60)
    sums = A.sum(-1)
    assert torch.allclose(sums[has_key[:, None].expand_as(sums)], torch.tensor(1.0), atol=1e-5)
    assert (A[~has_key[:, None].expand_as(sums)] == 0).all()
    assert (A * ~mask[:, None, None, :] == 0).all()  # padded keys
    if causal:
        assert (A.triu(1) == 0).all()  # future keys
    assert (A >= 0).all()
    assert rel(A @ v, z) <= 1e-5
    z_fast = attend("fft", q, k, v, b, W, mask=mask, causal=causal)
    assert rel(z_fast, z) <= 1e-4


# --------------------------------------------------------------------------------------------------------------
# Mixed precision: float32 inside, finite at 8k tokens.

@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_autocast_long_sequence_is_finite(half):
    N = 8192
    q, k, v, _, W = make_inputs(B=1, H=1, N=N, D=8, Dv=4, m=4)
    bucket_bias = 3 * torch.randn(1, 32, generator=torch.Generator().manual_seed(2))
    b = rpe_bias_from_buckets(bucket_bias, N, bidirectional=False)
    md = t5_constant_distance(False)
    leaves = [t.to(half).requires_grad_() for t in (q, k, v)]
    with torch.autocast("cpu", dtype=half):
        z_band = nprf_attention(*leaves, b, W, max_distance=md, is_causal=True)  # auto: the band path
        z_fft = attend("fft", *leaves, b, W, causal=True)
    assert z_band.dtype == half and z_fft.dtype == half
    assert torch.isfinite(z_band).all() and torch.isfinite(z_fft).all()
    (z_band.float().sum() + z_fft.float().sum()).backward()
    assert all(torch.isfinite(t.grad).all() for t in leaves)
    # Both are the float32 result rounded to half.
    want = attend("band", *(t.detach().float() for t in leaves), b, W, causal=True, max_distance=md)
    assert rel(z_band.float(), want) <= 1e-2 and rel(z_fft.float(), want) <= 1e-2


# --------------------------------------------------------------------------------------------------------------
# T5 buckets: exactly where the bias stops changing.

@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (32, 64), (16, 100), (8, 20)])
def test_t5_buckets_and_constant_distance(bidirectional, num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    t = torch.arange(-1000, 1001)
    got = t5_relative_buckets(t, bidirectional, num_buckets, max_distance)
    want = T5Attention._relative_position_bucket(t, bidirectional, num_buckets, max_distance)
    assert torch.equal(got, want)

    d = t5_constant_distance(bidirectional, num_buckets, max_distance)
    assert 1 <= d <= max_distance
    far = torch.arange(d, 20 * max_distance)
    for sign in (1, -1):
        assert (t5_relative_buckets(sign * far, bidirectional, num_buckets, max_distance) ==
                t5_relative_buckets(torch.tensor(sign * d), bidirectional, num_buckets, max_distance)).all()
    # Minimal: one step closer, one side still differs (the negative side when causal: j − i ≥ 0 is all bucket 0).
    b_d = t5_relative_buckets(torch.tensor([-d, d]), bidirectional, num_buckets, max_distance)
    b_d1 = t5_relative_buckets(torch.tensor([-(d - 1), d - 1]), bidirectional, num_buckets, max_distance)
    assert d == 1 or (b_d != b_d1).any()


def test_t5_constant_distance_defaults():
    # Documented for the model layer: below T5's max_distance because the last log bucket starts earlier.
    assert t5_constant_distance(True, 32, 128) == 91
    assert t5_constant_distance(False, 32, 128) == 113


@pytest.mark.parametrize("bidirectional", [True, False])
def test_bucketed_bias_band_equals_unclamped_explicit(bidirectional):
    N, num_buckets, max_distance = 200, 16, 40
    d = t5_constant_distance(bidirectional, num_buckets, max_distance)
    q, k, v, _, W = make_inputs(N=N)
    bucket_bias = torch.randn(2, num_buckets, generator=torch.Generator().manual_seed(3), requires_grad=True)
    mask = padding_mask(2, N)
    out = {}
    for path, md in (("explicit", None), ("band", d), ("fft", None)):
        b = rpe_bias_from_buckets(bucket_bias, N, bidirectional=bidirectional, max_distance=max_distance)
        z = attend(path, q, k, v, b, W, max_distance=md, mask=mask, causal=not bidirectional, band_block=8)
        out[path] = (z.detach(), torch.autograd.grad(z.square().sum(), bucket_bias)[0])
    for path in ("band", "fft"):
        assert rel(out[path][0], out["explicit"][0]) <= 1e-4
        assert rel(out[path][1], out["explicit"][1]) <= 1e-4
    # One less than d is not enough (the band path then reads the wrong bucket for some offsets).
    b = rpe_bias_from_buckets(bucket_bias.detach(), N, bidirectional=bidirectional, max_distance=max_distance)
    z = attend("band", q, k, v, b, W, max_distance=d - 1, mask=mask, causal=not bidirectional, band_block=8)
    assert rel(z, out["explicit"][0]) > 1e-4


# --------------------------------------------------------------------------------------------------------------
# API details.

def _rule_cases():
    """(facts of a call, the backend backend="auto" takes)."""
    n_band = 2 * 10 + 3 * nprf._band_block(10) + 1  # the shortest sequence whose band (w = 10) is narrower
    n_fit = math.isqrt(EXPLICIT_MAX_WEIGHTS // 8)  # the longest sequence whose explicit weights fit, B·H = 8
    n_wide = 2 * 300 + 3 * nprf._band_block(300)  # a band (w = 300) as wide as the sequence ...
    bh_wide = EXPLICIT_MAX_WEIGHTS // (n_wide * n_wide) + 1  # ... with this many B·H the explicit weights do not fit
    return [
        (dict(n=64, max_distance=10, return_weights=True), "explicit"),
        (dict(n=64, max_distance=10, mask="pairs"), "explicit"),
        (dict(n=64, s=32, has_bias=False), "explicit"),  # cross-attention
        (dict(n=n_band, s=n_band, max_distance=10), "band"),
        (dict(n=n_band - 1, s=n_band - 1, max_distance=10), "explicit"),
        (dict(n=n_band, s=n_band, max_distance=10, mask="padding"), "band"),
        (dict(n=n_band, s=n_band, has_bias=False), "band"),  # no bias: c constant everywhere
        (dict(batch_heads=8, n=n_fit, s=n_fit), "explicit"),
        (dict(batch_heads=8, n=n_fit + 1, s=n_fit + 1), "fft"),
        (dict(n=4000, s=4000, max_distance=3000), "explicit"),  # band wider than the sequence ...
        (dict(batch_heads=bh_wide, n=n_wide, s=n_wide, max_distance=300), "band"),  # ... unless explicit won't fit
        (dict(batch_heads=bh_wide - 1, n=n_wide, s=n_wide, max_distance=300), "explicit"),
        (dict(n=100, s=100, explicit_max_weights=0), "fft"),
        (dict(n=100, s=100, max_distance=8), "explicit"),  # 2w + 3P >= N with the default block ...
        (dict(n=100, s=100, max_distance=8, band_block=8), "band"),  # ... not with a block of 8
    ]


@pytest.mark.parametrize("facts,expected", _rule_cases())
def test_backend_rule(facts, expected):
    call = dict(batch_heads=1, n=64, s=64, has_bias=True, max_distance=None, return_weights=False, mask=None)
    assert choose_backend(**{**call, **facts}) == expected


def test_auto_is_the_backend_the_rule_names():
    q, k, v, b, W = make_inputs(N=100)
    for kw, expected in [(dict(max_distance=8, band_block=8), "band"), (dict(explicit_max_weights=0), "fft"),
                         (dict(max_distance=8), "explicit")]:
        z = nprf_attention(q, k, v, b, W, is_causal=True, **kw)
        assert torch.equal(z, nprf_attention(q, k, v, b, W, is_causal=True, backend=expected, **kw)), expected
        assert rel(z, attend("reference", q, k, v, b, W, max_distance=kw.get("max_distance"), causal=True)) <= 1e-5


def test_backend_errors_name_the_allowed_ones():
    q, k, v, b, W = make_inputs(N=20)
    with pytest.raises(ValueError, match=r"unknown backend 'toeplitz'; allowed: 'auto', 'explicit', 'fft', 'band'"):
        nprf_attention(q, k, v, b, W, backend="toeplitz")
    with pytest.raises(ValueError, match=r"backend 'fft' cannot run this call: return_weights .* explicit path"):
        nprf_attention(q, k, v, b, W, backend="fft", return_weights=True)
    with pytest.raises(ValueError, match=r"backend 'band' cannot run this call: the band path needs max_distance"):
        nprf_attention(q, k, v, b, W, backend="band")
    with pytest.raises(ValueError, match=r"backend 'band' cannot run this call: N != S"):
        nprf_attention(q[..., :5, :], k, v, None, W, backend="band")


@pytest.mark.parametrize("causal", [False, True])
def test_last_queries_against_a_longer_key_cache(causal):
    # Decoding with a cache: N < S queries are the last N positions; rows equal the full computation's.
    q, k, v, b, W = make_inputs(N=60)
    mask = padding_mask(2, 60)
    full = nprf_attention(q, k, v, b, W, attention_mask=mask, is_causal=causal)
    for n in (1, 3):
        z = nprf_attention(q[..., -n:, :], k, v, b, W, attention_mask=mask, is_causal=causal)
        assert rel(z, full[..., -n:, :]) <= 1e-6


def test_cross_attention_without_rpe_and_errors():
    q, k, v, _, W = make_inputs(N=30)
    z = nprf_attention(q[..., :7, :], k, v, None, W)
    assert z.shape == (2, 2, 7, 6)
    assert rel(z, nprf_attention(q, k, v, None, W)[..., :7, :]) <= 1e-6
    with pytest.raises(ValueError):
        nprf_attention(q, k[..., :7, :], v[..., :7, :], torch.zeros(2, 13), W)  # N > S with a bias
    with pytest.raises(ValueError):
        nprf_attention(q, k, v, torch.zeros(2, 30), W)


def test_draw_features_is_reproducible():
    W1 = draw_features(16, 8, torch.Generator().manual_seed(5))
    W2 = draw_features(16, 8, torch.Generator().manual_seed(5))
    assert W1.shape == (16, 8) and torch.equal(W1, W2)


def test_module_imports_only_stdlib_torch_and_its_torch_only_siblings():
    import ast
    import sys

    tree = ast.parse(open(nprf.__file__, encoding="utf-8").read())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    assert all(r == "torch" or r in sys.stdlib_module_names for r in roots), roots
    siblings = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level > 0}
    assert siblings <= {"attention_masks", "attention_blocks"}, siblings
