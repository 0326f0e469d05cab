"""The Triton kernels' bodies for a mixing network ((hard) GFiSH: Linear(M, H) -> ReLU -> Linear(H, H) along the
head axis, noise sigma_k eps_k on its input), in 2-D tiles: the M global heads unrolled (tl.static_range over MP,
their tiles held in tuples), each global product X_k = scale q_k . k_k one 2-D tl.dot (wgmma on sm_90), the network
applied elementwise per tile. A program covers a group of GROUP local heads (attention_fish_triton.heads_a_program),
their per-head state in tuples: the global scores, the noise and each hidden unit are formed once a tile for the
group, and in the backward dq, dk and the hidden layer's gradients once from the group's dA (per pair and local head
a hidden unit costs M + 1 operations over G plus one, where a program per head paid M + 2). attention_fish_triton
calls these from its kernels (which dispatch on NETWORK): the forward per (batch x group, block of query rows); the
backward in one pass, per (batch x group, block of keys) over the query blocks: the group's share of dk (summed in
torch), each head's dv, dq added by float32 atomics, and the shares of dW1, db1, dW2, db2 and dsigma (summed in
torch). Masks only on edge blocks (attention_triton.free_keys_end / free_queries_start). The noise eps_k:
attention_triton.normal_tile under the call's seed, stream b, rows' counter bases (k N + n) ceil(S / 4). q and k come
as (B, N|S, MP BLOCK_D), each head's columns padded (attention_fish_triton._concat_keys), dq and dk go out so; V, dO,
the output and dV with rows of BLOCK_DV (DV is BLOCK_DV here: the dispatching kernels pass it so, torch pads), as the
linear kernels'.

Torch-free Triton code (this file travels next to remote-code model files with attention_fish_triton).
"""

from .attention_triton import LOG2E, tl, triton  # noqa: F401 (LOG2E: what modeling_fish_gpt2 imports)

if triton is not None:
    from .attention_fish_triton_linear import _rows, _value_tile
    from .attention_fish_triton_linear import weights_grad as _weights_grad
    from .attention_triton import dot as _dot
    from .attention_triton import free_keys_end as _free_keys_end
    from .attention_triton import free_queries_start as _free_queries_start
    from .attention_triton import keep as _keep
    from .attention_triton import key_end as _key_end
    from .attention_triton import normal_tile as _normal_tile
    from .attention_triton import online_softmax as _online_softmax
    from .attention_triton import query_start as _query_start
    from .attention_triton import softmax_state as _softmax_state

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
    def _mixed(xs, b, g, offs_m, start_n, N, S, M, H, W1, B1, W2, B2, KB, PADDED: tl.constexpr, CAUSAL: tl.constexpr,
               EDGE: tl.constexpr, BLOCK_N: tl.constexpr, MP: tl.constexpr, GROUP: tl.constexpr):
        """A_j of a tile (BM, BN) for the group's local heads j = g GROUP + t (a tuple of GROUP tiles), each hidden
        unit formed once for all of them; on an EDGE block -inf where hidden (causal, past S), padding's -inf
        everywhere (and past S)."""
        aa = ()
        for t in tl.static_range(GROUP):
            aa = aa + (tl.zeros_like(xs[0]) + tl.load(B2 + g * GROUP + t),)
        for i in range(H):
            hidden = tl.maximum(_pre(xs, i, W1, B1, M, MP), 0.0)
            new = ()
            for t in tl.static_range(GROUP):
                new = new + (aa[t] + tl.load(W2 + (g * GROUP + t) * H + i) * hidden,)
            aa = new
        offs_n = start_n + tl.arange(0, BLOCK_N)
        bias = tl.zeros_like(xs[0])
        if PADDED:  # 0 for a real key, -inf for padding and past S
            bias += tl.load(KB + b * S + offs_n, mask=offs_n < S, other=float("-inf"))[None, :]
        if EDGE:
            seen = (offs_n < S)[None, :]
            if CAUSAL:  # bottom-right aligned: query i sees key j <= i + S - N
                seen = seen & (offs_n[None, :] <= offs_m[:, None] + (S - N))
            bias = tl.where(seen, bias, float("-inf"))
        if PADDED or EDGE:
            new = ()
            for t in tl.static_range(GROUP):
                new = new + (aa[t] + bias,)
            aa = new
        return aa

    @triton.jit
    def _mixed_grad(xs, das, g, offs_h, offs_k, M, H, W1, B1, W2, dw1, db1, dw2s, MP: tl.constexpr,
                    GROUP: tl.constexpr):
        """dX_k (a tuple of MP tiles) from the group's dA_j (a tuple of GROUP tiles), and this tile's shares of dW1
        (HP, MP), db1 (HP,) and the group's rows of dW2 (a tuple of GROUP (HP,)) added to the accumulators (ReLU's
        gradient 0 at 0, as torch's). Each tile sum is a reduction across the program's warps, through shared memory,
        so they are few: with one head (g = [pre_i > 0] dA_j, t_0 = sum g, t_k = sum g X_k) db1_i = W2_ji t_0, dW1_ik
        = W2_ji t_k and dW2_ji = sum dA_j ReLU(pre_i) = b1_i t_0 + sum_k W1_ik t_k (pre_i = b1_i + sum_k W1_ik X_k
        where g is not 0): M + 1 sums a hidden unit, not M + 2 (on sm_90's model, bf16, M = 2: hard GFiSH's backward
        1.923 -> 1.662 cycles a pair, GFiSH's 2.325 -> 2.054); with G heads, r = [pre_i > 0] sum_j W2_ji dA_j, db1_i
        = sum r, dW1_ik = sum r X_k and dW2_ji = sum dA_j ReLU(pre_i): G + M + 1 sums for G heads."""
        dxs = ()
        for k in tl.static_range(MP):
            dxs = dxs + (tl.zeros_like(das[0]),)
        for i in range(H):
            pre = _pre(xs, i, W1, B1, M, MP)
            if GROUP == 1:
                gi = tl.where(pre > 0, das[0], 0.0)
                w2 = tl.load(W2 + g * H + i)
                t0 = tl.sum(gi)
                db1 += tl.where(offs_h == i, w2 * t0, 0.0)
                through = tl.load(B1 + i) * t0  # dW2_ji: b1_i t_0, then W1_ik t_k
                new = ()
                for k in tl.static_range(MP):
                    w1 = tl.load(W1 + i * MP + k)
                    new = new + (dxs[k] + (w1 * w2) * gi,)
                    t = tl.sum(gi * xs[k])
                    dw1 += tl.where((offs_h[:, None] == i) & (offs_k[None, :] == k), w2 * t, 0.0)
                    through += w1 * t
                dxs = new
                dw2s = (dw2s[0] + tl.where(offs_h == i, through, 0.0),)
            else:
                r = tl.zeros_like(pre)
                hidden = tl.maximum(pre, 0.0)
                new = ()
                for t in tl.static_range(GROUP):
                    r += tl.load(W2 + (g * GROUP + t) * H + i) * das[t]
                    new = new + (dw2s[t] + tl.where(offs_h == i, tl.sum(das[t] * hidden), 0.0),)
                dw2s = new
                r = tl.where(pre > 0, r, 0.0)
                db1 += tl.where(offs_h == i, tl.sum(r), 0.0)
                new = ()
                for k in tl.static_range(MP):
                    new = new + (dxs[k] + tl.load(W1 + i * MP + k) * r,)
                    dw1 += tl.where((offs_h[:, None] == i) & (offs_k[None, :] == k), tl.sum(r * xs[k]), 0.0)
                dxs = new
        return dxs, dw1, db1, dw2s

    @triton.jit
    def _fwd_step(qs, K, VS, SIG, W1, B1, W2, B2, KB, b, g, offs_m, start_n, N, S, D, DV, M, H, scale, ms, ls, accs,
                  P_DROP, SEED, NSEED, NOISE: tl.constexpr, PADDED: tl.constexpr, CAUSAL: tl.constexpr,
                  DROPOUT: tl.constexpr, EDGE: tl.constexpr, PREC: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, MP: tl.constexpr, GROUP: tl.constexpr):
        """One key block of the group's online softmaxes (tuples of GROUP m_i, l_i, acc; VS: the heads' V)."""
        offs_n = start_n + tl.arange(0, BLOCK_N)
        ks = _heads(K, offs_n, S, EDGE, MP, BLOCK_D)
        xs, _ = _globals(qs, ks, b, offs_m, start_n, N, S, M, scale, SIG, NSEED, NOISE, PREC, BLOCK_N, MP)
        aa = _mixed(xs, b, g, offs_m, start_n, N, S, M, H, W1, B1, W2, B2, KB, PADDED, CAUSAL, EDGE, BLOCK_N, MP,
                    GROUP)
        new_m, new_l, new_acc = (), (), ()
        for t in tl.static_range(GROUP):
            bh = b * H + g * GROUP + t  # 32-bit: the dropout draws' key
            p, alpha, m_new, l_i = _online_softmax(aa[t], ms[t], ls[t])
            v = _value_tile(VS[t], offs_n, S, EDGE, BLOCK_DV)
            if DROPOUT:  # the weights dropped after the normalisation: l sums the undropped P
                p = tl.where(_keep(SEED, bh, offs_m, start_n, S, P_DROP, BLOCK_N), p, 0.0)  # 1 / (1 - p) at the end
            new_m, new_l = new_m + (m_new,), new_l + (l_i,)
            new_acc = new_acc + (accs[t] * alpha[:, None] + _dot(p.to(v.dtype), v, PREC),)
        return new_m, new_l, new_acc

    @triton.jit
    def fwd(Q, K, V, SIG, W1, B1, W2, B2, KB, O, LSE, N, S, D, DV, M, H, scale, P_DROP, SEED, NSEED, MP: tl.constexpr,
            NOISE: tl.constexpr, PADDED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
            PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
            BLOCK_DV: tl.constexpr, GROUP: tl.constexpr):
        """One program per (batch x group of GROUP local heads, block of query rows): the global scores and the
        network's hidden layer formed once a tile for the group's heads."""
        groups = H // GROUP
        b, g = tl.program_id(0) // groups, tl.program_id(0) % groups  # 32-bit: the draws' keys
        b64 = tl.program_id(0).to(tl.int64) // groups  # the bases' offsets in 64 bits (B H N D passes 2^31)
        Q, K = Q + b64 * N * (MP * BLOCK_D), K + b64 * S * (MP * BLOCK_D)
        VS, OS, LSES = (), (), ()  # the group's heads' V, output and saved rows
        for t in tl.static_range(GROUP):
            bh64 = b64 * H + g.to(tl.int64) * GROUP + t  # no 32-bit term in a 64-bit offset
            VS, OS, LSES = VS + (V + bh64 * S * DV,), OS + (O + bh64 * N * DV,), LSES + (LSE + bh64 * N * 2,)
        start_m = tl.program_id(1) * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_dv = tl.arange(0, BLOCK_DV)
        qs = _heads(Q, offs_m, N, True, MP, BLOCK_D)
        ms, ls, accs = (), (), ()
        for t in tl.static_range(GROUP):
            m_i, l_i, acc = _softmax_state(BLOCK_M, BLOCK_DV)
            ms, ls, accs = ms + (m_i,), ls + (l_i,), accs + (acc,)
        free = _free_keys_end(start_m, BLOCK_N, N, S, CAUSAL)
        for start_n in range(0, free, BLOCK_N):
            ms, ls, accs = _fwd_step(qs, K, VS, SIG, W1, B1, W2, B2, KB, b, g, offs_m, start_n, N, S, D, DV, M, H,
                                     scale, ms, ls, accs, P_DROP, SEED, NSEED, NOISE, PADDED, CAUSAL, DROPOUT, False,
                                     PREC, BLOCK_N, BLOCK_D, BLOCK_DV, MP, GROUP)
        for start_n in range(free, _key_end(start_m, BLOCK_M, N, S, CAUSAL), BLOCK_N):
            ms, ls, accs = _fwd_step(qs, K, VS, SIG, W1, B1, W2, B2, KB, b, g, offs_m, start_n, N, S, D, DV, M, H,
                                     scale, ms, ls, accs, P_DROP, SEED, NSEED, NOISE, PADDED, CAUSAL, DROPOUT, True,
                                     PREC, BLOCK_N, BLOCK_D, BLOCK_DV, MP, GROUP)
        for t in tl.static_range(GROUP):
            seen = ls[t] > 0  # a row that sees no key: output 0, max +inf (backward's weights all 0)
            out = accs[t] / tl.where(seen, ls[t], 1.0)[:, None]
            if DROPOUT:
                out = out * (1.0 / (1.0 - P_DROP))
            tl.store(OS[t] + offs_m[:, None] * DV + offs_dv[None, :], out.to(O.dtype.element_ty),
                     mask=(offs_m < N)[:, None] & (offs_dv < DV)[None, :])
            tl.store(LSES[t] + offs_m * 2, tl.where(seen, ms[t], float("inf")), mask=offs_m < N)
            tl.store(LSES[t] + offs_m * 2 + 1, tl.log2(tl.where(seen, ls[t], 1.0)), mask=offs_m < N)

    @triton.jit
    def _dkv_step(ks, dks, Q, DOS, LSES, DELTAS, DQ, vs, dvs, SIG, W1, B1, W2, B2, KB, b, g, offs_h, offs_k, start_m,
                  start_n, N, S, D, DV, M, H, scale, dw1, db1, dw2s, db2s, dsig, P_DROP, SEED, NSEED,
                  NOISE: tl.constexpr, PADDED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
                  EDGE: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, MP: tl.constexpr, GROUP: tl.constexpr):
        """A block of query rows for the group's heads (DOS, LSES, DELTAS: their rows' bases): X and its noise, the
        network and its hidden layer once; per head the weights P as the forward applied them to V (dropped), dA and
        dV; then dX for the group."""
        offs_m = start_m + tl.arange(0, BLOCK_M)
        qs = _heads(Q, offs_m, N, EDGE, MP, BLOCK_D)
        xs, epss = _globals(qs, ks, b, offs_m, start_n, N, S, M, scale, SIG, NSEED, NOISE, PREC, BLOCK_N, MP)
        aa = _mixed(xs, b, g, offs_m, start_n, N, S, M, H, W1, B1, W2, B2, KB, PADDED, CAUSAL, EDGE, BLOCK_N, MP,
                    GROUP)
        das, new_dv, new_db2 = (), (), ()
        for t in tl.static_range(GROUP):
            bh = b * H + g * GROUP + t
            do, row_max, log2_l, delta = _rows(DOS[t], LSES[t], DELTAS[t], offs_m, N, EDGE, BLOCK_DV)
            p_used, da = _weights_grad(aa[t], do, vs[t], row_max, log2_l, delta, bh, offs_m, start_n, S, P_DROP,
                                       SEED, DROPOUT, PREC, BLOCK_N, False)
            das = das + (da,)
            new_dv = new_dv + (dvs[t] + _dot(tl.trans(p_used).to(do.dtype), do, PREC),)
            new_db2 = new_db2 + (db2s[t] + tl.sum(da, 1),)
        dxs, dw1, db1, dw2s = _mixed_grad(xs, das, g, offs_h, offs_k, M, H, W1, B1, W2, dw1, db1, dw2s, MP, GROUP)
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
        return new, new_dv, dw1, db1, dw2s, new_db2, dsig

    @triton.jit
    def bwd_kv(Q, K, V, DO, LSE, DELTA, SIG, W1, B1, W2, B2, KB, DK, DVO, DQ, DW1P, DB1P, DW2P, DB2P, DSIGP, N, S, D,
               DV, M, H, scale, P_DROP, SEED, NSEED, MP: tl.constexpr, HP: tl.constexpr, NOISE: tl.constexpr,
               PADDED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
               GROUP: tl.constexpr):
        """The backward in one pass, for one (batch x group of GROUP local heads, block of keys): the group's share of
        dk_k = scale sum_j sum_i dX_jk^T q_k (into DK, (B, H / GROUP, S, MP BLOCK_D), summed over the groups in torch:
        a program per group fills the GPU), each head's dv_j = P_j^T dO_j, the group's dq_k = scale sum_s dX_k k_k
        added to DQ (zeroed) by atomics, and the shares of the network's gradients (a row of DW1P, DB1P, DSIGP per
        program; of DW2P and DB2P per head and key block)."""
        groups = H // GROUP
        b, g = tl.program_id(0) // groups, tl.program_id(0) % groups  # 32-bit: the draws' keys
        b64 = tl.program_id(0).to(tl.int64) // groups  # the bases' offsets in 64 bits (B H N D passes 2^31)
        Q, K, DQ = Q + b64 * N * (MP * BLOCK_D), K + b64 * S * (MP * BLOCK_D), DQ + b64 * N * (MP * BLOCK_D)
        VS, DOS, LSES, DELTAS, DVS = (), (), (), (), ()  # the group's heads' V, dO, saved rows, delta and dV
        for t in tl.static_range(GROUP):
            bh64 = b64 * H + g.to(tl.int64) * GROUP + t  # no 32-bit term in a 64-bit offset
            VS, DOS, LSES = VS + (V + bh64 * S * DV,), DOS + (DO + bh64 * N * DV,), LSES + (LSE + bh64 * N * 2,)
            DELTAS, DVS = DELTAS + (DELTA + bh64 * N,), DVS + (DVO + bh64 * S * DV,)
        DK = DK + tl.program_id(0).to(tl.int64) * S * (MP * BLOCK_D)
        prog = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        start_n = tl.program_id(1) * BLOCK_N
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_k, offs_h = tl.arange(0, MP), tl.arange(0, HP)
        offs_dv = tl.arange(0, BLOCK_DV)
        cols = offs_n < S
        ks = _heads(K, offs_n, S, True, MP, BLOCK_D)
        vs, dvs, dw2s, db2s = (), (), (), ()
        for t in tl.static_range(GROUP):
            vs = vs + (tl.load(VS[t] + offs_n[:, None] * DV + offs_dv[None, :],
                               mask=cols[:, None] & (offs_dv < DV)[None, :], other=0.0),)
            dvs = dvs + (tl.zeros([BLOCK_N, BLOCK_DV], tl.float32),)
            dw2s = dw2s + (tl.zeros([HP], tl.float32),)
            db2s = db2s + (tl.zeros([BLOCK_M], tl.float32),)
        dks = ()
        for k in tl.static_range(MP):
            dks = dks + (tl.zeros([BLOCK_N, BLOCK_D], tl.float32),)
        dw1 = tl.zeros([HP, MP], tl.float32)
        db1 = tl.zeros([HP], tl.float32)
        dsig = tl.zeros([MP], tl.float32)
        lo = _query_start(start_n, BLOCK_M, N, S, CAUSAL)
        free = _free_queries_start(start_n, lo, BLOCK_M, BLOCK_N, N, S, CAUSAL)
        full = tl.maximum(free, N // BLOCK_M * BLOCK_M)
        for start_m in range(lo, free, BLOCK_M):
            dks, dvs, dw1, db1, dw2s, db2s, dsig = _dkv_step(
                ks, dks, Q, DOS, LSES, DELTAS, DQ, vs, dvs, SIG, W1, B1, W2, B2, KB, b, g, offs_h, offs_k, start_m,
                start_n, N, S, D, DV, M, H, scale, dw1, db1, dw2s, db2s, dsig, P_DROP, SEED, NSEED, NOISE, PADDED,
                CAUSAL, DROPOUT, True, PREC, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, MP, GROUP)
        for start_m in range(free, N // BLOCK_M * BLOCK_M, BLOCK_M):
            dks, dvs, dw1, db1, dw2s, db2s, dsig = _dkv_step(
                ks, dks, Q, DOS, LSES, DELTAS, DQ, vs, dvs, SIG, W1, B1, W2, B2, KB, b, g, offs_h, offs_k, start_m,
                start_n, N, S, D, DV, M, H, scale, dw1, db1, dw2s, db2s, dsig, P_DROP, SEED, NSEED, NOISE, PADDED,
                CAUSAL, DROPOUT, False, PREC, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, MP, GROUP)
        for start_m in range(full, N, BLOCK_M):
            dks, dvs, dw1, db1, dw2s, db2s, dsig = _dkv_step(
                ks, dks, Q, DOS, LSES, DELTAS, DQ, vs, dvs, SIG, W1, B1, W2, B2, KB, b, g, offs_h, offs_k, start_m,
                start_n, N, S, D, DV, M, H, scale, dw1, db1, dw2s, db2s, dsig, P_DROP, SEED, NSEED, NOISE, PADDED,
                CAUSAL, DROPOUT, True, PREC, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, MP, GROUP)
        for t in tl.static_range(GROUP):
            bh = b * H + g * GROUP + t
            dv = dvs[t]
            if DROPOUT:
                dv = dv * (1.0 / (1.0 - P_DROP))
            tl.store(DVS[t] + offs_n[:, None] * DV + offs_dv[None, :], dv, mask=cols[:, None] & (offs_dv < DV)[None, :])
            head_prog = bh * tl.num_programs(1) + tl.program_id(1)  # DW2P (B, H, key blocks, HP), DB2P (B, H, ..)
            tl.store(DW2P + head_prog * HP + offs_h, dw2s[t])
            tl.store(DB2P + head_prog, tl.sum(db2s[t]))
        offs_d = tl.arange(0, BLOCK_D)
        for k in tl.static_range(MP):  # into (B, H / GROUP, S, MP BLOCK_D), as k was given with a head axis
            tl.store(DK + offs_n[:, None] * (MP * BLOCK_D) + k * BLOCK_D + offs_d[None, :], dks[k] * scale,
                     mask=cols[:, None])
        tl.store(DW1P + (prog * HP + offs_h[:, None]) * MP + offs_k[None, :], dw1)
        tl.store(DB1P + prog * HP + offs_h, db1)
        tl.store(DSIGP + prog * MP + offs_k, dsig)
