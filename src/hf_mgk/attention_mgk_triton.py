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
maximum m_i: a block's M tiles t_r = s_r q.k_r + y_r first, the row maximum of every t_r + x_r (x_r is one number a
row), then one rescale; exp2 with log2(e) folded into s, x and y. Masks only where needed: the causal `where` on
the blocks the diagonal crosses (bottom-right aligned), bounds masks only where a length is not a multiple of its
block (EVEN_N / EVEN_S / EVEN_D). Saved: lse_i = m_i + log2 sum_j P_ij (log2 units; +inf for a row that sees no
key, whose output is 0) and the output in float32 (soft: its P split into two half-precision parts for the
products with V, so that delta_i = dO_i . h_i holds to ~16 bits; see backward).
Backward recomputes a_ijr = exp2(L_ijr - lse_i) from q and k: dL_ijr = a_ijr (dO_i . v_j - delta_i) (hard: a_ij
split between the keys with the largest term, ties equally as torch.amax's backward). dK, dV and dy per key block
over the query blocks, key-major, every key r of the block in one program (dV from one product with sum_r a_ijr); dQ
and dx per query block over the key blocks in a second pass, or (the hard E-step, is_one_pass) added by the dK / dV
programs.
Dropout (on a_ij, as F.dropout on the weights): a counter-based draw per (batch x head, query, key),
attention_triton.keep (one Philox word a pair), one seed from torch's generator per call: forward and backward
regenerate the same mask with nothing stored, and a seeded run repeats.
Torch, and Triton where it is installed (this file travels next to remote-code model files: the import is guarded);
on CPU tensors the kernels run in Triton's interpreter when TRITON_INTERPRET=1 was set before triton's import.
"""

import math

import torch

from .attention_triton import (LOG2E, MAX_HEAD_SIZE, available, draw_seed, precision, refusal, shape_class, tl,
                               triton, tuned_blocks)

if triton is not None:
    from .attention_triton import dot as _dot
    from .attention_triton import free_keys_end as _free_keys_end
    from .attention_triton import keep as _keep
    from .attention_triton import key_end as _key_end
    from .attention_triton import query_start as _query_start
    from .attention_triton import softmax_state as _softmax_state

__all__ = ["MAX_HEAD_SIZE", "available", "block_sizes", "dkv_rows", "is_one_pass", "launch_options", "mgk_triton",
           "refusal"]


def block_sizes(device_type, head_size, value_size, dtype=None, key_tiles=1):
    """(BLOCK_M query rows, BLOCK_N keys) of a program (the dK / dV kernel takes them the other way round): the
    interpreter's small tiles, a GPU's defaults, or the tuned ones (attention_triton.tuned_blocks). GPU defaults
    (sm_90 / 80 / 86): 128 x 64 in half precision, the cheapest on the static cost model (benchmark.static), within
    sm_86's 99 KB at 2 stages; float32 SMALL_FLOAT32. From 4 key tiles a block (key_tiles: MGK's M, sMGK's 1)
    64 x 32: 128 x 64 spilled inside the main loops (sm_90, bf16: 18-56 spill loads / stores an iteration, 339-421
    with dropout and causal; 64 x 32: 0, 110-115), for 0.53 -> 0.61 cycles a pair on the model (blind to spills)."""
    if device_type == "cpu":
        default = (32, 32)
    elif dtype == torch.float32:
        default = SMALL_FLOAT32
    elif max(head_size, value_size) > 64 or key_tiles >= 4:  # wider heads: not studied on the model
        default = (64, 32)
    else:
        default = (128, 64)
    return tuned_blocks("mgk", default, shape_class(max(head_size, value_size)))


SMALL_FLOAT32 = (32, 32)  # float32 at M = 4, 2 stages: 78.6 KB of shared memory on sm_86 at D = 64 (64 x 32: 140 KB)

def launch_options(block_m, block_n):
    """num_warps and num_stages of a launch over tiles of these blocks: 8 warps (two warpgroups) from 128 x 64, so a
    thread holds what it holds at 64 x 64 with 4. No register cap: at the flash baseline's + 32 (136 / 160 / 246)
    ptxas spilled inside the main loops (up to 700 spill loads / stores an iteration with dropout or M = 4)."""
    return dict(num_warps=8 if block_m * block_n >= 128 * 64 else 4, num_stages=2)


def dkv_rows(block_n, num_keys=2):
    """The query rows an iteration of the key-major dK / dV program takes: half the forward's, a quarter for M >= 3
    keys (16 at least). Its M dK accumulators, dV and a (keys, rows) iteration's tiles spilled at 128 x 64 on sm_90;
    at 128 keys x 32 rows M = 2 does not, at 128 x 16 M = 3 (kernel notes)."""
    return max(16, block_n // (2 if num_keys <= 2 else 4))


def is_one_pass(hard, shared, num_keys):
    """Whether the backward is one pass, dq and dx added by the dK / dV programs (float32 atomics), not a dQ pass
    before it: the hard E-step, sMGK at any M, MGK up to 3 keys. On sm_90's model (bf16, D = 64) hard MGK's backward
    fell 0.200 -> 0.157 cycles a pair at M = 2, 0.361 -> 0.291 at M = 3; at M = 4 its dK / dV program (four dK
    accumulators and dq's products) spilled inside its loop (768 spill loads / stores: 1.12 against 0.48)."""
    return hard and (shared or num_keys <= 3)


if triton is not None:

    @triton.jit
    def _tile(base, offs_a, offs_b, stride, A, B, EVEN_A: tl.constexpr, EVEN_B: tl.constexpr):
        """The (offs_a, offs_b) tile of a row-major matrix, 0 past A rows or B columns: a bounds mask only on a
        side whose length is not a multiple of its block (EVEN_*), so even lengths load without predicates."""
        ptrs = base + offs_a[:, None] * stride + offs_b[None, :]
        if EVEN_A and EVEN_B:
            t = tl.load(ptrs)
        elif EVEN_A:
            t = tl.load(ptrs, mask=(offs_b < B)[None, :], other=0.0)
        elif EVEN_B:
            t = tl.load(ptrs, mask=(offs_a < A)[:, None], other=0.0)
        else:
            t = tl.load(ptrs, mask=(offs_a < A)[:, None] & (offs_b < B)[None, :], other=0.0)
        return t

    @triton.jit
    def _put(base, offs_a, offs_b, stride, A, B, value, EVEN_A: tl.constexpr, EVEN_B: tl.constexpr,
             ADD: tl.constexpr = False):
        """Store a tile as `_tile` loads one (masks only on uneven sides), or ADD it (float32 atomics)."""
        ptrs = base + offs_a[:, None] * stride + offs_b[None, :]
        mask = None if EVEN_A and EVEN_B else (offs_a < A)[:, None] & (offs_b < B)[None, :]
        if ADD:
            tl.atomic_add(ptrs, value, mask=mask, sem="relaxed")
        else:
            tl.store(ptrs, value, mask=mask)

    @triton.jit
    def _put_row(base, offs, L, value, EVEN: tl.constexpr):
        """Store a vector, masked only where L is not a multiple of its block."""
        tl.store(base + offs, value, mask=None if EVEN else offs < L)

    @triton.jit
    def _rows(base, offs, L, other, M: tl.constexpr, EVEN: tl.constexpr):
        """The M per-key vectors (x_r of the rows offs, or y_r of the keys offs) of a (M, L) matrix, as a tuple."""
        out = ()
        for r in tl.static_range(M):
            out = out + (tl.load(base + r * L + offs, mask=None if EVEN else offs < L, other=None if EVEN else other),)
        return out

    @triton.jit
    def _keys(K, stride_kr, offs_n, offs_d, S, D, M: tl.constexpr, SHARED: tl.constexpr, EVEN_S: tl.constexpr,
              EVEN_D: tl.constexpr):
        """The key tiles of a block: M (MGK) or the one key (sMGK), as a tuple."""
        out = ()
        for r in tl.static_range(1 if SHARED else M):
            out = out + (_tile(K + r * stride_kr, offs_n, offs_d, D, S, D, EVEN_S, EVEN_D),)
        return out

    @triton.jit
    def _head(Q, K, V, X, Y, N, S, D, DV, M: tl.constexpr, SHARED: tl.constexpr):
        """The program's head: bh (32-bit, the dropout draws' key), bh64, and its q, keys, v, x, y (64-bit bases)."""
        bh = tl.program_id(0)
        bh64 = bh.to(tl.int64)  # bases' products from bh64 on in 64 bits (B H N D passes 2^31), the tiles' in 32
        return (bh, bh64, Q + bh64 * N * D, K + (bh64 * S * D if SHARED else bh64 * M * S * D), V + bh64 * S * DV,
                X + bh64 * M * N, Y + bh64 * M * S)

    @triton.jit
    def _query_rows(Q, DO, LSE, DELTA, X, offs_m, offs_d, offs_dv, N, D, DV, M: tl.constexpr, EVEN_N: tl.constexpr,
                    EVEN_D: tl.constexpr):
        """What the backward reads of a block of query rows: q, dO, lse (+inf past N), delta, the M x_r."""
        q = _tile(Q, offs_m, offs_d, D, N, D, EVEN_N, EVEN_D)
        do = _tile(DO, offs_m, offs_dv, DV, N, DV, EVEN_N, EVEN_D)
        lse = tl.load(LSE + offs_m) if EVEN_N else tl.load(LSE + offs_m, mask=offs_m < N, other=float("inf"))
        delta = tl.load(DELTA + offs_m) if EVEN_N else tl.load(DELTA + offs_m, mask=offs_m < N, other=0.0)
        return q, do, lse, delta, _rows(X, offs_m, N, 0.0, M, EVEN_N)

    @triton.jit
    def _terms(q, ks, ys, s2s, offs_m, offs_n, N, S, M: tl.constexpr, SHARED: tl.constexpr,
               CAUSAL_MASK: tl.constexpr, KEY_MAJOR: tl.constexpr, PREC: tl.constexpr):
        """The M tiles t_r = s_r q.k_r + y_r of a block (log2 units; x_r is added per row by the caller), -inf
        where causal hides the pair (bottom-right aligned: query i sees key j <= i + S - N; padding and keys past
        S have y = -inf). Query-major (i, j), or KEY_MAJOR (j, i) for the dK / dV kernel. sMGK: one product."""
        ts = ()
        qk = ks[0]  # placeholder, assigned before use
        for r in tl.static_range(M):
            if r == 0 or not SHARED:
                qk = _dot(ks[r], tl.trans(q), PREC) if KEY_MAJOR else _dot(q, tl.trans(ks[r]), PREC)
            t = qk * s2s[r] + (ys[r][:, None] if KEY_MAJOR else ys[r][None, :])
            if CAUSAL_MASK:  # only the blocks the diagonal crosses
                seen = (offs_n[:, None] <= offs_m[None, :] + (S - N) if KEY_MAJOR
                        else offs_n[None, :] <= offs_m[:, None] + (S - N))
                t = tl.where(seen, t, float("-inf"))
            ts = ts + (t,)
        return ts

    @triton.jit
    def _weights(ts, xls, ds, M: tl.constexpr, HARD: tl.constexpr):
        """(A, dls): A_ij = sum_r a_ijr (what dV needs) and dL_ijr = a_ijr ds_ij from the tiles t_r and
        xl_r = x_r - lse (broadcast to the tile: a_ijr = exp2(t_r + xl_r)). Hard: a_ij = exp2(max_r (t_r + xl_r))
        split equally between the keys tied for the maximum, as torch.amax's backward (hidden pairs: all -inf,
        weight 0)."""
        dls = ()
        if HARD:
            ls = ()
            for r in tl.static_range(M):
                ls = ls + (ts[r] + xls[r],)
            lmax = ls[0]
            for r in tl.static_range(1, M):
                lmax = tl.maximum(lmax, ls[r])
            A = tl.exp2(lmax)
            w = A * ds
            if M == 1:
                dls = (w,)
            elif M == 2:  # key 0's share f = 1, 1/2 or 0 as l_0 >, = or < l_1, in two instructions (FADD, FFMA.SAT):
                # any nonzero difference |d| >= 2^-126 saturates; a hidden pair (both -inf, d NaN) clamps to 0
                f = tl.clamp((ls[0] - ls[1]) * 8.507059173023462e37 + 0.5, 0.0, 1.0)
                d0 = w * f
                dls = (d0, w - d0)
            else:  # e_r = 1 where key r ties for the maximum: counts them and picks them (no select, no division)
                es = ((ls[0] == lmax).to(tl.float32),)
                cnt = es[0]
                for r in tl.static_range(1, M):
                    es = es + ((ls[r] == lmax).to(tl.float32),)
                    cnt += es[r]
                inv = 1.5 - 0.5 * cnt  # 1 / cnt for 1 and 2 ties, more are rarer still
                for c in tl.static_range(3, M + 1):
                    inv = tl.where(cnt == c, 1.0 / c, inv)
                w = w * inv
                for r in tl.static_range(M):
                    dls = dls + (es[r] * w,)
        else:
            A = tl.exp2(ts[0] + xls[0])
            dls = (A * ds,)
            for r in tl.static_range(1, M):
                a = tl.exp2(ts[r] + xls[r])
                A += a
                dls = dls + (a * ds,)
        return A, dls

    @triton.jit
    def _fwd_step(q, xs, s2s, K, stride_kr, V, Y, start_n, offs_m, offs_d, offs_dv, m_i, l_i, acc, N, S, D, DV,
                  P_DROP, SEED, bh, DROPOUT: tl.constexpr, M: tl.constexpr, HARD: tl.constexpr,
                  SHARED: tl.constexpr, CAUSAL_MASK: tl.constexpr, EVEN_S: tl.constexpr, EVEN_D: tl.constexpr,
                  PREC: tl.constexpr, BLOCK_N: tl.constexpr):
        """One key block of the online softmax: the M tiles first, their maximum, then one rescale."""
        offs_n = start_n + tl.arange(0, BLOCK_N)
        ks = _keys(K, stride_kr, offs_n, offs_d, S, D, M, SHARED, EVEN_S, EVEN_D)
        ys = _rows(Y, offs_n, S, float("-inf"), M, EVEN_S)
        ts = _terms(q, ks, ys, s2s, offs_m, offs_n, N, S, M, SHARED, CAUSAL_MASK, False, PREC)
        lmax = ts[0]
        if HARD:  # L - x_0 = max_r (t_r + x_r - x_0) per pair: x_0 joins the row's term, - m (one FADD saved)
            for r in tl.static_range(1, M):
                lmax = tl.maximum(lmax, ts[r] + (xs[r] - xs[0])[:, None])
            m_new = tl.maximum(m_i, tl.max(lmax, 1) + xs[0])
        else:  # the row maximum of every L_r = t_r + x_r: x_r is one number per row
            m_new = m_i
            for r in tl.static_range(M):
                m_new = tl.maximum(m_new, tl.max(ts[r], 1) + xs[r])
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing seen yet: P stays 0
        p = tl.exp2((lmax if HARD else ts[0]) + (xs[0] - m_use)[:, None])
        for r in tl.static_range(1, 1 if HARD else M):
            p += tl.exp2(ts[r] + (xs[r] - m_use)[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _tile(V, offs_n, offs_dv, DV, S, DV, EVEN_S, EVEN_D)
        if DROPOUT:  # a_ij dropped after the normalisation (Z sums the undropped P); 1 / (1 - p) at the end
            p = tl.where(_keep(SEED, bh, offs_m, start_n, S, P_DROP, BLOCK_N), p, 0.0)
        hi = p.to(v.dtype)
        acc = acc * alpha[:, None] + _dot(hi, v, PREC)
        if PREC != "ieee" and not HARD:  # soft, half precision: P = hi + lo to ~16 bits (see backward's delta)
            acc += _dot((p - hi.to(tl.float32)).to(v.dtype), v, PREC)
        return m_new, l_i, acc

    @triton.jit
    def _fwd_kernel(Q, K, V, X, Y, S2, O, LSE, N, S, D, DV, P_DROP, SEED,
                    DROPOUT: tl.constexpr, M: tl.constexpr, HARD: tl.constexpr, CAUSAL: tl.constexpr,
                    SHARED: tl.constexpr, EVEN_N: tl.constexpr, EVEN_S: tl.constexpr, EVEN_D: tl.constexpr,
                    PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_DV: tl.constexpr):
        if EVEN_D:  # the row strides as constants: addresses with immediate offsets
            D, DV = BLOCK_D, BLOCK_DV
        stride_kr = tl.cast(S, tl.int64) * D  # key r starts at r S D: 64-bit, as S D may pass 2^31 / 3
        bh, bh64, Q, K, V, X, Y = _head(Q, K, V, X, Y, N, S, D, DV, M, SHARED)
        O, LSE = O + bh64 * N * DV, LSE + bh64 * N
        start_m = tl.program_id(1) * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        q = _tile(Q, offs_m, offs_d, D, N, D, EVEN_N, EVEN_D)
        xs = _rows(X, offs_m, N, 0.0, M, EVEN_N)  # once per program
        s2s = ()
        for r in tl.static_range(M):
            s2s = s2s + (tl.load(S2 + r),)
        m_i, l_i, acc = _softmax_state(BLOCK_M, BLOCK_DV)
        # key blocks before `full` need no mask (all inside S, every row sees them), those up to `end` do
        full, end = _free_keys_end(start_m, BLOCK_N, N, S, CAUSAL), _key_end(start_m, BLOCK_M, N, S, CAUSAL)
        for start_n in range(0, full, BLOCK_N):  # no mask
            m_i, l_i, acc = _fwd_step(q, xs, s2s, K, stride_kr, V, Y, start_n, offs_m, offs_d, offs_dv, m_i, l_i,
                                      acc, N, S, D, DV, P_DROP, SEED, bh, DROPOUT, M, HARD, SHARED, False, True,
                                      EVEN_D, PREC, BLOCK_N)
        for start_n in range(full, end, BLOCK_N):  # the causal diagonal, the ragged end
            m_i, l_i, acc = _fwd_step(q, xs, s2s, K, stride_kr, V, Y, start_n, offs_m, offs_d, offs_dv, m_i, l_i,
                                      acc, N, S, D, DV, P_DROP, SEED, bh, DROPOUT, M, HARD, SHARED, CAUSAL, EVEN_S,
                                      EVEN_D, PREC, BLOCK_N)
        seen = l_i > 0  # a row that sees no key: output 0, lse +inf (backward's weights all 0)
        scale = tl.where(seen, 1.0 / tl.where(seen, l_i, 1.0), 0.0)
        if DROPOUT:
            scale = scale / (1.0 - P_DROP)
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("inf"))
        _put(O, offs_m, offs_dv, DV, N, DV, acc * scale[:, None], EVEN_N, EVEN_D)
        _put_row(LSE, offs_m, N, lse, EVEN_N)

    @triton.jit
    def _dq_step(q, do, xls, delta, s2s, K, stride_kr, V, Y, start_n, offs_m, offs_d, offs_dv, dq, dxs, N, S, D,
                 DV, P_DROP, SEED, bh, DROPOUT: tl.constexpr, M: tl.constexpr, HARD: tl.constexpr,
                 SHARED: tl.constexpr, CAUSAL_MASK: tl.constexpr, EVEN_S: tl.constexpr, EVEN_D: tl.constexpr,
                 PREC: tl.constexpr, BLOCK_N: tl.constexpr):
        """One key block of dq_i = sum_jr s_r dL_ijr k_jr and dx_ir = sum_j dL_ijr."""
        offs_n = start_n + tl.arange(0, BLOCK_N)
        ks = _keys(K, stride_kr, offs_n, offs_d, S, D, M, SHARED, EVEN_S, EVEN_D)
        ys = _rows(Y, offs_n, S, float("-inf"), M, EVEN_S)
        ts = _terms(q, ks, ys, s2s, offs_m, offs_n, N, S, M, SHARED, CAUSAL_MASK, False, PREC)
        dp = _dot(do, tl.trans(_tile(V, offs_n, offs_dv, DV, S, DV, EVEN_S, EVEN_D)), PREC)
        if DROPOUT:  # d a_ij = mask_ij dO_i . v_j / (1 - p)
            dp = tl.where(_keep(SEED, bh, offs_m, start_n, S, P_DROP, BLOCK_N), dp * (1.0 / (1.0 - P_DROP)), 0.0)
        c = s2s[0] if HARD else 1.0  # hard: dls come out as s2_0 dL_r (in ds's FFMA); dx divided by s2_0 after
        _, dls = _weights(ts, xls, dp * c - (delta * c)[:, None], M, HARD)
        g = dls[0] if HARD else dls[0] * s2s[0]  # sMGK: sum_r s_r dL_r against the one key (s2 = s log2 e)
        sums = ()
        for r in tl.static_range(M):
            if not HARD or r < M - 1:  # hard: sum_r dx_ir = sum_j a_ij (dp_ij - delta_i) = 0, the last one from it
                sums = sums + (dxs[r] + tl.sum(dls[r], 1),)
            if SHARED:
                if r > 0:
                    g += dls[r] * (s2s[r] / s2s[0] if HARD else s2s[r])
            elif HARD:
                dq += _dot((dls[r] if r == 0 else dls[r] * (s2s[r] / s2s[0])).to(ks[r].dtype), ks[r], PREC)
            else:  # soft MGK: dls already s2_r dL_r (log2 s2_r in xl_r); dx divided by s2_r at the end
                dq += _dot(dls[r].to(ks[r].dtype), ks[r], PREC)
        if SHARED:
            dq += _dot(g.to(ks[0].dtype), ks[0], PREC)
        if HARD:
            sums = sums + (dxs[M - 1],)
        return dq, sums

    @triton.jit
    def _bwd_dq_kernel(Q, K, V, X, Y, S2, DO, LSE, DELTA, DQ, DX, N, S, D, DV, P_DROP, SEED,
                       DROPOUT: tl.constexpr, M: tl.constexpr, HARD: tl.constexpr, CAUSAL: tl.constexpr,
                       SHARED: tl.constexpr, EVEN_N: tl.constexpr, EVEN_S: tl.constexpr, EVEN_D: tl.constexpr,
                       PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                       BLOCK_DV: tl.constexpr):
        """dq (the product term's) and dx (DX: (M, N) a head) for one block of query rows, over the key blocks."""
        if EVEN_D:  # the row strides as constants: addresses with immediate offsets
            D, DV = BLOCK_D, BLOCK_DV
        stride_kr = tl.cast(S, tl.int64) * D  # key r starts at r S D: 64-bit, as S D may pass 2^31 / 3
        bh, bh64, Q, K, V, X, Y = _head(Q, K, V, X, Y, N, S, D, DV, M, SHARED)
        DO, DQ, DX = DO + bh64 * N * DV, DQ + bh64 * N * D, DX + bh64 * M * N
        LSE, DELTA = LSE + bh64 * N, DELTA + bh64 * N
        start_m = tl.program_id(1) * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        q, do, lse, delta, xs = _query_rows(Q, DO, LSE, DELTA, X, offs_m, offs_d, offs_dv, N, D, DV, M, EVEN_N, EVEN_D)
        xls = ()
        s2s = ()
        dxs = ()
        for r in tl.static_range(M):
            s2s = s2s + (tl.load(S2 + r),)
            if SHARED or HARD:
                xls = xls + ((xs[r] - lse)[:, None],)
            else:  # soft MGK: the weights come out as s2_r a_r, the operand of key r's product
                xls = xls + ((xs[r] - lse + tl.log2(s2s[r]))[:, None],)
            dxs = dxs + (tl.zeros([BLOCK_M], tl.float32),)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        # key blocks before `full` need no mask (all inside S, every row sees them), those up to `end` do
        full, end = _free_keys_end(start_m, BLOCK_N, N, S, CAUSAL), _key_end(start_m, BLOCK_M, N, S, CAUSAL)
        for start_n in range(0, full, BLOCK_N):  # no mask
            dq, dxs = _dq_step(q, do, xls, delta, s2s, K, stride_kr, V, Y, start_n, offs_m, offs_d, offs_dv, dq, dxs,
                               N, S, D, DV, P_DROP, SEED, bh, DROPOUT, M, HARD, SHARED, False, True, EVEN_D, PREC,
                               BLOCK_N)
        for start_n in range(full, end, BLOCK_N):  # the causal diagonal, the ragged end
            dq, dxs = _dq_step(q, do, xls, delta, s2s, K, stride_kr, V, Y, start_n, offs_m, offs_d, offs_dv, dq, dxs,
                               N, S, D, DV, P_DROP, SEED, bh, DROPOUT, M, HARD, SHARED, CAUSAL, EVEN_S, EVEN_D,
                               PREC, BLOCK_N)
        _put(DQ, offs_m, offs_d, D, N, D, dq / 1.4426950408889634, EVEN_N, EVEN_D)
        last = tl.zeros([BLOCK_M], tl.float32)  # hard: sum_r dx_ir = 0, the last key's from the others'
        for r in tl.static_range(M):
            if not HARD:
                dx = dxs[r] if SHARED else dxs[r] / s2s[r]
            elif r < M - 1:
                dx = dxs[r] / s2s[0]
                last -= dx
            else:
                dx = last
            _put_row(DX + r * N, offs_m, N, dx, EVEN_N)

    @triton.jit
    def _dkv_step(ks, v, ys, s2s, Q, DO, X, LSE, DELTA, DQ, DX, start_m, offs_n, offs_d, offs_dv, dks, dv, dys, N, S,
                  D, DV, P_DROP, SEED, bh, DROPOUT: tl.constexpr, M: tl.constexpr, HARD: tl.constexpr,
                  SHARED: tl.constexpr, CAUSAL_MASK: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
                  PREC: tl.constexpr, BLOCK_M: tl.constexpr, DQ_ATOMIC: tl.constexpr, start_n,
                  BLOCK_N: tl.constexpr):
        """One block of query rows of dk_jr = s_r sum_i dL_ijr q_i, dy_jr = sum_i dL_ijr and dv_j = sum_i A_ij dO_i,
        key-major (the tiles are (keys, rows)): every key r of the block in one program."""
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q, do, lse, delta, xs = _query_rows(Q, DO, LSE, DELTA, X, offs_m, offs_d, offs_dv, N, D, DV, M, EVEN_N, EVEN_D)
        xls = ()
        for r in tl.static_range(M):
            xls = xls + ((xs[r] - lse)[None, :],)
        ts = _terms(q, ks, ys, s2s, offs_m, offs_n, N, S, M, SHARED, CAUSAL_MASK, True, PREC)
        dp = _dot(v, tl.trans(do), PREC)
        if DROPOUT:  # the forward's draw of (i, j), transposed
            keep = tl.trans(_keep(SEED, bh, offs_m, start_n, S, P_DROP, BLOCK_N))
            dp = tl.where(keep, dp * (1.0 / (1.0 - P_DROP)), 0.0)
        A, dls = _weights(ts, xls, dp - delta[None, :], M, HARD)
        if DROPOUT:  # 1 / (1 - p) at the end
            A = tl.where(keep, A, 0.0)
        dv += _dot(A.to(do.dtype), do, PREC)
        g = dls[0] * s2s[0]  # sMGK: sum_r s_r dL_r against q
        sums = ()
        grads = ()
        dq = tl.zeros([q.shape[0], q.shape[1]], tl.float32)
        for r in tl.static_range(M):
            sums = sums + (dys[r] + tl.sum(dls[r], 1),)
            if SHARED:
                if r > 0:
                    g += dls[r] * s2s[r]
            else:  # s_r applied at the end
                dlh = dls[r].to(q.dtype)
                grads = grads + (dks[r] + _dot(dlh, q, PREC),)
                if DQ_ATOMIC:  # hard MGK: dq_i += s_r sum_j dL_ijr k_jr, dK's operand transposed
                    dq += _dot(tl.trans(dlh), ks[r], PREC) * s2s[r]
        if SHARED:
            gh = g.to(q.dtype)
            grads = (dks[0] + _dot(gh, q, PREC),)
            if DQ_ATOMIC:
                dq = _dot(tl.trans(gh), ks[0], PREC)
        if DQ_ATOMIC:  # hard's one pass: this block's dq_i = sum_j g_ij k_j (dK's operand) and dx_ir, added
            _put(DQ, offs_m, offs_d, D, N, D, dq * (1.0 / 1.4426950408889634), EVEN_N, EVEN_D, True)
            # dx_ir = sum_j dL_ijr, a sum across the warps of the key-major tile: as a product with a tile of ones
            # (~30 instructions a thread, where tl.sum's shuffles took ~200; the last key's from sum_r dx_ir = 0)
            col = tl.arange(0, 16)[None, :]
            for r in tl.static_range(M - 1):  # every column of the product is dx: column 0 is added
                dx = _dot(tl.trans(dls[r].to(q.dtype)), tl.full([ks[0].shape[0], 16], 1.0, q.dtype), PREC)
                tl.atomic_add(DX + r * N + offs_m[:, None] + col * 0, dx, mask=(offs_m < N)[:, None] & (col == 0),
                              sem="relaxed")
        return grads, dv, sums

    @triton.jit
    def _bwd_dkv_kernel(Q, K, V, X, Y, S2, DO, LSE, DELTA, DK, DV_OUT, DY, DQ, DX, N, S, D, DV, P_DROP, SEED,
                        DROPOUT: tl.constexpr, M: tl.constexpr, HARD: tl.constexpr, CAUSAL: tl.constexpr,
                        SHARED: tl.constexpr, EVEN_N: tl.constexpr, EVEN_S: tl.constexpr, EVEN_D: tl.constexpr,
                        PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_DV: tl.constexpr, DQ_ATOMIC: tl.constexpr = False):
        """dk (DK: the M keys', or sMGK the one key's), dv and dy (DY: (M, S) a head) for one block of keys, over
        the blocks of query rows: the causal diagonal's first (masked), then the rest. DQ_ATOMIC (is_one_pass): dq
        and dx too, added to DQ and DX (zeroed) in float32 atomics."""
        if EVEN_D:  # the row strides as constants: addresses with immediate offsets
            D, DV = BLOCK_D, BLOCK_DV
        stride_kr = tl.cast(S, tl.int64) * D  # key r starts at r S D: 64-bit, as S D may pass 2^31 / 3
        bh, bh64, Q, K, V, X, Y = _head(Q, K, V, X, Y, N, S, D, DV, M, SHARED)
        DO, LSE, DELTA, DY = DO + bh64 * N * DV, LSE + bh64 * N, DELTA + bh64 * N, DY + bh64 * M * S
        DQ, DX = DQ + bh64 * N * D, DX + bh64 * M * N
        DK, DV_OUT = DK + (bh64 * S * D if SHARED else bh64 * M * S * D), DV_OUT + bh64 * S * DV
        start_n = tl.program_id(1) * BLOCK_N
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        ks = _keys(K, stride_kr, offs_n, offs_d, S, D, M, SHARED, EVEN_S, EVEN_D)  # once per program
        v = _tile(V, offs_n, offs_dv, DV, S, DV, EVEN_S, EVEN_D)
        ys = _rows(Y, offs_n, S, float("-inf"), M, EVEN_S)
        s2s = ()
        dys = ()
        dks = ()
        for r in tl.static_range(M):
            s2s = s2s + (tl.load(S2 + r),)
            dys = dys + (tl.zeros([BLOCK_N], tl.float32),)
            if r == 0 or not SHARED:
                dks = dks + (tl.zeros([BLOCK_N, BLOCK_D], tl.float32),)
        dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
        start, full = 0, 0
        if CAUSAL:  # query i sees key j from i = j - (S - N) on: every row of a block from `full` on sees them all
            start = _query_start(start_n, BLOCK_M, N, S, CAUSAL)
            full = (tl.maximum(start_n + BLOCK_N - 1 - (S - N), 0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        for start_m in range(start, tl.minimum(full, N), BLOCK_M):  # the causal diagonal, masked
            dks, dv, dys = _dkv_step(ks, v, ys, s2s, Q, DO, X, LSE, DELTA, DQ, DX, start_m, offs_n, offs_d, offs_dv,
                                     dks, dv, dys, N, S, D, DV, P_DROP, SEED, bh, DROPOUT, M, HARD, SHARED, CAUSAL,
                                     EVEN_N, EVEN_D, PREC, BLOCK_M, DQ_ATOMIC, start_n,
                                     BLOCK_N)
        for start_m in range(full, N, BLOCK_M):  # no causal mask
            dks, dv, dys = _dkv_step(ks, v, ys, s2s, Q, DO, X, LSE, DELTA, DQ, DX, start_m, offs_n, offs_d, offs_dv,
                                     dks, dv, dys, N, S, D, DV, P_DROP, SEED, bh, DROPOUT, M, HARD, SHARED, False,
                                     EVEN_N, EVEN_D, PREC, BLOCK_M, DQ_ATOMIC, start_n,
                                     BLOCK_N)
        if DROPOUT:
            dv = dv * (1.0 / (1.0 - P_DROP))
        _put(DV_OUT, offs_n, offs_dv, DV, S, DV, dv, EVEN_S, EVEN_D)
        for r in tl.static_range(M):
            if r == 0 or not SHARED:  # s_r (s2 = s log2 e: log2 e divided out), sMGK's already in
                scale = 1.0 / 1.4426950408889634 if SHARED else s2s[r] / 1.4426950408889634
                _put(DK + r * stride_kr, offs_n, offs_d, D, S, D, dks[r] * scale, EVEN_S, EVEN_D)
            _put_row(DY + r * S, offs_n, S, dys[r], EVEN_S)


class _TritonMGK(torch.autograd.Function):
    """L = s_r q.k_r + x_r + y_r attention; inputs q (BH, N, D), k (BH, M, S, D) or shared (BH, S, D), v (BH, S, Dv),
    x (BH, M, N), y (BH, M, S) float32; gradients of q and k through the product term only, of x and y whole."""

    @staticmethod
    def forward(ctx, q, k, v, x, y, inv_var, hard, causal, shared, dropout_p, seed):
        bh, n, d = q.shape
        s, dv, m = v.shape[1], v.shape[2], x.shape[1]
        block_m, block_n = block_sizes(q.device.type, d, dv, q.dtype, 1 if shared else m)
        s2 = torch.tensor(inv_var, dtype=torch.float32, device=q.device) * LOG2E
        x2, y2 = (x * LOG2E).contiguous(), (y * LOG2E).contiguous()
        out = torch.empty(bh, n, dv, dtype=torch.float32, device=q.device)  # float32: backward's delta = dO . out
        lse = torch.empty(bh, n, dtype=torch.float32, device=q.device)
        consts = _constants(q, n, s, d, dv, m, hard, causal, shared, block_m, block_n, dropout_p)
        _fwd_kernel[(bh, triton.cdiv(n, block_m))](q, k, v, x2, y2, s2, out, lse, n, s, d, dv, dropout_p, seed,
                                                   **consts, **launch_options(block_m, block_n))
        ctx.save_for_backward(q, k, v, x2, y2, s2, out, lse)
        ctx.shape = (bh, n, s, d, dv, m, block_m, block_n, dropout_p, seed)
        ctx.consts = consts
        return out.to(q.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, x2, y2, s2, out, lse = ctx.saved_tensors
        bh, n, s, d, dv, m, block_m, block_n, dropout_p, seed = ctx.shape
        dout = dout.contiguous()
        one_pass = is_one_pass(ctx.consts["HARD"], ctx.consts["SHARED"], m)
        f32, first = dict(dtype=torch.float32, device=q.device), torch.zeros if one_pass else torch.empty
        dq, dx, dk = first(bh, n, d, **f32), first(bh, m, n, **f32), torch.empty(k.shape, **f32)
        dvv, dy = torch.empty(bh, s, dv, **f32), torch.empty(bh, m, s, **f32)
        # delta_i = dO_i . h_i = sum_jr a_ijr dO_i . v_j from the float32 output. The row sums sum_jr dL_ijr must
        # vanish as they do exactly: the |q|^2 / 2 terms of x make dq = s (sum_j dL k - q sum_j dL) a difference,
        # and the prior's gradient cancels, both amplifying a rounded delta (a bfloat16 output: 3x the dense path's
        # error in dq, 10x in the prior's gradient; P in one bfloat16 part for its product with V failed the
        # prior's gradient by 4x, P = hi + lo, the forward's two products, passes with the old margins).
        delta = (dout.float() * out).sum(-1)
        args = (n, s, d, dv, dropout_p, seed)
        if not one_pass:
            _bwd_dq_kernel[(bh, triton.cdiv(n, block_m))](q, k, v, x2, y2, s2, dout, lse, delta, dq, dx, *args,
                                                          **ctx.consts, **launch_options(block_m, block_n))
        # dK / dV key-major: block_m keys a program, dkv_rows query rows an iteration, the forward's tile's warps
        consts = _constants(q, n, s, d, dv, m, ctx.consts["HARD"], ctx.consts["CAUSAL"], ctx.consts["SHARED"],
                            dkv_rows(block_n, m), block_m, dropout_p)
        _bwd_dkv_kernel[(bh, triton.cdiv(s, block_m))](q, k, v, x2, y2, s2, dout, lse, delta, dk, dvv, dy, dq, dx,
                                                       *args, **consts, **launch_options(block_m, block_n),
                                                       DQ_ATOMIC=one_pass)
        if one_pass:  # sum_r dx_ir = sum_j a_ij (dp_ij - delta_i) = 0
            dx[:, m - 1] = -dx[:, :m - 1].sum(1)
        return (dq.to(q.dtype), dk.to(k.dtype), dvv.to(v.dtype), dx, dy, None, None, None, None, None, None)


def _constants(q, n, s, d, dv, m, hard, causal, shared, block_m, block_n, dropout_p):
    block_d, block_dv = max(16, triton.next_power_of_2(d)), max(16, triton.next_power_of_2(dv))
    return dict(DROPOUT=dropout_p > 0, M=m, HARD=hard, CAUSAL=causal, SHARED=shared, EVEN_N=n % block_m == 0,
                EVEN_S=s % block_n == 0, EVEN_D=d == block_d and dv == block_dv,
                PREC=precision(q.dtype, q.device.type), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
                BLOCK_DV=block_dv)


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
    # dropout on a_ij, drawn in the kernels from one seed of the device's generator (a seeded run repeats)
    seed = draw_seed(query.device) if dropout_p > 0 else 0
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
