"""Normalized positive random features with relative positions (NPRF + RPE), computed exactly.

Where the math comes from: Luo et al., "Stable, Fast and Accurate: Kernelized Attention with Relative Positional
Encoding" (NeurIPS 2021, arXiv:2106.12566), with these choices where it leaves them open: one learned bias table
per head, T5 buckets, only exact ways to compute it:

    q̂ = q/‖q‖,  k̂ = k/‖k‖                                     §3.3 "Normalized Kernelized Attention"
    φ(x) = exp(W x − ‖x‖²/2) / √m,  W ∈ R^{m×D}, rows ~ N(0, I)   Eq. (5), positive random features
    c_t = exp(b_t),  t = j − i                                   Eq. (6), RPE as a bias, per head
    z_i = φ(q̂_i)ᵀ Σ_j c_{j−i} φ(k̂_j) v_jᵀ / φ(q̂_i)ᵀ Σ_j c_{j−i} φ(k̂_j)     Eq. (10)

The sums over j are products with the Toeplitz matrix C = [c_{j−i}] (Eq. 11–13). Three exact backends compute
them, all giving the same function (tests check outputs and gradients against the plain reference in
`hf_mgk.reference`, which is not part of this file):

  explicit  build the N×S weights: O(N²) time and memory; the only path for return_weights, a pair mask or N ≠ S.
  fft       Toeplitz product by FFT (§3.2): O(N log N) for any bias, on m·(Dv+1) channels per (batch, head).
  band      needs max_distance = w (or no bias): c is constant for |j − i| ≥ w, so C is a band plus two
            constant triangles. The band is done blockwise (query block against its neighbour key blocks), the
            triangles from prefix sums over blocks of φ(k̂)[v, 1]ᵀ: exact and O(N·(w + m·Dv)).

`choose_backend` picks one for backend="auto": explicit for the weights, a pair mask or N ≠ S; band where it
applies and its band is narrower than the sequence (2w + 3P < N, P the band block), or where the explicit weights
would not fit (B·H·N·S > explicit_max_weights); else explicit while it fits, fft beyond. Memory decides between
explicit and fft, not speed (timings: hf-mgk's docs/benchmarks/kernel-notes.md#nprf-path-rule).

Exactness conventions (none changes Eq. 10):
  * φ is shifted by constants that cancel in the ratio: 1/√m is dropped, each query's features are divided by
    their largest entry, the keys' by one shared factor (data-independent under normalize=True, so causal outputs
    do not depend on later tokens even in round-off; under normalize=False the bound ‖w_r‖²/2 when causal, the
    max over valid keys otherwise).
    c = exp(b − max b), the max taken over the offsets that are used.
  * max_distance=w means b_t for |t| > w is read from b_{±w}: entries further out are not used by any path (they
    must equal b_{±w}, as T5 buckets do; see `t5_constant_distance`), and their gradient lands on b_{±w}.
  * A query with no valid key (all keys padded, or causal and every key up to it padded) gets z = 0, like a fully
    masked row, and a zero gradient.
  * Everything runs in float32 (float64 if given) with autocast disabled (no half precision), the FFTs in
    FFT_DTYPE (float64, see there); outputs come back in the query's dtype.

Only the standard library, torch and its siblings are imported: this file is copied next to HF remote-code model
files.
"""

import math

import torch
import torch.nn.functional as F

from .attention_blocks import resolve_backend
from .attention_masks import mask_kind, rows_with_keys

__all__ = [
    "BACKENDS",
    "choose_backend",
    "nprf_attention",
    "draw_features",
    "t5_relative_buckets",
    "t5_constant_distance",
    "rpe_bias_from_buckets",
]

BACKENDS = ("explicit", "fft", "band")
# The defaults of nprf_attention's keyword arguments of the same names (module docstring), to retune for other
# hardware. Largest B·H·N·S for the explicit path when the band path does not apply: 256 MiB per float32 N×S tensor.
EXPLICIT_MAX_WEIGHTS = 2**26
# Target band block length. The block actually used divides the band evenly (`_band_block`): shorter blocks
# waste less band, longer ones make better matmuls (hf-mgk's docs/benchmarks/kernel-notes.md#nprf-path-rule).
BAND_BLOCK = 64
# FFT precision. FFT round-off is absolute, set by the largest terms (the largest c, φ ≥ 0 piling up at frequency
# 0), so a row whose own terms are all small loses its relative precision: early causal rows (a few keys) when b
# spans several nats (hf-mgk's docs/benchmarks/kernel-notes.md#nprf-fft-precision). Float32 (never less) may be set here
# for speed where b's range is small.
FFT_DTYPE = torch.float64
# Working memory of one FFT chunk (the channels' spectra); backward recomputes them chunk by chunk.
FFT_CHUNK_BYTES = 32 * 2**20


def draw_features(m, D, generator=None, *, device=None, dtype=torch.float32):
    """W (m, D) with rows ~ N(0, I) (Eq. 5). Store it as a persistent buffer so reloads give the same outputs."""
    return torch.randn(m, D, generator=generator, device=device, dtype=dtype)


def t5_relative_buckets(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """T5's bucket of each offset j − i (HF T5Attention._relative_position_bucket, the same arithmetic).

    Half the buckets (per direction) are exact offsets, the rest logarithmic up to max_distance; beyond it the
    last bucket. bidirectional=False maps every j − i ≥ 0 to bucket 0 (a causal model never uses j > i).
    """
    relative_position = torch.as_tensor(relative_position)
    buckets = torch.zeros_like(relative_position, dtype=torch.long)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).long() * num_buckets
        n = relative_position.abs()
    else:
        n = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    if max_distance <= max_exact:
        raise ValueError(f"max_distance={max_distance} must exceed the exact range {max_exact} (T5 buckets)")
    # log(0) at n = 0 is discarded by the torch.where below, as in T5.
    large = max_exact + (
        torch.log(n.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(n < max_exact, n, large)


def t5_constant_distance(bidirectional=True, num_buckets=32, max_distance=128):
    """Smallest d ≥ 1 with bucket(t) = bucket(d) for all t ≥ d and bucket(t) = bucket(−d) for all t ≤ −d.

    Pass it as `max_distance` to `nprf_attention` with a bias from `rpe_bias_from_buckets`. It is below T5's
    max_distance: the last log bucket starts earlier (defaults: 91 bidirectional, 113 unidirectional).
    """
    # Buckets grow with |t| and saturate at |t| = max_distance at the latest (the log ratio reaches 1 there);
    # scanning twice as far also checks that they stay put.
    t = torch.arange(0, 2 * max_distance + 2)
    d = 1
    for sign in (1, -1):
        b = t5_relative_buckets(sign * t, bidirectional, num_buckets, max_distance)
        changes = (b[1:] != b[:-1]).nonzero()
        if len(changes):
            d = max(d, int(changes[-1]) + 1)
    if d > max_distance:
        raise AssertionError("T5 buckets did not saturate by max_distance")
    return d


def rpe_bias_from_buckets(bucket_bias, length, *, bidirectional=True, max_distance=128):
    """Expand per-bucket biases (H, num_buckets) to rpe_bias (H, 2·length − 1) for offsets −(S−1) … S−1.

    Differentiable (a gather), so the learned parameters stay the per-bucket biases.
    """
    t = torch.arange(-(length - 1), length, device=bucket_bias.device)
    idx = t5_relative_buckets(t, bidirectional, bucket_bias.shape[-1], max_distance)
    return bucket_bias[:, idx]


def choose_backend(*, batch_heads, n, s, has_bias, max_distance, return_weights, mask,
                   explicit_max_weights=EXPLICIT_MAX_WEIGHTS, band_block=None):
    """The backend `nprf_attention` runs with backend="auto" (module docstring), from plain facts about the call:
    batch_heads = B·H; has_bias: an rpe_bias is given; mask: None, "padding" or "pairs" (a whole 4-D mask);
    band_block: the band path's block length (None: `_band_block(w)`)."""
    if return_weights or mask == "pairs" or n != s:
        return "explicit"
    w = max_distance if has_bias else 0
    explicit_fits = batch_heads * n * s <= explicit_max_weights
    # The band path sees under 2w + 3P keys per query where the explicit one sees N. Where its band covers the
    # whole sequence it is still exact and O(N) in memory, and faster than the float64 FFT, so it takes over from
    # explicit before the FFT would.
    if w is not None and (2 * w + 3 * (band_block or _band_block(w)) < n or not explicit_fits):
        return "band"
    return "explicit" if explicit_fits else "fft"


def _refusals(*, n, s, has_bias, max_distance, return_weights, mask, **_):
    """Why each backend cannot run a call (None: it can)."""
    linear = ("return_weights and a 3-D / 4-D attention mask need the explicit path"
              if return_weights or mask == "pairs"
              else "N != S (queries that are not the whole sequence) needs the explicit path" if n != s else None)
    band = linear or ("the band path needs max_distance (or rpe_bias=None)" if has_bias and max_distance is None
                      else None)
    return {"explicit": None, "fft": linear, "band": band}


def nprf_attention(query, key, value, rpe_bias, features, *, normalize=True, max_distance=None,
                   attention_mask=None, is_causal=False, return_weights=False, query_offset=None, backend="auto",
                   explicit_max_weights=EXPLICIT_MAX_WEIGHTS, band_block=None, fft_chunk_bytes=FFT_CHUNK_BYTES):
    """Eq. (10) of Luo et al. 2021; see the module docstring for the backends and conventions.

    query (B, H, N, D), key (B, H, S, D), value (B, H, S, Dv); features (m, D) = W.
        N < S (decoding with a key/value cache): the queries are the last N positions, query i sits at
        position i + S − N (only the explicit path, O(N·S)). Without bias and causality any N, S.
    rpe_bias: (H, 2S−1) b for offsets j − i = −(S−1) … S−1 (index j − i + S − 1), or None (c = 1: plain linear
        attention, the paper's no-RPE ablation).
    normalize: unit-norm q and k first (NPRF); False is the unnormalized PRF ablation (its features can
        underflow/overflow for large norms: that is the paper's point, nothing hides it).
    max_distance: b is constant for j − i ≥ max_distance and for j − i ≤ −max_distance (enables the O(N) path).
    attention_mask: bool (B, S), True = real token; or a whole (B or 1, 1, N, S) mask for the pairs, bool (True =
        may attend) or additive float (its exp multiplies the pair's term, as c does). A pair mask needs the explicit
        path (the linear-time paths sum over the keys without forming pairs): backend="auto" takes that path while
        its N×S weights fit (B·H·N·S ≤ explicit_max_weights) and refuses the call beyond.
    is_causal: c_{j−i} = 0 for j > i.
    query_offset: the position of the first query among the S keys (default S − N, the last N positions; less with
        a static cache, whose free slots follow the queries).
    backend: "auto" (`choose_backend`) or one of BACKENDS ("explicit", "fft", "band"); a ValueError names one that
        cannot run the call.
    explicit_max_weights: the largest B·H·N·S the automatic choice gives the explicit path (its memory).
    band_block: the band path's block length P (None: near BAND_BLOCK, covering the band evenly: `_band_block`).
    fft_chunk_bytes: working memory of one FFT chunk (the channels' spectra); backward recomputes them chunk by
        chunk.
    Returns z (B, H, N, Dv) and, with return_weights, the (B, H, N, S) attention matrix as well.
    """
    B, H, N, D = query.shape
    S = key.shape[-2]
    mask = mask_kind(attention_mask)
    pairs = mask == "pairs"
    if key.shape != (B, H, S, D) or value.shape[:3] != (B, H, S) or features.shape[-1] != D:
        raise ValueError(f"shapes: query {tuple(query.shape)}, key {tuple(key.shape)}, "
                         f"value {tuple(value.shape)}, features {tuple(features.shape)}")
    if N > S and (rpe_bias is not None or is_causal):
        raise ValueError("relative positions and causal masking need N <= S (queries = the last N positions)")
    if rpe_bias is not None and (rpe_bias.dim() != 2 or rpe_bias.shape[-1] != 2 * S - 1
                                 or rpe_bias.shape[0] not in (1, H)):
        raise ValueError(f"rpe_bias must be (H, 2S-1) = ({H}, {2 * S - 1}), got {tuple(rpe_bias.shape)}")
    if pairs and backend == "auto" and B * H * N * S > explicit_max_weights:
        raise ValueError(
            f"a 3-D / 4-D attention mask needs NPRF's explicit path, whose weights (B·H·N·S = {B * H * N * S}) exceed "
            f"explicit_max_weights = {explicit_max_weights}; the linear-time paths take a (batch, sequence_length) "
            "padding mask only")
    facts = dict(batch_heads=B * H, n=N, s=S, has_bias=rpe_bias is not None, max_distance=max_distance,
                 return_weights=return_weights, mask=mask)
    backend = resolve_backend(backend, choose_backend(**facts, explicit_max_weights=explicit_max_weights,
                                                      band_block=band_block), _refusals(**facts))
    dtype = torch.promote_types(query.dtype, torch.float32)
    offset = S - N if query_offset is None else query_offset
    pair_weight, valid = None, None
    if pairs:  # the pair mask as a factor of each term; keys that no query sees count as padding
        pair_weight = attention_mask.to(query.device)
        pair_weight = pair_weight.to(dtype) if pair_weight.dtype == torch.bool else torch.exp(pair_weight.to(dtype))
        valid = (pair_weight > 0).any(-2).any(1).expand(B, S)
    elif attention_mask is not None:
        valid = attention_mask.to(device=query.device, dtype=torch.bool)
    # No half precision inside, even under fp16/bf16 autocast (float32 math, FFT_DTYPE FFTs): the sums over N
    # positive terms overflow float16, and bfloat16 loses the small ones.
    with torch.autocast(query.device.type, enabled=False):
        q, k, v, W = (t.to(dtype) for t in (query, key, value, features))
        phi_q, phi_k = _feature_maps(q, k, W, normalize, valid, is_causal)
        c = _toeplitz_coefficients(rpe_bias, S, max_distance, is_causal, dtype, q.device)
        # The value gets a channel of ones: its output is the denominator, computed with the numerator.
        v1 = torch.cat([v, v.new_ones(B, H, S, 1)], dim=-1)
        weights = None
        if backend == "explicit":
            out, weights = _explicit(phi_q, phi_k, v1, c, offset, pair_weight)
        elif backend == "fft":
            out = _fft(phi_q, phi_k, v1, c, fft_chunk_bytes)
        else:
            w = 0 if rpe_bias is None else max_distance  # no bias: c is constant everywhere
            out = _band(phi_q, phi_k, v1, c, w, is_causal, band_block or _band_block(w))
        num, den = out[..., :-1], out[..., -1:]

        # Rows without any valid key have den = 0 exactly in Eq. 10; decide them from the mask, not from den,
        # so FFT round-off cannot turn 0/0 into noise, and give them z = 0 and no gradient.
        # Without a mask every row has a key (the first one): no selection needed.
        if pairs:
            has_key = (pair_weight > 0).any(-1, keepdim=True).expand(B, 1, N, 1)
        else:
            has_key = None if valid is None else rows_with_keys(valid, N, is_causal, offset)
        if has_key is not None:
            den = torch.where(has_key, den, torch.ones_like(den))
        z = num / den
        if has_key is not None:
            z = torch.where(has_key, z, torch.zeros_like(num))
        if return_weights:
            weights = weights / den
            if has_key is not None:
                weights = torch.where(has_key, weights, torch.zeros_like(weights))
            weights = weights.to(query.dtype)
            # z again, as the returned weights times v (Eq. 10 row by row): the output is then computed from the
            # tensor handed out, which is in the autograd graph (gradient-based attention attribution).
            z = weights.to(dtype) @ v
        z = z.to(query.dtype)
    return (z, weights) if return_weights else z


def _feature_maps(q, k, W, normalize, valid, is_causal):
    """φ(q̂), φ(k̂) of Eq. (5), each up to a constant factor that cancels in Eq. (10) and keeps exp ≤ 1."""
    log_q, log_k = _log_features(q, W, normalize), _log_features(k, W, normalize)
    if valid is not None:
        # Padded keys: φ = 0. Masked before exp so that no inf·0 reaches the backward pass.
        log_k = log_k.masked_fill(~valid[:, None, :, None], float("-inf"))
    # Per query: any factor cancels in z_i. Keys: one factor for all of them (per batch row and head).
    q_shift = log_q.amax(-1, keepdim=True)
    if normalize:
        # |w_r·k̂| ≤ ‖w_r‖: a bound that does not look at the data, so later tokens cannot change
        # earlier outputs even in round-off.
        k_shift = W.norm(dim=-1).amax(-1)
    elif is_causal:
        # w_r·k − ‖k‖²/2 ≤ ‖w_r‖‖k‖ − ‖k‖²/2 ≤ ‖w_r‖²/2: again a bound independent of the data. The max over
        # the keys would let a later key with large features underflow every earlier key to 0 (0/0 = NaN in
        # earlier rows: a causal leak); with the bound, underflow depends on each key alone.
        k_shift = 0.5 * W.norm(dim=-1).amax(-1).square()
    else:
        # Bidirectional: every query sees every key, so the data's own max keeps the most keys representable.
        k_shift = log_k.amax(dim=(-2, -1), keepdim=True)
        k_shift = torch.where(torch.isfinite(k_shift), k_shift, torch.zeros_like(k_shift))  # all padded
    return torch.exp(log_q - q_shift.detach()), torch.exp(log_k - k_shift.detach())


def _log_features(x, W, normalize):
    """W x̂ − ‖x̂‖²/2 with x̂ = x/‖x‖ (F.normalize's eps: a zero vector stays zero) or x̂ = x.

    Normalising after the projection, W x̂ = (W x)/‖x‖, divides m values per position instead of D, and its
    backward is far cheaper than F.normalize's (kernel notes, "NPRF path rule"); the result is the same function.
    """
    if not normalize:
        return x @ W.T - 0.5 * (x * x).sum(-1, keepdim=True)
    norm = x.norm(dim=-1, keepdim=True)
    clamped = norm.clamp_min(1e-12)
    return (x @ W.T) / clamped - 0.5 * (norm / clamped).square()


def _toeplitz_coefficients(rpe_bias, S, max_distance, is_causal, dtype, device):
    """c_t = exp(b_t − max b) for t = −(S−1) … S−1, shape (H or 1, 2S−1); the factor exp(−max b) cancels."""
    t = torch.arange(-(S - 1), S, device=device)
    if rpe_bias is None:
        b = torch.zeros(1, 2 * S - 1, dtype=dtype, device=device)
    else:
        b = rpe_bias.to(dtype)
        if max_distance is not None:
            # Every path reads b_{±w} beyond ±w, so all paths compute one function (and one gradient).
            b = b[:, t.clamp(-max_distance, max_distance) + S - 1]
    if is_causal:
        b = b.masked_fill(t > 0, float("-inf"))
    return torch.exp(b - b.amax(-1, keepdim=True).detach())


def _explicit(phi_q, phi_k, v1, c, offset, pair_weight=None):
    """Unnormalized weights φ(q̂_i)·φ(k̂_j) c_{j−i} for every pair (times the pair mask's factor, if
    any), then Eq. (10) term by term. Query i sits at position offset + i."""
    N, S = phi_q.shape[-2], phi_k.shape[-2]
    # Index of the offset j − (i + offset) in c: j − i − offset + S − 1. Clamped only for N > S (no bias, not
    # causal), where c ≡ 1 anyway.
    idx = (torch.arange(S, device=c.device)[None, :] - torch.arange(N, device=c.device)[:, None] - offset + S - 1)
    weights = (phi_q @ phi_k.transpose(-1, -2)) * c[:, idx.clamp(0, 2 * S - 2)]
    if pair_weight is not None:
        weights = weights * pair_weight
    return weights @ v1, weights


def _fft(phi_q, phi_k, v1, c, chunk_bytes):
    """§3.2: out_i = Σ_r φ(q̂_i)_r Σ_j c_{j−i} φ(k̂_j)_r [v_j, 1] with the sums over j done by FFT."""
    B, H, N, m = phi_q.shape
    E = v1.shape[-1]
    G = B * H
    # Sequence last: the FFT runs along contiguous memory. c per (batch, head) group; its gradient sums back.
    q, k, v = (t.reshape(G, -1, t.shape[-1]).transpose(1, 2) for t in (phi_q, phi_k, v1))
    out = _ToeplitzFFT.apply(q, k, v, c.expand(H, -1).repeat(B, 1), chunk_bytes)  # (G, E, N)
    return out.transpose(1, 2).reshape(B, H, N, E)


class _ToeplitzFFT(torch.autograd.Function):
    """out[g, e, i] = Σ_r q[g, r, i] Σ_j c[g, j−i] k[g, r, j] v[g, e, j], per group g (Eq. 11–13).

    The m·E channels X_j = k_j v_jᵀ are the paper's; Σ_j c_{j−i} X_j = Σ_s h_s X_{i−s} with h_s = c_{−s} is a
    linear convolution, done circularly with length L ≥ 2S−1 so that offsets −(S−1) … S−1 never wrap onto each
    other. A hand-written backward uses the adjoints (the transposed Toeplitz product has spectrum conj(ĥ);
    the gradient of c is a cross-correlation) and recomputes the channels chunk by chunk: nothing of size
    m·E·L is stored (faster than autograd plus checkpointing; hf-mgk's docs/benchmarks/kernel-notes.md#nprf-fft).
    """

    @staticmethod
    def forward(ctx, q, k, v, c, chunk_bytes):
        ctx.save_for_backward(q, k, v, c)
        ctx.chunk_bytes = chunk_bytes
        out = q.new_zeros(q.shape[0], v.shape[1], q.shape[2])
        for g, r, h_hat, L in _fft_chunks(q, k, v, c, chunk_bytes):
            x_hat = torch.fft.rfft(_outer(k[g, r], v[g]), n=L)  # (g, r, E, L//2+1)
            out[g] += _contract(q[g, r], torch.fft.irfft(x_hat.mul_(h_hat), n=L)[..., :q.shape[2]])
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, c = ctx.saved_tensors
        N, S = q.shape[2], k.shape[2]
        grad_q, grad_k, grad_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        L = _fft_length(2 * S - 1)
        cross = q.new_zeros(q.shape[0], L // 2 + 1, dtype=torch.promote_types(FFT_DTYPE, torch.complex64))
        for g, r, h_hat, L in _fft_chunks(q, k, v, c, ctx.chunk_bytes):
            x_hat = torch.fft.rfft(_outer(k[g, r], v[g]), n=L)
            # dq_ir = Σ_e dout_ie (C X)_ire
            y = torch.fft.irfft(x_hat * h_hat, n=L)[..., :N]
            grad_q[g, r] = (y.mul_(grad_out[g, None].to(y.dtype))).sum(2).to(q.dtype)
            # Z = Cᵀ A with A_i = q_i dout_iᵀ: dk_jr = Σ_e Z_jre v_je, dv_je = Σ_r Z_jre k_jr
            a_hat = torch.fft.rfft(_outer(q[g, r], grad_out[g]), n=L)
            z = torch.fft.irfft(a_hat * h_hat.conj(), n=L)[..., :S]
            grad_k[g, r] = (z * v[g, None].to(z.dtype)).sum(2).to(k.dtype)
            grad_v[g] += (z * k[g, r, None].to(z.dtype)).sum(1).to(v.dtype)
            # dc_t = Σ_i Σ_re A_ire X_(i+t)re: a cross-correlation, summed over channels in frequency space
            if ctx.needs_input_grad[3]:
                cross[g] += (a_hat.conj() * x_hat).sum((1, 2))
        cross = torch.fft.irfft(cross, n=L)  # cross[t mod L] for t = −(S−1) … S−1
        grad_c = torch.cat([cross[:, L - S + 1:], cross[:, :S]], dim=-1).to(c.dtype)
        return grad_q, grad_k, grad_v, grad_c, None


def _fft_chunks(q, k, v, c, chunk_bytes):
    """(group slice, feature slice, kernel spectrum ĥ, L) covering all (g, r), each chunk's spectra within
    chunk_bytes (one (g, r) unit at least)."""
    G, m, S = k.shape
    E = v.shape[1]
    L = _fft_length(2 * S - 1)
    f = c.to(FFT_DTYPE).flip(-1)  # f[n] = c_{S−1−n}, so h_s = f[S−1+s] for s = −(S−1) … S−1, placed at s mod L
    h_hat = torch.fft.rfft(torch.cat([f[:, S - 1:], f.new_zeros(G, L - 2 * S + 1), f[:, :S - 1]], dim=-1))
    unit = 8 * L * E * h_hat.real.element_size()  # x̂, â, their products and inverse transforms per (g, r)
    units = max(1, chunk_bytes // unit)
    r_step = min(m, units)
    g_step = max(1, units // m) if r_step == m else 1
    for g0 in range(0, G, g_step):
        g = slice(g0, min(G, g0 + g_step))
        for r0 in range(0, m, r_step):
            yield g, slice(r0, min(m, r0 + r_step)), h_hat[g, None, None, :], L


def _outer(a, b):
    """(g, r, n) × (g, E, n) -> (g, r, E, n) channels in FFT precision."""
    return a[:, :, None, :].to(FFT_DTYPE) * b[:, None, :, :].to(FFT_DTYPE)


def _contract(a, y):
    """Σ_r a[g, r, n] y[g, r, e, n] -> (g, E, n), back in a's dtype (y is scratch: overwritten)."""
    return y.mul_(a[:, :, None, :].to(y.dtype)).sum(1).to(a.dtype)


def _fft_length(n):
    """Smallest 2^a·3^b·5^c ≥ n: FFT libraries are fastest on such sizes, and it wastes less than 2^a."""
    best = 1 << (n - 1).bit_length()
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            p = p35
            while p < n:
                p *= 2
            best = min(best, p)
            p35 *= 3
        p5 *= 5
    return best


def _near(x, n, width):
    """(B, H, nb, P, e) blocks -> (B, H, nb, width·P, e): block I's neighbours I−n … I−n+width−1 side by side
    (zero blocks beyond the ends)."""
    nb = x.shape[2]
    xp = F.pad(x, (0, 0, 0, 0, n, n))
    return torch.cat([xp[:, :, d:d + nb] for d in range(width)], dim=3)


class _BandProduct(torch.autograd.Function):
    """out_I = ((q_I k_near(I)ᵀ) ∘ c_near) v_near(I) for every query block I (the band of `_band`).

    Autograd through the same three ops spent most of its time outside the matrix products (zero-filled
    full-size gradients for every neighbour slice, the concatenations' backward, the broadcast product's
    reductions; hf-mgk's docs/benchmarks/kernel-notes.md#nprf-band); here the neighbours' gradients are added straight
    into one buffer and only the scores q kᵀ are kept (the weighted ones are rebuilt).
    """

    @staticmethod
    def forward(ctx, qb, kb, vb, c_near, n, width):
        k_near, v_near = _near(kb, n, width), _near(vb, n, width)
        scores = qb @ k_near.transpose(-1, -2)  # (B, H, nb, P, width·P)
        ctx.save_for_backward(qb, k_near, v_near, c_near, scores)
        ctx.n = n
        return (scores * c_near[:, None]) @ v_near

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        qb, k_near, v_near, c_near, scores = ctx.saved_tensors
        n, c = ctx.n, c_near[:, None]
        grad_w = grad_out @ v_near.transpose(-1, -2)  # d(weighted scores)
        grad_c = (grad_w * scores).sum((0, 2))  # (H, P, width·P)
        if c_near.shape[0] == 1:
            grad_c = grad_c.sum(0, keepdim=True)
        grad_v_near = (scores * c).transpose(-1, -2) @ grad_out  # not in place: saved tensors may be reused
        grad_s = grad_w.mul_(c)
        grad_q = grad_s @ k_near
        grad_k_near = grad_s.transpose(-1, -2) @ qb
        P = qb.shape[3]
        return grad_q, _near_backward(grad_k_near, n, P), _near_backward(grad_v_near, n, P), grad_c, None, None


def _near_backward(grad_near, n, P):
    """Adjoint of `_near`: (B, H, nb, width·P, e) -> (B, H, nb, P, e), each neighbour's share added in place."""
    B, H, nb, WP, e = grad_near.shape
    grad = grad_near.new_zeros(B, H, nb + 2 * n, P, e)
    for d in range(WP // P):
        grad[:, :, d:d + nb] += grad_near[:, :, :, d * P:(d + 1) * P]
    return grad[:, :, n:n + nb]


def _band_block(w):
    """Block length P near BAND_BLOCK with n·P just ≥ w − 1: the band then covers 2w − 1 offsets with less
    than 2n extra keys per query (BAND_BLOCK itself would leave up to 2P − 2 unused ones, 30% more work at
    the default w = 91)."""
    if w - 1 <= BAND_BLOCK:  # one neighbour block each side (or none): blocks shorter than this only cost
        return BAND_BLOCK
    n = round((w - 1) / BAND_BLOCK)
    return -(-(w - 1) // n)


def _band(phi_q, phi_k, v1, c, w, is_causal, P):
    """Band plus constant triangles: exact when c_t = c_{±w} for |t| ≥ w.

    Blocks of P positions. Key block J = I + d holds offsets j − i in dP ± (P−1), so only the
    n = ⌈(w−1)/P⌉ neighbour blocks on each side can hold some |j − i| < w: query block I meets key blocks
    I−n … I+n (causal: I−n … I) with the exact c_{j−i}. Every further block J is at least nP+1 ≥ w away, so its c
    is the constant c_{±w} and its contribution is φ(q̂_i)ᵀ c_{±w} Σ_{j in J} φ(k̂_j)[v_j, 1]ᵀ: prefix sums over
    blocks of m×(Dv+1) matrices. Nothing of size m·Dv per position is formed; the work per query is
    (2n+1)·P < 2w + 3P keys plus one m×(Dv+1) product.
    """
    B, H, N, m = phi_q.shape
    S, E = phi_k.shape[-2], v1.shape[-1]
    n = max(0, -(-(w - 1) // P))
    nb = -(-N // P)

    def blocks(x):  # (B, H, N, e) -> (B, H, nb, P, e), zero-padded: padded keys add nothing
        return F.pad(x, (0, 0, 0, nb * P - N)).view(B, H, nb, P, x.shape[-1])

    qb, kb, vb = blocks(phi_q), blocks(phi_k), blocks(v1)

    # Band: query block I against key blocks I+d, d in nbrs (zero blocks beyond the ends).
    nbrs = range(-n, 1 if is_causal else n + 1)
    a = torch.arange(P, device=c.device)
    t = torch.arange(len(nbrs) * P, device=c.device)[None, :] - n * P - a[:, None]  # j − i in the band
    # Offsets beyond ±(S−1) pair a real position with padding (φ = 0): any finite c will do.
    c_near = c[:, t.clamp(-(S - 1), S - 1) + S - 1]  # (H or 1, P, len(nbrs)·P), the same for every block
    out = _BandProduct.apply(qb, kb, vb, c_near, n, len(nbrs))

    # Far triangles: J ≤ I−n−1 with c_{−w}, J ≥ I+n+1 with c_{+w}, read at ±(nP+1) where c already equals
    # c_{±w} (nP+1 ≤ S−1 whenever such blocks exist).
    if nb > n + 1:
        kv = kb.transpose(-1, -2) @ vb  # (B, H, nb, m, Dv+1): Σ_{j in J} φ(k̂_j)[v_j, 1]ᵀ
        far_t = n * P + 1
        before = F.pad(kv.cumsum(2), (0, 0, 0, 0, n + 1, 0))[:, :, :nb]  # Σ_{J ≤ I−n−1}
        far = c[:, S - 1 - far_t].view(-1, 1, 1, 1) * before
        if not is_causal:
            after = F.pad(kv.flip(2).cumsum(2).flip(2), (0, 0, 0, 0, 0, n + 1))[:, :, n + 1:]  # Σ_{J ≥ I+n+1}
            far = far + c[:, S - 1 + far_t].view(-1, 1, 1, 1) * after
        out = out + qb @ far
    return out.reshape(B, H, nb * P, E)[:, :, :N]
