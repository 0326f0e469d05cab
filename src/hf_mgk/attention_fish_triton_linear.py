"""The Triton kernels' bodies for linear mixing (FiSH, hard FiSH, MiSH): flash attention over a folded query.

A_j = scale sum_k w_kj q_k . k_k = q'_j . k' with q'_j = concat_k(scale w_kj q_k) and k' = concat_k(k_k), each
global head's D columns padded to BLOCK_D (zeros: no product changes), W = MP BLOCK_D columns in all. So local head
j is flash attention of depth W with its own V, one 2-D product per tile (wgmma on sm_90), the M global products
summed inside it at no cost beyond depth, and nothing per pair for the mixing; its noise std_j eps_j (one normal per
pair and local head) is added to A afterwards. attention_fish_triton builds q' and k' in torch (O(H N W) and
O(S W), not O(N S)), calls these from its kernels (which dispatch on NETWORK) and finishes the gradients:
* forward: one program per (batch x local head, block of query rows), one pass over the key blocks;
* backward, one pass: per (batch x local head j, block of keys), over the query blocks: j's share dA_j^T q'_j of dk'
  (q'_j already holds scale w_kj; summed over the heads in torch), its dV, and G_j = dA_j k' (= dL/dq'_j, dK's operand
  transposed) added to a float32 (B, H, N, W) by atomics, dstd_j = sum dA_j eps_j per program: the scores and the
  noise drawn once in the backward (a dQ pass before it drew and multiplied them again: on sm_90's model, bf16, D =
  64, M = 2, hard FiSH's backward 0.344 -> 0.250 cycles a pair and head, FiSH's 0.599 -> 0.442). torch forms dq_k =
  scale sum_j w_kj G_jk and dw_kj = scale sum q_k . G_jk (O(H N W): the mixing's gradient costs nothing per pair).
Masks only where a block needs them: each loop over blocks is split into whole blocks that every row sees (no
bounds or causal mask) and the edge ones (attention_triton.free_keys_end / free_queries_start); the padding bias
is data and added everywhere.

Torch-free Triton code (this file travels next to remote-code model files with attention_fish_triton).
"""

from .attention_triton import LOG2E, tl, triton

if triton is not None:
    from .attention_triton import dot as _dot
    from .attention_triton import free_keys_end as _free_keys_end
    from .attention_triton import free_queries_start as _free_queries_start
    from .attention_triton import keep as _keep
    from .attention_triton import key_end as _key_end
    from .attention_triton import normal_tile as _normal_tile
    from .attention_triton import online_softmax as _online_softmax
    from .attention_triton import query_start as _query_start
    from .attention_triton import softmax_state as _softmax_state

    _LOG2E = tl.constexpr(LOG2E)

    @triton.jit
    def noise(NSEED, b, j, H, offs_m, start_n, S, BLOCK_N: tl.constexpr):
        """eps of local head j in batch b, rows offs_m, keys start_n + [0, BN): attention_triton.normal_tile under the
        call's seed, stream b H + j, rows' counter bases m ceil(S / 4)."""
        return _normal_tile(NSEED, b * H + j, offs_m * ((S + 3) // 4), start_n, BLOCK_N)

    @triton.jit
    def _key_tile(K, KB, b, start_n, S, PADDED: tl.constexpr, EDGE: tl.constexpr, BLOCK_N: tl.constexpr,
                  W: tl.constexpr):
        """A block of keys' k' (BN, W) and padding bias (0 for a real key, -inf for padding or past S; 0 without
        padding); bounds only on an EDGE block."""
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kp = K + offs_n[:, None] * W + tl.arange(0, W)[None, :]
        kb = tl.zeros([BLOCK_N], tl.float32)
        if EDGE:
            k = tl.load(kp, mask=(offs_n < S)[:, None], other=0.0)
            if PADDED:
                kb = tl.load(KB + b * S + offs_n, mask=offs_n < S, other=float("-inf"))
        else:
            k = tl.load(kp)
            if PADDED:
                kb = tl.load(KB + b * S + offs_n)
        return k, kb

    @triton.jit
    def _per_row(x, T: tl.constexpr):
        """A per-query-row vector broadcast over a tile: (BM, 1), or (1, BM) for a transposed (keys x rows) tile."""
        if T:
            y = x[None, :]
        else:
            y = x[:, None]
        return y

    @triton.jit
    def _per_key(x, T: tl.constexpr):
        """A per-key vector broadcast over a tile: (1, BN), or (BN, 1) for a transposed tile."""
        if T:
            y = x[:, None]
        else:
            y = x[None, :]
        return y

    @triton.jit
    def _scores(q, k, kb, b, j, H, offs_m, start_n, N, S, std, NSEED, NOISE: tl.constexpr, PADDED: tl.constexpr,
                CAUSAL: tl.constexpr, EDGE: tl.constexpr, PREC: tl.constexpr, BLOCK_N: tl.constexpr,
                T: tl.constexpr):
        """A_j of a tile (BM, BN) from the folded query q (BM, W) and keys k (BN, W), or A_j^T (BN, BM) with T (the dK
        / dV kernel's: keys as the products' rows, the tutorial's layout, every product a wgmma with its operands as
        they come); -inf where hidden, and the tile's noise eps (A itself without noise). EDGE: the block may pass S
        or the causal diagonal (masked); else no mask at all."""
        if T:
            a = _dot(k, tl.trans(q), PREC)
        else:
            a = _dot(q, tl.trans(k), PREC)
        eps = a
        if NOISE:
            eps = noise(NSEED, b, j, H, offs_m, start_n, S, BLOCK_N)
            if T:
                eps = tl.trans(eps)
            a += std * eps
        if PADDED:
            a += _per_key(kb, T)
        if EDGE:
            offs_n = _per_key(start_n + tl.arange(0, BLOCK_N), T)
            seen = offs_n < S
            if CAUSAL:  # bottom-right aligned: query i sees key j <= i + S - N
                seen = seen & (offs_n <= _per_row(offs_m, T) + (S - N))
            a = tl.where(seen, a, float("-inf"))
        return a, eps

    @triton.jit
    def _fwd_step(q, K, V, STD, KB, b, j, bh, H, offs_m, start_n, N, S, std, m_i, l_i, acc, P_DROP, SEED, NSEED,
                  NOISE: tl.constexpr, PADDED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
                  EDGE: tl.constexpr, PREC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr,
                  W: tl.constexpr):
        """One key block of the online softmax (m_i, l_i, acc)."""
        k, kb = _key_tile(K, KB, b, start_n, S, PADDED, EDGE, BLOCK_N, W)
        a, _ = _scores(q, k, kb, b, j, H, offs_m, start_n, N, S, std, NSEED, NOISE, PADDED, CAUSAL, EDGE, PREC,
                       BLOCK_N, False)
        p, alpha, m_new, l_i = _online_softmax(a, m_i, l_i)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        v = _value_tile(V, offs_n, S, EDGE, BLOCK_DV)
        if DROPOUT:  # the weights dropped after the normalisation: l sums the undropped P
            p = tl.where(_keep(SEED, bh, offs_m, start_n, S, P_DROP, BLOCK_N), p, 0.0)  # 1 / (1 - p) at the end
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PREC)
        return m_new, l_i, acc

    @triton.jit
    def fwd(Q, K, V, STD, KB, O, LSE, N, S, H, P_DROP, SEED, NSEED, NOISE: tl.constexpr,
            PADDED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr, W: tl.constexpr):
        """Q: q' (B, H, N, W), K: k' (B, S, W); one program per (batch x local head, block of query rows)."""
        bh = tl.program_id(0)  # 32-bit: the draws' keys
        b, j = bh // H, bh % H
        bh64 = bh.to(tl.int64)  # the bases' offsets in 64 bits (B H N W passes 2^31), the tiles' in 32
        Q, K = Q + bh64 * N * W, K + b.to(tl.int64) * S * W
        V, O, LSE = V + bh64 * S * BLOCK_DV, O + bh64 * N * BLOCK_DV, LSE + bh64 * N * 2
        start_m = tl.program_id(1) * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_dv = tl.arange(0, BLOCK_DV)
        q = tl.load(Q + offs_m[:, None] * W + tl.arange(0, W)[None, :], mask=(offs_m < N)[:, None], other=0.0)
        std = tl.load(STD + j) if NOISE else 0.0
        m_i, l_i, acc = _softmax_state(BLOCK_M, BLOCK_DV)
        free = _free_keys_end(start_m, BLOCK_N, N, S, CAUSAL)
        for start_n in range(0, free, BLOCK_N):
            m_i, l_i, acc = _fwd_step(q, K, V, STD, KB, b, j, bh, H, offs_m, start_n, N, S, std, m_i, l_i, acc,
                                      P_DROP, SEED, NSEED, NOISE, PADDED, CAUSAL, DROPOUT, False, PREC, BLOCK_N,
                                      BLOCK_DV, W)
        for start_n in range(free, _key_end(start_m, BLOCK_M, N, S, CAUSAL), BLOCK_N):
            m_i, l_i, acc = _fwd_step(q, K, V, STD, KB, b, j, bh, H, offs_m, start_n, N, S, std, m_i, l_i, acc,
                                      P_DROP, SEED, NSEED, NOISE, PADDED, CAUSAL, DROPOUT, True, PREC, BLOCK_N,
                                      BLOCK_DV, W)
        seen = l_i > 0  # a row that sees no key: output 0, max +inf (backward's weights all 0)
        out = acc / tl.where(seen, l_i, 1.0)[:, None]
        if DROPOUT:
            out = out * (1.0 / (1.0 - P_DROP))
        tl.store(O + offs_m[:, None] * BLOCK_DV + offs_dv[None, :], out.to(O.dtype.element_ty),
                 mask=(offs_m < N)[:, None])
        tl.store(LSE + offs_m * 2, tl.where(seen, m_i, float("inf")), mask=offs_m < N)
        tl.store(LSE + offs_m * 2 + 1, tl.log2(tl.where(seen, l_i, 1.0)), mask=offs_m < N)

    @triton.jit
    def _grad_tile(q, k, kb, do, row_max, log2_l, delta, v, b, j, H, offs_m, start_n, N, S, std, P_DROP, SEED,
                   NSEED, NOISE: tl.constexpr, PADDED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
                   EDGE: tl.constexpr, PREC: tl.constexpr, BLOCK_N: tl.constexpr):
        """What the backward recomputes for a tile, transposed (keys x rows, as _scores with T): the weights P as
        the forward applied them to V (dropped), dA and the noise eps."""
        a, eps = _scores(q, k, kb, b, j, H, offs_m, start_n, N, S, std, NSEED, NOISE, PADDED, CAUSAL, EDGE, PREC,
                         BLOCK_N, True)
        p_used, da = weights_grad(a, do, v, row_max, log2_l, delta, b * H + j, offs_m, start_n, S, P_DROP, SEED,
                                  DROPOUT, PREC, BLOCK_N, True)
        return p_used, da, eps

    @triton.jit
    def weights_grad(a, do, v, row_max, log2_l, delta, bh, offs_m, start_n, S, P_DROP, SEED, DROPOUT: tl.constexpr,
                     PREC: tl.constexpr, BLOCK_N: tl.constexpr, T: tl.constexpr):
        """A head's weights P of a tile from its scores A and saved rows, as the forward applied them to V (dropped),
        and dA = P (dP - delta); query-major (rows x keys), or keys x rows with T (the linear dK / dV layout). Shared
        by both kinds of mixing."""
        p = tl.exp2((a - _per_row(row_max, T)) * _LOG2E - _per_row(log2_l, T))
        if T:
            dp = _dot(v, tl.trans(do), PREC)
        else:
            dp = _dot(do, tl.trans(v), PREC)
        p_used = p
        if DROPOUT:  # d P_ij = mask_ij dO_i . v_j / (1 - p)
            kept = _keep(SEED, bh, offs_m, start_n, S, P_DROP, BLOCK_N)
            if T:
                kept = tl.trans(kept)
            p_used = tl.where(kept, p, 0.0)  # dV's 1 / (1 - p) at the end
            dp = tl.where(kept, dp * (1.0 / (1.0 - P_DROP)), 0.0)
        return p_used, p * (dp - _per_row(delta, T))

    @triton.jit
    def _value_tile(V, offs_n, S, EDGE: tl.constexpr, BLOCK_DV: tl.constexpr):
        """Rows offs_n of V (rows of BLOCK_DV: torch pads Dv), bounds only on an EDGE block."""
        vp = V + offs_n[:, None] * BLOCK_DV + tl.arange(0, BLOCK_DV)[None, :]
        if EDGE:
            return tl.load(vp, mask=(offs_n < S)[:, None], other=0.0)
        return tl.load(vp)

    @triton.jit
    def _rows(DO, LSE, DELTA, offs_m, N, EDGE: tl.constexpr, BLOCK_DV: tl.constexpr):
        """A block of rows' dO, saved row maximum and log2 of the sum, and delta (rows past N, only in an EDGE block:
        dO 0, max +inf)."""
        if EDGE:
            rows = offs_m < N
            return (_value_tile(DO, offs_m, N, True, BLOCK_DV), tl.load(LSE + offs_m * 2, mask=rows, other=float("inf")),
                    tl.load(LSE + offs_m * 2 + 1, mask=rows, other=0.0), tl.load(DELTA + offs_m, mask=rows, other=0.0))
        return (_value_tile(DO, offs_m, N, False, BLOCK_DV), tl.load(LSE + offs_m * 2), tl.load(LSE + offs_m * 2 + 1),
                tl.load(DELTA + offs_m))

    @triton.jit
    def _dkv_step(k, kb, v, Q, DO, LSE, DELTA, DQ, b, j, H, start_m, start_n, N, S, std, dk, dv, dstd, P_DROP,
                  SEED, NSEED, NOISE: tl.constexpr, PADDED: tl.constexpr, CAUSAL: tl.constexpr,
                  DROPOUT: tl.constexpr, EDGE: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr, W: tl.constexpr):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_w = tl.arange(0, W)
        qp = Q + offs_m[:, None] * W + offs_w[None, :]
        if EDGE:
            q = tl.load(qp, mask=(offs_m < N)[:, None], other=0.0)
        else:
            q = tl.load(qp)
        do, row_max, log2_l, delta = _rows(DO, LSE, DELTA, offs_m, N, EDGE, BLOCK_DV)
        p_used, da, eps = _grad_tile(q, k, kb, do, row_max, log2_l, delta, v, b, j, H, offs_m, start_n, N, S, std,
                                     P_DROP, SEED, NSEED, NOISE, PADDED, CAUSAL, DROPOUT, EDGE, PREC, BLOCK_N)
        dv += _dot(p_used.to(do.dtype), do, PREC)  # (BN, BM): P^T, dA^T as they come
        dah = da.to(q.dtype)
        dk += _dot(dah, q, PREC)
        # G_j = dA_j k' for these rows, added (float32 atomics): dK's operand transposed
        tl.atomic_add(DQ + offs_m[:, None] * W + offs_w[None, :], _dot(tl.trans(dah), k, PREC),
                      mask=(offs_m < N)[:, None] if EDGE else None, sem="relaxed")
        if NOISE:
            dstd += tl.sum(da * eps, 1)
        return dk, dv, dstd

    @triton.jit
    def bwd_kv(Q, K, V, DO, LSE, DELTA, STD, KB, DK, DVO, DQ, DSP, N, S, H, P_DROP, SEED, NSEED,
               NOISE: tl.constexpr, PADDED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
               PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr,
               W: tl.constexpr):
        """For one (batch x local head j, block of keys): head j's share dA_j^T q'_j of dk' (into DK, (B, H, S, W)
        float32, summed over the heads in torch: a program per head, not one looping over them, so that B H S /
        BLOCK_N programs fill the GPU), its dv_j = P_j^T dO_j, G_j added to DQ and its share of dstd_j."""
        bh = tl.program_id(0)
        b, j = bh // H, bh % H
        bh64 = bh.to(tl.int64)  # the bases' offsets in 64 bits, the tiles' in 32
        K, DK = K + b.to(tl.int64) * S * W, DK + bh64 * S * W
        Q, DO, DQ = Q + bh64 * N * W, DO + bh64 * N * BLOCK_DV, DQ + bh64 * N * W
        LSE, DELTA = LSE + bh64 * N * 2, DELTA + bh64 * N
        start_n = tl.program_id(1) * BLOCK_N
        offs_n = start_n + tl.arange(0, BLOCK_N)
        cols = offs_n < S
        k, kb = _key_tile(K, KB, b, start_n, S, PADDED, True, BLOCK_N, W)  # keys past S: not stored
        v = _value_tile(V + bh64 * S * BLOCK_DV, offs_n, S, True, BLOCK_DV)
        std = tl.load(STD + j) if NOISE else 0.0
        dk = tl.zeros([BLOCK_N, W], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
        dstd = tl.zeros([BLOCK_N], tl.float32)
        lo = _query_start(start_n, BLOCK_M, N, S, CAUSAL)
        free = _free_queries_start(start_n, lo, BLOCK_M, BLOCK_N, N, S, CAUSAL)
        full = tl.maximum(free, N // BLOCK_M * BLOCK_M)
        for start_m in range(lo, free, BLOCK_M):
            dk, dv, dstd = _dkv_step(k, kb, v, Q, DO, LSE, DELTA, DQ, b, j, H, start_m, start_n, N, S, std, dk, dv,
                                     dstd, P_DROP, SEED, NSEED, NOISE, PADDED, CAUSAL, DROPOUT, True, PREC, BLOCK_M,
                                     BLOCK_N, BLOCK_DV, W)
        for start_m in range(free, N // BLOCK_M * BLOCK_M, BLOCK_M):
            dk, dv, dstd = _dkv_step(k, kb, v, Q, DO, LSE, DELTA, DQ, b, j, H, start_m, start_n, N, S, std, dk, dv,
                                     dstd, P_DROP, SEED, NSEED, NOISE, PADDED, CAUSAL, DROPOUT, False, PREC, BLOCK_M,
                                     BLOCK_N, BLOCK_DV, W)
        for start_m in range(full, N, BLOCK_M):
            dk, dv, dstd = _dkv_step(k, kb, v, Q, DO, LSE, DELTA, DQ, b, j, H, start_m, start_n, N, S, std, dk, dv,
                                     dstd, P_DROP, SEED, NSEED, NOISE, PADDED, CAUSAL, DROPOUT, True, PREC, BLOCK_M,
                                     BLOCK_N, BLOCK_DV, W)
        if DROPOUT:
            dv = dv * (1.0 / (1.0 - P_DROP))
        tl.store(DVO + bh64 * S * BLOCK_DV + offs_n[:, None] * BLOCK_DV + tl.arange(0, BLOCK_DV)[None, :], dv,
                 mask=cols[:, None])
        if NOISE:
            tl.store(DSP + bh * tl.num_programs(1) + tl.program_id(1), tl.sum(dstd))
        tl.store(DK + offs_n[:, None] * W + tl.arange(0, W)[None, :], dk, mask=cols[:, None])
