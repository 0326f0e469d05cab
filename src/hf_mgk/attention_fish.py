"""FiSH attention: a finite admixture of shared heads, as plain torch functions.

Where the math comes from: Nguyen et al., "Improving Transformer with an Admixture of Attention Heads"
(NeurIPS 2022, openreview.net/forum?id=0VFQhPGF1M3), first circulated as "FiSHformer: Transformer with a Finite
Admixture of Shared Heads", whose section and equation numbers are used here:

* M global query/key heads give the global attention matrices G_k = Q_k K_k^T (§2.2, Def. 1), scaled by
  1/sqrt(D) *before* mixing, as the authors' machine-translation code does.
* H local heads mix them. FiSH (Eqn. 9, with the "discriminative relaxation" of Remark 3: p_kj are free
  learned weights):   A_j = sum_k p_kj (G_k + sigma_k eps_jk),  eps ~ N(0, I), training only.
  Hard FiSH (Eqn. 10): the same without noise.  MiSH (Eqn. 11, Remark 4): one weight vector p_k shared by
  all local heads.  GFiSH / hard GFiSH (§2.4, Eqn. 12 and the authors' code): a small network
  Linear(M, H) -> ReLU -> Linear(H, H) applied along the head axis of G + sigma eps.
* out_j = softmax(A_j + mask) V_j for the H local value heads; masks act on the mixed scores (a
  causal mask is applied after mixing).

This file imports only the standard library and torch, so it can be copied next to HuggingFace
"remote code" model files.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["fish_attention", "fish_attention_reference", "make_gfish_mixing"]

# The materialised path works on blocks of this many query rows. Measured on the shared 2-core CPU
# (torch 2.13, one thread, H=8, M=2, D=64, forward+backward): 128 rows beat 32 / 64 / 256 at B=1,
# N=1024 and 2048, and tied with 64 at B=8, N=512. Smaller blocks lose to per-block overhead (each
# block's slice of K and V costs a full-size gradient accumulation); one block of N rows streams
# H*N*S scores through memory (2-4x slower at N=1024-2048). Without autograd it also bounds the
# memory to B*H*128*S scores.
_BLOCK_ROWS = 128
# The recomputing path keeps its blocks' scores and weights for backward while they take at most this many bytes
# per call (see _recomputed_attention).
_KEEP_BYTES = 2**28


def fish_attention(query, key, value, mixing, *, scale=None, noise_std=None, attention_mask=None,
                   is_causal=False, return_weights=False, dropout_p=0.0, generator=None):
    """FiSH / hard FiSH / MiSH / (hard) GFiSH attention, computed on the fastest exact path.

    Args:
        query: (B, M, N, D), the M global query heads.
        key: (B, M, S, D), the M global key heads.
        value: (B, H, S, Dv), the H local value heads.
        mixing: how local heads are made from global ones:
            a tensor (M, H) of p_kj (FiSH, hard FiSH);
            a tensor (M, 1): one weight vector shared by all local heads (MiSH);
            an nn.Module mapping the last axis from M to H (GFiSH), e.g. ``make_gfish_mixing(M, H)``;
            it is applied to the scores moved to the last axis, shape (B, N, S, M) -> (B, N, S, H).
        scale: multiplies G_k = Q_k K_k^T before mixing; default 1/sqrt(D).
        noise_std: None (no noise, evaluation / hard variants) or a (M,) tensor of sigma_k (training).
            Noise is drawn here, from ``generator`` if given.
        attention_mask: bool (B, S), True = real token, or None; or a whole (B or 1, 1, N, S) mask for the
            pairs, bool (True = may attend) or additive float (added to the mixed scores), which is used as
            it is (with is_causal=False: it says which keys each query sees).
        is_causal: query i sees keys j <= i + S - N (bottom-right aligned: with a KV cache the N
            queries are the last N positions), applied after mixing.
        return_weights: also return the (B, H, N, S) attention probabilities (after dropout).
        dropout_p: attention dropout on the probabilities (training only; the caller passes 0 in eval).
        generator: torch.Generator for the FiSH noise, so runs can be reproduced.

    Returns:
        out (B, H, N, Dv), and with ``return_weights`` also the weights (B, H, N, S).
        Query rows that see no key at all (all keys padded) get zero weights and a zero output.

    Path rule (every path is exact; the rule is only about speed and memory). No dropout, no weights requested:
    * a (M, H) mixing tensor, H > 1, no noise and no autograd, or on an accelerator: one fused SDPA call
      (_fused_attention: H heads of query/key size M*D, flash kernels, O(N) memory);
    * with autograd, float32/64 outside autocast: a (M, H) mixing tensor (FiSH, hard FiSH), MiSH with noise, and
      on the CPU the GFiSH network of make_gfish_mixing: the blocked formula with a hand-written backward
      (_recomputed_attention), which keeps the blocks' scores and weights for backward up to _KEEP_BYTES and
      recomputes them above (O(N) memory).
    Everything else (MiSH without noise, other mixing networks, dropout, autocast): the materialised formula in
    blocks of query rows through autograd (_blocked_attention), which keeps B * (H + M) * N * S scores for
    backward; MiSH without noise computes its one shared attention matrix once and broadcasts it over the H value
    heads. With ``return_weights``, the formula in one piece: the output is the returned weights times V, so the
    weights are in the autograd graph (gradient-based attribution sees them), as in stock GPT-2's eager attention.
    Measured on the shared 2-core CPU (B=1, H=8, M=2, D=64, causal, forward+backward, one thread, interleaved
    with 8-head SDPA): the hand-written path took 0.61-0.76x SDPA's time at N=1024 and 0.86-0.92x at N=2048
    without noise; drawing the noise (H random numbers per visible pair, ~3.3 ns each, serial) adds about
    0.3-0.5x SDPA's time. Forward only without noise, the fused call took 0.89-1.0x the blocked path's time.
    """
    _, _, _, D, S, H, _ = _check_shapes(query, key, value, mixing, noise_std, attention_mask)
    scale = D ** -0.5 if scale is None else float(scale)
    linear = isinstance(mixing, torch.Tensor) and dropout_p == 0.0 and not return_weights
    training = _needs_grad(query, key, value, mixing, noise_std)
    if linear and mixing.shape[1] > 1 and noise_std is None and (query.device.type != "cpu" or not training):
        return _fused_attention(query, key, value, mixing, scale, attention_mask, is_causal)
    eps = _draw_noise(query, mixing, noise_std, H, S, is_causal, generator)
    # MiSH without noise stays on the materialised path: there all H heads share one softmax, computed once.
    by_hand = (linear and (mixing.shape[1] > 1 or noise_std is not None)) or (
        _is_gfish_network(mixing) and dropout_p == 0.0 and not return_weights and query.device.type == "cpu")
    if by_hand and training and query.dtype in (torch.float32, torch.float64) and not torch.is_autocast_enabled(
            query.device.type):
        return _recomputed_attention(query, key, value, mixing, scale, noise_std, eps, attention_mask, is_causal)
    out, weights = _blocked_attention(query, key, value, mixing, scale, noise_std, eps, attention_mask,
                                      is_causal, dropout_p, return_weights)
    return (out, weights) if return_weights else out


def fish_attention_reference(query, key, value, mixing, *, scale=None, noise_std=None,
                             attention_mask=None, is_causal=False, return_weights=False, dropout_p=0.0,
                             generator=None):
    """The plain N x S formula of fish_attention, in one piece: the reference the fast paths are tested
    against. Same arguments and results; with the same ``generator`` state it draws the same noise."""
    B, _, N, D, S, H, _ = _check_shapes(query, key, value, mixing, noise_std, attention_mask)
    scale = D ** -0.5 if scale is None else float(scale)
    eps = _whole_noise(_draw_noise(query, mixing, noise_std, H, S, is_causal, generator), S)
    hidden, empty = _hidden(N, S, attention_mask, is_causal, query.device)
    out, weights = _materialised(query * scale, key, value, mixing, noise_std, eps, hidden, empty,
                                 dropout_p, every_head=True)
    return (out, weights) if return_weights else out


def _materialised(query, key, value, mixing, noise_std, eps, hidden, empty, dropout_p, every_head=False):
    """The formula itself (module docstring), for a query already multiplied by the scale; hidden and
    empty come from _hidden. Returns out (B, H, N, Dv) and weights (B, H or 1, N, S); (B, H, N, S) with
    ``every_head``, the tensor the output is computed from."""
    B, _, N, _ = query.shape
    S = key.shape[2]
    g = torch.matmul(query, key.transpose(-1, -2))  # (B, M, N, S): the global G_k, scaled
    if isinstance(mixing, nn.Module):
        if noise_std is not None:  # GFiSH: the noise goes into the network's input
            g = g + noise_std.to(g.dtype)[:, None, None] * eps
        scores = mixing(g.movedim(1, -1)).movedim(-1, 1)  # (B, H, N, S)
    else:
        p = mixing.to(g.dtype)
        # MiSH (p of shape (M, 1)) gives one shared matrix (B, 1, N, S), broadcast over V's heads below.
        scores = _mix(p, g)
        if noise_std is not None:
            # sum_k p_kj sigma_k eps_jk with independent eps_jk ~ N(0, 1) is exactly N(0, sum_k p_kj^2
            # sigma_k^2) per element and independent over j, so one draw per local head scaled by that
            # std is the same distribution, costs H*N*S instead of H*M*N*S random numbers, and keeps
            # gradients to p and sigma (reparameterisation, Eqn. 9). vector_norm has a zero gradient
            # (not NaN) where the std is 0, e.g. sigma initialised to 0.
            std = torch.linalg.vector_norm(p * noise_std.to(g.dtype)[:, None], dim=0)  # (H,)
            scores = scores + std[:, None, None] * eps
    scores = _masked(scores, hidden)
    # softmax in float32 even when the scores are bf16/fp16 (as HF's eager attention does)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    if empty is not None:
        weights = weights.masked_fill(empty, 0.0)
    if dropout_p > 0.0 or every_head:
        weights = weights.expand(B, value.shape[1], N, S)
    if dropout_p > 0.0:  # independent per local head, also where MiSH shares one matrix
        weights = F.dropout(weights, p=dropout_p)
    return torch.matmul(weights, value), weights


def _blocked_attention(query, key, value, mixing, scale, noise_std, eps, attention_mask, is_causal,
                       dropout_p, return_weights):
    """_materialised on blocks of _BLOCK_ROWS query rows. With is_causal, the keys after the last one
    a block can see (row i sees keys j <= i + S - N) are cut off instead of masked, which skips about
    half the work. Scaling and masks are computed once for all blocks: on a CPU shared with other
    work every extra small op per block can cost a scheduler time slice."""
    N, S = query.shape[2], key.shape[2]
    query = query * scale
    hidden, empty = _hidden(N, S, attention_mask, is_causal, query.device)
    if return_weights:  # all N x S weights are handed out anyway: one block, the output computed from them
        return _materialised(query, key, value, mixing, noise_std, _whole_noise(eps, S), hidden, empty, dropout_p,
                             every_head=True)
    outs = []
    for i, (rows, end) in enumerate(_row_blocks(N, S, is_causal)):
        out, _ = _materialised(
            query[:, :, rows], key[:, :, :end], value[:, :, :end], mixing, noise_std,
            None if eps is None else eps[i],
            None if hidden is None else hidden[:, :, rows, :end],
            None if empty is None else empty[:, :, rows], dropout_p)
        outs.append(out)
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)), None


def _recomputed_attention(query, key, value, mixing, scale, noise_std, eps, attention_mask, is_causal):
    """Training with autograd on the CPU (FiSH, hard FiSH, MiSH with noise, (hard) GFiSH with the network of
    make_gfish_mixing): blocks of rows with a hand-written backward.

    Per block only the keys the block may see are used (causal: about half the pairs), and only the block's
    diagonal tile is masked when causality is the only mask. Backward needs each block's global scores (the
    network's input and hidden layer for GFiSH) and softmax weights: they are kept from the forward while they
    take at most _KEEP_BYTES per call (measured at N = 1024, 8 + 2 heads, one thread: 0.77-0.84x SDPA's time
    against 1.08x recomputing them), else recomputed per block like flash attention, so memory stays O(N) at any
    length. Against autograd through _blocked_attention it also avoids the per-block zero-filled full-size
    gradients of the K and V slices and keeps fewer score-sized tensors: far fewer memory passes.
    """
    B, M, N, _ = query.shape
    S, H = key.shape[2], value.shape[1]
    tile_only = is_causal and attention_mask is None and N <= S  # causality alone: masks in the diagonal tiles
    hidden, empty = (None, None) if tile_only else _hidden(N, S, attention_mask, is_causal, query.device)
    if isinstance(mixing, nn.Module):  # Linear(M, H) -> ReLU -> Linear(H, H); noise on its input
        params = tuple(t.to(query.dtype) for t in (mixing[0].weight, mixing[0].bias, mixing[2].weight,
                                                   mixing[2].bias))
        std, kept_heads = noise_std, M + 2 * H
    else:
        params, kept_heads = (mixing.to(query.dtype),), M + H
        std = None
        if noise_std is not None:  # the std of sum_k p_kj sigma_k eps_jk, as in _materialised
            std = torch.linalg.vector_norm(mixing * noise_std.to(query.dtype)[:, None], dim=0)
    pairs = sum((rows.stop - rows.start) * end for rows, end in _row_blocks(N, S, is_causal))
    keep = B * kept_heads * pairs * query.element_size() <= _KEEP_BYTES
    out = _RecomputedFiSH.apply(query * scale, key, value, std, eps, hidden, is_causal, tile_only, keep, *params)
    return out if empty is None else out.masked_fill(empty, 0.0)


def _is_gfish_network(mixing):
    """Whether mixing is the network of make_gfish_mixing (the one _RecomputedFiSH differentiates by hand)."""
    return (isinstance(mixing, nn.Sequential) and len(mixing) == 3 and type(mixing[1]) is nn.ReLU
            and all(type(m) is nn.Linear and m.bias is not None for m in (mixing[0], mixing[2])))


def _mix(p, g, out=None):
    """A_j = sum_k p_kj G_k: p (M, H), g (B, M, n, e) -> (B, H, n, e), one batched matmul over the head axis,
    into `out` if given. Written as bmm of (B, H, M) by (B, M, n*e): torch.matmul of (H, M) by (B, M, n*e)
    computes the transposed product and then copies it into place, a full extra pass over the H scores
    (measured: 60 ms of a 300 ms 2k-token fwd+bwd)."""
    B, _, n, e = g.shape
    flat = None if out is None else out.view(B, -1, n * e)
    return torch.bmm(p.t().expand(B, -1, -1), g.reshape(B, g.shape[1], n * e), out=flat).view(B, -1, n, e)


class _Scratch:
    """Reused buffers for a call's per-block temporaries, instead of a new tensor per block (causal blocks grow by a
    tile each, so the allocator rarely reuses a freed one). Measured on the loaded 2-core CPU, one thread: from
    no difference (within the noise) to 14% faster (FiSH with noise, N = 2048). Each buffer is sized once for the
    largest block (rows x all keys)."""

    def __init__(self, rows, keys):
        self.rows, self.keys, self.bufs = rows, keys, {}

    def __call__(self, name, shape, like):
        n = math.prod(shape)
        buf = self.bufs.get(name)
        if buf is None or buf.numel() < n:
            buf = self.bufs[name] = like.new_empty(max(n, math.prod(shape[:-2]) * self.rows * self.keys))
        return buf[:n].view(shape)


def _fresh(name, shape, like):
    """_Scratch's signature for tensors that must outlive the block (kept for backward)."""
    return like.new_empty(shape)


def _row_blocks(N, S, is_causal):
    """(rows, end) per block of _BLOCK_ROWS query rows: keys :end are all the block's rows may see (row i sees
    j <= i + S - N when causal; at least one column, so that a block of rows that see nothing stays a block)."""
    for start in range(0, N, _BLOCK_ROWS):
        stop = min(N, start + _BLOCK_ROWS)
        yield slice(start, stop), (min(S, max(1, stop + S - N)) if is_causal else S)


def _block_hidden(hidden, tile_only, rows, end, N, S, like):
    """(hidden part or None, first column it covers) of one block: the slice of _hidden's mask, or with causality
    alone (tile_only) the block's diagonal tile, keys j > i + S - N, built here (a few KB)."""
    if not tile_only:
        return (None if hidden is None else hidden[:, :, rows, :end]), 0
    lo = min(end, rows.start + S - N + 1)  # every key before lo is visible to all the block's rows
    tile = torch.ones(rows.stop - rows.start, end - lo, dtype=torch.bool, device=like.device).triu_()
    return tile, lo


def _block_weights(q, k, params, std, eps, hidden, lo, scratch, out):
    """One block of rows: what backward needs (saved) and the local softmax weights (B, H, n, e).

    Linear mixing, params (p,): saved = (g,), the global scores (B, M, n, e); with a one-column p (MiSH) the mixed
    matrix is computed once and the noise makes the H heads' matrices. Network, params (W1, b1, W2, b2): saved =
    (x, r), the network's input x = g + sigma eps (B, M, n, e) and hidden layer r = ReLU(W1 x + b1) (B, H, n, e).
    Kept tensors go to out(name, shape, like) (_Scratch or _fresh), temporaries to scratch."""
    B, M, n, _ = q.shape
    e = k.shape[2]
    g = torch.matmul(q, k.transpose(-1, -2), out=out("g", (B, M, n, e), q))
    if len(params) == 1:
        p = params[0]
        H = p.shape[1] if eps is None else eps.shape[1]
        saved = (g,)
        a = _mix(p, g, out=scratch("a", (B, p.shape[1], n, e), q))
        if std is not None:
            a = a.addcmul_(std[:, None, None], eps) if a.shape[1] == H else torch.addcmul(
                a, std[:, None, None], eps, out=scratch("noisy", (B, H, n, e), q))
    else:
        w1, b1, w2, b2 = params
        x = g if std is None else g.addcmul_(std[:, None, None], eps)
        r = _mix(w1.t(), x, out=out("r", (B, w1.shape[0], n, e), q)).add_(b1[:, None, None]).relu_()
        a = _mix(w2.t(), r, out=scratch("a", r.shape, q)).add_(b2[:, None, None])
        saved = (x, r)
    if hidden is not None and hidden.dtype == torch.bool:
        a[..., lo:].masked_fill_(hidden, torch.finfo(a.dtype).min)
    elif hidden is not None:
        a[..., lo:].add_(hidden)
    return saved, torch._softmax(a, -1, False, out=out("w", a.shape, q))


def _mixing_backward(params, saved, da, std, eps, grads, scratch):
    """Backward of one block's mixing: accumulates the parameter gradients (and sigma's, last) into grads and
    returns d g (B, M, n, e). da (B, H, n, e) is the gradient of the mixed scores (overwritten)."""
    sum_heads = lambda t, u: torch.matmul(t.flatten(2), u.flatten(2).transpose(-1, -2)).sum(0)  # sum_b t u^T
    if len(params) == 1:
        (p,), (g,) = params, saved
        if std is not None:  # per head sum of da * eps, without a product tensor (measured 2x faster; a bmm of
            per_head = torch.einsum("bhij,bhij->h", da, eps)  # (1 x ne) by (ne x 1) takes 6x)
            grads[-1] += per_head if grads[-1].shape[0] == per_head.shape[0] else per_head.sum()
        if p.shape[1] == 1 < da.shape[1]:  # MiSH: the mixed matrix feeds every head
            da = torch.sum(da, 1, keepdim=True, out=scratch("da1", g.shape[:1] + (1,) + g.shape[2:], g))
        grads[0] += sum_heads(g, da)
        return _mix(p.t(), da, out=scratch("dg", g.shape, g))
    (w1, _, w2, _), (x, r) = params, saved
    grads[3] += da.sum((0, 2, 3))
    grads[2] += sum_heads(da, r)
    dh = _mix(w2, da, out=scratch("dr", r.shape, r))
    dh = torch.ops.aten.threshold_backward(dh, r, 0.0)  # ReLU's backward in one pass: dr where r > 0
    grads[1] += dh.sum((0, 2, 3))
    grads[0] += sum_heads(dh, x)
    dx = _mix(w1, dh, out=scratch("dg", x.shape, x))
    if std is not None:
        grads[-1] += torch.einsum("bkij,bkij->k", dx, eps)
    return dx


class _RecomputedFiSH(torch.autograd.Function):
    """out = softmax(mix(q k^T, noise), masked) v per block of rows; see _recomputed_attention."""

    @staticmethod
    def forward(ctx, q, k, v, std, eps, hidden, is_causal, tile_only, keep, *params):
        N, S = q.shape[2], k.shape[2]
        out = v.new_empty(q.shape[0], v.shape[1], N, v.shape[3])
        tiles, kept = [], []
        scratch = _Scratch(_BLOCK_ROWS, S)
        for i, (rows, end) in enumerate(_row_blocks(N, S, is_causal)):
            tiles.append(_block_hidden(hidden, tile_only, rows, end, N, S, q))
            saved, w = _block_weights(q[:, :, rows], k[:, :, :end], params, std, None if eps is None else eps[i],
                                      *tiles[-1], scratch, _fresh if keep else scratch)
            out[:, :, rows] = torch.matmul(w, v[:, :, :end])
            if keep:
                kept.append((saved, w))
        ctx.save_for_backward(q, k, v, std, out, *params)
        ctx.blocks = (is_causal, tiles, kept, eps)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, std, out, *params = ctx.saved_tensors
        is_causal, tiles, kept, eps = ctx.blocks
        grad_out = grad_out.contiguous()
        # Contiguous buffers whatever the inputs' strides (zeros_like would copy a transposed view's layout, and
        # flatten below would then return a copy instead of a view to accumulate into).
        dq, dk, dv = (torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
        grads = [torch.zeros_like(t) for t in params] + ([] if std is None else [torch.zeros_like(std)])
        # softmax backward: dA = w * (dW - sum_s w dW), sum_s w_s dW_s = dout . out per row, so dW - that sum is
        # one product of [dout, -dout . out] with [v, 1] (no separate pass over the block to subtract it)
        do_aug = torch.cat([grad_out, -(grad_out * out).sum(-1, keepdim=True)], -1)
        v_aug = torch.cat([v, v.new_ones(v.shape[:-1] + (1,))], -1)
        dk3, dv3 = dk.flatten(0, 1), dv.flatten(0, 1)  # (B*heads, S, D) views: bmm accumulates into them
        scratch = _Scratch(_BLOCK_ROWS, k.shape[2])
        for i, (rows, end) in enumerate(_row_blocks(q.shape[2], k.shape[2], is_causal)):
            qb, kb = q[:, :, rows], k[:, :, :end]
            eb = None if eps is None else eps[i]
            saved, w = kept[i] if kept else _block_weights(qb, kb, params, std, eb, *tiles[i], scratch, scratch)
            dv3[:, :end].baddbmm_(w.flatten(0, 1).transpose(1, 2), grad_out[:, :, rows].flatten(0, 1))
            da = torch.matmul(do_aug[:, :, rows], v_aug[:, :, :end].transpose(-1, -2),
                              out=scratch("da", w.shape, w)).mul_(w)
            dg = _mixing_backward(params, saved, da, std, eb, grads, scratch)
            dq[:, :, rows] = torch.matmul(dg, kb)
            dk3[:, :end].baddbmm_(dg.flatten(0, 1).transpose(1, 2), qb.flatten(0, 1))
        dstd = grads.pop() if std is not None else None
        return (dq, dk, dv, dstd, None, None, None, None, None, *grads)


def _fused_attention(query, key, value, p, scale, attention_mask, is_causal):
    """Linear mixing without noise as one scaled_dot_product_attention call.

    A_j = sum_k p_kj scale Q_k K_k^T = concat_k(p_kj scale Q_k) @ concat_k(K_k)^T, so local head j is
    ordinary attention with query head size M*D; the key is the same for all local heads (an expand, no
    copy). PyTorch's CPU flash kernel runs only when q/k and v have one head size (otherwise a math path,
    measured 4-5x slower with torch 2.13), so the smaller side is padded with zeros, which changes no dot
    product, and the output is sliced back to Dv.
    """
    B, M, N, D = query.shape
    S = key.shape[2]
    H = p.shape[1]
    Dv = value.shape[-1]
    w = (p * scale).t().to(query.dtype)  # (H, M)
    q = (query.unsqueeze(1) * w[:, :, None, None]).transpose(2, 3).reshape(B, H, N, M * D)
    k = key.transpose(1, 2).reshape(B, 1, S, M * D)
    size = max(M * D, Dv)
    if size > M * D:
        q, k = F.pad(q, (0, size - M * D)), F.pad(k, (0, size - M * D))
    v = F.pad(value, (0, size - Dv)) if size > Dv else value
    k = k.expand(B, H, S, size)
    hidden = empty = None
    if attention_mask is not None or (is_causal and N != S and N > 1):
        hidden, empty = _hidden(N, S, attention_mask, is_causal, query.device)
    # SDPA's own is_causal is top-left aligned: use it only where that equals bottom-right (N == S).
    # A single query (N = 1, bottom-right aligned) sees every key, so needs no causal mask at all.
    attn_mask = None if hidden is None else hidden if hidden.is_floating_point() else ~hidden
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                         scale=1.0, is_causal=is_causal and N == S and hidden is None)
    out = out[..., :Dv] if size > Dv else out
    return out if empty is None else out.masked_fill(empty, 0.0)


def _needs_grad(*tensors):
    """Whether autograd records this call. Not in a trace or compiled graph (torch.export, torch.onnx, torch.compile,
    torch.jit.trace): there the plain differentiable formulas run, not the hand-written backward, whose in-place
    block writes the TorchScript-based ONNX exporter mistranslates."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return False
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _hidden(N, S, attention_mask, is_causal, device):
    """Which keys each query may not see: (hidden, empty).

    hidden: bool (B or 1, 1, N, S), True where key j is padding or (is_causal) j > i + S - N, or hidden by a
    whole (B or 1, 1, N, S) bool mask; a whole additive mask itself (float, added to the scores); or None
    when every key is visible. empty: bool (B or 1, 1, N, 1), True on rows that see no key at all, or
    None; those rows are opened to every key here (so no path ever computes a softmax over nothing, which
    is NaN, with NaN gradients, on some backends) and the caller sets their output to zero. (No test for
    whether such rows exist: a traced or compiled graph must not depend on the mask's values.)
    """
    if attention_mask is not None and attention_mask.dim() == 4:
        if attention_mask.is_floating_point():
            return attention_mask, None
        visible = attention_mask
    else:
        visible = None
        if is_causal:  # bottom-right aligned
            visible = torch.ones(N, S, dtype=torch.bool, device=device).tril(S - N)[None, None]
        if attention_mask is not None:
            pad = attention_mask[:, None, None, :].to(torch.bool)
            visible = pad if visible is None else visible & pad
    if visible is None:
        return None, None
    empty = ~visible.any(dim=-1, keepdim=True)
    # expanded (views) to N query rows, so that query blocks can slice them
    return (~(visible | empty)).expand(-1, -1, N, -1), empty.expand(-1, -1, N, -1)


def _masked(scores, hidden):
    """scores with what `hidden` (from _hidden) hides set to the dtype's minimum, or its additive mask added."""
    if hidden is None:
        return scores
    if hidden.dtype == torch.bool:
        return scores.masked_fill(hidden, torch.finfo(scores.dtype).min)
    return scores + hidden.to(scores.dtype)


def _draw_noise(query, mixing, noise_std, H, S, is_causal, generator):
    """eps ~ N(0, 1), drawn once for the whole call so every path sees the same numbers, as one tensor per block
    of query rows (_row_blocks) over the keys that block may see: (B, M, rows, end) for a network (noise on G),
    (B, H, rows, end) for linear mixing (one draw per local head). Causal: noise for keys no row of a block can
    see is not drawn (random numbers cost ~15x an exp on the CPU: half of a causal FiSH step's noise cost)."""
    if noise_std is None:
        return None
    B, M, N, _ = query.shape
    heads = M if isinstance(mixing, nn.Module) else H
    return [torch.randn((B, heads, rows.stop - rows.start, end), generator=generator, device=query.device,
                        dtype=query.dtype) for rows, end in _row_blocks(N, S, is_causal)]


def _whole_noise(blocks, S):
    """The blocks of _draw_noise as one (B, heads, N, S) tensor, zero where no noise was drawn (hidden keys)."""
    if blocks is None:
        return None
    return torch.cat([F.pad(e, (0, S - e.shape[-1])) for e in blocks], dim=2)


def _check_shapes(query, key, value, mixing, noise_std, attention_mask):
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError("query (B, M, N, D), key (B, M, S, D) and value (B, H, S, Dv) must be 4-d")
    B, M, N, D = query.shape
    _, H, S, Dv = value.shape
    if key.shape != (B, M, S, D):
        raise ValueError(f"key must be (B, M, S, D) = {(B, M, S, D)}, got {tuple(key.shape)}")
    if value.shape[0] != B:
        raise ValueError(f"value batch {value.shape[0]} != query batch {B}")
    if isinstance(mixing, torch.Tensor):
        if mixing.dim() != 2 or mixing.shape[0] != M or mixing.shape[1] not in (1, H):
            raise ValueError(f"mixing tensor must be (M, H) = ({M}, {H}) or (M, 1), "
                             f"got {tuple(mixing.shape)}")
    elif not isinstance(mixing, nn.Module):
        raise TypeError("mixing must be a tensor (M, H) / (M, 1) or an nn.Module mapping M -> H")
    if noise_std is not None and tuple(noise_std.shape) != (M,):
        raise ValueError(f"noise_std must be (M,) = ({M},), got {tuple(noise_std.shape)}")
    if attention_mask is not None and tuple(attention_mask.shape) != (B, S) and not (
            attention_mask.dim() == 4 and attention_mask.shape[0] in (1, B) and attention_mask.shape[1:] == (1, N, S)):
        raise ValueError(f"attention_mask must be bool (B, S) = {(B, S)} or a whole mask (B, 1, N, S) = "
                         f"{(B, 1, N, S)}, got {tuple(attention_mask.shape)}")
    return B, M, N, D, S, H, Dv


def make_gfish_mixing(num_global_heads, num_heads):
    """The GFiSH network of the authors' code: Linear(M, H) -> ReLU -> Linear(H, H), PyTorch default
    init, applied along the head axis (pass it as ``mixing``)."""
    return nn.Sequential(nn.Linear(num_global_heads, num_heads), nn.ReLU(),
                         nn.Linear(num_heads, num_heads))
