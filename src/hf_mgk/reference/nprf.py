"""NPRF + RPE written out: Luo et al., "Stable, Fast and Accurate: Kernelized Attention with Relative Positional
Encoding" (NeurIPS 2021, arXiv:2106.12566), with the Toeplitz matrix C built as an explicit N x S matrix (O(N^2)).

    q^ = q/|q|,  k^ = k/|k|                                 Sec. 3.3 (normalize=True)
    phi(x) = exp(W x - |x|^2/2) / sqrt(m)                    Eq. (5), W (m, D)
    c_{j-i} = exp(b_{j-i})                                   Eq. (6)
    z_i = sum_j c_{j-i} phi(q^_i).phi(k^_j) v_j / sum_j c_{j-i} phi(q^_i).phi(k^_j)      Eq. (10)
"""

import math

import torch
import torch.nn.functional as F


def nprf_attention_reference(query, key, value, rpe_bias, features, *, normalize=True, max_distance=None,
                             attention_mask=None, is_causal=False, return_weights=False, query_offset=None):
    """Eq. (10) with the arguments of hf_mgk.nprf_attention: query (B, H, N, D) at positions query_offset + i
    (default S - N), key (B, H, S, D), value (B, H, S, Dv); rpe_bias (H or 1, 2S - 1), b_t at index t + S - 1, or
    None (c = 1); max_distance w: b_t for |t| > w is b_{+-w}; attention_mask: None, bool (B, S), or a whole
    (B or 1, 1, N, S) mask, bool or additive (its exp multiplies the pair's term); causal: c_t = 0 for t > 0.
    Float32 for half inputs (autocast off). A query with no valid key gets z = 0.
    Returns z (B, H, N, Dv), and the (B, H, N, S) weights with return_weights."""
    B, H, N, D = query.shape
    S = key.shape[2]
    if N > S and (rpe_bias is not None or is_causal):
        raise ValueError("relative positions and causal masking need N <= S (queries = the last N positions)")
    offset = S - N if query_offset is None else query_offset
    with torch.autocast(query.device.type, enabled=False):
        dtype = torch.promote_types(query.dtype, torch.float32)
        q, k, v, W = (t.to(dtype) for t in (query, key, value, features))
        if normalize:
            q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)

        def phi(x):
            return torch.exp(x @ W.T - 0.5 * x.pow(2).sum(-1, keepdim=True)) / math.sqrt(W.shape[0])

        t = torch.arange(S, device=q.device)[None, :] - (offset + torch.arange(N, device=q.device))[:, None]
        if rpe_bias is None:
            c = torch.ones(1, N, S, dtype=dtype, device=q.device)
        else:
            read = t if max_distance is None else t.clamp(-max_distance, max_distance)
            c = torch.exp(rpe_bias.to(dtype)[:, read + S - 1])                          # (H or 1, N, S)
        if is_causal:
            c = c * (t <= 0)
        a = (phi(q) @ phi(k).transpose(-1, -2)) * c                                     # (B, H, N, S)
        if attention_mask is not None and attention_mask.dim() == 4:
            mask = attention_mask.to(q.device)
            a = a * (mask.to(dtype) if mask.dtype == torch.bool else mask.to(dtype).exp())
        elif attention_mask is not None:
            a = a * attention_mask.to(device=q.device, dtype=dtype)[:, None, None, :]
        den = a.sum(-1, keepdim=True)
        weights = a / torch.where(den > 0, den, torch.ones_like(den))
        z = weights @ v
    return (z.to(query.dtype), weights.to(query.dtype)) if return_weights else z.to(query.dtype)
