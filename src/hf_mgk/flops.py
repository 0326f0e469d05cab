"""The papers' cost formulas as code, for the benchmark and for anyone comparing configurations on paper.

Nothing here runs a model: every function takes sizes and returns counts. Notation: N sequence length,
d_model = D_x the hidden size, D the head size, M keys per position (MGK), m random features (NPRF).
``num_heads`` is always the number of heads the model itself has (MGK's H/M, not the baseline's H).

- MGK, App. B of "Improving Transformers with Probabilistic Attention Keys" (Nguyen et al., ICML 2022):
  FLOPs of one attention layer (Q, K, V projections, Q K^T, A V, output projection; no softmax, no bias),
  a product (m x k)(k x n) counted as m n (2k - 1) operations. `mgk_attention_flops` / `mgk_attention_params`.
- FiSH, App. D of "Transformers with a Finite Admixture of Shared Heads": `fish_cost` (the attention-matrix part
  only).
- NPRF, "Stable, Fast and Accurate: Kernelized Attention with Relative Positional Encoding" (Luo et al., 2021)
  states its cost only as O(N log N) (§3.2, the Toeplitz products of Eqs. (12)-(13) by FFT) against the O(N^2)
  of forming the N x N matrix; it gives no count. `nprf_attention_flops` counts those products itself.

torch.utils.flop_counter.FlopCounterMode counts 2 m n k per product and nothing elementwise; tests/test_flops.py
states and asserts, for each formula, how it relates to what FlopCounterMode counts on the package's models.
"""

import math

__all__ = ["mgk_attention_flops", "mgk_attention_params", "nprf_attention_flops", "fish_cost"]


def mgk_attention_flops(seq_len, d_model, num_heads, head_dim, num_keys=1):
    """App. B, one attention layer, for any D_x (the paper takes D_x = H D in the output projection).

    num_keys=1: (i) softmax attention with H = num_heads heads, per head 3 N D (2 D_x - 1) for Q, K, V,
    N^2 (2D - 1) for Q K^T, N (2N - 1) D for A V; the output projection N D_x (2 H D - 1). With D_x = H D this is
    the paper's N^2 H (4D - 1) + N H D (6 D_x + 2 H D - 5).
    num_keys=M > 1: (ii) a mixture of M Gaussian keys with h = num_heads heads (the paper's H/M), per head
    N^2 ((2M + 2) D - 1) + N D ((M + 2)(2 D_x - 1) - 1) (M keys' distances cost what M dot products cost), and the
    output projection N D_x (2 h D - 1): App. B's own line before its closed form. That closed form,
    N^2 H (2(M + 1) D - 1) / M + N H D (2(M + 2) D_x / M + 2 H D / M - (3M + 2) / M), carries -(3M + 2)/M where the
    line gives -(2M + 3)/M: it is N H D (M - 1) / M lower (M = 2: the printed N^2 H (3D - 0.5) + N H D (4 D_x + H D - 4)
    against -3.5 in the last term; 0.01% of a layer at N = 512, D = 64, D_x = 512). This follows the line.
    """
    n, dx, h, d, m = seq_len, d_model, num_heads, head_dim, num_keys
    if m == 1:
        per_head = 3 * n * d * (2 * dx - 1) + n * n * (2 * d - 1) + n * (2 * n - 1) * d
    else:
        per_head = n * n * ((2 * m + 2) * d - 1) + n * d * ((m + 2) * (2 * dx - 1) - 1)
    return h * per_head + n * dx * (2 * h * d - 1)


def mgk_attention_params(d_model, num_heads, head_dim, num_keys=1):
    """App. B.2, weights of one attention layer (no biases): (iii) softmax 3 H D D_x + H D D_x (the paper's
    (H D)^2 with D_x = H D); (iv) M keys, h = num_heads heads: Q and V h D D_x each, the M keys M h D D_x, the
    output h D D_x and the priors pi_jr, M per head. With h = H/2, M = 2, D_x = H D: 2 H D D_x + 0.5 (H D)^2 + H."""
    dx, h, d, m = d_model, num_heads, head_dim, num_keys
    if m == 1:
        return 4 * h * d * dx
    return (m + 3) * h * d * dx + m * h


def nprf_attention_flops(seq_len, d_model, num_heads, head_dim, num_features, *, toeplitz="fft"):
    """Products of one NPRF attention layer (Eqs. (10)-(13) of Luo et al.), FlopCounterMode's convention
    (2 m n k per product; the paper has none of its own), per layer, no bias:

        projections      Q, K, V, output                     4 * 2 N D_x H D
        feature maps     phi(q^), phi(k^) = exp(W x - ...)   H * 2 * 2 N D m
        Toeplitz part    C [phi(k) v^T, phi(k)], E = m (D + 1) channels, then phi(q) against them:
          toeplitz="explicit"  the N x N matrix formed: (phi(Q) phi(K)^T o C) [V, 1]: H * (2 N^2 m + 2 N^2 (D + 1))
          toeplitz="fft"       per channel two real FFTs of length L = 2N (5/2 L log2 L each, the radix-2
                               count) and the spectrum product (6 (L/2 + 1)); the channels N E multiplies and
                               the contraction with phi(q) 2 N E: H * (E (5 L log2 L + 6 (L/2 + 1)) + 3 N E)
    The "fft" form is the paper's O(N log N); the "explicit" one its quadratic alternative."""
    n, dx, h, d, m = seq_len, d_model, num_heads, head_dim, num_features
    linear = 4 * 2 * n * dx * h * d + h * 2 * 2 * n * d * m
    if toeplitz == "explicit":
        return linear + h * (2 * n * n * m + 2 * n * n * (d + 1))
    if toeplitz == "fft":
        e, length = m * (d + 1), 2 * n
        fft = 5 * length * math.log2(length) + 6 * (length // 2 + 1)
        return linear + h * round(e * fft + 3 * n * e)
    raise ValueError(f"toeplitz must be 'fft' or 'explicit', got {toeplitz!r}")


def fish_cost(d_model, num_heads, num_global_heads, head_dim, seq_len, *, variant="fish"):
    """FLOPs and parameters of the attention-matrix part of one layer, App. D of the FiSH paper.

    Notation of App. D: D_x = d_model, D = head_dim, H local heads, M global heads, N = seq_len.
    A matrix product (m x k)(k x n) counts m*n*(2k-1) operations (k multiplications, k-1 additions
    per entry); softmax, the product with V and the output projection are left out (they are the same
    for both models), and projections have no bias.

        (i)   H-head attention FLOPs    N^2 H (2D-1) + 2 N H D (2 D_x - 1)
        (ii)  FiSH FLOPs                N^2 M (2D-1) + 2 N M D (2 D_x - 1) + H (2M-1) N^2 + M N^2
                                        = [2 (D+H) M - H] N^2 + 2 N M D (2 D_x - 1)
              saving (i) - (ii)         [2 (H-M) D - 2 M H] N^2 + 2 (H-M) D (2 D_x - 1) N
        (iii) H-head attention params   2 H D D_x
        (iv)  FiSH params               2 M D D_x + H M + M          (p_kj and sigma_k)
              saving (iii) - (iv)       2 (H-M) D D_x - H M - M

    ``variant="fish"`` is App. D exactly. The others change only the mixing and noise terms, counted
    the same way (these are ours, not the paper's):
        hard_fish   no noise: minus M N^2 FLOPs and the M sigma_k;
        mish        p_k shared by all local heads: one mixed matrix, (2M-1) N^2 instead of
                    H (2M-1) N^2, and M mixing weights instead of H M (the noise is counted as
                    M N^2, as App. D does for fish);
        gfish       Linear(M, H) + bias, ReLU (not counted, like softmax), Linear(H, H) + bias:
                    H (2M-1) N^2 + H N^2 + H (2H-1) N^2 + H N^2 FLOPs, H M + H + H^2 + H weights;
        hard_gfish  gfish without noise.

    Returns a dict: mha_flops, fish_flops, flops_saved, mha_params, fish_params, params_saved.
    """
    Dx, H, M, D, N = d_model, num_heads, num_global_heads, head_dim, seq_len
    if variant not in ("fish", "hard_fish", "mish", "gfish", "hard_gfish"):
        raise ValueError(f"unknown variant {variant!r}")
    noise = not variant.startswith("hard")
    mha_flops = N * N * H * (2 * D - 1) + 2 * N * H * D * (2 * Dx - 1)  # (i)
    mha_params = 2 * H * D * Dx  # (iii)
    global_flops = N * N * M * (2 * D - 1) + 2 * N * M * D * (2 * Dx - 1)  # the M global matrices
    global_params = 2 * M * D * Dx
    if variant in ("gfish", "hard_gfish"):
        mix_flops = (H * (2 * M - 1) + H + H * (2 * H - 1) + H) * N * N
        mix_params = H * M + H + H * H + H
    else:
        local = 1 if variant == "mish" else H
        mix_flops = local * (2 * M - 1) * N * N
        mix_params = local * M
    fish_flops = global_flops + mix_flops + (M * N * N if noise else 0)  # (ii) for "fish"
    fish_params = global_params + mix_params + (M if noise else 0)  # (iv) for "fish"
    return {
        "mha_flops": mha_flops, "fish_flops": fish_flops, "flops_saved": mha_flops - fish_flops,
        "mha_params": mha_params, "fish_params": fish_params, "params_saved": mha_params - fish_params,
    }
