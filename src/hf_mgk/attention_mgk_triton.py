"""The Triton path of MGK / sMGK attention: fused kernels, forward and backward, in the flash pattern.

Nguyen et al., "Improving Transformers with Probabilistic Attention Keys" (ICML 2022, arXiv:2110.08678), Eq. 7
(soft E-step) and Sec. 2.3 (hard E-step). `attention_mgk.mgk_attention` / `smgk_attention` (backend="triton")
call `mgk_triton`. The flash pattern: Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with
IO-Awareness" (NeurIPS 2022), Alg. 1 and 2.

With s_r = 1 / sigma_r^2 every log-kernel term of Eq. 7 is one product plus a per-query and a per-key term:

    L_ijr = log pi_r - s_r |q_i - k_jr|^2 / 2 = s_r q_i . k_jr + x_ir + y_jr
    MGK:  x_ir = log pi_r - s_r |q_i|^2 / 2,            y_jr = -s_r |k_jr|^2 / 2
    sMGK: x_ir = log pi_r - s_r |q_i - b_r|^2 / 2,      y_jr = -s_r (|k_j|^2 / 2 + b_r . k_j)   (k_jr = k_j + b_r)

x and y (O((N + S) M) numbers) are formed in torch with autograd; the kernels see only q, the keys, v, x and y, and
hand back the gradients of the product term and of x and y, so torch's chain rule carries them on to q, the keys,
the shifts and the prior. Padded keys get y = -inf. Then, with P_ij = sum_r exp(L_ijr) (soft) or exp(max_r L_ijr)
(hard, pi unused), h_i = sum_j P_ij v_j / sum_j P_ij: softmax_j(logsumexp_r L_ijr) needs no logarithm.

Forward: one program per (batch x head, block of query rows), one pass over the key blocks with an online row
maximum m_i (the M keys of a block are folded in one after another, each rescaling the block's P when it raises
the maximum), exp2 with log2(e) folded into s, x and y. Saved for backward: lse_i = m_i + log2 sum_j P_ij (in
log2 units; +inf for a row that sees no key, whose output is 0, so that every recomputed weight of it is 0).
Backward recomputes the weights a_ijr = exp2(L_ijr - lse_i) from q and k (nothing N x S is kept): with
delta_i = dO_i . h_i, dL_ijr = a_ijr (dO_i . v_j - delta_i) (hard: a_ij split between the keys with the largest
term, ties equally as torch.amax's backward). delta comes from one pass over the recomputed weights (the dQ kernel
without dQ), dQ from a second (per query block, over key blocks), dK and dV from a third kernel (per key block and
key r, over query blocks; the M programs' dV shares are summed afterwards).

Dropout (on a_ij, as F.dropout on the weights): the mask of each (batch x head, query, key) is a counter-based draw,
tl.rand(seed + batch x head, i S + j), from one seed drawn from torch's generator per call, so that the forward
and the backward kernels regenerate the same mask with nothing stored, and a seeded run repeats.

Torch, and Triton where it is installed (this file travels next to remote-code model files: the import is guarded,
and without Triton the other backends run). On CPU tensors the kernels run in Triton's interpreter when
TRITON_INTERPRET=1 was set before triton was imported.
"""

import math

import torch

from .attention_triton import (LOG2E, MAX_HEAD_SIZE, available, fitted, precision, refusal, shape_class,
                               shared_memory, tl, triton, tuned_blocks)

if triton is not None:
    from .attention_triton import dot as _dot
    from .attention_triton import keep as _keep
    from .attention_triton import key_end as _key_end
    from .attention_triton import query_start as _query_start
    from .attention_triton import softmax_state as _softmax_state

__all__ = ["MAX_HEAD_SIZE", "available", "block_sizes", "mgk_triton", "refusal"]


def block_sizes(device_type, head_size, value_size, dtype=torch.bfloat16, shared=None):
    """(BLOCK_M query rows, BLOCK_N keys) of a program: the interpreter's small tiles (the tests' short sequences
    still span several blocks), a GPU's defaults fitted to its `shared` memory per program in `dtype`
    (attention_triton.fitted), or the tuned ones (attention_triton.tuned_blocks)."""
    if device_type == "cpu":
        default = (32, 32)
    else:
        default = fitted((64, 64) if max(head_size, value_size) <= 64 else (64, 32), dtype, shared)
    return tuned_blocks("mgk", default, shape_class(max(head_size, value_size)))


if triton is not None:

    @triton.jit
    def _scores(q, k_ptrs, r, s2_ptr, x_ptr, y_ptr, offs_m, offs_n, n_q, n_k, N, S, qk_shared,
                CAUSAL: tl.constexpr, SHARED: tl.constexpr, PREC: tl.constexpr):
        """L_r * log2(e) of a (BLOCK_M, BLOCK_N) tile, -inf where hidden (causal, padding, past the ends)."""
        if SHARED:  # sMGK: one q . k for all M keys
            qk = qk_shared
        else:
            k = tl.load(k_ptrs, mask=(offs_n < S)[:, None] & n_k[None, :], other=0.0)
            qk = _dot(q, tl.trans(k), PREC)
        s2 = tl.load(s2_ptr + r)
        x = tl.load(x_ptr + offs_m, mask=offs_m < N, other=0.0)
        y = tl.load(y_ptr + offs_n, mask=offs_n < S, other=float("-inf"))
        score = qk * s2 + x[:, None] + y[None, :]
        if CAUSAL:  # bottom-right aligned: query i sees key j <= i + S - N
            score = tl.where(offs_n[None, :] <= offs_m[:, None] + (S - N), score, float("-inf"))
        return score

    @triton.jit
    def _fwd_kernel(Q, K, V, X, Y, S2, O, LSE, N, S, D, DV, stride_kr, P_DROP, SEED,
                    DROPOUT: tl.constexpr, M: tl.constexpr, HARD: tl.constexpr, CAUSAL: tl.constexpr,
                    SHARED: tl.constexpr,
                    PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_DV: tl.constexpr):
        bh = tl.program_id(0)  # 32-bit: the dropout draws' key
        bh64 = bh.to(tl.int64)  # the head's base offsets in 64 bits (B H N D passes 2^31), its tiles' in 32
        Q, O, LSE = Q + bh64 * N * D, O + bh64 * N * DV, LSE + bh64 * N
        V, X, Y = V + bh64 * S * DV, X + bh64 * M * N, Y + bh64 * M * S
        start_m = tl.program_id(1) * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        n_q, n_v = offs_d < D, offs_dv < DV
        q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :], mask=(offs_m < N)[:, None] & n_q[None, :],
                    other=0.0)
        k_base = K + bh64 * (S * D if SHARED else M * S * D)
        m_i, l_i, acc = _softmax_state(BLOCK_M, BLOCK_DV)
        hi = _key_end(start_m, BLOCK_M, N, S, CAUSAL)
        for start_n in range(0, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            qk0 = q  # placeholder where the keys have their own products
            if SHARED:
                k = tl.load(k_base + offs_n[:, None] * D + offs_d[None, :], mask=(offs_n < S)[:, None] & n_q[None, :],
                            other=0.0)
                qk0 = _dot(q, tl.trans(k), PREC)
            m_cur = m_i
            p = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            lmax = tl.full([BLOCK_M, BLOCK_N], float("-inf"), tl.float32)
            for r in tl.static_range(M):
                score = _scores(q, k_base + r * stride_kr + offs_n[:, None] * D + offs_d[None, :], r, S2,
                                X + r * N, Y + r * S, offs_m, offs_n, n_q, n_q, N, S, qk0,
                                CAUSAL, SHARED, PREC)
                if HARD:
                    lmax = tl.maximum(lmax, score)
                else:  # fold key r into the block's P, rescaled when it raises the row maximum
                    m_new = tl.maximum(m_cur, tl.max(score, 1))
                    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing seen yet: P stays 0
                    p = p * tl.exp2(m_cur - m_use)[:, None] + tl.exp2(score - m_use[:, None])
                    m_cur = m_new
            if HARD:
                m_cur = tl.maximum(m_i, tl.max(lmax, 1))
                p = tl.exp2(lmax - tl.where(m_cur == float("-inf"), 0.0, m_cur)[:, None])
            alpha = tl.exp2(m_i - tl.where(m_cur == float("-inf"), 0.0, m_cur))
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + offs_n[:, None] * DV + offs_dv[None, :],
                        mask=(offs_n < S)[:, None] & n_v[None, :], other=0.0)
            pv = p
            if DROPOUT:  # a_ij dropped after the normalisation: Z sums the undropped P
                pv = tl.where(_keep(SEED, bh, offs_m, offs_n, S, P_DROP), p / (1.0 - P_DROP), 0.0)
            acc = acc * alpha[:, None] + _dot(pv.to(v.dtype), v, PREC)
            m_i = m_cur
        seen = l_i > 0  # a row that sees no key: output 0, lse +inf (backward's weights all 0)
        out = acc / tl.where(seen, l_i, 1.0)[:, None]
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("inf"))
        tl.store(O + offs_m[:, None] * DV + offs_dv[None, :], out.to(O.dtype.element_ty),
                 mask=(offs_m < N)[:, None] & n_v[None, :])
        tl.store(LSE + offs_m, lse, mask=offs_m < N)

    @triton.jit
    def _bwd_dq_kernel(Q, K, V, X, Y, S2, DO, LSE, DELTA, DQ, DX, N, S, D, DV, stride_kr, P_DROP, SEED,
                       DROPOUT: tl.constexpr, M: tl.constexpr, MP: tl.constexpr, HARD: tl.constexpr,
                       CAUSAL: tl.constexpr,
                       SHARED: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, WITH_DQ: tl.constexpr):
        """dq_i = sum_r s_r sum_j dL_ijr k_jr and dx_ir = sum_j dL_ijr for one block of query rows. Without WITH_DQ
        (and DELTA = 0) only the row sums: sum_r dx_ir is then delta_i = sum_jr a_ijr dO_i . v_j."""
        bh = tl.program_id(0)  # 32-bit: the dropout draws' key
        bh64 = bh.to(tl.int64)  # the head's base offsets in 64 bits (B H N D passes 2^31), its tiles' in 32
        Q, DO, DQ, DX = Q + bh64 * N * D, DO + bh64 * N * DV, DQ + bh64 * N * D, DX + bh64 * N * M
        V, X, Y, LSE, DELTA = V + bh64 * S * DV, X + bh64 * M * N, Y + bh64 * M * S, LSE + bh64 * N, DELTA + bh64 * N
        start_m = tl.program_id(1) * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        offs_r = tl.arange(0, MP)
        n_q, n_v, rows = offs_d < D, offs_dv < DV, offs_m < N
        q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :], mask=rows[:, None] & n_q[None, :],
                    other=0.0)
        do = tl.load(DO + offs_m[:, None] * DV + offs_dv[None, :], mask=rows[:, None] & n_v[None, :],
                     other=0.0)
        lse = tl.load(LSE + offs_m, mask=rows, other=float("inf"))
        delta = tl.load(DELTA + offs_m, mask=rows, other=0.0)
        k_base = K + bh64 * (S * D if SHARED else M * S * D)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        dx = tl.zeros([BLOCK_M, MP], tl.float32)  # column r: the row sums of dL_r
        hi = _key_end(start_m, BLOCK_M, N, S, CAUSAL)
        for start_n in range(0, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            v = tl.load(V + offs_n[:, None] * DV + offs_dv[None, :],
                        mask=(offs_n < S)[:, None] & n_v[None, :], other=0.0)
            dp = _dot(do, tl.trans(v), PREC)
            if DROPOUT:  # d a_ij = mask_ij dO_i . v_j / (1 - p)
                dp = tl.where(_keep(SEED, bh, offs_m, offs_n, S, P_DROP), dp / (1.0 - P_DROP), 0.0)
            ds = dp - delta[:, None]
            qk0 = q
            k_shared = q
            if SHARED:
                k_shared = tl.load(k_base + offs_n[:, None] * D + offs_d[None, :],
                                   mask=(offs_n < S)[:, None] & n_q[None, :], other=0.0)
                qk0 = _dot(q, tl.trans(k_shared), PREC)
            lmax = tl.full([BLOCK_M, BLOCK_N], float("-inf"), tl.float32)
            count = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            if HARD:  # the largest term and how many keys tie for it
                for r in tl.static_range(M):
                    score = _scores(q, k_base + r * stride_kr + offs_n[:, None] * D + offs_d[None, :], r, S2,
                                    X + r * N, Y + r * S, offs_m, offs_n, n_q, n_q, N, S, qk0,
                                    CAUSAL, SHARED, PREC)
                    count = tl.where(score > lmax, 1.0, tl.where(score == lmax, count + 1.0, count))
                    lmax = tl.maximum(lmax, score)
                ds = ds * tl.exp2(lmax - lse[:, None]) / count
            dg = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)  # sMGK: sum_r s_r dL_r
            for r in tl.static_range(M):
                score = _scores(q, k_base + r * stride_kr + offs_n[:, None] * D + offs_d[None, :], r, S2,
                                X + r * N, Y + r * S, offs_m, offs_n, n_q, n_q, N, S, qk0,
                                CAUSAL, SHARED, PREC)
                if HARD:
                    dl = tl.where(score == lmax, ds, 0.0)
                else:
                    dl = tl.exp2(score - lse[:, None]) * ds
                dl = tl.where(score == float("-inf"), 0.0, dl)  # hidden pairs (ties of -inf in the hard count)
                dx += tl.where(offs_r[None, :] == r, tl.sum(dl, 1)[:, None], 0.0)
                if WITH_DQ:
                    s = tl.load(S2 + r) / 1.4426950408889634
                    if SHARED:
                        dg += dl * s
                    else:
                        k = tl.load(k_base + r * stride_kr + offs_n[:, None] * D + offs_d[None, :],
                                    mask=(offs_n < S)[:, None] & n_q[None, :], other=0.0)
                        dq += _dot((dl * s).to(k.dtype), k, PREC)
            if SHARED and WITH_DQ:
                dq += _dot(dg.to(k_shared.dtype), k_shared, PREC)
        if WITH_DQ:
            tl.store(DQ + offs_m[:, None] * D + offs_d[None, :], dq, mask=rows[:, None] & n_q[None, :])
        tl.store(DX + offs_m[:, None] * M + offs_r[None, :], dx,
                 mask=rows[:, None] & (offs_r < M)[None, :])

    @triton.jit
    def _bwd_dkv_kernel(Q, K, V, X, Y, S2, DO, LSE, DELTA, DK, DV_OUT, DY, N, S, D, DV, stride_kr, P_DROP, SEED,
                        DROPOUT: tl.constexpr, M: tl.constexpr, HARD: tl.constexpr, CAUSAL: tl.constexpr,
                        SHARED: tl.constexpr,
                        PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_DV: tl.constexpr):
        """For key r of one block of keys: s_r sum_i dL_ijr q_i (DK[r]), dy_jr = sum_i dL_ijr, and the share of
        dv_j that key r's weights give, sum_i a_ijr dO_i (DV_OUT[r]; the shares sum to dv over r)."""
        bh = tl.program_id(0)  # 32-bit: the dropout draws' key
        start_n = tl.program_id(1) * BLOCK_N
        r_own = tl.program_id(2)
        bh64 = bh.to(tl.int64)  # the head's base offsets in 64 bits (B H N D passes 2^31), its tiles' in 32
        Q, DO, LSE, DELTA = Q + bh64 * N * D, DO + bh64 * N * DV, LSE + bh64 * N, DELTA + bh64 * N
        V, X, Y, DY = V + bh64 * S * DV, X + bh64 * M * N, Y + bh64 * M * S, DY + (bh64 * M + r_own) * S
        part = r_own.to(tl.int64) * tl.num_programs(0) + bh64  # DK and DV_OUT: (M, BH, S, D)
        DK, DV_OUT = DK + part * S * D, DV_OUT + part * S * DV
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        n_q, n_v, cols = offs_d < D, offs_dv < DV, offs_n < S
        k_base = K + bh64 * (S * D if SHARED else M * S * D)
        v = tl.load(V + offs_n[:, None] * DV + offs_dv[None, :], mask=cols[:, None] & n_v[None, :],
                    other=0.0)
        k_shared = tl.load(k_base + offs_n[:, None] * D + offs_d[None, :], mask=cols[:, None] & n_q[None, :],
                           other=0.0)
        s_own = tl.load(S2 + r_own) / 1.4426950408889634
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
        dy = tl.zeros([BLOCK_N], tl.float32)
        lo = _query_start(start_n, BLOCK_M, N, S, CAUSAL)
        for start_m in range(lo, N, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            rows = offs_m < N
            q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :], mask=rows[:, None] & n_q[None, :],
                        other=0.0)
            do = tl.load(DO + offs_m[:, None] * DV + offs_dv[None, :],
                         mask=rows[:, None] & n_v[None, :], other=0.0)
            lse = tl.load(LSE + offs_m, mask=rows, other=float("inf"))
            delta = tl.load(DELTA + offs_m, mask=rows, other=0.0)
            qk0 = q
            if SHARED:
                qk0 = _dot(q, tl.trans(k_shared), PREC)
            lmax = tl.full([BLOCK_M, BLOCK_N], float("-inf"), tl.float32)
            count = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            own = tl.full([BLOCK_M, BLOCK_N], float("-inf"), tl.float32)
            for r in tl.static_range(M):
                if HARD or M == 1:
                    score = _scores(q, k_base + r * stride_kr + offs_n[:, None] * D + offs_d[None, :], r, S2,
                                    X + r * N, Y + r * S, offs_m, offs_n, n_q, n_q, N, S,
                                    qk0, CAUSAL, SHARED, PREC)
                    count = tl.where(score > lmax, 1.0, tl.where(score == lmax, count + 1.0, count))
                    lmax = tl.maximum(lmax, score)
                    own = tl.where(r_own == r, score, own)
            if not HARD and M > 1:  # the soft weights of key r need its own term only
                own = _scores(q, k_base + r_own * stride_kr + offs_n[:, None] * D + offs_d[None, :], r_own, S2,
                              X + r_own * N, Y + r_own * S, offs_m, offs_n, n_q, n_q, N, S,
                              qk0, CAUSAL, SHARED, PREC)
            if HARD:  # key r's share of a_ij: a_ij / count where it has the largest term
                a = tl.where(own == lmax, tl.exp2(lmax - lse[:, None]) / count, 0.0)
            else:
                a = tl.exp2(own - lse[:, None])
            a = tl.where(own == float("-inf"), 0.0, a)
            dp = _dot(do, tl.trans(v), PREC)
            if DROPOUT:
                keep = _keep(SEED, bh, offs_m, offs_n, S, P_DROP)
                dv += _dot(tl.trans(tl.where(keep, a / (1.0 - P_DROP), 0.0)).to(do.dtype), do, PREC)
                dp = tl.where(keep, dp / (1.0 - P_DROP), 0.0)
            else:
                dv += _dot(tl.trans(a).to(do.dtype), do, PREC)
            dl = a * (dp - delta[:, None])
            dy += tl.sum(dl, 0)
            dk += _dot(tl.trans(dl * s_own).to(q.dtype), q, PREC)
        tl.store(DK + offs_n[:, None] * D + offs_d[None, :], dk,
                 mask=cols[:, None] & n_q[None, :])
        tl.store(DV_OUT + offs_n[:, None] * DV + offs_dv[None, :], dv,
                 mask=cols[:, None] & n_v[None, :])
        tl.store(DY + offs_n, dy, mask=cols)


class _TritonMGK(torch.autograd.Function):
    """L = s_r q.k_r + x_r + y_r attention; inputs q (BH, N, D), k (BH, M, S, D) or shared (BH, S, D), v (BH, S, Dv),
    x (BH, M, N), y (BH, M, S) float32; gradients of q and k through the product term only, of x and y whole."""

    @staticmethod
    def forward(ctx, q, k, v, x, y, inv_var, hard, causal, shared, dropout_p, seed):
        bh, n, d = q.shape
        s, dv, m = v.shape[1], v.shape[2], x.shape[1]
        block_m, block_n = block_sizes(q.device.type, d, dv, q.dtype, shared_memory(q.device))
        s2 = torch.tensor(inv_var, dtype=torch.float32, device=q.device) * LOG2E
        x2, y2 = (x * LOG2E).contiguous(), (y * LOG2E).contiguous()
        out = torch.empty(bh, n, dv, dtype=q.dtype, device=q.device)
        lse = torch.empty(bh, n, dtype=torch.float32, device=q.device)
        consts = _constants(q, d, dv, m, hard, causal, shared, block_m, block_n, dropout_p)
        stride_kr = 0 if shared else s * d
        _fwd_kernel[(bh, triton.cdiv(n, block_m))](q, k, v, x2, y2, s2, out, lse, n, s, d, dv, stride_kr, dropout_p,
                                                   seed, **consts)
        ctx.save_for_backward(q, k, v, x2, y2, s2, lse)
        ctx.shape = (bh, n, s, d, dv, m, stride_kr, block_m, block_n, dropout_p, seed)
        ctx.consts = consts
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, x2, y2, s2, lse = ctx.saved_tensors
        bh, n, s, d, dv, m, stride_kr, block_m, block_n, dropout_p, seed = ctx.shape
        dout = dout.contiguous()
        dq = torch.empty(bh, n, d, dtype=torch.float32, device=q.device)
        dx = torch.empty(bh, n, m, dtype=torch.float32, device=q.device)
        dk = torch.empty(m, bh, s, d, dtype=torch.float32, device=q.device)
        dv_parts = torch.empty(m, bh, s, dv, dtype=torch.float32, device=q.device)
        dy = torch.empty(bh, m, s, dtype=torch.float32, device=q.device)
        consts = ctx.consts
        grid_q = (bh, triton.cdiv(n, block_m))
        # delta_i = dO_i . h_i, from the weights backward recomputes (one more pass over the keys), not from the
        # stored output: the row sums sum_jr dL_ijr must vanish as they do exactly, since the |q|^2 / 2 terms of
        # x make dq = s (sum_j dL k - q sum_j dL) a difference; dO . h with h rounded (a half-precision output, or
        # P rounded for the product with V) leaves sum_j dL ~ eps |delta| per row, which that difference and
        # the prior's gradient (a sum of cancelling terms) amplify (measured in bfloat16: 3x the dense path's
        # error in dq, and 10x in the prior's gradient).
        zero = torch.zeros(bh, n, dtype=torch.float32, device=q.device)
        _bwd_dq_kernel[grid_q](q, k, v, x2, y2, s2, dout, lse, zero, dq, dx, n, s, d, dv, stride_kr, dropout_p, seed,
                               MP=triton.next_power_of_2(m), WITH_DQ=False, **consts)
        delta = dx.sum(-1).contiguous()
        _bwd_dq_kernel[grid_q](q, k, v, x2, y2, s2, dout, lse, delta, dq, dx, n, s, d, dv, stride_kr, dropout_p,
                               seed, MP=triton.next_power_of_2(m), WITH_DQ=True, **consts)
        _bwd_dkv_kernel[(bh, triton.cdiv(s, block_n), m)](q, k, v, x2, y2, s2, dout, lse, delta, dk, dv_parts, dy,
                                                          n, s, d, dv, stride_kr, dropout_p, seed, **consts)
        shared = consts["SHARED"]
        dk = dk.sum(0) if shared else dk.transpose(0, 1)
        return (dq.to(q.dtype), dk.to(k.dtype), dv_parts.sum(0).to(v.dtype), dx.transpose(1, 2), dy,
                None, None, None, None, None, None)


def _constants(q, d, dv, m, hard, causal, shared, block_m, block_n, dropout_p):
    return dict(DROPOUT=dropout_p > 0, M=m, HARD=hard, CAUSAL=causal, SHARED=shared,
                PREC=precision(q.dtype, q.device.type), BLOCK_M=block_m,
                BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
                BLOCK_DV=max(16, triton.next_power_of_2(dv)))


def mgk_triton(query, keys, key_shift, value, variances, log_prior, e_step, attention_mask, is_causal,
               dropout_p=0.0):
    """MGK (key_shift None, keys (B, H, M, S, D)) or sMGK (keys = the one key (B, H, S, D), key_shift (H, M, D))
    with the Triton kernels. variances: the M sigma_r^2, numbers (a list: no device sync) or a tensor that needs no
    gradient (sigma is fixed: attention_mgk's backend rule refuses one that does); log_prior (H, M) or None
    (uniform).
    float32 / bfloat16 / float16 inputs (k, v in the query's dtype), float32 accumulation; output in the query's
    dtype."""
    hard = e_step == "hard"
    shared = key_shift is not None
    b, h, n, d = query.shape
    s, dv = value.shape[2], value.shape[3]
    m = key_shift.shape[1] if shared else keys.shape[2]
    dtype = query.dtype
    if dtype == torch.float32 and torch.is_autocast_enabled(query.device.type):  # as autocast runs matmuls
        dtype = torch.get_autocast_dtype(query.device.type)
    # dropout on a_ij, drawn in the kernels from one seed of torch's global generator (a seeded run repeats)
    seed = int(torch.randint(0, 2**31 - 2**20, (), device="cpu")) if dropout_p > 0 else 0
    if isinstance(variances, torch.Tensor):
        variances = variances.detach().double().reshape(-1).tolist()
    inv_var = [1.0 / float(v) for v in variances]
    sv = torch.tensor(inv_var, dtype=torch.float32, device=query.device)
    # x and y from the same rounded q and k as the kernels' products: L's terms must cancel as in exact arithmetic
    query, keys, value = query.to(dtype), keys.to(dtype), value.to(dtype)
    # x and y in float32 with autograd (outside autocast: sMGK's b_r . k_j must not round to half precision)
    with torch.autocast(query.device.type, enabled=False):
        qf, kf = query.float(), keys.float()
        if shared:
            # |q_i - b_r|^2 = |q_i|^2 - 2 q_i . b_r + |b_r|^2: no (B, H, M, N, D) difference tensor
            b_r = key_shift.float()                                                        # (H, M, D)
            q_sq = qf.pow(2).sum(-1)[:, :, None]                                           # (B, H, 1, N)
            qb = torch.einsum("bhnd,hmd->bhmn", qf, b_r)
            x = (q_sq - 2 * qb + b_r.pow(2).sum(-1)[None, :, :, None]) * (-0.5 * sv.view(1, 1, m, 1))
            y = -(kf.pow(2).sum(-1)[:, :, None] * 0.5 + torch.einsum("bhsd,hmd->bhms", kf, b_r)) * sv.view(1, 1, m, 1)
        else:
            x = qf.pow(2).sum(-1)[:, :, None] * (-0.5 * sv.view(1, 1, m, 1))               # (B, H, M, N)
            y = kf.pow(2).sum(-1) * (-0.5 * sv.view(1, 1, m, 1))                            # (B, H, M, S)
        if log_prior is not None and not hard:
            x = x + log_prior.float()[None, :, :, None]
        if attention_mask is not None:
            y = y.masked_fill(~attention_mask.bool()[:, None, None, :], -math.inf)
    k_flat = keys.reshape(b * h, s, d) if shared else keys.reshape(b * h, m, s, d)
    out = _TritonMGK.apply(query.reshape(b * h, n, d).contiguous(), k_flat.contiguous(),
                           value.reshape(b * h, s, dv).contiguous(), x.reshape(b * h, m, n),
                           y.reshape(b * h, m, s), inv_var, hard, bool(is_causal), shared, float(dropout_p), seed)
    return out.view(b, h, n, dv)
