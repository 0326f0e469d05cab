"""The recomputed path of FiSH attention: blocks of query rows with a hand-written backward.

Nguyen et al., "Improving Transformer with an Admixture of Attention Heads" (NeurIPS 2022), first circulated as
"FiSHformer: Transformer with a Finite Admixture of Shared Heads": FiSH / hard FiSH (Eqn. 9-10), MiSH with noise
(Eqn. 11) and (hard) GFiSH with the network Linear(M, H) -> ReLU -> Linear(H, H) (Eqn. 12). `attention_fish`
(backend="recomputed") prepares the operands, q already scaled:

    linear:  A = mix(p, G) + std eps,  G = q k^T (B, M, n, e), std_j = |p_j sigma| (one draw per local head)
    network: X = G + sigma eps,  R = ReLU(W1 X + b1),  A = W2 R + b2   (along the head axis)
    W = softmax(A, masked),  out = W v

Backward: with dW = dout v^T and delta = sum_s W dW (from one product of [dout, -dout . out] with [v, 1]),
dA = W (dW - delta); then linear: dp = sum G dA^T, dstd_j = sum dA_j eps_j, dG = mix(p^T, dA) (MiSH: dA summed
over the heads); network: db2 = sum dA, dW2 = sum dA R^T, dR = mix(W2, dA) (R > 0), db1 = sum dR,
dW1 = sum dR X^T, dG = mix(W1, dR), dsigma = sum dG eps; dq = dG k, dk = dG^T q.

Torch only: this file travels next to the remote-code model files.
"""

import math

import torch

from .attention_blocks import row_blocks
from .attention_masks import causal_mask

__all__ = ["RecomputedFiSH", "mix"]


def mix(p, g, out=None):
    """A_j = sum_k p_kj G_k: p (M, H), g (B, M, n, e) -> (B, H, n, e), one batched matmul over the head axis,
    into `out` if given. Written as bmm of (B, H, M) by (B, M, n*e): torch.matmul of (H, M) by (B, M, n*e)
    computes the transposed product and then copies it into place, a full extra pass over the H scores (kernel
    notes, "FiSH path rule")."""
    B, _, n, e = g.shape
    flat = None if out is None else out.view(B, -1, n * e)
    return torch.bmm(p.t().expand(B, -1, -1), g.reshape(B, g.shape[1], n * e), out=flat).view(B, -1, n, e)


class _Scratch:
    """Reused buffers for a call's per-block temporaries, instead of a new tensor per block (causal blocks grow by a
    tile each, so the allocator rarely reuses a freed one; hf-mgk's docs/benchmarks/kernel-notes.md#fish-scratch).
    Each buffer is sized once for the largest block (rows x all keys)."""

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


def _block_hidden(hidden, tile_only, rows, end, lo, like):
    """(hidden part or None, first column it covers) of one block of `row_blocks`: the slice of the mask that
    attention_fish._visible gives, or with causality alone (tile_only) the block's diagonal tile, keys lo:end, built here (a few KB)."""
    if not tile_only:
        return (None if hidden is None else hidden[:, :, rows, :end]), 0
    return causal_mask(rows.stop - rows.start, end - lo, like.device).logical_not_(), lo


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
        a = mix(p, g, out=scratch("a", (B, p.shape[1], n, e), q))
        if std is not None:
            a = a.addcmul_(std[:, None, None], eps) if a.shape[1] == H else torch.addcmul(
                a, std[:, None, None], eps, out=scratch("noisy", (B, H, n, e), q))
    else:
        w1, b1, w2, b2 = params
        x = g if std is None else g.addcmul_(std[:, None, None], eps)
        r = mix(w1.t(), x, out=out("r", (B, w1.shape[0], n, e), q)).add_(b1[:, None, None]).relu_()
        a = mix(w2.t(), r, out=scratch("a", r.shape, q)).add_(b2[:, None, None])
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
        if std is not None:  # per head sum of da * eps without a product tensor (faster; kernel notes)
            per_head = torch.einsum("bhij,bhij->h", da, eps)
            grads[-1] += per_head if grads[-1].shape[0] == per_head.shape[0] else per_head.sum()
        if p.shape[1] == 1 < da.shape[1]:  # MiSH: the mixed matrix feeds every head
            da = torch.sum(da, 1, keepdim=True, out=scratch("da1", g.shape[:1] + (1,) + g.shape[2:], g))
        grads[0] += sum_heads(g, da)
        return mix(p.t(), da, out=scratch("dg", g.shape, g))
    (w1, _, w2, _), (x, r) = params, saved
    grads[3] += da.sum((0, 2, 3))
    grads[2] += sum_heads(da, r)
    dh = mix(w2, da, out=scratch("dr", r.shape, r))
    dh = torch.ops.aten.threshold_backward(dh, r, 0.0)  # ReLU's backward in one pass: dr where r > 0
    grads[1] += dh.sum((0, 2, 3))
    grads[0] += sum_heads(dh, x)
    dx = mix(w1, dh, out=scratch("dg", x.shape, x))
    if std is not None:
        grads[-1] += torch.einsum("bkij,bkij->k", dx, eps)
    return dx


class RecomputedFiSH(torch.autograd.Function):
    """out = softmax(mix(q k^T, noise), masked) v per block of rows; called by attention_fish.fish_recomputed,
    which computes the operands (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, std, eps, hidden, is_causal, tile_only, keep, block_rows, *params):
        N, S = q.shape[2], k.shape[2]
        out = v.new_empty(q.shape[0], v.shape[1], N, v.shape[3])
        tiles, kept = [], []
        scratch = _Scratch(block_rows, S)
        for i, (rows, end, lo) in enumerate(row_blocks(N, S, is_causal, block_rows, keep_empty=True)):
            tiles.append(_block_hidden(hidden, tile_only, rows, end, lo, q))
            saved, w = _block_weights(q[:, :, rows], k[:, :, :end], params, std, None if eps is None else eps[i],
                                      *tiles[-1], scratch, _fresh if keep else scratch)
            out[:, :, rows] = torch.matmul(w, v[:, :, :end])
            if keep:
                kept.append((saved, w))
        ctx.save_for_backward(q, k, v, std, out, *params)
        ctx.blocks = (is_causal, tiles, kept, eps)
        ctx.block_rows = block_rows
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
        scratch = _Scratch(ctx.block_rows, k.shape[2])
        for i, (rows, end, _) in enumerate(row_blocks(q.shape[2], k.shape[2], is_causal, ctx.block_rows, True)):
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
        return (dq, dk, dv, dstd, None, None, None, None, None, None, *grads)
