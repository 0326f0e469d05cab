"""Mixture of Gaussian Keys (MGK) and Mixture of Linear Keys (MLK) attention.

Nguyen et al., "Improving Transformers with Probabilistic Attention Keys" (ICML 2022, arXiv:2110.08678), Sec. 2
and App. A.1.
Every key position j carries M keys k_j1..k_jM with prior pi_r and fixed variance sigma_r^2:

    score(i, j) = log sum_r pi_r exp(-|q_i - k_jr|^2 / (2 sigma_r^2))     soft E-step (Eq. 7)
    score(i, j) = max_r (-|q_i - k_jr|^2 / (2 sigma_r^2))                 hard E-step (Sec. 2.3)
    h_i = sum_j softmax_j(score(i, j) + mask) v_j

Three exact backends compute it (`choose_backend` picks one for backend="auto"):
  dense    the N x N x M matmul form; the only one that hands out the (B, H, N, S) weights.
  sdpa     the soft E-step as softmax attention over N*M keys whose values repeat v_j: with q~_i = [q_i, 1,
           -|q_i|^2/2] and k~_jr = [k_jr/sigma_r^2, log pi_r - |k_jr|^2/(2 sigma_r^2), 1/sigma_r^2], q~_i . k~_jr is
           the log-kernel term, so one fused SDPA call computes MGK with O(N) memory.
  blocked  per block of query rows, the M keys' log-kernel terms from one product (sMGK: one q.k for all M
           shifted keys), the keys' exponentials summed and multiplied by V once, with a hand-written backward
           (section "blocked path").
  compiled the blocked path's formula as plain torch functions fused by torch.compile (C++ on the CPU, Triton on
           GPUs), forward and backward (section "compiled path"; attention_compile.py).
The plain references the tests hold these to are in `hf_mgk.reference` (not part of this file).

Torch only (this file travels next to remote-code model files). Shapes: B batch, H heads, M keys per position,
N queries, S keys, D head size, Dv value size.
"""

import math

import torch
import torch.nn.functional as F

from .attention_compile import block_offsets, key_padding, run as run_compiled, usable, value_backward
from .attention_blocks import autocast_enabled, resolve_backend, row_blocks
from .attention_masks import allowed_pairs, causal_mask, is_tracing, mask_kind, masked_scores

__all__ = [
    "BACKENDS",
    "MLK_BACKENDS",
    "choose_backend",
    "choose_mlk_backend",
    "mgk_attention",
    "mgk_responsibilities",
    "mlk_attention",
    "smgk_attention",
]

BACKENDS = ("dense", "sdpa", "blocked", "compiled")
MLK_BACKENDS = ("dense", "linear")
# Query rows per block of the blocked path (hf-mgk's docs/benchmarks/kernel-notes.md#mgk-blocked-path).
BLOCK_ROWS = 128
# The blocked path keeps its block probabilities for backward while they take at most this many bytes per call
# (faster: hf-mgk's docs/benchmarks/kernel-notes.md#mgk-blocked-path); above it they are recomputed (O(N) memory).
KEEP_BYTES = 2**28
# The blocked path redoes a block with its rows' maxima subtracted when a row's sum of kernel terms falls below this
# (section "blocked path").
MIN_ROW_SUM = math.exp(-40.0)
# Bytes of the scores L (B, H, rows, M, S) per block of the compiled path: its block rows follow from it.
COMPILED_BLOCK_BYTES = 2**26
# Chunk length of causal MLK (`_causal_linear`).
MLK_CHUNK = 64


def choose_backend(*, e_step, return_weights, device_type, dtype, autocast, tracing, mask):
    """The backend `mgk_attention` / `smgk_attention` run with backend="auto", from plain facts about the call:
    e_step "soft" / "hard"; device_type e.g. "cpu"; dtype the query's; autocast: whether autocast is on for that
    device; tracing: traced or compiled; mask: None, "padding" (B, S) or "pairs" (a whole 4-D mask).

    The weights come from the dense form only. On the CPU in float32 / float64 outside autocast (a padding mask or
    none, not traced: its Python loop reads tensor values) the blocked path, with or without autograd, so that
    training and evaluation compute bit for bit the same function. Elsewhere (accelerators, half precision,
    autocast) the soft E-step as one SDPA call, the hard E-step in the dense form.
    Why (timings): hf-mgk's docs/benchmarks/kernel-notes.md#mgk-path-rule. It never names "compiled": measured
    slower than these on the CPU, untimed on GPUs (ibid., #mgk-compiled-path)."""
    if return_weights:
        return "dense"
    if (device_type == "cpu" and dtype in (torch.float32, torch.float64) and not autocast and not tracing
            and mask != "pairs"):
        return "blocked"
    return "dense" if e_step == "hard" else "sdpa"


def _refusals(*, e_step, return_weights, device_type, dtype, autocast, tracing, mask):
    """Why each backend cannot run a call (None: it can)."""
    fused = ("return_weights (only 'dense' forms the weights)" if return_weights
             else "a whole 4-D mask" if mask == "pairs"
             else "inside an outer trace or compile (the plain paths trace as they are)" if tracing else None)
    blocked = ("return_weights (only 'dense' forms the weights)" if return_weights
               else "a whole 4-D mask" if mask == "pairs"
               else "half precision" if dtype not in (torch.float32, torch.float64)
               else "autocast" if autocast
               else "tracing or compiling (its Python loop reads tensor values)" if tracing else None)
    sdpa = ("the hard E-step" if e_step == "hard"
            else "return_weights (only 'dense' forms the weights)" if return_weights else None)
    return {"dense": None, "sdpa": sdpa, "blocked": blocked, "compiled": fused}


def _backend(backend, query, attention_mask, e_step, return_weights):
    facts = dict(e_step=e_step, return_weights=return_weights, device_type=query.device.type, dtype=query.dtype,
                 autocast=autocast_enabled(query.device.type), tracing=is_tracing(),
                 mask=mask_kind(attention_mask))
    chosen = resolve_backend(backend, choose_backend(**facts), _refusals(**facts))
    return usable(chosen, query.device.type, lambda: choose_backend(**facts))


def _as_variances(variances, like: torch.Tensor, num_keys: int) -> torch.Tensor:
    # In the caller's precision: a float32 sigma^2 would cap float64 checks at 1e-8.
    var = torch.as_tensor(variances, dtype=like.dtype, device=like.device).reshape(-1)
    if var.numel() != num_keys:
        raise ValueError(f"`variances` must give one sigma^2 per key: got {var.numel()} values for {num_keys} keys")
    # Checked on the numbers given (the models pass a list); a tensor's values only outside tracing, where a check
    # that reads them cannot be part of the graph.
    if isinstance(variances, torch.Tensor) and is_tracing():
        return var
    positive = bool((var > 0).all()) if isinstance(variances, torch.Tensor) else all(v > 0 for v in variances)
    if not positive:
        raise ValueError(f"`variances` must be positive, got {var.tolist()}")
    return var


def _check_e_step(e_step):
    if e_step not in ("soft", "hard"):
        raise ValueError(f"`e_step` must be 'soft' or 'hard', got {e_step!r}")


def _check_shapes(query, keys, value):
    if keys.dim() != 5:
        raise ValueError(f"`keys` must be (B, H, M, S, D), got shape {tuple(keys.shape)}")
    b, h, _, d = query.shape
    if keys.shape[0] != b or keys.shape[1] != h or keys.shape[-1] != d:
        raise ValueError(f"`keys` {tuple(keys.shape)} does not match `query` {tuple(query.shape)}")
    if value.shape[:2] != (b, h) or value.shape[2] != keys.shape[3]:
        raise ValueError(f"`value` {tuple(value.shape)} does not match `keys` {tuple(keys.shape)}")


def _log_kernel(query, keys, variances, log_prior):
    """(B, H, M, N, S) log pi_r - |q_i - k_jr|^2 / (2 sigma_r^2): the Eq. 7 terms, with
    |q - k|^2 = |q|^2 - 2 q.k + |k|^2 from one matmul per key."""
    var = variances.to(query.dtype)[None, None, :, None, None]
    q_sq = query.pow(2).sum(-1)[:, :, None, :, None]
    k_sq = keys.pow(2).sum(-1)[:, :, :, None, :]
    dist2 = q_sq + k_sq - 2 * torch.matmul(query[:, :, None], keys.transpose(-1, -2))
    out = -dist2 / (2 * var)
    if log_prior is not None:
        out = out + log_prior.to(query.dtype)[None, :, :, None, None]
    return out


def _mgk_dense(query, keys, value, var, log_prior, e_step, attention_mask, is_causal, dropout_p, return_weights):
    """The N x N x M form: scores, masked softmax, dropout on a_ij, product with V."""
    if e_step == "soft":
        scores = torch.logsumexp(_log_kernel(query, keys, var, log_prior), dim=2)
    else:
        scores = _log_kernel(query, keys, var, None).amax(dim=2)  # hard: pi plays no role (Remark 3)
    allowed = allowed_pairs(attention_mask, is_causal, query.shape[2], keys.shape[3], query.device)
    weights = torch.softmax(masked_scores(scores, allowed), dim=-1)
    out = torch.matmul(F.dropout(weights, p=dropout_p), value)
    return (out, weights) if return_weights else out


def _mgk_soft_sdpa(query, keys, value, var, log_prior, attention_mask, is_causal, dropout_p):
    """Soft E-step as one SDPA call over M*S augmented keys (exact, O(N) memory with the flash kernel)."""
    b, h, m, s, d = keys.shape
    n, dv = query.shape[2], value.shape[-1]
    # PyTorch's CPU flash kernel needs one head size for q/k and v (else a slower math path: kernel notes, "MGK path
    # rule"), so every operand is built at `width` directly inside its one concatenation: no separate pad/copy passes.
    width = max(d + 2, dv)
    inv_var = (1.0 / var).to(query.dtype).view(1, 1, m, 1, 1)
    k_scaled = keys * inv_var                                                          # k_jr / sigma_r^2
    bias = (k_scaled * keys).sum(-1, keepdim=True) * -0.5                              # -|k_jr|^2 / (2 sigma_r^2)
    if log_prior is not None:
        bias = bias + log_prior.to(query.dtype).view(1, h, m, 1, 1)
    k_parts = [k_scaled, bias, inv_var.expand(b, h, m, s, 1)]
    q_parts = [query, query.new_ones(b, h, n, 1), query.pow(2).sum(-1, keepdim=True) * -0.5]
    v_parts = [value]
    if width > d + 2:
        k_parts.append(keys.new_zeros(b, h, m, s, width - d - 2))
        q_parts.append(query.new_zeros(b, h, n, width - d - 2))
    if width > dv:
        v_parts.append(value.new_zeros(b, h, s, width - dv))
    k_aug = torch.cat(k_parts, dim=-1).view(b, h, m * s, width)
    q_aug = torch.cat(q_parts, dim=-1)
    v_aug = torch.cat(v_parts, dim=-1).repeat(1, 1, m, 1)                              # key r of position j -> v_j
    allowed = allowed_pairs(attention_mask, is_causal, n, s, query.device)
    if allowed is not None:
        allowed = allowed.repeat(1, 1, 1, m)
    out = F.scaled_dot_product_attention(q_aug, k_aug, v_aug, attn_mask=allowed, dropout_p=dropout_p, scale=1.0)
    return out[..., :dv] if width > dv else out


# ------------------------------------------------------------------------------------------------ blocked path
# The exact path that pays only what the formula needs. Per block of `block_rows` query rows against every key the
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
    """One call's operands (no autograd; see the section comment) and the scores / probabilities of a block."""

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




def _mgk_blocked(query, keys, key_shift, value, var, log_prior, e_step, attention_mask, is_causal, dropout_p,
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


# ----------------------------------------------------------------------------------------------- compiled path
# The blocked path's formula as plain torch functions that torch.compile fuses (attention_compile): per block of
# query rows, with s_r = 1 / sigma_r^2,
#
#     L_ijr = s_r G_rij + x_ir + y_jr          G_r = q . k_r (MGK: one product per key; sMGK: one q . k for all r)
#     MGK:  x_ir = log pi_r - s_r |q_i|^2 / 2,          y_jr = -s_r |k_jr|^2 / 2
#     sMGK: x_ir = log pi_r - s_r |q_i - b_r|^2 / 2,    y_jr = -s_r (|k_j|^2 / 2 + b_r . k_j)
#     E_ijr = exp(L_ijr - m_i) on the pairs the masks allow (m_i: the row's largest L, so no row underflows)
#     P_ij = sum_r E_ijr (soft; hard: exp(max_r L_ijr - m_i)),  Z_i = sum_j P_ij,  h_i = sum_j (P_ij / Z_i) v_j
#
# The scores of a block are laid out (B, H, n, M, S): each query's M x S terms contiguous, so the reductions over
# keys run along a row. x and y are O((N + S) M) numbers computed eagerly with autograd; the compiled functions take
# G's operands, x, y and V and hand back d/dq, d/dk, d/dx, d/dy, d/dV. Backward recomputes E from q and k with the
# forward's row shifts m (nothing of size N x S x M is kept): with a_ij = P_ij / Z_i, dA_ij = dO_i . v_j (times the
# dropout mask), delta_i = sum_j a_ij dA_ij,
#     soft: dL_ijr = E_ijr (dA_ij - delta_i) / Z_i,      hard: dL_ijr = a_ij (dA_ij - delta_i) w_ijr
# (w: 1 for the largest term, shared equally by ties, as torch.amax's backward). Dropout masks are drawn inside the
# compiled forward and kept for backward as bool (B, H, N, S).


def _flat_keys(kk):
    """(B, H, Mk, S, D) -> (B, H, Mk * S, D): every key of a position block in one product's rows."""
    return kk.reshape(kk.shape[0], kk.shape[1], -1, kk.shape[-1])


def _compiled_scores(q, kk, x, y, s, pad, offset):
    """L (B, H, n, M, S) of one block, -inf where hidden: each query's M x S scores contiguous (from one product
    with the flattened keys), so that its sums and maxima over keys run along one row. pad (B, S) True = a real
    key; query i sees keys j <= i + offset (a 0-d tensor; offset >= S: every key)."""
    n, mk, length = q.shape[2], kk.shape[2], kk.shape[3]
    g = torch.matmul(q, _flat_keys(kk).transpose(-1, -2)).unflatten(-1, (mk, length))           # (B, H, n, Mk, S)
    scores = g * s[:, None] + x.transpose(2, 3)[..., None] + y[:, :, None]
    rows = torch.arange(n, device=q.device)[:, None] + offset
    allowed = (torch.arange(length, device=q.device) <= rows)[:, None] & pad[:, None, None, None, :]
    return scores.masked_fill(~allowed, -math.inf)


def _compiled_probs(scores, hard, m=None):
    """(E or the hard weights w (B, H, n, M, S), P (B, H, n, S), m (B, H, n, 1)): see the section comment. m: the
    row shifts when known (backward takes the forward's: no second pass for the row maxima)."""
    top = scores.amax(dim=3)
    if m is None:
        m = top.amax(dim=-1, keepdim=True)
        m = torch.where(m > -math.inf, m, torch.zeros_like(m))               # rows that see no key: P = 0
    if hard:
        wins = (scores == top[:, :, :, None]).to(scores.dtype)
        return wins / wins.sum(3, keepdim=True), torch.exp(top - m), m
    e = torch.exp(scores - m[..., None])
    return e, e.sum(3), m


def _mgk_compiled_block_forward(q, kk, x, y, s, v, pad, offset, hard, dropout_p):
    """One block's output (B, H, n, Dv), row sums Z (B, H, n, 1), shifts m and dropout mask (or None)."""
    _, p, m = _compiled_probs(_compiled_scores(q, kk, x, y, s, pad, offset), hard)
    z = p.sum(-1, keepdim=True)
    a = p / torch.where(z > 0, z, torch.ones_like(z))
    keep = None
    if dropout_p > 0:
        keep = torch.rand_like(a) >= dropout_p
        a = a * keep / (1.0 - dropout_p)
    return torch.matmul(a, v), z, m, keep


def _mgk_compiled_block_backward(q, kk, x, y, s, v, pad, offset, hard, dropout_p, z, m, keep, dout):
    """d/dq, d/dkk, d/dx, d/dy, d/dv of one block (section comment)."""
    weights, p, _ = _compiled_probs(_compiled_scores(q, kk, x, y, s, pad, offset), hard, m)
    z = torch.where(z > 0, z, torch.ones_like(z))
    a = p / z
    da, dv = value_backward(a, v, dout, keep, dropout_p)
    delta = (da * a).sum(-1, keepdim=True)
    if hard:
        dl = (a * (da - delta))[:, :, :, None] * weights                        # (B, H, n, M, S)
    else:
        dl = weights * ((da - delta) / z)[:, :, :, None]
    dg = dl * s[:, None]
    if kk.shape[2] == 1:
        dg = dg.sum(3, keepdim=True)
    dg = dg.flatten(-2)                                                         # (B, H, n, Mk * S)
    dq = torch.matmul(dg, _flat_keys(kk))
    dkk = torch.matmul(dg.transpose(-1, -2), q).unflatten(2, kk.shape[2:4])
    return dq, dkk, dl.sum(-1).transpose(2, 3), dl.sum(2), dv


class _CompiledMGK(torch.autograd.Function):
    """The compiled path in blocks of query rows: forward and backward each one compiled function per block."""

    @staticmethod
    def forward(ctx, q, kk, x, y, v, s, pad, hard, is_causal, dropout_p, block_rows):
        n, length = q.shape[2], kk.shape[3]
        outs, saved = [], []
        for rows, end, offset in block_offsets(n, length, is_causal, block_rows, q.device):
            args = (q[:, :, rows], kk[..., :end, :], x[..., rows], y[..., :end], s, v[:, :, :end], pad[:, :end],
                    offset, hard, dropout_p)
            out, z, m, keep = run_compiled("mgk_forward", _mgk_compiled_block_forward, *args)
            outs.append(out)
            saved.append((rows, end, offset, z, m, keep))
        ctx.save_for_backward(q, kk, x, y, v, s, pad)
        ctx.blocks, ctx.hard, ctx.dropout_p = saved, hard, dropout_p
        return torch.cat(outs, dim=2)

    @staticmethod
    def backward(ctx, dout):
        q, kk, x, y, v, s, pad = ctx.saved_tensors
        dq, dkk, dx, dy, dv = (torch.zeros_like(t) for t in (q, kk, x, y, v))
        dout = dout.contiguous()
        for rows, end, offset, z, m, keep in ctx.blocks:
            args = (q[:, :, rows], kk[..., :end, :], x[..., rows], y[..., :end], s, v[:, :, :end], pad[:, :end],
                    offset, ctx.hard, ctx.dropout_p, z, m, keep, dout[:, :, rows])
            bq, bk, bx, by, bv = run_compiled("mgk_backward", _mgk_compiled_block_backward, *args)
            dq[:, :, rows] = bq
            dkk[..., :end, :] += bk
            dx[..., rows] = bx
            dy[..., :end] += by
            dv[:, :, :end] += bv
        return dq, dkk, dx, dy, dv, None, None, None, None, None, None


def _mgk_compiled(query, keys, key_shift, value, var, log_prior, e_step, attention_mask, is_causal, dropout_p,
                  block_bytes):
    """MGK (keys (B, H, M, S, D)) or sMGK (keys (B, H, S, D) and key_shift (H, M, D)) through `_CompiledMGK`, in
    float32 at least (half inputs are computed in float32 and the output cast back)."""
    hard = e_step == "hard"
    dtype = torch.promote_types(query.dtype, torch.float32)
    q, keys, v = query.to(dtype), keys.to(dtype), value.to(dtype)
    s = (1.0 / var).to(dtype)
    m = s.numel()
    if key_shift is None:
        kk = keys
        x = (q * q).sum(-1)[:, :, None] * (-0.5 * s)[:, None]                              # (B, H, M, N)
        y = (keys * keys).sum(-1) * (-0.5 * s)[:, None]                                     # (B, H, M, S)
    else:
        kk = keys[:, :, None]
        b = key_shift.to(dtype)
        x = (q[:, :, None] - b[None, :, :, None]).pow(2).sum(-1) * (-0.5 * s)[:, None]      # (B, H, M, N)
        y = ((keys * keys).sum(-1)[:, :, None] * 0.5
             + torch.einsum("bhsd,hmd->bhms", keys, b)) * -s[:, None]                       # (B, H, M, S)
    if log_prior is not None and not hard:
        x = x + log_prior.to(dtype)[None, :, :, None]
    b_, h, n = q.shape[:3]
    length = kk.shape[3]
    pad = key_padding(attention_mask, b_, length, q.device)
    block_rows = max(1, block_bytes // max(1, b_ * h * m * length * q.element_size()))
    out = _CompiledMGK.apply(q, kk, x, y, v, s, pad, hard, is_causal, dropout_p, block_rows)
    return out.to(query.dtype)


def mgk_attention(query, keys, value, *, variances, log_prior=None, e_step="soft", attention_mask=None,
                  is_causal=False, dropout_p=0.0, return_weights=False, backend="auto", block_rows=BLOCK_ROWS,
                  keep_bytes=KEEP_BYTES, min_row_sum=MIN_ROW_SUM, compiled_block_bytes=COMPILED_BLOCK_BYTES):
    """MGK attention (Eq. 7). query (B,H,N,D), keys (B,H,M,S,D), value (B,H,S,Dv) -> (B,H,N,Dv).

    variances: the M absolute sigma_r^2; log_prior: (H, M) log pi (None = uniform, which cancels in the softmax);
    attention_mask: bool (B, S), True = real token, or a whole (B or 1, 1, N, S) mask (bool, or additive float);
    is_causal: query i sees keys j <= i + S - N (bottom-right aligned); dropout_p: dropout on a_ij.

    backend: "auto" (`choose_backend`) or one of BACKENDS ("dense", "sdpa", "blocked", "compiled"; module
    docstring); every one is exact, and a ValueError names one that cannot run the call ("compiled" where nothing
    can compile, e.g. HF_MGK_COMPILE=0, warns once and runs the "auto" rule's eager path). With dropout the blocked and dense paths drop
    a_ij itself; SDPA over the augmented keys drops each key's share of it independently (the same mean, not the
    same distribution). block_rows, keep_bytes, min_row_sum: the blocked path's block size, the bytes of block
    probabilities it keeps for backward (above: recomputed), and the row sum below which a block is redone shifted;
    compiled_block_bytes: the bytes of scores per block of the compiled path.
    """
    _check_e_step(e_step)
    _check_shapes(query, keys, value)
    var = _as_variances(variances, query, keys.shape[2])
    backend = _backend(backend, query, attention_mask, e_step, return_weights)
    if backend == "compiled":
        return _mgk_compiled(query, keys, None, value, var, log_prior, e_step, attention_mask, is_causal, dropout_p,
                             compiled_block_bytes)
    if backend == "blocked":
        return _mgk_blocked(query, keys, None, value, var, log_prior, e_step, attention_mask, is_causal, dropout_p,
                            block_rows, keep_bytes, min_row_sum)
    if backend == "sdpa":
        return _mgk_soft_sdpa(query, keys, value, var, log_prior, attention_mask, is_causal, dropout_p)
    return _mgk_dense(query, keys, value, var, log_prior, e_step, attention_mask, is_causal, dropout_p,
                      return_weights)


def smgk_attention(query, key, key_shift, value, *, variances, log_prior=None, e_step="soft", attention_mask=None,
                   is_causal=False, dropout_p=0.0, return_weights=False, backend="auto", block_rows=BLOCK_ROWS,
                   keep_bytes=KEEP_BYTES, min_row_sum=MIN_ROW_SUM, compiled_block_bytes=COMPILED_BLOCK_BYTES):
    """sMGK (option B of the paper): MGK with the M keys k_jr = k_j + b_r of one key projection and a learned
    shift per key and head. key (B,H,S,D), key_shift (H,M,D); the rest as `mgk_attention`, which this equals
    with keys = key + key_shift. The blocked path computes q.k once for all M keys (section comment above); the
    other backends run `mgk_attention` on the M shifted keys."""
    if key.dim() != 4 or key.shape != query.shape[:2] + key.shape[2:3] + query.shape[3:]:
        raise ValueError(f"`key` must be (B, H, S, D) matching `query` {tuple(query.shape)}, got {tuple(key.shape)}")
    if key_shift.dim() != 3 or key_shift.shape[0] != query.shape[1] or key_shift.shape[2] != query.shape[3]:
        raise ValueError(f"`key_shift` must be (H, M, D) = ({query.shape[1]}, M, {query.shape[3]}), "
                         f"got {tuple(key_shift.shape)}")
    _check_e_step(e_step)
    _check_shapes(query, key[:, :, None].expand(-1, -1, key_shift.shape[1], -1, -1), value)  # shapes only (a view)
    var = _as_variances(variances, query, key_shift.shape[1])
    backend = _backend(backend, query, attention_mask, e_step, return_weights)
    if backend == "compiled":
        return _mgk_compiled(query, key, key_shift, value, var, log_prior, e_step, attention_mask, is_causal,
                             dropout_p, compiled_block_bytes)
    if backend == "blocked":
        return _mgk_blocked(query, key, key_shift, value, var, log_prior, e_step, attention_mask, is_causal,
                            dropout_p, block_rows, keep_bytes, min_row_sum)
    return mgk_attention(query, key[:, :, None] + key_shift[None, :, :, None, :], value, variances=variances,
                         log_prior=log_prior, e_step=e_step, attention_mask=attention_mask, is_causal=is_causal,
                         dropout_p=dropout_p, return_weights=return_weights, backend=backend)


@torch.no_grad()
def mgk_responsibilities(query, keys, *, variances, log_prior=None, attention_mask=None, is_causal=False):
    """Mean soft-E-step responsibility of each key over valid (query, key) pairs: the M-step pi_r, shape (H, M).

    Eq. 8: gamma_ijr = pi_r N(q_i | k_jr, sigma_r^2) / sum_r' pi_r' N(q_i | k_jr', sigma_r'^2); the paper's
    pi_jr = N_jr / N becomes, with pi shared over positions, the mean of gamma over all valid (i, j).
    Pairs whose responsibilities are not finite (a NaN or inf in that query or key, e.g. one bad row of a
    batch) are left out, so they cannot reach pi; a head with no finite valid pair gets NaN (keep its old pi)."""
    var = _as_variances(variances, query, keys.shape[2])
    log_gamma = torch.log_softmax(_log_kernel(query.float(), keys.float(), var, log_prior), dim=2)  # (B,H,M,N,S)
    gamma = log_gamma.exp()
    used = torch.isfinite(gamma).all(dim=2, keepdim=True)                                        # (B,H,1,N,S)
    allowed = allowed_pairs(attention_mask, is_causal, query.shape[2], keys.shape[3], query.device)
    if allowed is not None:
        if not allowed.dtype == torch.bool:  # an additive mask: the pairs it does not push to the minimum
            allowed = allowed > torch.finfo(allowed.dtype).min
        used = used & allowed[:, :, None]
    gamma = torch.where(used, gamma, torch.zeros((), dtype=gamma.dtype, device=gamma.device))
    return gamma.sum(dim=(0, 3, 4)) / used.sum(dim=(0, 3, 4)).to(gamma.dtype)


# ------------------------------------------------------------------------------------------------ MLK (Sec. 2.4)
def choose_mlk_backend(*, return_weights, mask, is_causal, tracing):
    """The backend `mlk_attention` runs with backend="auto": "dense" (the explicit N x S matrix) for the weights, a
    whole 4-D mask (mask="pairs", which sums over keys cannot apply) and causal calls in a traced or compiled graph
    (the chunks' padding to a multiple of the chunk length cannot stay symbolic: torch.export with a dynamic length
    fails on its guards); otherwise "linear", O(N)."""
    return "dense" if return_weights or mask == "pairs" or (is_causal and tracing) else "linear"


def _elu1(x):
    return F.elu(x) + 1.0


def _mixed_key_features(keys, log_prior):
    """sum_r pi_r phi(k_jr): (B, H, S, D). MLK is linear attention on this one mixed key feature."""
    m = keys.shape[2]
    if log_prior is None:
        prior = torch.full((1, 1, m, 1, 1), 1.0 / m, dtype=keys.dtype, device=keys.device)
    else:
        prior = log_prior.exp().to(keys.dtype)[None, :, :, None, None]
    return (_elu1(keys) * prior).sum(dim=2)


def _nonzero(den):
    """The normaliser with 1 where it is 0: a query that sees no key (padding, or before the first position) has a
    zero numerator too, so its output is 0, and its gradients are 0 (dividing by a clamped tiny value instead gives
    0 / tiny^2 = NaN in backward)."""
    return torch.where(den > 0, den, torch.ones((), dtype=den.dtype, device=den.device))


def _float32(*tensors):
    """Half-precision tensors as float32 (float64 kept; None passed through): MLK's sums over N positions."""
    return [None if t is None else t.to(torch.promote_types(t.dtype, torch.float32)) for t in tensors]


def _mlk_dense(query, keys, value, log_prior, attention_mask, is_causal, return_weights):
    """The explicit N x S matrix a_ij = phi(q_i).sum_r pi_r phi(k_jr), row-normalised, in float32 for half inputs;
    the output is the returned (rounded) weights times the values, so the weights stay in the autograd graph
    (gradient-based attribution)."""
    with torch.autocast(query.device.type, enabled=False):
        q, k, v, log_prior = _float32(query, keys, value, log_prior)
        kernel = torch.matmul(_elu1(q), _mixed_key_features(k, log_prior).transpose(-1, -2))
        allowed = allowed_pairs(attention_mask, is_causal, query.shape[2], keys.shape[3], query.device)
        if allowed is not None:
            kernel = kernel * (allowed if allowed.dtype == torch.bool else allowed.exp())
        weights = (kernel / _nonzero(kernel.sum(-1, keepdim=True))).to(query.dtype)
        out = torch.matmul(weights.to(v.dtype), v).to(query.dtype)
    return (out, weights) if return_weights else out


def mlk_attention(query, keys, value, *, log_prior=None, attention_mask=None, is_causal=False,
                  return_weights=False, backend="auto", chunk_size=MLK_CHUNK):
    """Mixture of linear keys, phi = elu + 1: h_i = phi(q_i)^T KV / phi(q_i)^T Z, KV = sum_j phi_j v_j^T and
    Z = sum_j phi_j with phi_j = sum_r pi_r phi(k_jr) (causal: sums over j <= i + S - N).

    backend: "auto" (`choose_mlk_backend`), "dense" (the explicit N x S matrix, the only one with the weights) or
    "linear" (O(N): the sums, causal as prefix sums evaluated in chunks of `chunk_size` positions, `_causal_linear`,
    so that memory stays O(N (C + D Dv / C)) instead of O(N D Dv)).
    The sums run in float32 whatever the input dtype or autocast (output in the query's dtype): Z and the
    normaliser phi(q_i)^T Z grow with N and overflow float16 from N ~ 1k (outputs 0 or NaN), and bfloat16
    prefix sums lose the later terms."""
    _check_shapes(query, keys, value)
    mask = mask_kind(attention_mask)
    linear = ("return_weights (only 'dense' forms the weights)" if return_weights
              else "a whole 4-D mask" if mask == "pairs" else None)
    backend = resolve_backend(backend, choose_mlk_backend(return_weights=return_weights, mask=mask,
                                                          is_causal=is_causal, tracing=is_tracing()),
                              {"dense": None, "linear": linear})
    if backend == "dense":
        return _mlk_dense(query, keys, value, log_prior, attention_mask, is_causal, return_weights)
    with torch.autocast(query.device.type, enabled=False):
        q, k, value, log_prior = _float32(query, keys, value, log_prior)
        phi_q = _elu1(q)
        phi_k = _mixed_key_features(k, log_prior)
        if attention_mask is not None:
            phi_k = phi_k * attention_mask[:, None, :, None].to(phi_k.dtype)
        if not is_causal:
            kv = torch.matmul(phi_k.transpose(-1, -2), value)                            # (B,H,D,Dv)
            z = phi_k.sum(dim=2)                                                          # (B,H,D)
            num = torch.matmul(phi_q, kv)
            den = (phi_q * z[:, :, None, :]).sum(-1, keepdim=True)
            return (num / _nonzero(den)).to(query.dtype)
        return _causal_linear(phi_q, phi_k, value, chunk_size).to(query.dtype)


def _causal_linear(phi_q, phi_k, value, c):
    """Causal linear attention h_i = phi_q_i^T sum_{j <= p_i} phi_k_j v_j^T / phi_q_i^T sum_{j <= p_i} phi_k_j,
    the N queries being the last N of the S positions (p_i = i + S - N: bottom-right alignment for cached
    decoding), in chunks of c positions. Prefix sums of phi_k v^T per position would hold N x D x Dv numbers per
    head (gigabytes at N = 2048); here the keys of a query's own chunk come from a masked C x C product and all
    earlier keys from the state sum_{j before the chunk} phi_k_j v_j^T, one (D, Dv) per chunk.
    Causal linear attention as prefix sums: Katharopoulos et al., "Transformers are RNNs" (ICML 2020), Sec. 3.3;
    the chunked evaluation: Hua et al., "Transformer Quality in Linear Time" (ICML 2022), mixed chunk attention."""
    n, s = phi_q.shape[2], phi_k.shape[2]
    if s < n:  # queries before position 0 see nothing: positions with no key (phi = 0) put in front
        phi_k, value = (F.pad(t, (0, 0, n - s, 0)) for t in (phi_k, value))
        s = n
    past = s - n  # keys every query sees in full
    kv0 = torch.matmul(phi_k[:, :, :past].transpose(-1, -2), value[:, :, :past])        # (B, H, D, Dv)
    z0 = phi_k[:, :, :past].sum(2)                                                       # (B, H, D)
    # the queries' own positions, padded at the end to whole chunks (later than every real query: unseen)
    pad = -n % c
    q, k, v = (F.pad(t[:, :, t.shape[2] - n:], (0, 0, 0, pad)).unflatten(2, (-1, c)) for t in (phi_q, phi_k, value))
    kv = torch.matmul(k.transpose(-1, -2), v)                                            # (B, H, chunks, D, Dv)
    z = k.sum(3)                                                                         # (B, H, chunks, D)
    # state before each chunk: an exclusive prefix sum over chunks, starting from the past keys' sums
    kv_state = torch.cat([kv0[:, :, None], kv[:, :, :-1]], 2).cumsum(2)
    z_state = torch.cat([z0[:, :, None], z[:, :, :-1]], 2).cumsum(2)
    own = causal_mask(c, c, q.device)                                                    # key j <= query i
    scores = torch.matmul(q, k.transpose(-1, -2)).masked_fill(~own, 0.0)                 # (B, H, chunks, C, C)
    num = torch.matmul(scores, v) + torch.matmul(q, kv_state)
    den = scores.sum(-1, keepdim=True) + torch.matmul(q, z_state[..., None])
    return (num / _nonzero(den)).flatten(2, 3)[:, :, :n]
