"""The Triton kernels' bodies for a mixing network ((hard) GFiSH: Linear(M, H) -> ReLU -> Linear(H, H) along the
head axis, noise sigma_k eps_k on its input), in 2-D tiles: the M global heads unrolled (tl.static_range over MP,
their tiles held in tuples), each global product X_k = scale q_k . k_k one 2-D tl.dot (wgmma on sm_90), the network
applied elementwise per tile (its hidden layer recomputed per local head). attention_fish_triton calls these from its
kernels (which dispatch on NETWORK): the forward per (batch x local head, block of query rows); the backward in one
pass, per (batch x local head, block of keys) over the query blocks: the head's share of dk (summed in torch), its
dv, dq added by float32 atomics, and its shares of dW1, db1, dW2, db2 and dsigma (summed in torch). Masks only on edge
blocks (attention_triton.free_keys_end / free_queries_start). The noise eps_k: attention_triton.normal_tile under the
call's seed, stream b, rows' counter bases (k N + n) ceil(S / 4). q and k come as (B, N|S, MP BLOCK_D), each head's
columns padded (attention_fish_triton._concat_keys), dq and dk go out so; V, dO, the output and dV with rows of
BLOCK_DV (DV is BLOCK_DV here: the dispatching kernels pass it so, torch pads), as the linear kernels'.

Torch-free Triton code (this file travels next to remote-code model files with attention_fish_triton).
"""

from .attention_triton import LOG2E, tl, triton

if triton is not None:
    from .attention_fish_triton_linear import _rows, _value_tile
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
    def global_noise(NSEED, b, offs_k, offs_m, start_n, N, S, BLOCK_N: tl.constexpr):
        """eps (MP, BM, BN) of the global heads offs_k, rows offs_m, keys start_n + [0, BN) (the noise kernel's; the
        kernels draw each head's tile with `_noise`, the same numbers)."""
        rows = tl.reshape((offs_k[:, None] * N + offs_m[None, :]) * ((S + 3) // 4),
                          (offs_k.shape[0] * offs_m.shape[0],))
        return tl.reshape(_normal_tile(NSEED, b, rows, start_n, BLOCK_N), (offs_k.shape[0], offs_m.shape[0], BLOCK_N))

    @triton.jit
    def _noise(NSEED, b, k, offs_m, start_n, N, S, BLOCK_N: tl.constexpr):
        return _normal_tile(NSEED, b, (k * N + offs_m) * ((S + 3) // 4), start_n, BLOCK_N)

    @triton.jit
    def _heads(X, offs_r, R, EDGE: tl.constexpr, MP: tl.constexpr, BLOCK_D: tl.constexpr):
        """The (BR, BLOCK_D) tiles of rows offs_r of global heads 0..MP-1, as a tuple, from a batch's (R, MP BLOCK_D)
        block at X (each head's columns padded with zeros in torch, as the linear kernels' k'): no column masks, rows
        bounded only on an EDGE block."""
        offs_d = tl.arange(0, BLOCK_D)
        tiles = ()
        for k in tl.static_range(MP):
            ptr = X + offs_r[:, None] * (MP * BLOCK_D) + k * BLOCK_D + offs_d[None, :]
            if EDGE:
                tiles = tiles + (tl.load(ptr, mask=(offs_r < R)[:, None], other=0.0),)
            else:
                tiles = tiles + (tl.load(ptr),)
        return tiles

    @triton.jit
    def _globals(qs, ks, b, offs_m, start_n, N, S, M, scale, SIG, NSEED, NOISE: tl.constexpr, PREC: tl.constexpr,
                 BLOCK_N: tl.constexpr, MP: tl.constexpr):
        """X_k = scale q_k . k_k (+ sigma_k eps_k) of a tile, one 2-D product per global head, and the noise eps_k
        (X_k itself without noise): two tuples of MP (BM, BN) tiles."""
        xs = ()
        epss = ()
        for k in tl.static_range(MP):
            x = _dot(qs[k], tl.trans(ks[k]), PREC) * scale
            eps = x
            if NOISE:
                eps = _noise(NSEED, b, k, offs_m, start_n, N, S, BLOCK_N)
                x += tl.load(SIG + k) * eps  # sigma padded to MP with zeros (torch)
            xs = xs + (x,)
            epss = epss + (eps,)
        return xs, epss

    @triton.jit
    def _pre(xs, i, W1, B1, M, MP: tl.constexpr):
        """Hidden unit i's input b1_i + sum_k W1_ik X_k of a tile (W1 (H, MP): torch pads its columns with zeros)."""
        pre = xs[0] * tl.load(W1 + i * MP) + tl.load(B1 + i)
        for k in tl.static_range(1, MP):
            pre += xs[k] * tl.load(W1 + i * MP + k)
        return pre

    @triton.jit
    def _mixed(xs, b, j, offs_m, start_n, N, S, M, H, W1, B1, W2, B2, KB, PADDED: tl.constexpr,
               CAUSAL: tl.constexpr, EDGE: tl.constexpr, BLOCK_N: tl.constexpr, MP: tl.constexpr):
        """A_j of a tile (BM, BN); on an EDGE block -inf where hidden (causal, past S), padding's -inf everywhere
        (and past S)."""
        a = tl.zeros_like(xs[0]) + tl.load(B2 + j)
        for i in range(H):
            a += tl.load(W2 + j * H + i) * tl.maximum(_pre(xs, i, W1, B1, M, MP), 0.0)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if PADDED:  # 0 for a real key, -inf for padding (bounds always: dK / dV's free blocks may pass S)
            a += tl.load(KB + b * S + offs_n, mask=offs_n < S, other=float("-inf"))[None, :]
        if EDGE:
            seen = (offs_n < S)[None, :]
            if CAUSAL:  # bottom-right aligned: query i sees key j <= i + S - N
                seen = seen & (offs_n[None, :] <= offs_m[:, None] + (S - N))
            a = tl.where(seen, a, float("-inf"))
        return a

    @triton.jit
    def _mixed_grad(xs, da, j, offs_h, offs_k, M, H, W1, B1, W2, dw1, db1, dw2, PARAMS: tl.constexpr,
                    MP: tl.constexpr):
        """dX_k (a tuple of MP tiles) from dA_j; with PARAMS, this tile's shares of dW1 (HP, MP), db1 (HP,) and row j
        of dW2 (HP,) added to the accumulators (ReLU's gradient 0 at 0, as torch's). The three come from M + 1 tile
        sums a hidden unit i, not M + 2: with g = [pre_i > 0] dA_j, t_0 = sum g and t_k = sum g X_k, db1_i = W2_ji t_0,
        dW1_ik = W2_ji t_k and dW2_ji = sum dA_j ReLU(pre_i) = b1_i t_0 + sum_k W1_ik t_k (pre_i = b1_i + sum_k W1_ik
        X_k where g is not 0). Each sum is a reduction across the program's warps, through shared memory: on sm_90's
        model (bf16, M = 2) hard GFiSH's backward 1.923 -> 1.662 cycles a pair, GFiSH's 2.325 -> 2.054."""
        dxs = ()
        for k in tl.static_range(MP):
            dxs = dxs + (tl.zeros_like(da),)
        for i in range(H):
            g = tl.where(_pre(xs, i, W1, B1, M, MP) > 0, da, 0.0)
            w2 = tl.load(W2 + j * H + i)
            new = ()
            if PARAMS:
                t0 = tl.sum(g)
                db1 += tl.where(offs_h == i, w2 * t0, 0.0)
                through = tl.load(B1 + i) * t0  # dW2_ji: b1_i t_0, then W1_ik t_k
            for k in tl.static_range(MP):
                w1 = tl.load(W1 + i * MP + k)
                new = new + (dxs[k] + (w1 * w2) * g,)
                if PARAMS:
                    t = tl.sum(g * xs[k])
                    dw1 += tl.where((offs_h[:, None] == i) & (offs_k[None, :] == k), w2 * t, 0.0)
                    through += w1 * t
            dxs = new
            if PARAMS:
                dw2 += tl.where(offs_h == i, through, 0.0)
        return dxs, dw1, db1, dw2

    @triton.jit
    def _fwd_step(qs, K, V, SIG, W1, B1, W2, B2, KB, b, j, bh, offs_m, start_n, N, S, D, DV, M, H, scale, m_i, l_i,
                  acc, P_DROP, SEED, NSEED, NOISE: tl.constexpr, PADDED: tl.constexpr, CAUSAL: tl.constexpr,
                  DROPOUT: tl.constexpr, EDGE: tl.constexpr, PREC: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, MP: tl.constexpr):
        """One key block of the online softmax (m_i, l_i, acc)."""
        offs_n = start_n + tl.arange(0, BLOCK_N)
        ks = _heads(K, offs_n, S, EDGE, MP, BLOCK_D)
        xs, _ = _globals(qs, ks, b, offs_m, start_n, N, S, M, scale, SIG, NSEED, NOISE, PREC, BLOCK_N, MP)
        a = _mixed(xs, b, j, offs_m, start_n, N, S, M, H, W1, B1, W2, B2, KB, PADDED, CAUSAL, EDGE, BLOCK_N, MP)
        p, alpha, m_new, l_i = _online_softmax(a, m_i, l_i)
        v = _value_tile(V, offs_n, S, EDGE, BLOCK_DV)
        if DROPOUT:  # the weights dropped after the normalisation: l sums the undropped P
            p = tl.where(_keep(SEED, bh, offs_m, start_n, S, P_DROP, BLOCK_N), p, 0.0)  # 1 / (1 - p) at the end
        return m_new, l_i, acc * alpha[:, None] + _dot(p.to(v.dtype), v, PREC)

    @triton.jit
    def fwd(Q, K, V, SIG, W1, B1, W2, B2, KB, O, LSE, N, S, D, DV, M, H, scale, P_DROP, SEED, NSEED, MP: tl.constexpr,
            NOISE: tl.constexpr, PADDED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
            PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
            BLOCK_DV: tl.constexpr):
        bh = tl.program_id(0)  # 32-bit: the dropout draws' key
        b, j = bh // H, bh % H
        bh64 = bh.to(tl.int64)  # the bases' offsets in 64 bits (B H N D passes 2^31), the tiles' in 32
        Q, K = Q + b.to(tl.int64) * N * (MP * BLOCK_D), K + b.to(tl.int64) * S * (MP * BLOCK_D)
        V, O, LSE = V + bh64 * S * DV, O + bh64 * N * DV, LSE + bh64 * N * 2
        start_m = tl.program_id(1) * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_dv = tl.arange(0, BLOCK_DV)
        qs = _heads(Q, offs_m, N, True, MP, BLOCK_D)
        m_i, l_i, acc = _softmax_state(BLOCK_M, BLOCK_DV)
        free = _free_keys_end(start_m, BLOCK_N, N, S, CAUSAL)
        for start_n in range(0, free, BLOCK_N):
            m_i, l_i, acc = _fwd_step(qs, K, V, SIG, W1, B1, W2, B2, KB, b, j, bh, offs_m, start_n, N, S, D, DV, M, H,
                                      scale, m_i, l_i, acc, P_DROP, SEED, NSEED, NOISE, PADDED, CAUSAL, DROPOUT, False,
                                      PREC, BLOCK_N, BLOCK_D, BLOCK_DV, MP)
        for start_n in range(free, _key_end(start_m, BLOCK_M, N, S, CAUSAL), BLOCK_N):
            m_i, l_i, acc = _fwd_step(qs, K, V, SIG, W1, B1, W2, B2, KB, b, j, bh, offs_m, start_n, N, S, D, DV, M, H,
                                      scale, m_i, l_i, acc, P_DROP, SEED, NSEED, NOISE, PADDED, CAUSAL, DROPOUT, True,
                                      PREC, BLOCK_N, BLOCK_D, BLOCK_DV, MP)
        seen = l_i > 0  # a row that sees no key: output 0, max +inf (backward's weights all 0)
        out = acc / tl.where(seen, l_i, 1.0)[:, None]
        if DROPOUT:
            out = out * (1.0 / (1.0 - P_DROP))
        tl.store(O + offs_m[:, None] * DV + offs_dv[None, :], out.to(O.dtype.element_ty),
                 mask=(offs_m < N)[:, None] & (offs_dv < DV)[None, :])
        tl.store(LSE + offs_m * 2, tl.where(seen, m_i, float("inf")), mask=offs_m < N)
        tl.store(LSE + offs_m * 2 + 1, tl.log2(tl.where(seen, l_i, 1.0)), mask=offs_m < N)

    @triton.jit
    def _tile_grad(qs, ks, do, row_max, log2_l, delta, v, b, j, offs_m, start_n, N, S, M, H, scale, SIG, W1, B1, W2,
                   B2, KB, P_DROP, SEED, NSEED, NOISE: tl.constexpr, PADDED: tl.constexpr, CAUSAL: tl.constexpr,
                   DROPOUT: tl.constexpr, EDGE: tl.constexpr, PREC: tl.constexpr, BLOCK_N: tl.constexpr,
                   MP: tl.constexpr):
        """What both backward kernels recompute for a tile of local head j: X and its noise, the weights P as the
        forward applied them to V (dropped), and dA."""
        xs, epss = _globals(qs, ks, b, offs_m, start_n, N, S, M, scale, SIG, NSEED, NOISE, PREC, BLOCK_N, MP)
        a = _mixed(xs, b, j, offs_m, start_n, N, S, M, H, W1, B1, W2, B2, KB, PADDED, CAUSAL, EDGE, BLOCK_N, MP)
        p = tl.exp2((a - row_max[:, None]) * _LOG2E - log2_l[:, None])
        dp = _dot(do, tl.trans(v), PREC)
        p_used = p
        if DROPOUT:  # d P_ij = mask_ij dO_i . v_j / (1 - p)
            kept = _keep(SEED, b * H + j, offs_m, start_n, S, P_DROP, BLOCK_N)
            p_used = tl.where(kept, p, 0.0)  # dV's 1 / (1 - p) at the end
            dp = tl.where(kept, dp * (1.0 / (1.0 - P_DROP)), 0.0)
        return xs, epss, p_used, p * (dp - delta[:, None])

    @triton.jit
    def _dkv_step(ks, dks, Q, DO, LSE, DELTA, DQ, v, dv, SIG, W1, B1, W2, B2, KB, b, j, offs_h, offs_k, start_m,
                  start_n, N, S, D, DV, M, H, scale, dw1, db1, dw2, db2, dsig, P_DROP, SEED, NSEED,
                  NOISE: tl.constexpr, PADDED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
                  EDGE: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, MP: tl.constexpr):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        qs = _heads(Q, offs_m, N, EDGE, MP, BLOCK_D)
        do, row_max, log2_l, delta = _rows(DO, LSE, DELTA, offs_m, N, EDGE, BLOCK_DV)
        xs, epss, p_used, da = _tile_grad(qs, ks, do, row_max, log2_l, delta, v, b, j, offs_m, start_n, N, S, M, H,
                                          scale, SIG, W1, B1, W2, B2, KB, P_DROP, SEED, NSEED, NOISE, PADDED, CAUSAL,
                                          DROPOUT, EDGE, PREC, BLOCK_N, MP)
        dv += _dot(tl.trans(p_used).to(do.dtype), do, PREC)
        dxs, dw1, db1, dw2 = _mixed_grad(xs, da, j, offs_h, offs_k, M, H, W1, B1, W2, dw1, db1, dw2, True, MP)
        db2 += tl.sum(da, 1)
        offs_d = tl.arange(0, BLOCK_D)
        new = ()
        for k in tl.static_range(MP):
            if NOISE:
                dsig += tl.where(offs_k == k, tl.sum(dxs[k] * epss[k]), 0.0)
            dx = dxs[k].to(qs[k].dtype)
            new = new + (dks[k] + _dot(tl.trans(dx), qs[k], PREC),)
            # dq_k of these rows, added (float32 atomics): dK's operand as it comes
            tl.atomic_add(DQ + offs_m[:, None] * (MP * BLOCK_D) + k * BLOCK_D + offs_d[None, :],
                          _dot(dx, ks[k], PREC) * scale, mask=(offs_m < N)[:, None] if EDGE else None,
                          sem="relaxed")
        return new, dv, dw1, db1, dw2, db2, dsig

    @triton.jit
    def bwd_kv(Q, K, V, DO, LSE, DELTA, SIG, W1, B1, W2, B2, KB, DK, DVO, DQ, DW1P, DB1P, DW2P, DB2P, DSIGP, N, S, D,
               DV, M, H, scale, P_DROP, SEED, NSEED, MP: tl.constexpr, HP: tl.constexpr, NOISE: tl.constexpr,
               PADDED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
        """The backward in one pass, for one (batch x local head j, block of keys): head j's share of dk_k = scale
        sum_j sum_i dX_jk^T q_k (into DK, (B, H, S, MP BLOCK_D), summed over the heads in torch: a program per head
        fills the GPU), its dv_j = P_j^T dO_j, its dq_k = scale sum_s dX_jk k_k added to DQ (zeroed) by atomics, and
        its shares of the network's gradients (a row of DW1P, DB1P, DW2P, DB2P, DSIGP per program)."""
        bh = tl.program_id(0)
        b, j = bh // H, bh % H
        b64, bh64 = b.to(tl.int64), bh.to(tl.int64)  # the bases' offsets in 64 bits (B H N D passes 2^31)
        Q, K, DQ = Q + b64 * N * (MP * BLOCK_D), K + b64 * S * (MP * BLOCK_D), DQ + b64 * N * (MP * BLOCK_D)
        DK = DK + bh64 * S * (MP * BLOCK_D)
        DO, LSE, DELTA = DO + bh64 * N * DV, LSE + bh64 * N * 2, DELTA + bh64 * N
        prog = bh * tl.num_programs(1) + tl.program_id(1)
        start_n = tl.program_id(1) * BLOCK_N
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_k, offs_h = tl.arange(0, MP), tl.arange(0, HP)
        offs_dv = tl.arange(0, BLOCK_DV)
        cols = offs_n < S
        ks = _heads(K, offs_n, S, True, MP, BLOCK_D)
        v = tl.load(V + bh64 * S * DV + offs_n[:, None] * DV + offs_dv[None, :],
                    mask=cols[:, None] & (offs_dv < DV)[None, :], other=0.0)
        dks = ()
        for k in tl.static_range(MP):
            dks = dks + (tl.zeros([BLOCK_N, BLOCK_D], tl.float32),)
        dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
        dw1 = tl.zeros([HP, MP], tl.float32)
        db1 = tl.zeros([HP], tl.float32)
        dw2 = tl.zeros([HP], tl.float32)
        db2 = tl.zeros([BLOCK_M], tl.float32)
        dsig = tl.zeros([MP], tl.float32)
        lo = _query_start(start_n, BLOCK_M, N, S, CAUSAL)
        free = _free_queries_start(start_n, lo, BLOCK_M, BLOCK_N, N, S, CAUSAL)
        full = tl.maximum(free, N // BLOCK_M * BLOCK_M)
        for start_m in range(lo, free, BLOCK_M):
            dks, dv, dw1, db1, dw2, db2, dsig = _dkv_step(
                ks, dks, Q, DO, LSE, DELTA, DQ, v, dv, SIG, W1, B1, W2, B2, KB, b, j, offs_h, offs_k, start_m,
                start_n, N, S, D, DV, M, H, scale, dw1, db1, dw2, db2, dsig, P_DROP, SEED, NSEED, NOISE, PADDED,
                CAUSAL, DROPOUT, True, PREC, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, MP)
        for start_m in range(free, N // BLOCK_M * BLOCK_M, BLOCK_M):
            dks, dv, dw1, db1, dw2, db2, dsig = _dkv_step(
                ks, dks, Q, DO, LSE, DELTA, DQ, v, dv, SIG, W1, B1, W2, B2, KB, b, j, offs_h, offs_k, start_m,
                start_n, N, S, D, DV, M, H, scale, dw1, db1, dw2, db2, dsig, P_DROP, SEED, NSEED, NOISE, PADDED,
                CAUSAL, DROPOUT, False, PREC, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, MP)
        for start_m in range(full, N, BLOCK_M):
            dks, dv, dw1, db1, dw2, db2, dsig = _dkv_step(
                ks, dks, Q, DO, LSE, DELTA, DQ, v, dv, SIG, W1, B1, W2, B2, KB, b, j, offs_h, offs_k, start_m,
                start_n, N, S, D, DV, M, H, scale, dw1, db1, dw2, db2, dsig, P_DROP, SEED, NSEED, NOISE, PADDED,
                CAUSAL, DROPOUT, True, PREC, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, MP)
        if DROPOUT:
            dv = dv * (1.0 / (1.0 - P_DROP))
        tl.store(DVO + bh64 * S * DV + offs_n[:, None] * DV + offs_dv[None, :], dv,
                 mask=cols[:, None] & (offs_dv < DV)[None, :])
        offs_d = tl.arange(0, BLOCK_D)
        for k in tl.static_range(MP):  # into (B, H, S, MP BLOCK_D), as k was given with a head axis
            tl.store(DK + offs_n[:, None] * (MP * BLOCK_D) + k * BLOCK_D + offs_d[None, :], dks[k] * scale,
                     mask=cols[:, None])
        tl.store(DW1P + (prog * HP + offs_h[:, None]) * MP + offs_k[None, :], dw1)
        tl.store(DB1P + prog * HP + offs_h, db1)
        tl.store(DW2P + prog * HP + offs_h, dw2)
        tl.store(DB2P + prog, tl.sum(db2))
        tl.store(DSIGP + prog * MP + offs_k, dsig)
