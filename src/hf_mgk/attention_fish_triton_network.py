"""The Triton kernels' bodies for a mixing network ((hard) GFiSH: Linear(M, H) -> ReLU -> Linear(H, H) along the
head axis, noise sigma_k eps_k on its input): the M global heads of a tile as one (MP, rows, keys) block from one
batched product, the network applied per tile in registers (its hidden layer recomputed per local head).
attention_fish_triton calls these from its kernels (which dispatch on NETWORK): the forward per (batch x local head,
block of query rows); dQ per (batch, block of query rows) over the local heads and key blocks, with each program's
shares of dW1, db1, dW2, db2 and dsigma (summed in torch); dK / dV per (batch, block of keys) over the local heads
and query blocks. The noise eps_k: attention_triton.normal_tile under the call's seed, stream b, rows' counter bases
(k N + n) ceil(S / 4).

Torch-free Triton code (this file travels next to remote-code model files with attention_fish_triton).
"""

from .attention_triton import LOG2E, tl, triton

if triton is not None:
    from .attention_triton import dot as _dot
    from .attention_triton import keep as _keep
    from .attention_triton import key_end as _key_end
    from .attention_triton import normal_tile as _normal_tile
    from .attention_triton import query_start as _query_start
    from .attention_triton import softmax_state as _softmax_state

    _LOG2E = tl.constexpr(LOG2E)

    @triton.jit
    def _load3(ptr, offs_k, offs_r, offs_d, M, R, D):
        """The (MP, BR, BD) tile of rows offs_r of a batch's (M, R, D) block at ptr, zero outside it."""
        mask = (offs_k < M)[:, None, None] & (offs_r < R)[None, :, None] & (offs_d < D)[None, None, :]
        return tl.load(ptr + (offs_k[:, None, None] * R + offs_r[None, :, None]) * D + offs_d[None, None, :],
                       mask=mask, other=0.0)

    @triton.jit
    def _own_block(X, R, M, D, BLOCK: tl.constexpr, MP: tl.constexpr, BLOCK_D: tl.constexpr):
        """A backward program's own block of rows of X (B, M, R, D), the batch from program axis 0 and the block from
        axis 1: (b, the rows' offsets, the (MP, BLOCK, BLOCK_D) tile, a float32 zero accumulator of its shape)."""
        b = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        tile = _load3(X + b.to(tl.int64) * M * R * D, tl.arange(0, MP), offs, tl.arange(0, BLOCK_D), M, R, D)
        return b, offs, tile, tl.zeros([MP, BLOCK, BLOCK_D], tl.float32)

    @triton.jit
    def global_noise(NSEED, b, offs_k, offs_m, start_n, N, S, BLOCK_N: tl.constexpr):
        """eps (MP, BM, BN) of the global heads offs_k, rows offs_m, keys start_n + [0, BN)."""
        rows = tl.reshape((offs_k[:, None] * N + offs_m[None, :]) * ((S + 3) // 4),
                          (offs_k.shape[0] * offs_m.shape[0],))
        return tl.reshape(_normal_tile(NSEED, b, rows, start_n, BLOCK_N), (offs_k.shape[0], offs_m.shape[0], BLOCK_N))

    @triton.jit
    def _global(q3, k3, b, offs_k, offs_m, start_n, N, S, M, scale, SIG, NSEED, NOISE: tl.constexpr,
                PREC: tl.constexpr, BLOCK_N: tl.constexpr):
        """X of a tile, (MP, BM, BN), and the noise eps (X itself where there is none)."""
        x3 = _dot(q3, tl.permute(k3, 0, 2, 1), PREC) * scale
        eps3 = x3
        if NOISE:
            eps3 = global_noise(NSEED, b, offs_k, offs_m, start_n, N, S, BLOCK_N)
            sig = tl.load(SIG + offs_k, mask=offs_k < M, other=0.0)
            x3 = x3 + sig[:, None, None] * eps3
        return x3, eps3

    @triton.jit
    def _mixed(x3, b, j, offs_k, offs_m, offs_n, N, S, M, H, W1, B1, W2, B2, KB, PADDED: tl.constexpr,
               CAUSAL: tl.constexpr):
        """A_j of a tile (BM, BN), -inf where hidden (causal, padding, past the ends)."""
        a = tl.zeros([x3.shape[1], x3.shape[2]], tl.float32) + tl.load(B2 + j)
        for i in range(H):
            w1 = tl.load(W1 + i * M + offs_k, mask=offs_k < M, other=0.0)
            pre = tl.sum(w1[:, None, None] * x3, 0) + tl.load(B1 + i)
            a += tl.load(W2 + j * H + i) * tl.maximum(pre, 0.0)
        if PADDED:  # 0 for a real key, -inf for padding
            a += tl.load(KB + b * S + offs_n, mask=offs_n < S, other=float("-inf"))[None, :]
        seen = (offs_m < N)[:, None] & (offs_n < S)[None, :]
        if CAUSAL:  # bottom-right aligned: query i sees key j <= i + S - N
            seen = seen & (offs_n[None, :] <= offs_m[:, None] + (S - N))
        return tl.where(seen, a, float("-inf"))

    @triton.jit
    def _mixed_grad(x3, da, j, offs_k, offs_h, M, H, W1, B1, W2, dw1, db1, dw2, PARAMS: tl.constexpr):
        """dX (MP, BM, BN) from dA_j; with PARAMS, this tile's shares of dW1 (HP, MP), db1 (HP,) and row j of dW2
        (HP,) added to the accumulators (ReLU's gradient 0 at 0, as torch's)."""
        dx3 = tl.zeros_like(x3)
        for i in range(H):
            w1 = tl.load(W1 + i * M + offs_k, mask=offs_k < M, other=0.0)
            pre = tl.sum(w1[:, None, None] * x3, 0) + tl.load(B1 + i)
            dr = tl.where(pre > 0, tl.load(W2 + j * H + i) * da, 0.0)
            dx3 += w1[:, None, None] * dr[None, :, :]
            if PARAMS:
                dw2 += tl.where(offs_h == i, tl.sum(da * tl.maximum(pre, 0.0)), 0.0)
                db1 += tl.where(offs_h == i, tl.sum(dr), 0.0)
                dw1 += tl.where(offs_h[:, None] == i, tl.sum(tl.sum(dr[None, :, :] * x3, 2), 1)[None, :], 0.0)
        return dx3, dw1, db1, dw2

    @triton.jit
    def fwd(Q, K, V, SIG, W1, B1, W2, B2, KB, O, LSE, N, S, D, DV, M, H, scale, P_DROP, SEED, NSEED, MP: tl.constexpr,
            NOISE: tl.constexpr, PADDED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
            PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
            BLOCK_DV: tl.constexpr):
        bh = tl.program_id(0)  # 32-bit: the dropout draws' key
        b, j = bh // H, bh % H
        bh64 = bh.to(tl.int64)  # the bases' offsets in 64 bits (B H N D passes 2^31), the tiles' in 32
        Q, K = Q + b.to(tl.int64) * M * N * D, K + b.to(tl.int64) * M * S * D
        V, O, LSE = V + bh64 * S * DV, O + bh64 * N * DV, LSE + bh64 * N * 2
        start_m = tl.program_id(1) * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_k, offs_d, offs_dv = tl.arange(0, MP), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
        q3 = _load3(Q, offs_k, offs_m, offs_d, M, N, D)
        m_i, l_i, acc = _softmax_state(BLOCK_M, BLOCK_DV)
        hi = _key_end(start_m, BLOCK_M, N, S, CAUSAL)
        for start_n in range(0, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k3 = _load3(K, offs_k, offs_n, offs_d, M, S, D)
            x3, _ = _global(q3, k3, b, offs_k, offs_m, start_n, N, S, M, scale, SIG, NSEED, NOISE, PREC, BLOCK_N)
            a = _mixed(x3, b, j, offs_k, offs_m, offs_n, N, S, M, H, W1, B1, W2, B2, KB, PADDED, CAUSAL)
            m_new = tl.maximum(m_i, tl.max(a, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing seen yet: P stays 0
            p = tl.exp2((a - m_use[:, None]) * _LOG2E)
            alpha = tl.exp2((m_i - m_use) * _LOG2E)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + offs_n[:, None] * DV + offs_dv[None, :],
                        mask=(offs_n < S)[:, None] & (offs_dv < DV)[None, :], other=0.0)
            if DROPOUT:  # the weights dropped after the normalisation: l sums the undropped P
                p = tl.where(_keep(SEED, bh, offs_m, offs_n, S, P_DROP), p / (1.0 - P_DROP), 0.0)
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PREC)
            m_i = m_new
        seen = l_i > 0  # a row that sees no key: output 0, max +inf (backward's weights all 0)
        out = acc / tl.where(seen, l_i, 1.0)[:, None]
        tl.store(O + offs_m[:, None] * DV + offs_dv[None, :], out.to(O.dtype.element_ty),
                 mask=(offs_m < N)[:, None] & (offs_dv < DV)[None, :])
        tl.store(LSE + offs_m * 2, tl.where(seen, m_i, float("inf")), mask=offs_m < N)
        tl.store(LSE + offs_m * 2 + 1, tl.log2(tl.where(seen, l_i, 1.0)), mask=offs_m < N)

    @triton.jit
    def _tile_grad(q3, k3, do, row_max, log2_l, delta, v, b, j, offs_k, offs_m, offs_n, start_n, N, S, M, H, scale,
                   SIG, W1, B1, W2, B2, KB, P_DROP, SEED, NSEED, NOISE: tl.constexpr, PADDED: tl.constexpr,
                   CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr, BLOCK_N: tl.constexpr):
        """What both backward kernels recompute for a tile of local head j: X and its noise, the weights P as the
        forward applied them to V (dropped), and dA."""
        x3, eps3 = _global(q3, k3, b, offs_k, offs_m, start_n, N, S, M, scale, SIG, NSEED, NOISE, PREC, BLOCK_N)
        a = _mixed(x3, b, j, offs_k, offs_m, offs_n, N, S, M, H, W1, B1, W2, B2, KB, PADDED, CAUSAL)
        p = tl.exp2((a - row_max[:, None]) * _LOG2E - log2_l[:, None])
        dp = _dot(do, tl.trans(v), PREC)
        p_used = p
        if DROPOUT:  # d P_ij = mask_ij dO_i . v_j / (1 - p)
            kept = _keep(SEED, b * H + j, offs_m, offs_n, S, P_DROP)
            p_used = tl.where(kept, p / (1.0 - P_DROP), 0.0)
            dp = tl.where(kept, dp / (1.0 - P_DROP), 0.0)
        return x3, eps3, p_used, p * (dp - delta[:, None])

    @triton.jit
    def bwd_q(Q, K, V, DO, LSE, DELTA, SIG, W1, B1, W2, B2, KB, DQ, DW1P, DB1P, DW2P, DB2P, DSIGP, N, S, D, DV, M, H,
              scale, P_DROP, SEED, NSEED, MP: tl.constexpr, HP: tl.constexpr, NOISE: tl.constexpr,
              PADDED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
        """dq_k = scale sum_j sum_s dX_jk k_k for one block of query rows, and this program's shares of the network's
        gradients (per local head into DW2P / DB2P, summed over the heads into DW1P / DB1P / DSIGP)."""
        b, offs_m, q3, dq3 = _own_block(Q, N, M, D, BLOCK_M, MP, BLOCK_D)
        b64 = b.to(tl.int64)  # the bases' offsets in 64 bits (B H N D passes 2^31), the tiles' in 32
        K, DQ = K + b64 * M * S * D, DQ + b64 * M * N * D
        prog = b * tl.num_programs(1) + tl.program_id(1)
        start_m = tl.program_id(1) * BLOCK_M
        offs_k, offs_h = tl.arange(0, MP), tl.arange(0, HP)
        offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
        rows = offs_m < N
        dw1 = tl.zeros([HP, MP], tl.float32)
        db1 = tl.zeros([HP], tl.float32)
        dsig = tl.zeros([MP], tl.float32)
        hi = _key_end(start_m, BLOCK_M, N, S, CAUSAL)
        for j in range(H):
            bh = b64 * H + j
            Vj = V + bh * S * DV
            do = tl.load(DO + bh * N * DV + offs_m[:, None] * DV + offs_dv[None, :],
                         mask=rows[:, None] & (offs_dv < DV)[None, :], other=0.0)
            row_max = tl.load(LSE + bh * N * 2 + offs_m * 2, mask=rows, other=float("inf"))
            log2_l = tl.load(LSE + bh * N * 2 + offs_m * 2 + 1, mask=rows, other=0.0)
            delta = tl.load(DELTA + bh * N + offs_m, mask=rows, other=0.0)
            db2 = tl.zeros([BLOCK_M], tl.float32)
            dw2 = tl.zeros([HP], tl.float32)
            for start_n in range(0, hi, BLOCK_N):
                offs_n = start_n + tl.arange(0, BLOCK_N)
                k3 = _load3(K, offs_k, offs_n, offs_d, M, S, D)
                v = tl.load(Vj + offs_n[:, None] * DV + offs_dv[None, :],
                            mask=(offs_n < S)[:, None] & (offs_dv < DV)[None, :], other=0.0)
                x3, eps3, _, da = _tile_grad(
                    q3, k3, do, row_max, log2_l, delta, v, b, j, offs_k, offs_m, offs_n, start_n, N, S, M, H, scale,
                    SIG, W1, B1, W2, B2, KB, P_DROP, SEED, NSEED, NOISE, PADDED, CAUSAL, DROPOUT, PREC, BLOCK_N)
                dx3, dw1, db1, dw2 = _mixed_grad(x3, da, j, offs_k, offs_h, M, H, W1, B1, W2, dw1, db1, dw2, True)
                db2 += tl.sum(da, 1)
                if NOISE:
                    dsig += tl.sum(tl.sum(dx3 * eps3, 2), 1)
                dq3 += _dot(dx3.to(k3.dtype), k3, PREC)
            tl.store(DW2P + (prog * H + j) * HP + offs_h, dw2)
            tl.store(DB2P + prog * H + j, tl.sum(db2))
        tl.store(DQ + (offs_k[:, None, None] * N + offs_m[None, :, None]) * D + offs_d[None, None, :],
                 dq3 * scale, mask=(offs_k < M)[:, None, None] & rows[None, :, None] & (offs_d < D)[None, None, :])
        tl.store(DW1P + (prog * HP + offs_h[:, None]) * MP + offs_k[None, :], dw1)
        tl.store(DB1P + prog * HP + offs_h, db1)
        tl.store(DSIGP + prog * MP + offs_k, dsig)

    @triton.jit
    def bwd_kv(Q, K, V, DO, LSE, DELTA, SIG, W1, B1, W2, B2, KB, DK, DVO, N, S, D, DV, M, H, scale, P_DROP, SEED,
               NSEED, MP: tl.constexpr, HP: tl.constexpr, NOISE: tl.constexpr, PADDED: tl.constexpr,
               CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
        """For one block of keys: dk_k = scale sum_j sum_i dX_jk^T q_k and each local head's dv_j = P_j^T dO_j."""
        b, offs_n, k3, dk3 = _own_block(K, S, M, D, BLOCK_N, MP, BLOCK_D)
        b64 = b.to(tl.int64)  # the bases' offsets in 64 bits (B H N D passes 2^31), the tiles' in 32
        Q, DK = Q + b64 * M * N * D, DK + b64 * M * S * D
        start_n = tl.program_id(1) * BLOCK_N
        offs_k, offs_h = tl.arange(0, MP), tl.arange(0, HP)
        offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
        cols = offs_n < S
        unused = tl.zeros([HP], tl.float32)
        unused2 = tl.zeros([HP, MP], tl.float32)
        lo = _query_start(start_n, BLOCK_M, N, S, CAUSAL)
        for j in range(H):
            bh = b64 * H + j
            v = tl.load(V + bh * S * DV + offs_n[:, None] * DV + offs_dv[None, :],
                        mask=cols[:, None] & (offs_dv < DV)[None, :], other=0.0)
            dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
            DOj, LSEj, DELTAj = DO + bh * N * DV, LSE + bh * N * 2, DELTA + bh * N
            for start_m in range(lo, N, BLOCK_M):
                offs_m = start_m + tl.arange(0, BLOCK_M)
                rows = offs_m < N
                q3 = _load3(Q, offs_k, offs_m, offs_d, M, N, D)
                do = tl.load(DOj + offs_m[:, None] * DV + offs_dv[None, :],
                             mask=rows[:, None] & (offs_dv < DV)[None, :], other=0.0)
                row_max = tl.load(LSEj + offs_m * 2, mask=rows, other=float("inf"))
                log2_l = tl.load(LSEj + offs_m * 2 + 1, mask=rows, other=0.0)
                delta = tl.load(DELTAj + offs_m, mask=rows, other=0.0)
                x3, _, p_used, da = _tile_grad(
                    q3, k3, do, row_max, log2_l, delta, v, b, j, offs_k, offs_m, offs_n, start_n, N, S, M, H, scale,
                    SIG, W1, B1, W2, B2, KB, P_DROP, SEED, NSEED, NOISE, PADDED, CAUSAL, DROPOUT, PREC, BLOCK_N)
                dv += _dot(tl.trans(p_used).to(do.dtype), do, PREC)
                dx3, _, _, _ = _mixed_grad(x3, da, j, offs_k, offs_h, M, H, W1, B1, W2, unused2, unused, unused, False)
                dk3 += _dot(tl.permute(dx3, 0, 2, 1).to(q3.dtype), q3, PREC)
            tl.store(DVO + bh * S * DV + offs_n[:, None] * DV + offs_dv[None, :], dv,
                     mask=cols[:, None] & (offs_dv < DV)[None, :])
        tl.store(DK + (offs_k[:, None, None] * S + offs_n[None, :, None]) * D + offs_d[None, None, :],
                 dk3 * scale, mask=(offs_k < M)[:, None, None] & cols[None, :, None] & (offs_d < D)[None, None, :])
