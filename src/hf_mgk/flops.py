"""The papers' cost formulas as code, for the benchmark and for anyone comparing configurations on paper.

Nothing here runs a model: every function takes sizes and returns counts. Notation: N sequence length,
d_model = D_x the hidden size, D the head size, M keys per position (MGK), m random features (NPRF).
``num_heads`` is always the number of heads the model itself has (MGK's H/M, not the baseline's H).

- MGK, App. B of "Improving Transformers with Probabilistic Attention Keys" (Nguyen et al., ICML 2022):
  FLOPs of one attention layer (Q, K, V projections, Q K^T, A V, output projection; no softmax, no bias),
  a product (m x k)(k x n) counted as m n (2k - 1) operations. `mgk_attention_flops` / `mgk_attention_params`.
- FiSH, App. D of "Transformers with a Finite Admixture of Shared Heads": `hf_mgk.attention_fish.fish_cost`
  (the attention-matrix part only), re-exported here as `fish_cost`.
- NPRF, "Stable, Fast and Accurate: Kernelized Attention with Relative Positional Encoding" (Luo et al., 2021)
  states its cost only as O(N log N) (§3.2, the Toeplitz products of Eqs. (12)-(13) by FFT) against the O(N^2)
  of forming the N x N matrix; it gives no count. `nprf_attention_flops` counts those products itself.

torch.utils.flop_counter.FlopCounterMode counts 2 m n k per product and nothing elementwise; tests/test_flops.py
states and asserts, for each formula, how it relates to what FlopCounterMode counts on the package's models.
"""

import math

from .attention_fish import fish_cost

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
