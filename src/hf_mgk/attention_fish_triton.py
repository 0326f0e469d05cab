"""The Triton path of FiSH attention: fused kernels, forward and backward, in the flash pattern.

Nguyen et al., "Improving Transformer with an Admixture of Attention Heads" (NeurIPS 2022), first circulated as
"FiSHformer: Transformer with a Finite Admixture of Shared Heads", whose equation numbers are used here:

    X_k = scale q_k . k_k  (+ sigma_k eps_k: GFiSH's noise, on the network's input)        the M global heads
    linear (FiSH, hard FiSH: Eqn. 9-10; MiSH: Eqn. 11, its one column repeated for every local head):
        A_j = sum_k w_kj X_k  (+ std_j eps_j, std_j = |w_j sigma|: one draw per local head, as attention_fish)
    network ((hard) GFiSH, Eqn. 12): A_j = b2_j + sum_i W2_ji ReLU(b1_i + sum_k W1_ik X_k)
    out_j = softmax_s(A_j + mask) v_j

`attention_fish.fish_attention` (backend="triton") calls `fish_triton`. The flash pattern: Dao et al.,
"FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness" (NeurIPS 2022), Alg. 1 and 2.

Every kernel holds the M global heads of a tile as one (M, rows, keys) block, from one batched product of the
(M, rows, D) queries with the (M, keys, D) keys; the local heads' scores are formed from it in registers (the
network per tile, its hidden layer recomputed where needed), so nothing of size N x S is written.
* Forward: one program per (batch x local head, block of query rows), one pass over the key blocks with an online
  row maximum m, exp2 of (A - m) log2(e). Saved per row: m and log2 of the softmax's sum (+inf and 0 for a row
  that sees no key, whose output is 0); backward forms P = exp2((A - m) log2(e) - log2 l): A - m is exact near the
  maximum, where P matters, whereas one log-sum-exp (A log2(e) - lse) rounds at the size of |A| (measured: 20x the
  reference's float32 error in a cancelling gradient, sigma's, with scores of ~20).
* Backward, with delta_j = dO_j . out_j (torch) and dA_j = P_j (dO_j . v_j - delta_j):
  dQ per (batch, block of query rows), looping over the local heads and the key blocks; it also sums the mixing's
  gradients (dw_kj = sum dA_j X_k, dstd_j = sum dA_j eps_j; the network's dW1, db1, dW2, db2, dsigma) per program,
  summed over programs in torch. dK and dV per (batch, block of keys), looping over the local heads and the query
  blocks (dV of each local head written once, dK summed over the heads in registers).
* Noise and dropout are counter-based draws (attention_triton): noise eps_j = tl.randn(seed + b H + j, n S + s)
  for linear mixing, eps_k = tl.randn(seed + b, (k N + n) S + s) for a network; the dropout mask
  tl.rand(seed' + b H + j, n S + s). The seeds: one per call from the caller's generator (noise) and from torch's
  (dropout). Backward regenerates both; 32-bit counters bound N S (M N S for a network's noise) below 2^31.

Torch, and Triton where it is installed (this file travels next to remote-code model files; without Triton the
other backends run). On CPU tensors the kernels run in Triton's interpreter (TRITON_INTERPRET=1 set before the
import).
"""

import torch
from torch import nn

from .attention_triton import LOG2E, fitted, precision, shape_class, shared_memory, tl, triton, tuned_blocks

if triton is not None:
    from .attention_triton import dot as _dot
    from .attention_triton import keep as _keep
    from .attention_triton import key_end as _key_end
    from .attention_triton import query_start as _query_start
    from .attention_triton import softmax_state as _softmax_state

    _LOG2E = tl.constexpr(LOG2E)  # a kernel reads only constexpr globals

__all__ = ["MAX_GLOBAL_HEADS", "block_sizes", "counters", "fish_triton", "kernel_noise", "noise_seed"]

# The global heads' tile is (M rows-by-keys blocks) in registers: more than this would spill.
MAX_GLOBAL_HEADS = 8


def counters(num_global, n, s, network, noise):
    """The largest counter a call's draws use, + 1 (compare with attention_triton.MAX_COUNTER): N S, M N S for a
    network's noise."""
    return (num_global if network and noise else 1) * n * s


def block_sizes(device_type, num_global, head_size, value_size, dtype=torch.bfloat16, shared=None):
    """(BLOCK_M query rows, BLOCK_N keys) of a program: the interpreter's small tiles (the tests' short sequences
    span several blocks); on a GPU defaults where the (M, rows, keys) block of global scores bounds the rows, fitted
    to the GPU's `shared` memory per program in `dtype` (attention_triton.fitted), or the tuned sizes
    (attention_triton.tuned_blocks)."""
    if device_type == "cpu":
        default = (16, 16)
    else:
        width = triton.next_power_of_2(num_global) * max(head_size, value_size)
        default = fitted((64, 64) if width <= 128 else (32, 64) if width <= 256 else (16, 64), dtype, shared)
    return tuned_blocks("fish", default, shape_class(max(head_size, value_size), num_global))


def noise_seed(generator, device):
    """The seed of a call's noise, one draw from `generator` (or torch's default generator for `device`)."""
    gen_device = generator.device if generator is not None else "cpu"
    return int(torch.randint(0, 2**31 - 2**20, (), generator=generator, device=gen_device))


if triton is not None:

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
    def _linear_noise(seed, b, j, H, offs_m, offs_n, S):
        return tl.randn(seed + b * H + j, offs_m[:, None] * S + offs_n[None, :])

    @triton.jit
    def _global_noise(seed, b, offs_k, offs_m, offs_n, N, S):
        return tl.randn(seed + b, (offs_k[:, None, None] * N + offs_m[None, :, None]) * S + offs_n[None, None, :])

    @triton.jit
    def _global(q3, k3, b, offs_k, offs_m, offs_n, N, S, M, scale, SIG, NSEED,
                NETWORK: tl.constexpr, NOISE: tl.constexpr, PREC: tl.constexpr):
        """X of a tile, (MP, BM, BN), and the network's noise eps (X itself where there is none)."""
        x3 = _dot(q3, tl.permute(k3, 0, 2, 1), PREC) * scale
        eps3 = x3
        if NETWORK and NOISE:
            eps3 = _global_noise(NSEED, b, offs_k, offs_m, offs_n, N, S)
            sig = tl.load(SIG + offs_k, mask=offs_k < M, other=0.0)
            x3 = x3 + sig[:, None, None] * eps3
        return x3, eps3

    @triton.jit
    def _mixed(x3, b, j, offs_k, offs_m, offs_n, N, S, M, H, W, STD, W1, B1, W2, B2, KB, NSEED,
               NETWORK: tl.constexpr, NOISE: tl.constexpr, PADDED: tl.constexpr, CAUSAL: tl.constexpr):
        """A_j of a tile (BM, BN), -inf where hidden (causal, padding, past the ends), and the linear noise eps_j
        (A itself where there is none)."""
        if NETWORK:
            a = tl.zeros([x3.shape[1], x3.shape[2]], tl.float32) + tl.load(B2 + j)
            for i in range(H):
                w1 = tl.load(W1 + i * M + offs_k, mask=offs_k < M, other=0.0)
                pre = tl.sum(w1[:, None, None] * x3, 0) + tl.load(B1 + i)
                a += tl.load(W2 + j * H + i) * tl.maximum(pre, 0.0)
            eps = a
        else:
            w = tl.load(W + offs_k * H + j, mask=offs_k < M, other=0.0)
            a = tl.sum(w[:, None, None] * x3, 0)
            eps = a
            if NOISE:
                eps = _linear_noise(NSEED, b, j, H, offs_m, offs_n, S)
                a += tl.load(STD + j) * eps
        if PADDED:  # 0 for a real key, -inf for padding
            a += tl.load(KB + b * S + offs_n, mask=offs_n < S, other=float("-inf"))[None, :]
        seen = (offs_m < N)[:, None] & (offs_n < S)[None, :]
        if CAUSAL:  # bottom-right aligned: query i sees key j <= i + S - N
            seen = seen & (offs_n[None, :] <= offs_m[:, None] + (S - N))
        return tl.where(seen, a, float("-inf")), eps

    @triton.jit
    def _mixed_grad(x3, da, j, offs_k, offs_h, M, H, W, W1, B1, W2, dw1, db1, dw2,
                    NETWORK: tl.constexpr, PARAMS: tl.constexpr):
        """dX (MP, BM, BN) from dA_j; for a network with PARAMS, this tile's shares of dW1 (HP, MP), db1 (HP,) and row
        j of dW2 (HP,) added to the accumulators (ReLU's gradient 0 at 0, as torch's)."""
        if NETWORK:
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
        else:
            w = tl.load(W + offs_k * H + j, mask=offs_k < M, other=0.0)
            dx3 = w[:, None, None] * da[None, :, :]
        return dx3, dw1, db1, dw2

    @triton.jit
    def _fwd_kernel(Q, K, V, W, STD, SIG, W1, B1, W2, B2, KB, O, LSE, N, S, D, DV, M, H, scale, P_DROP, SEED,
                    NSEED, MP: tl.constexpr, NETWORK: tl.constexpr, NOISE: tl.constexpr, PADDED: tl.constexpr,
                    CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
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
            x3, _ = _global(q3, k3, b, offs_k, offs_m, offs_n, N, S, M, scale, SIG, NSEED, NETWORK, NOISE, PREC)
            a, _ = _mixed(x3, b, j, offs_k, offs_m, offs_n, N, S, M, H, W, STD, W1, B1, W2, B2, KB, NSEED, NETWORK,
                          NOISE, PADDED, CAUSAL)
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
    def _tile_grad(q3, k3, do, row_max, log2_l, delta, v, b, j, offs_k, offs_m, offs_n, N, S, M, H, scale, W, STD,
                   SIG, W1, B1, W2, B2, KB, P_DROP, SEED, NSEED, NETWORK: tl.constexpr, NOISE: tl.constexpr,
                   PADDED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr):
        """What both backward kernels recompute for a tile of local head j: X and the network's noise, the linear
        noise, the weights P as the forward applied them to V (dropped), and dA."""
        x3, eps3 = _global(q3, k3, b, offs_k, offs_m, offs_n, N, S, M, scale, SIG, NSEED, NETWORK, NOISE, PREC)
        a, eps = _mixed(x3, b, j, offs_k, offs_m, offs_n, N, S, M, H, W, STD, W1, B1, W2, B2, KB, NSEED, NETWORK,
                        NOISE, PADDED, CAUSAL)
        p = tl.exp2((a - row_max[:, None]) * _LOG2E - log2_l[:, None])
        dp = _dot(do, tl.trans(v), PREC)
        p_used = p
        if DROPOUT:  # d P_ij = mask_ij dO_i . v_j / (1 - p)
            kept = _keep(SEED, b * H + j, offs_m, offs_n, S, P_DROP)
            p_used = tl.where(kept, p / (1.0 - P_DROP), 0.0)
            dp = tl.where(kept, dp / (1.0 - P_DROP), 0.0)
        return x3, eps3, eps, p_used, p * (dp - delta[:, None])

    @triton.jit
    def _bwd_q_kernel(Q, K, V, DO, LSE, DELTA, W, STD, SIG, W1, B1, W2, B2, KB, DQ, DWP, DSP, DW1P, DB1P, DW2P, DB2P,
                      DSIGP, N, S, D, DV, M, H, scale, P_DROP, SEED, NSEED, MP: tl.constexpr, HP: tl.constexpr,
                      NETWORK: tl.constexpr, NOISE: tl.constexpr, PADDED: tl.constexpr, CAUSAL: tl.constexpr,
                      DROPOUT: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
        """dq_k = scale sum_j sum_s dX_jk k_k for one block of query rows, and this program's shares of the mixing's
        gradients (per local head into DWP / DSP / DW2P / DB2P, summed over the heads into DW1P / DB1P / DSIGP)."""
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
            dw = tl.zeros([MP], tl.float32)
            dstd = tl.zeros([BLOCK_M], tl.float32)
            db2 = tl.zeros([BLOCK_M], tl.float32)
            dw2 = tl.zeros([HP], tl.float32)
            for start_n in range(0, hi, BLOCK_N):
                offs_n = start_n + tl.arange(0, BLOCK_N)
                k3 = _load3(K, offs_k, offs_n, offs_d, M, S, D)
                v = tl.load(Vj + offs_n[:, None] * DV + offs_dv[None, :],
                            mask=(offs_n < S)[:, None] & (offs_dv < DV)[None, :], other=0.0)
                x3, eps3, eps, _, da = _tile_grad(
                    q3, k3, do, row_max, log2_l, delta, v, b, j, offs_k, offs_m, offs_n, N, S, M, H, scale, W, STD, SIG,
                    W1, B1, W2, B2, KB, P_DROP, SEED, NSEED, NETWORK, NOISE, PADDED, CAUSAL, DROPOUT, PREC)
                dx3, dw1, db1, dw2 = _mixed_grad(x3, da, j, offs_k, offs_h, M, H, W, W1, B1, W2, dw1, db1, dw2,
                                                 NETWORK, True)
                if NETWORK:
                    db2 += tl.sum(da, 1)
                    if NOISE:
                        dsig += tl.sum(tl.sum(dx3 * eps3, 2), 1)
                else:
                    dw += tl.sum(tl.sum(x3 * da[None, :, :], 2), 1)
                    if NOISE:
                        dstd += tl.sum(da * eps, 1)
                dq3 += _dot(dx3.to(k3.dtype), k3, PREC)
            if NETWORK:
                tl.store(DW2P + (prog * H + j) * HP + offs_h, dw2)
                tl.store(DB2P + prog * H + j, tl.sum(db2))
            else:
                tl.store(DWP + (prog * H + j) * MP + offs_k, dw)
                tl.store(DSP + prog * H + j, tl.sum(dstd))
        tl.store(DQ + (offs_k[:, None, None] * N + offs_m[None, :, None]) * D + offs_d[None, None, :],
                 dq3 * scale, mask=(offs_k < M)[:, None, None] & rows[None, :, None] & (offs_d < D)[None, None, :])
        if NETWORK:
            tl.store(DW1P + (prog * HP + offs_h[:, None]) * MP + offs_k[None, :], dw1)
            tl.store(DB1P + prog * HP + offs_h, db1)
            tl.store(DSIGP + prog * MP + offs_k, dsig)

    @triton.jit
    def _bwd_kv_kernel(Q, K, V, DO, LSE, DELTA, W, STD, SIG, W1, B1, W2, B2, KB, DK, DVO, N, S, D, DV, M, H, scale,
                       P_DROP, SEED, NSEED, MP: tl.constexpr, HP: tl.constexpr, NETWORK: tl.constexpr,
                       NOISE: tl.constexpr, PADDED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
                       PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                       BLOCK_DV: tl.constexpr):
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
                x3, _, _, p_used, da = _tile_grad(
                    q3, k3, do, row_max, log2_l, delta, v, b, j, offs_k, offs_m, offs_n, N, S, M, H, scale, W, STD, SIG,
                    W1, B1, W2, B2, KB, P_DROP, SEED, NSEED, NETWORK, NOISE, PADDED, CAUSAL, DROPOUT, PREC)
                dv += _dot(tl.trans(p_used).to(do.dtype), do, PREC)
                dx3, _, _, _ = _mixed_grad(x3, da, j, offs_k, offs_h, M, H, W, W1, B1, W2, unused2, unused, unused,
                                           NETWORK, False)
                dk3 += _dot(tl.permute(dx3, 0, 2, 1).to(q3.dtype), q3, PREC)
            tl.store(DVO + bh * S * DV + offs_n[:, None] * DV + offs_dv[None, :], dv,
                     mask=cols[:, None] & (offs_dv < DV)[None, :])
        tl.store(DK + (offs_k[:, None, None] * S + offs_n[None, :, None]) * D + offs_d[None, None, :],
                 dk3 * scale, mask=(offs_k < M)[:, None, None] & cols[None, :, None] & (offs_d < D)[None, None, :])

    @triton.jit
    def _noise_kernel(E, N, S, M, H, NSEED, NETWORK: tl.constexpr, MP: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):
        """The noise the kernels draw, written out (B, M or H, N, S): for tests, and for anyone who wants to see it."""
        b = tl.program_id(0)
        offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, MP)
        seen = (offs_m < N)[:, None] & (offs_n < S)[None, :]
        if NETWORK:
            eps3 = _global_noise(NSEED, b, offs_k, offs_m, offs_n, N, S)
            tl.store(E + b.to(tl.int64) * M * N * S + (offs_k[:, None, None] * N + offs_m[None, :, None]) * S
                     + offs_n[None, None, :],
                     eps3, mask=(offs_k < M)[:, None, None] & seen[None, :, :])
        else:
            for j in range(H):
                eps = _linear_noise(NSEED, b, j, H, offs_m, offs_n, S)
                tl.store(E + (b.to(tl.int64) * H + j) * N * S + offs_m[:, None] * S + offs_n[None, :], eps, mask=seen)


def kernel_noise(seed, batch, num_global, num_heads, n, s, network, device):
    """eps as the kernels draw it for a call with this noise seed (`noise_seed`): (B, M, N, S) for a network (on its
    input), (B, H, N, S) for linear mixing (one draw per local head), float32."""
    heads = num_global if network else num_heads
    eps = torch.empty(batch, heads, n, s, dtype=torch.float32, device=device)
    grid = (batch, triton.cdiv(n, 16), triton.cdiv(s, 16))
    _noise_kernel[grid](eps, n, s, num_global, num_heads, seed, NETWORK=network,
                        MP=triton.next_power_of_2(num_global), BLOCK_M=16, BLOCK_N=16)
    return eps


class _TritonFiSH(torch.autograd.Function):
    """Inputs q, k (B, M, N|S, D), v (B, H, S, Dv) in the compute dtype; float32 w (M, H) and std (H,) (linear) or
    sigma (M,), W1, b1, W2, b2 (network), each None where unused, kb (B, S) 0 / -inf or None."""

    @staticmethod
    def forward(ctx, q, k, v, w, std, sigma, w1, b1, w2, b2, kb, scale, causal, dropout_p, seed, nseed):
        b, m, n, d = q.shape
        h, s, dv = v.shape[1], v.shape[2], v.shape[3]
        network = w1 is not None
        block_m, block_n = block_sizes(q.device.type, m, d, dv, q.dtype, shared_memory(q.device))
        dummy = q.new_zeros(1, dtype=torch.float32)
        tensors = [t if t is not None else dummy for t in (w, std, sigma, w1, b1, w2, b2, kb)]
        out = torch.empty(b, h, n, dv, dtype=q.dtype, device=q.device)
        lse = torch.empty(b, h, n, 2, dtype=torch.float32, device=q.device)
        consts = dict(MP=triton.next_power_of_2(m), NETWORK=network,
                      NOISE=(sigma if network else std) is not None, PADDED=kb is not None, CAUSAL=causal,
                      DROPOUT=dropout_p > 0, PREC=precision(q.dtype, q.device.type, float32="tf32x3"),
                      BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
                      BLOCK_DV=max(16, triton.next_power_of_2(dv)))
        runtime = (n, s, d, dv, m, h, float(scale), float(dropout_p), seed, nseed)
        _fwd_kernel[(b * h, triton.cdiv(n, block_m))](q, k, v, *tensors, out, lse, *runtime, **consts)
        ctx.save_for_backward(q, k, v, out, lse, *tensors)
        ctx.runtime, ctx.consts, ctx.given = runtime, consts, [t is not None for t in (w, std, sigma, w1, b1, w2, b2)]
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse, *tensors = ctx.saved_tensors
        n, s, d, dv_size, m, h = ctx.runtime[:6]
        consts = ctx.consts
        b = q.shape[0]
        mp, hp = consts["MP"], triton.next_power_of_2(h)
        dout = dout.contiguous()
        delta = (dout.float() * out.float()).sum(-1).contiguous()
        f32 = dict(dtype=torch.float32, device=q.device)
        programs = b * triton.cdiv(n, consts["BLOCK_M"])
        dq = torch.empty(b, m, n, d, **f32)
        dk = torch.empty(b, m, s, d, **f32)
        dv = torch.empty(b, h, s, dv_size, **f32)
        dwp, dsp = torch.zeros(programs, h, mp, **f32), torch.zeros(programs, h, **f32)
        dw1p, db1p = torch.zeros(programs, hp, mp, **f32), torch.zeros(programs, hp, **f32)
        dw2p, db2p = torch.zeros(programs, h, hp, **f32), torch.zeros(programs, h, **f32)
        dsigp = torch.zeros(programs, mp, **f32)
        common = (q, k, v, dout, lse, delta, *tensors)
        _bwd_q_kernel[(b, triton.cdiv(n, consts["BLOCK_M"]))](*common, dq, dwp, dsp, dw1p, db1p, dw2p, db2p, dsigp,
                                                               *ctx.runtime, HP=hp, **consts)
        _bwd_kv_kernel[(b, triton.cdiv(s, consts["BLOCK_N"]))](*common, dk, dv, *ctx.runtime, HP=hp, **consts)
        grads = [dwp.sum(0)[:, :m].t(), dsp.sum(0), dsigp.sum(0)[:m], dw1p.sum(0)[:h, :m], db1p.sum(0)[:h],
                 dw2p.sum(0)[:, :h], db2p.sum(0)]
        grads = [g if given else None for g, given in zip(grads, ctx.given)]
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), *grads, None, None, None, None, None, None)


def fish_triton(query, key, value, mixing, scale, noise_std, attention_mask, is_causal, dropout_p=0.0,
                generator=None):
    """FiSH / hard FiSH / MiSH (mixing an (M, H) or (M, 1) tensor) or (hard) GFiSH (make_gfish_mixing's network)
    with the Triton kernels; the arguments as attention_fish.fish_attention's (attention_mask: bool (B, S) or None).
    float32 / bfloat16 / float16 inputs (under autocast: its dtype), float32 accumulation and mixing; output in
    the compute dtype."""
    b, m, n, _ = query.shape
    h, s = value.shape[1], value.shape[2]
    dtype = query.dtype
    if dtype == torch.float32 and torch.is_autocast_enabled(query.device.type):  # as autocast runs matmuls
        dtype = torch.get_autocast_dtype(query.device.type)
    network = isinstance(mixing, nn.Module)
    nseed = noise_seed(generator, query.device) if noise_std is not None else 0
    # dropout drawn in the kernels from one seed of torch's global generator (a seeded run repeats)
    seed = int(torch.randint(0, 2**31 - 2**20, (), device="cpu")) if dropout_p > 0 else 0
    with torch.autocast(query.device.type, enabled=False):
        w = std = sigma = w1 = b1 = w2 = b2 = None
        if network:
            w1, b1, w2, b2 = (t.float().contiguous() for t in (mixing[0].weight, mixing[0].bias, mixing[2].weight,
                                                                mixing[2].bias))
            sigma = None if noise_std is None else noise_std.float().contiguous()
        else:
            p = mixing.float()
            w = p.expand(m, h).contiguous()  # MiSH: its one column for every local head (gradients summed back)
            if noise_std is not None:  # the std of sum_k p_kj sigma_k eps_jk, as attention_fish
                std = torch.linalg.vector_norm(p * noise_std.float()[:, None], dim=0).expand(h).contiguous()
        kb = None
        if attention_mask is not None:
            kb = torch.zeros(b, s, dtype=torch.float32, device=query.device).masked_fill(
                ~attention_mask.bool(), float("-inf"))
    q, k, v = (t.to(dtype).contiguous() for t in (query, key, value))
    return _TritonFiSH.apply(q, k, v, w, std, sigma, w1, b1, w2, b2, kb, scale, bool(is_causal), float(dropout_p),
                             seed, nseed)
