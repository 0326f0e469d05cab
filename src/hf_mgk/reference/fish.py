"""FiSH written out: Nguyen et al., "Improving Transformer with an Admixture of Attention Heads" (NeurIPS 2022),
whose preprint "FiSHformer: Transformer with a Finite Admixture of Shared Heads" numbers the equations used here.

    G_k = scale Q_k K_k^T                                    the M global heads (scaled before mixing)
    FiSH / hard FiSH (Eqn. 9, 10):  A_j = sum_k p_kj (G_k + sigma_k eps_jk)    (noise in training only)
    MiSH (Eqn. 11):                 the same with one column p_k for every local head
    GFiSH (Eqn. 12):                A = network(G + sigma eps) along the head axis
    out_j = softmax(A_j + mask) V_j
"""

import torch
import torch.nn.functional as F
from torch import nn

from .masks import pair_mask, softmax_over_visible


def fish_attention_reference(query, key, value, mixing, *, scale=None, noise_std=None, attention_mask=None,
                             is_causal=False, return_weights=False, dropout_p=0.0, generator=None, block_rows=128,
                             noise=None):
    """The formula in one piece, with the arguments of hf_mgk.fish_attention: query, key (B, M, N|S, D), value
    (B, H, S, Dv); mixing an (M, H) or (M, 1) tensor of p_kj, or a module mapping the last axis from M to H.

    Noise: sum_k p_kj sigma_k eps_jk with independent eps_jk ~ N(0, 1) has the distribution of one draw per local
    head scaled by sqrt(sum_k p_kj^2 sigma_k^2); that form is used (as fish_attention does), and its numbers are
    drawn in fish_attention's order (`_noise`, with the same `block_rows`), so that both give the same output from
    one generator state; or, given `noise` (B, M or H, N, S), those numbers (e.g. the compiled path's, which it draws
    inside its kernel). A query that sees no key gets a zero output. Softmax in float32 at least (as HF's eager
    attention)."""
    B, M, N, D = query.shape
    S, H = key.shape[2], value.shape[1]
    scale = D ** -0.5 if scale is None else float(scale)
    g = torch.einsum("bknd,bksd->bkns", query, key) * scale                            # (B, M, N, S)
    network = isinstance(mixing, nn.Module)
    eps = None
    if noise_std is not None and noise is not None:
        eps = noise.to(query.dtype)
    elif noise_std is not None:
        eps = _noise(B, M if network else H, N, S, is_causal, generator, block_rows, query)
    if network:
        if eps is not None:
            g = g + noise_std.to(g.dtype)[:, None, None] * eps
        scores = mixing(g.movedim(1, -1)).movedim(-1, 1)                                # (B, H, N, S)
    else:
        p = mixing.to(g.dtype)
        scores = torch.einsum("kh,bkns->bhns", p, g)                                    # (B, H or 1, N, S)
        if eps is not None:
            std = torch.linalg.vector_norm(p * noise_std.to(g.dtype)[:, None], dim=0)   # (H or 1,)
            scores = scores + std[:, None, None] * eps
    mask = pair_mask(attention_mask, is_causal, N, S, query.device)
    softmax_dtype = torch.promote_types(scores.dtype, torch.float32)
    weights = softmax_over_visible(scores, mask, dtype=softmax_dtype).to(value.dtype).expand(B, H, N, S)
    weights = F.dropout(weights, p=dropout_p)
    out = weights @ value
    return (out, weights) if return_weights else out


def _noise(B, heads, N, S, is_causal, generator, block_rows, like):
    """eps ~ N(0, 1), (B, heads, N, S), drawn as fish_attention draws it: per block of `block_rows` query rows in
    order, over the keys the block's rows may see (causal: up to its last row's position, at least one key); zero
    on the pairs no draw covers (all of them hidden)."""
    eps = like.new_zeros(B, heads, N, S)
    for start in range(0, N, block_rows):
        stop = min(N, start + block_rows)
        end = min(S, max(1, stop + S - N)) if is_causal else S
        eps[:, :, start:stop, :end] = torch.randn((B, heads, stop - start, end), generator=generator,
                                                  device=like.device, dtype=like.dtype)
    return eps
