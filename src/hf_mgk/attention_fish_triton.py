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

The kernels (forward; the backward, one pass) take both kinds of mixing and run one body for each, so nothing of
size N x S is written:
* linear mixing (attention_fish_triton_linear): folded into the query, A_j = q'_j . k' with q'_j = concat_k(scale
  w_kj q_k) and k' = concat_k(k_k) formed here (`_fold`, `_concat_keys`): local head j is flash attention of depth
  M D (padded per head to BLOCK_D) with its own V, every product one 2-D tl.dot (wgmma on sm_90), nothing per pair
  for the mixing; the noise std_j eps_j added to A. The backward in one pass, per (batch x local head, block of
  keys) over the query blocks, keys as the products' rows: head j's share dA_j^T q'_j of dk' (summed here), and
  G_j = dA_j k' added by float32 atomics; torch forms dq = scale sum_j w_kj G_jk and dw_kj = scale sum q_k . G_jk
  (O(H N M D)).
* a network ((hard) GFiSH, attention_fish_triton_network): the M global heads of a tile unrolled, each a 2-D
  product, the network per tile in registers, a program per group of local heads (`heads_a_program`: the global
  scores and the hidden layer once a tile for the group); the backward in one pass, per (batch x group, block of
  keys): the group's share of dk, dq added by atomics, each program's shares of the network's gradients.
* Forward: one program per (batch x local head, or a network's group, block of query rows), one pass over the key
  blocks with an online row maximum m, exp2 of (A - m) log2(e). Saved per row: m and log2 of the softmax's sum (+inf
  and 0 for a row that sees no key, whose output is 0); backward forms P = exp2((A - m) log2(e) - log2 l): A - m is
  exact near the maximum, where P matters, whereas one log-sum-exp (A log2(e) - lse) rounds at the size of |A|
  (measured: 20x the reference's float32 error in a cancelling gradient, sigma's, with scores of ~20). The output is
  computed in float32 and rounded afterwards, so that backward's delta_j = dO_j . out_j (torch) is the unrounded
  output's.
* Noise and dropout are counter-based draws (attention_triton): the noise attention_triton.normal_tile
  (Philox4x32-10 under key (seed, stream), all four words of a call used: two Box-Muller pairs), stream b H + j for
  linear mixing (one normal per pair and local head), b for a network (rows k N + n: one per pair and global head);
  the dropout mask attention_triton.keep (stream 2^31 + b H + j: one word a pair, four a call). The seeds: one per
  call from the caller's generator (noise) and from torch's (dropout). Backward regenerates both; 32-bit counters
  bound N S (M N S for a network's noise) below 2^31.

Torch, and Triton where it is installed (this file travels next to remote-code model files; without Triton the
other backends run). On CPU tensors the kernels run in Triton's interpreter (TRITON_INTERPRET=1 set before the
import).
"""

import torch
from torch import nn

from .attention_triton import draw_seed, fitted, precision, shape_class, shared_memory, tl, triton, tuned_blocks

__all__ = ["MAX_GLOBAL_HEADS", "block_sizes", "counters", "fish_triton", "kernel_noise", "noise_seed"]

# The global heads' tile is (M rows-by-keys blocks) in registers: more than this would spill.
MAX_GLOBAL_HEADS = 8


def counters(num_global, n, s, network, noise):
    """The largest counter a call's draws use, + 1 (compare with attention_triton.MAX_COUNTER): N S, M N S for a
    network's noise."""
    return (num_global if network and noise else 1) * n * s


def block_sizes(device_type, num_global, head_size, value_size, dtype=torch.bfloat16, shared=None):
    """(BLOCK_M query rows, BLOCK_N keys) of a program: the interpreter's small tiles (the tests' short sequences
    span several blocks); on a GPU defaults where the (M, rows, keys) block of global scores bounds the rows, with
    fewer keys past width 128 where the GPU's `shared` memory per program is under 200 KB and halved in float32
    (attention_triton.fitted), or the tuned sizes (attention_triton.tuned_blocks)."""
    if device_type == "cpu":
        default = (16, 16)
    else:
        width = triton.next_power_of_2(num_global) * max(head_size, value_size)
        default = (64, 64) if width <= 128 else (32, 64) if width <= 256 else (16, 64)
        if width > 128 and shared is not None and shared < 200 * 1024:
            # the folded key tile (keys x width, 3 stages) at 64 keys passes sm_86's 99 KB from width 256 on
            default = (default[0], 32)
        default = fitted(default, dtype)
    return tuned_blocks("fish", default, shape_class(max(head_size, value_size), num_global))


def noise_seed(generator, device):
    """The seed of a call's noise: attention_triton.draw_seed from `generator`, or the default generator of
    `device`."""
    return draw_seed(torch.device(device), generator)


def kv_rows(block_m, network=False):
    """The query rows an iteration of the one-pass backward's programs (per block of keys) covers where the blocks
    are tuned or not studied (`launch_configs`): a quarter of BLOCK_M for linear mixing, half for a network (16 at
    least). They hold dk (keys x M D, float32), dV and dq's product (rows x M D) beside the tiles: at half the block
    (32 of 64) linear mixing spilled inside the loop on sm_90 in bf16 at M = 2 (spill loads / stores an iteration:
    hard FiSH 60, FiSH 351), at 16 rows 6 / 110. A network's iteration pays a fixed cost, the tile sums of its
    parameters' gradients per hidden unit, so fewer rows cost more."""
    return max(16, int(block_m) // (2 if network else 4))


# The launches of the half-precision defaults where M x D <= 128 and D <= 64, by (kind of mixing, dropout): the
# forward's (BLOCK_M, BLOCK_N, warps) and the backward's (query rows an iteration, BLOCK_N keys a program, warps).
# Chosen on sm_90's model (bf16, D = 64, M = 2; kernel notes, "FiSH launches"): the cheapest of every (BLOCK_M,
# BLOCK_N) in 64-128 x 32-128, backward rows 16-64, 4 or 8 warps, whose loops spill at most ~1% of their
# instructions (with dropout, causal and padding too). Cycles a pair, forward + backward, from the 64 x 64 blocks
# before: linear 0.127 + 0.270 -> 0.094 + 0.250 (its tensor-core floor: 11 units of 64-deep products a pair), with
# noise 0.271 + 0.445 -> 0.254 + 0.438; with dropout linear mixing keeps 64 x 64 forwards (128 rows spilled inside
# the loop) and 16-row backwards. A network (programs of NETWORK_GROUP = 2 local heads): hard GFiSH 0.483 + 2.000 ->
# 0.285 + 1.259, GFiSH 0.769 + 2.401 -> 0.482 + 1.777 (its 64-row backward: 1.466 but 190 spill instructions an
# iteration, 3% of its loop); hard GFiSH takes GFiSH's launches with dropout (its own spilled 3-5% of the loops).
LAUNCHES = {("linear", False): ((128, 64, 4), (32, 64, 4)),
            ("linear", True): ((64, 64, 4), (16, 64, 4)),
            ("noise", False): ((128, 32, 4), (16, 128, 8)),
            ("noise", True): ((64, 64, 4), (16, 128, 8)),
            ("network", False): ((128, 64, 8), (64, 64, 8)),
            ("network", True): ((128, 32, 8), (32, 64, 8)),
            ("network noise", False): ((128, 32, 8), (32, 64, 8)),
            ("network noise", True): ((128, 32, 8), (32, 64, 8))}


# A network's program covers this many local heads (at most; `heads_a_program`): the global scores and the hidden layer
# are formed once a tile for them (kernel notes, "A program per group of local heads").
NETWORK_GROUP = 2


def heads_a_program(num_heads, network, device_type="cuda", dtype=torch.bfloat16):
    """The local heads one program of a network's kernels covers: the largest divisor of H up to NETWORK_GROUP (so
    every program's heads exist); 1 for linear mixing, whose programs are per local head, and for float32 on a GPU
    (its tiles take twice the bytes: two heads' backward at float32's blocks needs 104 KB, over sm_86's 99 KB)."""
    if not network or (device_type != "cpu" and dtype == torch.float32):
        return 1
    return max(g for g in range(1, min(NETWORK_GROUP, num_heads) + 1) if num_heads % g == 0)


def launch_configs(device_type, num_global, head_size, value_size, dtype=torch.bfloat16, shared=None, network=False,
                   noise=False, dropout=False):
    """((BLOCK_M, BLOCK_N, num_warps) of the forward, (rows, BLOCK_N, num_warps) of the backward) of a call: for
    half precision on a GPU with M x D <= 128 and D <= 64 the studied defaults (LAUNCHES, by mixing: a network with
    or without noise, linear with noise, linear without; and dropout); else, or where HF_MGK_TRITON_BLOCKS tunes the
    blocks, `block_sizes` for both passes, 4 warps, the backward over kv_rows of BLOCK_M."""
    width = triton.next_power_of_2(num_global) * max(16, triton.next_power_of_2(max(head_size, value_size)))
    studied = (device_type != "cpu" and dtype != torch.float32 and width <= 128 and max(head_size, value_size) <= 64
               and tuned_blocks("fish", None, shape_class(max(head_size, value_size), num_global)) is None)
    if studied:
        kind = ("network noise" if noise else "network") if network else "noise" if noise else "linear"
        return LAUNCHES[kind, bool(dropout)]
    return block_launches(*block_sizes(device_type, num_global, head_size, value_size, dtype, shared), network)


def block_launches(block_m, block_n, network=False):
    """The launches of given (BLOCK_M, BLOCK_N) (tuned, or not studied): both passes at them with Triton's 4 warps,
    the backward's programs over kv_rows of BLOCK_M."""
    return (block_m, block_n, 4), (kv_rows(block_m, network), block_n, 4)


if triton is not None:
    from .attention_fish_triton_linear import bwd_kv as _lin_bwd_kv
    from .attention_fish_triton_linear import fwd as _lin_fwd
    from .attention_fish_triton_linear import noise as _lin_noise

    from .attention_fish_triton_network import bwd_kv as _net_bwd_kv
    from .attention_fish_triton_network import fwd as _net_fwd
    from .attention_fish_triton_network import global_noise as _net_global_noise

    # Each kernel takes both kinds of mixing (the same names, arguments and constants as before the split) and runs
    # one body: linear mixing folded into the query (attention_fish_triton_linear) or the network on the (MP, rows,
    # keys) block of global scores (attention_fish_triton_network). Linear: Q, K are q' (B, H, N, W) and k' (B, S, W)
    # with W = MP BLOCK_D (`_fold`), DQ receives G (B, H, N, W; zeroed, added to by the backward's programs), DK
    # each head's share of dk' (B, H, S, W), DSP dstd's shares; a network's DQ (B, N, MP BLOCK_D) and the D*P partial
    # sums of its gradients; a share per (batch, local head, key block): a program's.

    @triton.jit
    def _fwd_kernel(Q, K, V, W, STD, SIG, W1, B1, W2, B2, KB, O, LSE, N, S, D, DV, M, H, scale, P_DROP, SEED,
                    NSEED, MP: tl.constexpr, NETWORK: tl.constexpr, NOISE: tl.constexpr, PADDED: tl.constexpr,
                    CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, GROUP: tl.constexpr):
        if NETWORK:
            _net_fwd(Q, K, V, SIG, W1, B1, W2, B2, KB, O, LSE, N, S, D, BLOCK_DV, M, H, scale, P_DROP, SEED, NSEED, MP,
                     NOISE, PADDED, CAUSAL, DROPOUT, PREC, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, GROUP)
        else:
            _lin_fwd(Q, K, V, STD, KB, O, LSE, N, S, H, P_DROP, SEED, NSEED, NOISE, PADDED, CAUSAL, DROPOUT, PREC,
                     BLOCK_M, BLOCK_N, BLOCK_DV, MP * BLOCK_D)

    @triton.jit
    def _bwd_kv_kernel(Q, K, V, DO, LSE, DELTA, W, STD, SIG, W1, B1, W2, B2, KB, DK, DVO, DQ, DSP, DW1P, DB1P, DW2P,
                       DB2P, DSIGP, N, S, D, DV, M, H, scale, P_DROP, SEED, NSEED, MP: tl.constexpr, HP: tl.constexpr,
                       NETWORK: tl.constexpr, NOISE: tl.constexpr, PADDED: tl.constexpr, CAUSAL: tl.constexpr,
                       DROPOUT: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, GROUP: tl.constexpr):
        # the backward in one pass: dk, dv, and dq by atomics, per (batch x local head, block of BLOCK_N keys) over
        # blocks of BLOCK_M query rows (launch_configs' backward rows, fewer than the forward's): dK (BLOCK_N x W)
        # and dV in float32 take twice the baseline's accumulators, and at full blocks the tiles beside them (the
        # noise's words, a network's MP tiles of X and dX, dq's products) spilled
        if NETWORK:
            _net_bwd_kv(Q, K, V, DO, LSE, DELTA, SIG, W1, B1, W2, B2, KB, DK, DVO, DQ, DW1P, DB1P, DW2P, DB2P, DSIGP, N,
                        S, D, BLOCK_DV, M, H, scale, P_DROP, SEED, NSEED, MP, HP, NOISE, PADDED, CAUSAL, DROPOUT, PREC,
                        BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, GROUP)
        else:
            _lin_bwd_kv(Q, K, V, DO, LSE, DELTA, STD, KB, DK, DVO, DQ, DSP, N, S, H, P_DROP, SEED, NSEED, NOISE, PADDED,
                        CAUSAL, DROPOUT, PREC, BLOCK_M, BLOCK_N, BLOCK_DV, MP * BLOCK_D)

    @triton.jit
    def _noise_kernel(E, N, S, M, H, NSEED, NETWORK: tl.constexpr, MP: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):
        """The noise the kernels draw, written out (B, M or H, N, S): for tests, and for anyone who wants to see it."""
        b = tl.program_id(0)
        offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        start_n = tl.program_id(2) * BLOCK_N
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, MP)
        seen = (offs_m < N)[:, None] & (offs_n < S)[None, :]
        if NETWORK:
            eps3 = _net_global_noise(NSEED, b, offs_k, offs_m, start_n, N, S, BLOCK_N)
            tl.store(E + b.to(tl.int64) * M * N * S + (offs_k[:, None, None] * N + offs_m[None, :, None]) * S
                     + offs_n[None, None, :],
                     eps3, mask=(offs_k < M)[:, None, None] & seen[None, :, :])
        else:
            for j in range(H):
                eps = _lin_noise(NSEED, b, j, H, offs_m, start_n, S, BLOCK_N)
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


def _fold(q, w, scale, width):
    """q' (B, H, N, width) in q's dtype: q'_j = concat_k(scale w_kj q_k), each global head's D columns padded with
    zeros to width / next_power_of_2(M) (the kernels' BLOCK_D). Formed per local head in float32 and rounded once, so
    the forward and backward fold alike; a (B, N, M, D) float32 temporary, not (B, H, M, N, D)."""
    b, m, n, d = q.shape
    h = w.shape[1]
    mp = triton.next_power_of_2(m)
    out = q.new_zeros(b, h, n, mp, width // mp)
    rows = q.float().permute(0, 2, 1, 3)  # (B, N, M, D)
    sw = w * scale
    for j in range(h):
        out[:, j, :, :m, :d] = (rows * sw[:, j, None]).to(q.dtype)
    return out.view(b, h, n, width)


def _concat_keys(k, width):
    """k' (B, S, width): concat_k(k_k), each head's columns padded as `_fold`'s (also a network's q and k)."""
    b, m, s, d = k.shape
    mp = triton.next_power_of_2(m)
    out = k.new_zeros(b, s, mp, width // mp)
    out[:, :, :m, :d] = k.permute(0, 2, 1, 3)
    return out.view(b, s, width)


def consts_dv(dv):
    """BLOCK_DV of a value size: the linear kernels' row stride of V, dO, the output and dV."""
    return max(16, triton.next_power_of_2(dv))


def _pad(x, width):
    """x with its last axis padded with zeros to `width` (itself, contiguous, where it has that width)."""
    return x.contiguous() if x.shape[-1] == width else torch.nn.functional.pad(x, (0, width - x.shape[-1]))


def _unfold(x, m, d):
    """(..., R, width) float32 -> (..., M, R, D): the global heads' columns of a folded gradient."""
    mp = triton.next_power_of_2(m)
    return x.view(*x.shape[:-1], mp, x.shape[-1] // mp)[..., :m, :d].movedim(-2, -3)


class _TritonFiSH(torch.autograd.Function):
    """Inputs q, k (B, M, N|S, D), v (B, H, S, Dv) in the compute dtype; float32 w (M, H) and std (H,) (linear) or
    sigma (M,), W1, b1, W2, b2 (network), each None where unused, kb (B, S) 0 / -inf or None."""

    @staticmethod
    def forward(ctx, q, k, v, w, std, sigma, w1, b1, w2, b2, kb, scale, causal, dropout_p, seed, nseed):
        b, m, n, d = q.shape
        h, s, dv = v.shape[1], v.shape[2], v.shape[3]
        network = w1 is not None
        if network:  # W1's columns and sigma padded to MP with zeros: the kernels read them unmasked
            mp = triton.next_power_of_2(q.shape[1])
            w1 = torch.nn.functional.pad(w1, (0, mp - w1.shape[1]))
            sigma = None if sigma is None else torch.nn.functional.pad(sigma, (0, mp - sigma.shape[0]))
        fwd, bwd = launch_configs(q.device.type, m, d, dv, q.dtype, shared_memory(q.device), network,
                                  (sigma if network else std) is not None, dropout_p > 0)
        block_m, block_n, warps = fwd
        dummy = q.new_zeros(1, dtype=torch.float32)
        tensors = [t if t is not None else dummy for t in (w, std, sigma, w1, b1, w2, b2, kb)]
        # the output in float32, rounded to the compute dtype afterwards: backward's delta = dO . out from the
        # unrounded output (from the rounded one, half precision's rounding enters every row's dA, and sigma's
        # gradient, a cancelling sum over the pairs, amplified it past its tolerance in tests)
        width_v = consts_dv(dv)
        out = torch.empty(b, h, n, width_v, dtype=torch.float32, device=q.device)
        lse = torch.empty(b, h, n, 2, dtype=torch.float32, device=q.device)
        group = heads_a_program(h, network, q.device.type, q.dtype)
        consts = dict(MP=triton.next_power_of_2(m), NETWORK=network, GROUP=group,
                      NOISE=(sigma if network else std) is not None, PADDED=kb is not None, CAUSAL=causal,
                      DROPOUT=dropout_p > 0, PREC=precision(q.dtype, q.device.type, float32="tf32x3"),
                      BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
                      BLOCK_DV=consts_dv(dv))
        runtime = (n, s, d, dv, m, h, float(scale), float(dropout_p), seed, nseed)
        width = consts["MP"] * consts["BLOCK_D"]
        qkv = (_concat_keys(q, width) if network else _fold(q, w, scale, width), _concat_keys(k, width),
               _pad(v, width_v))
        _fwd_kernel[(b * h // group, triton.cdiv(n, block_m))](*qkv, *tensors, out, lse, *runtime, num_warps=warps,
                                                               **consts)
        out = out[..., :dv]
        ctx.save_for_backward(q, k, v, out, lse, *tensors)
        rows, keys, warps = bwd  # the backward's blocks: its rows an iteration as BLOCK_M
        ctx.consts = dict(consts, BLOCK_M=rows, BLOCK_N=keys)
        ctx.runtime, ctx.warps, ctx.given = runtime, warps, [t is not None for t in (w, std, sigma, w1, b1, w2, b2)]
        return out.to(q.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse, *tensors = ctx.saved_tensors
        n, s, d, dv_size, m, h, scale = ctx.runtime[:7]
        consts = ctx.consts
        b = q.shape[0]
        mp, hp = consts["MP"], triton.next_power_of_2(h)
        dout = dout.contiguous()
        delta = (dout.float() * out.float()).sum(-1).contiguous()
        f32 = dict(dtype=torch.float32, device=q.device)
        k_blocks = triton.cdiv(s, consts["BLOCK_N"])
        if not consts["PADDED"] and s % consts["BLOCK_N"]:
            # the last key block passes S, and the rows its program does not bounds-mask (free_queries_start) would
            # give the keys past S weight: a padding bias of zeros, whose loads give -inf past S, masks them (an
            # add a pair in these calls only; a mask in every row block would cost the main loop every call)
            tensors[-1] = torch.zeros(b, s, dtype=torch.float32, device=q.device)
            consts = dict(consts, PADDED=True)
        width = mp * consts["BLOCK_D"]
        # one pass, a program per (batch x GROUP local heads, block of keys): each program's share of dk (summed
        # here), dq added by the programs (zeroed), each program's shares of the mixing's gradients (of dW2, db2 each
        # head's)
        groups = h // consts["GROUP"]
        dout, dk = _pad(dout, consts_dv(dv_size)), torch.empty(b, groups, s, width, **f32)  # V, dO rows of BLOCK_DV
        programs, heads = (b, groups, k_blocks), (b, h, k_blocks)
        if consts["NETWORK"]:  # q and k with their heads side by side (padded), dq and dk likewise
            qw, dq = _concat_keys(q, width), torch.zeros(b, n, width, **f32)
        else:  # G_j = dL/dq'_j per local head, dk' (module docstring)
            qw, dq = _fold(q, tensors[0], scale, width), torch.zeros(b, h, n, width, **f32)
        qkv = (qw, _concat_keys(k, width), _pad(v, consts_dv(dv_size)))
        dv = torch.empty(b, h, s, qkv[2].shape[-1], **f32)
        dsp, db2p = torch.zeros(programs, **f32), torch.zeros(heads, **f32)
        dw1p, db1p = torch.zeros(*programs, hp, mp, **f32), torch.zeros(*programs, hp, **f32)
        dw2p, dsigp = torch.zeros(*heads, hp, **f32), torch.zeros(*programs, mp, **f32)
        _bwd_kv_kernel[(b * groups, k_blocks)](*qkv, dout, lse, delta, *tensors, dk, dv, dq, dsp, dw1p, db1p, dw2p,
                                               db2p, dsigp, *ctx.runtime, HP=hp, num_warps=ctx.warps, **consts)
        dk = dk.sum(1)
        if consts["NETWORK"]:
            over = (0, 1, 2)
            grads = [None, None, dsigp.sum(over)[:m], dw1p.sum(over)[:h, :m], db1p.sum(over)[:h],
                     dw2p.sum((0, 2))[:, :h], db2p.sum((0, 2))]
            dq = _unfold(dq, m, d)
        else:  # dq_k = scale sum_j w_kj G_jk, dw_kj = scale sum q_k . G_jk, dstd_j = sum of its programs' shares
            g, w = _unfold(dq, m, d), tensors[0]  # (B, H, M, N, D)
            dq = torch.einsum("bhknd,kh->bknd", g, w * scale)
            dw = torch.einsum("bhknd,bknd->kh", g, q.float()) * scale
            grads = [dw, dsp.sum((0, 2)), None, None, None, None, None]
        dk = _unfold(dk, m, d)
        grads = [g if given else None for g, given in zip(grads, ctx.given)]
        return (dq.to(q.dtype), dk.to(k.dtype), dv[..., :dv_size].to(v.dtype), *grads, None, None, None, None, None, None)


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
    # dropout drawn in the kernels from one seed of the device's generator (a seeded run repeats)
    seed = draw_seed(query.device) if dropout_p > 0 else 0
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
