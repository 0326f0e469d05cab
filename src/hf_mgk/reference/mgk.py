"""MGK and MLK written out: Nguyen et al., "Improving Transformers with Probabilistic Attention Keys" (ICML 2022,
arXiv:2110.08678).

    soft E-step (Eq. 7):  score(i, j) = log sum_r pi_r exp(-|q_i - k_jr|^2 / (2 sigma_r^2))
    hard E-step (Sec. 2.3): score(i, j) = max_r -|q_i - k_jr|^2 / (2 sigma_r^2)        (pi plays no role)
    h_i = sum_j softmax_j(score(i, j)) v_j over the keys query i sees
    MLK (Sec. 2.4): a_ij = phi(q_i) . sum_r pi_r phi(k_jr) / sum_j' (the same), phi = elu + 1
"""

import torch
import torch.nn.functional as F

from .masks import pair_mask, softmax_over_visible


def mgk_attention_reference(query, keys, value, *, variances, log_prior=None, e_step="soft", attention_mask=None,
                            is_causal=False, dropout_p=0.0, return_weights=False):
    """Eq. 7 with every difference q_i - k_jr formed (B*H*M*N*S*D numbers). query (B, H, N, D), keys
    (B, H, M, S, D), value (B, H, S, Dv); variances: the M sigma_r^2; log_prior (H, M) log pi or None (uniform);
    attention_mask: None, bool (B, S) or a whole (B or 1, 1, N, S) mask; causal: bottom-right aligned. A query that
    sees no key gets a zero output. Returns the output (B, H, N, Dv), and the weights too with return_weights."""
    if e_step not in ("soft", "hard"):
        raise ValueError(f"`e_step` must be 'soft' or 'hard', got {e_step!r}")
    var = torch.as_tensor(variances, dtype=query.dtype, device=query.device).reshape(1, 1, -1, 1, 1)
    diff = query[:, :, None, :, None, :] - keys[:, :, :, None, :, :]                    # (B, H, M, N, S, D)
    log_kernel = -diff.pow(2).sum(-1) / (2 * var)                                        # (B, H, M, N, S)
    if e_step == "soft":
        if log_prior is not None:
            log_kernel = log_kernel + log_prior.to(query.dtype)[None, :, :, None, None]
        scores = torch.logsumexp(log_kernel, dim=2)
    else:
        scores = log_kernel.amax(dim=2)
    mask = pair_mask(attention_mask, is_causal, query.shape[2], keys.shape[3], query.device)
    weights = softmax_over_visible(scores, mask)
    out = F.dropout(weights, p=dropout_p) @ value
    return (out, weights) if return_weights else out


def smgk_attention_reference(query, key, key_shift, value, **kwargs):
    """sMGK (Sec. 2.3, option B): MGK with the M keys k_jr = k_j + b_r. key (B, H, S, D), key_shift (H, M, D)."""
    return mgk_attention_reference(query, key[:, :, None] + key_shift[None, :, :, None, :], value, **kwargs)


def mlk_attention_reference(query, keys, value, *, log_prior=None, attention_mask=None, is_causal=False,
                            return_weights=False):
    """Sec. 2.4 with the explicit N x S matrix, in float32 for half inputs (autocast off). An additive 4-D mask
    multiplies each term by its exp; a query that sees no key gets a zero output."""
    with torch.autocast(query.device.type, enabled=False):
        dtype = torch.promote_types(query.dtype, torch.float32)
        q, k, v = (t.to(dtype) for t in (query, keys, value))
        num_keys = k.shape[2]
        if log_prior is None:
            prior = torch.full((q.shape[1], num_keys), 1.0 / num_keys, dtype=dtype, device=q.device)
        else:
            prior = log_prior.to(dtype).exp()
        kernel = torch.einsum("bhnd,bhmsd,hm->bhns", F.elu(q) + 1, F.elu(k) + 1, prior)
        mask = pair_mask(attention_mask, is_causal, q.shape[2], k.shape[3], q.device)
        kernel = kernel * (mask.to(dtype) if mask.dtype == torch.bool else mask.to(dtype).exp())
        den = kernel.sum(-1, keepdim=True)
        weights = kernel / torch.where(den > 0, den, torch.ones_like(den))
        out = weights @ v
    return (out.to(query.dtype), weights.to(query.dtype)) if return_weights else out.to(query.dtype)
