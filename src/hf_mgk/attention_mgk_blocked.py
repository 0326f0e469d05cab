"""The blocked path of MGK / sMGK attention: the exact path that pays only what the formula needs.

Nguyen et al., "Improving Transformers with Probabilistic Attention Keys" (ICML 2022, arXiv:2110.08678), Eq. 7
(soft E-step) and Sec. 2.3 (hard E-step). `attention_mgk.mgk_attention` / `smgk_attention` (backend="blocked")
call `mgk_blocked`; the derivation follows.

Torch only (this file travels next to remote-code model files).
"""

import math

import torch

from .attention_blocks import row_blocks
from .attention_masks import causal_mask

__all__ = ["BLOCK_ROWS", "KEEP_BYTES", "MIN_ROW_SUM", "mgk_blocked"]

# Query rows per block (hf-mgk's docs/benchmarks/kernel-notes.md#mgk-blocked-path).
BLOCK_ROWS = 128
# The path keeps its block probabilities for backward while they take at most this many bytes per call (faster:
# hf-mgk's docs/benchmarks/kernel-notes.md#mgk-blocked-path); above it they are recomputed (O(N) memory).
KEEP_BYTES = 2**28
# A block is redone with its rows' maxima subtracted when a row's sum of kernel terms falls below this (the comment below).
MIN_ROW_SUM = math.exp(-40.0)

# Per block of `block_rows` query rows against every key the
# block may see, with s_r = 1 / sigma_r^2:
#
#     L_ijr = log pi_r - s_r |q_i - k_jr|^2 / 2,   E_ijr = exp(L_ijr),   P_ij = sum_r E_ijr      (soft E-step)
#     P_ij = exp(max_r L_ijr)                                                                  (hard E-step)
#     h_i = sum_j P_ij v_j / Z_i,   Z_i = sum_j P_ij
#
# softmax_j(logsumexp_r L_ijr) = P_ij / Z_i: the sum of the keys' exponentials, normalised, so no log is taken
# and one product with V serves all M keys. The Gaussian log-kernel is never positive, so exp(L) cannot overflow
# and needs no running maximum: a block is redone with its rows' maxima subtracted only if a row's sum Z_i falls
# below `min_row_sum` = e^-40 (every term of the row deep in the tail, where float32 exp would lose them); otherwise
# each row's largest term is above e^-40 / (M S) and any term exp() flushes (below e^-87) weighs less than e^-27 of
# it. Rows that see no key at all get a zero output, as with SDPA. Backward uses Z and the row shift kept from the
# forward, and dS' = (dP - delta) / Z from one product of [dO / Z, -delta / Z] with [V, 1] (delta_i = dO_i . h_i).
#
# MGK (M key projections): L = q~ . k~_r with q~ = [q, -|q|^2/2, 1] against the M*S rows
#     k~_r = [s_r k_r, s_r, log pi_r - s_r |k_r|^2/2].
# sMGK (one key projection, k_jr = k_j + b_r): |q - k - b_r|^2 = |q - b_r|^2 - 2 q.k + 2 b_r.k + |k|^2, so
#     L_ijr = s_r q_i.k_j + x_ir + y_jr with x_ir = log pi_r - s_r |q_i - b_r|^2/2, y_jr = -s_r (|k_j|^2/2 +
#     b_r.k_j). One product q~ . k~ = L_1 (q~ = [s_1 q, x_1, 1], k~ = [k, 1, y_1]), and for r >= 2
#     L_r = rho_r L_1 + (x_r - rho_r x_1)_i + (y_r - rho_r y_1)_j, rho_r = s_r / s_1: two elementwise passes
#     each. With different sigma_r the per-query terms |q_i - b_r|^2 differ per key and do not cancel in the
#     softmax over j; they are kept exactly. Backward on dG = sum_r s_r dL_r (dq, dk); the row and column sums of
#     each dL_r give the x and y parts (dq, dk, shifts, prior).
# What each costs per (query, key) pair, against SDPA: hf-mgk's docs/benchmarks/kernel-notes.md#mgk-blocked-path.


def _fold(op, tensors):
    """op(op(t0, t1), t2)... with one new tensor (a sum over keys as adds: sum(0) zero-fills its output first)."""
    if len(tensors) == 1:
        return tensors[0]
    out = op(tensors[0], tensors[1])
    for t in tensors[2:]:
        op(out, t, out=out)
    return out


class _MGKBlocks:
    """One call's operands (no autograd; see the comment at the top) and the scores / probabilities of a block."""

    def __init__(self, query, keys, key_shift, log_prior, inv_var, pad, hard, is_causal, dropout_p, block_rows):
        self.hard, self.is_causal, self.inv_var, self.dropout_p = hard, is_causal, inv_var, dropout_p
        self.block_rows = block_rows
        self.num_keys = m = len(inv_var)
        self.shared = key_shift is not None
        self.n, self.s, self.d = query.shape[2], keys.shape[-2], query.shape[-1]
        s = torch.tensor(inv_var, dtype=query.dtype, device=query.device)
        ones = query.new_ones(query.shape[:-1] + (1,))
        self.hidden = None
        if is_causal:  # the pairs the causal mask hides
            self.hidden = causal_mask(self.n, self.s, query.device).logical_not_()
        if dropout_p > 0:  # one seed from the global generator: backward redraws the same masks
            self.seed = int(torch.randint(0, 2**62, (), device="cpu"))
        if not self.shared:
            sv = s.view(1, 1, m, 1, 1)
            self.k_scaled = keys * sv                                                   # (B, H, M, S, D)
            y = (self.k_scaled * keys).sum(-1, keepdim=True).mul_(-0.5)
            if log_prior is not None:
                y += log_prior[None, :, :, None, None]
            if pad is not None:
                y.masked_fill_(pad[:, None, None, :, None], -math.inf)
            self.qa = torch.cat([query, (query * query).sum(-1, keepdim=True).mul_(-0.5), ones], -1)
            self.ka = torch.cat([self.k_scaled, sv.expand(y.shape), y], -1)             # (B, H, M, S, D + 2)
            return
        sv = s.view(m, 1, 1, 1)
        b = key_shift.transpose(0, 1)[:, None, :, None, :]                             # (M, 1, H, 1, D)
        x = (query - b).pow_(2).sum(-1).mul_(-0.5 * sv)                                 # (M, B, H, N)
        if log_prior is not None:
            x += log_prior.t()[:, None, :, None]
        y = ((keys * keys).sum(-1).mul_(0.5) + torch.einsum("bhsd,mhd->mbhs", keys, b[:, 0, :, 0])).mul_(-sv)
        self.rho = (s / s[0]).tolist()
        rho = (s[1:] / s[0]).view(-1, 1, 1, 1)
        self.xd, self.yd = x[1:] - rho * x[0], y[1:] - rho * y[0]                      # (M - 1, B, H, N | S)
        y1 = y[0] if pad is None else y[0].masked_fill(pad[:, None, :], -math.inf)
        self.qa = torch.cat([query * s[0], x[0, ..., None], ones], -1)
        self.ka = torch.cat([keys, torch.ones_like(y1)[..., None], y1[..., None]], -1)  # (B, H, S, D + 2)

    def blocks(self):
        """(rows, end, lo) per block of query rows (`row_blocks`); rows that see no key are left out."""
        return row_blocks(self.n, self.s, self.is_causal, self.block_rows)

    @staticmethod
    def key_rows(t, end):
        """(B, H, M, S, X) -> (B, H, M * end, X), keys :end of every key r (a view when end = S)."""
        t = t[:, :, :, :end]
        return t.reshape(t.shape[0], t.shape[1], -1, t.shape[-1])

    def scores(self, rows, end, lo, shift=None):
        """L_r of one block (-inf where hidden), minus `shift` (B, H, n) if given: MGK one (B, H, n, M, e) tensor
        and its M slabs (views), sMGK None and M (B, H, n, e) tensors."""
        qa = self.qa[:, :, rows]
        if not self.shared:
            buf = torch.matmul(qa, self.key_rows(self.ka, end).transpose(-1, -2))
            buf = buf.view(buf.shape[:3] + (self.num_keys, end))
            if lo < end:
                buf[..., lo:].masked_fill_(self.hidden[rows, lo:end][:, None], -math.inf)
            if shift is not None:
                buf.sub_(shift[..., None, None])
            return buf, [buf[..., r, :] for r in range(self.num_keys)]
        first = torch.matmul(qa, self.ka[:, :, :end].transpose(-1, -2))
        if lo < end:
            first[..., lo:].masked_fill_(self.hidden[rows, lo:end], -math.inf)
        slabs = [first]
        for r in range(1, self.num_keys):
            slab = torch.add(self.xd[r - 1, :, :, rows, None], first, alpha=self.rho[r])
            slabs.append(slab.add_(self.yd[r - 1, :, :, None, :end]))
        if shift is not None:
            for slab in slabs:
                slab.sub_(shift[..., None])
        return None, slabs

    def probs(self, buf, slabs):
        """Unnormalised P (B, H, n, e) and what backward needs besides: soft the E_r = exp(L_r) (in place); hard
        the weight of each key in d score / d L_r, 1 for the largest term, shared equally by ties as in
        torch.amax's backward (None for one key; for two keys only key 1's weight w, key 2 gets 1 - w)."""
        if self.hard:
            if self.num_keys == 1:
                return slabs[0].exp(), None
            score = _fold(torch.maximum, slabs)
            if self.num_keys == 2:  # heaviside(-inf - -inf = nan) is 0: hidden entries, whose dscore is 0
                return torch.exp(score), torch.heaviside(slabs[0] - slabs[1], score.new_tensor(0.5))
            # float weights: bool masks in products and counts are slower (kernel notes, "MGK blocked path")
            wins = [(slab == score).to(score.dtype) for slab in slabs]
            count = _fold(torch.add, wins).clone()
            wins = [w.div_(count) for w in wins]
            return torch.exp(score), (torch.stack(wins, -2) if buf is not None else wins)
        if buf is not None:
            buf.exp_()
        else:
            for slab in slabs:
                slab.exp_()
        return _fold(torch.add, slabs), (buf if buf is not None else slabs)

    def dropout_masks(self, like):
        """Per block, in block order: 0 or 1 / (1 - p), drawn from this call's seed."""
        gen = torch.Generator(device=like.device)
        gen.manual_seed(self.seed)
        for rows, end, _ in self.blocks():
            shape = like.shape[:2] + (rows.stop - rows.start, end)
            u = torch.rand(shape, generator=gen, dtype=like.dtype, device=like.device)
            yield u.ge_(self.dropout_p).mul_(1.0 / (1.0 - self.dropout_p))


class _BlockedMGK(torch.autograd.Function):
    """MGK / sMGK attention, soft or hard E-step, in blocks of query rows with a hand-written backward."""

    @staticmethod
    def forward(ctx, query, keys, key_shift, value, log_prior, inv_var, pad, hard, is_causal, dropout_p, keep,
                block_rows, min_row_sum):
        blk = _MGKBlocks(query, keys, key_shift, log_prior, inv_var, pad, hard, is_causal, dropout_p, block_rows)
        out = value.new_zeros(value.shape[:2] + (blk.n, value.shape[-1]))
        z = query.new_zeros(query.shape[:3])
        shift = query.new_zeros(query.shape[:3])
        masks = blk.dropout_masks(query) if dropout_p > 0 else None
        kept, shifted = [], []
        for rows, end, lo in blk.blocks():
            p, aux = blk.probs(*blk.scores(rows, end, lo))
            zb = p.sum(-1)
            shifted.append(not bool(zb.min() >= min_row_sum))    # also when NaN
            if shifted[-1]:
                m = _fold(torch.maximum, [t.amax(-1) for t in blk.scores(rows, end, lo)[1]])
                m.masked_fill_(m == -math.inf, 0.0)                 # rows that see no key: P = 0, output 0
                shift[:, :, rows] = m
                p, aux = blk.probs(*blk.scores(rows, end, lo, m))
                zb = p.sum(-1)
            z[:, :, rows] = zb
            mask = None if masks is None else next(masks)
            pv = p if mask is None else p * mask
            out[:, :, rows] = torch.matmul(pv, value[:, :, :end]).div_(zb.clamp_min(torch.finfo(zb.dtype).tiny)[..., None])
            if keep:
                kept.append((p, aux, mask))
        ctx.blocks, ctx.kept, ctx.shifted = blk, kept, shifted
        ctx.save_for_backward(query, keys, key_shift, value, out, z, shift)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        query, keys, key_shift, value, out, z, shift = ctx.saved_tensors
        blk, kept = ctx.blocks, ctx.kept
        m, s, d = blk.num_keys, blk.s, blk.d
        # dO / Z; rows that see no key (Z = 0) have a constant zero output and pass no gradient on
        dout = dout * torch.where(z > 0, 1.0 / z, 0.0)[..., None]
        neg_delta = -(dout * out).sum(-1, keepdim=True)                                 # -delta / Z
        masks = blk.dropout_masks(query) if (blk.dropout_p > 0 and not kept) else None
        if blk.dropout_p == 0:  # dS' from one product: [dO / Z, -delta / Z] . [v, 1]
            do_aug = torch.cat([dout, neg_delta], -1)
            v_aug = torch.cat([value, value.new_ones(value.shape[:-1] + (1,))], -1)
        # Contiguous buffers: zeros_like keeps a strided input's layout (the model's keys are permuted views),
        # and the gradients are written through .view below.
        dq, dv = (torch.zeros_like(t, memory_format=torch.contiguous_format) for t in (query, value))
        dx = query.new_zeros(query.shape[:3] + (m,))                                     # row sums of dL_r
        dy = query.new_zeros(query.shape[:2] + (m, s))                                   # column sums of dL_r
        q_op, k_op = (query * blk.inv_var[0], keys) if blk.shared else (query, blk.k_scaled)
        dk_op = torch.zeros_like(k_op, memory_format=torch.contiguous_format)
        scratch = None
        for i, (rows, end, lo) in enumerate(blk.blocks()):
            if kept:
                p, aux, mask = kept[i]
            else:
                p, aux = blk.probs(*blk.scores(rows, end, lo, shift[:, :, rows] if ctx.shifted[i] else None))
                mask = None if masks is None else next(masks)
            pv = p if mask is None else p * mask
            _accumulate(dv, end, pv.transpose(-1, -2), dout[:, :, rows])
            if mask is None:
                ds = torch.matmul(do_aug[:, :, rows], v_aug[:, :, :end].transpose(-1, -2))   # (dP - delta) / Z
            else:
                ds = torch.matmul(dout[:, :, rows], value[:, :, :end].transpose(-1, -2))
                ds = torch.addcmul(neg_delta[:, :, rows], ds, mask)
            if blk.hard:  # dscore = P dS' (P unnormalised: dS' carries 1 / Z), to the key(s) with the largest term
                ds.mul_(p)
            dl, scratch = _block_grad(aux, ds, scratch, bool(kept), blk)
            if not blk.shared:                                                            # (B, H, n, M, e)
                dx[:, :, rows] = dl.sum(-1)
                dy[:, :, :, :end] += dl.sum(2)
                flat = dl.view(dl.shape[:3] + (-1,))
                dq[:, :, rows] = torch.matmul(flat, blk.key_rows(k_op, end))
                if end == s:
                    _accumulate(dk_op.view(dk_op.shape[:2] + (-1, d)), m * s, flat.transpose(-1, -2), q_op[:, :, rows])
                else:
                    dk_op[:, :, :, :end] += torch.matmul(flat.transpose(-1, -2), q_op[:, :, rows]).view(
                        dk_op.shape[:3] + (end, d))
            else:                                                                         # M slabs
                for r, t in enumerate(dl):
                    dx[:, :, rows, r] = t.sum(-1)
                    dy[:, :, r, :end] += t.sum(-2)
                dg = dl[0]
                for r in range(1, m):
                    dg.add_(dl[r], alpha=blk.rho[r])
                dq[:, :, rows] = torch.matmul(dg, k_op[:, :, :end])
                _accumulate(dk_op, end, dg.transpose(-1, -2), q_op[:, :, rows])
        sv = torch.tensor(blk.inv_var, dtype=query.dtype, device=query.device)
        prior = not blk.hard and ctx.needs_input_grad[4]
        if not blk.shared:
            # L_r = q . (s_r k_r) - s_r |q|^2/2 - s_r |k_r|^2/2 + log pi_r
            dq -= (dx @ sv)[..., None] * query
            dk = (dk_op - dy[..., None] * keys).mul_(sv.view(1, 1, m, 1, 1))
            return (dq, dk, None, dv, dy.sum((0, 3)) if prior else None) + (None,) * 8
        # L_r = s_r q.k + x_r + y_r, x_r = log pi_r - s_r |q - b_r|^2/2, y_r = -s_r (|k|^2/2 + b_r . k)
        b = key_shift.transpose(0, 1)                                                     # (M, H, D)
        wx, wy = dx * sv, dy * sv.view(1, 1, m, 1)                                       # s_r dx_r, s_r dy_r
        dq = dq * blk.inv_var[0] - wx.sum(-1, keepdim=True) * query + torch.einsum("bhnm,mhd->bhnd", wx, b)
        dk = dk_op - wy.sum(2)[..., None] * keys - torch.einsum("bhms,mhd->bhsd", wy, b)
        dshift = (torch.einsum("bhnm,bhnd->hmd", wx, query) - wx.sum((0, 2))[..., None] * key_shift
                  - torch.einsum("bhms,bhsd->hmd", wy, keys))
        return (dq, dk, dshift, dv, dx.sum((0, 2)) if prior else None) + (None,) * 8


def _accumulate(acc, end, a, b):
    """acc[:, :, :end] += a @ b for (B, H, ., .) tensors, as one batched product into acc's rows."""
    acc[:, :, :end].flatten(0, 1).baddbmm_(a.flatten(0, 1), b.flatten(0, 1))


def _block_grad(aux, ds, scratch, kept, blk):
    """dL_r = aux_r * ds for every key r (soft: aux = E_r; hard: the keys' weights from `probs`, ds = dscore).
    MGK: one (B, H, n, M, e) tensor, sMGK: a list of M slabs. Recomputed E_r are overwritten; kept ones must
    survive a second backward, so the products go to one reused scratch buffer (a new tensor per block costs
    page faults)."""
    if aux is None:  # hard E-step, one key
        return ([ds] if blk.shared else ds[..., None, :]), scratch
    m, size = blk.num_keys, ds.numel()
    if not kept and (not blk.hard or m > 2):
        return ([a.mul_(ds) for a in aux] if blk.shared else aux.mul_(ds[..., None, :])), scratch
    if scratch is None or scratch.numel() < m * size:
        scratch = ds.new_empty(m * size)
    if blk.shared:  # M contiguous slabs (sMGK's products take one slab)
        out, slabs = None, [scratch[r * size:(r + 1) * size].view(ds.shape) for r in range(m)]
    else:  # (B, H, n, M, e), one product over the M * e keys
        out = scratch[:m * size].view(ds.shape[:3] + (m, ds.shape[-1]))
        slabs = [out[..., r, :] for r in range(m)]
    if blk.hard and m == 2:  # aux = key 1's weight w: dL_1 = w ds, dL_2 = ds - dL_1
        torch.sub(ds, torch.mul(ds, aux, out=slabs[0]), out=slabs[1])
    elif blk.shared:
        for a, t in zip(aux, slabs):
            torch.mul(a, ds, out=t)
    else:
        torch.mul(aux, ds[..., None, :], out=out)
    return (slabs if blk.shared else out), scratch


def mgk_blocked(query, keys, key_shift, value, var, log_prior, e_step, attention_mask, is_causal, dropout_p,
                 block_rows, keep_bytes, min_row_sum):
    hard = e_step == "hard"
    num_keys = var.numel()
    inv_var = (1.0 / var.double()).tolist()
    lp = None if (hard or log_prior is None) else log_prior.to(query.dtype)
    pad = None if attention_mask is None else ~attention_mask.bool()
    training = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (query, keys, key_shift, value, lp))
    b, h, n = query.shape[:3]
    kept = (num_keys + 1 + (dropout_p > 0)) * b * h * n * keys.shape[-2] * query.element_size()
    return _BlockedMGK.apply(query, keys, key_shift, value, lp, inv_var, pad, hard, is_causal, dropout_p,
                             training and kept <= keep_bytes, block_rows, min_row_sum)
