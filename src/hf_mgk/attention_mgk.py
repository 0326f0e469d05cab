"""Mixture of Gaussian Keys (MGK) and Mixture of Linear Keys (MLK) attention.

Nguyen et al., "Improving Transformers with Probabilistic Attention Keys" (ICML 2022, arXiv:2110.08678), Sec. 2
and App. A.1.
Every key position j carries M keys k_j1..k_jM with prior pi_r and fixed variance sigma_r^2:

    score(i, j) = log sum_r pi_r exp(-|q_i - k_jr|^2 / (2 sigma_r^2))     soft E-step (Eq. 7)
    score(i, j) = max_r (-|q_i - k_jr|^2 / (2 sigma_r^2))                 hard E-step (Sec. 2.3)
    h_i = sum_j softmax_j(score(i, j) + mask) v_j

The soft E-step is exactly softmax attention over N*M keys whose values repeat v_j: with
q~_i = [q_i, 1, -|q_i|^2/2] and k~_jr = [k_jr/sigma_r^2, log pi_r - |k_jr|^2/(2 sigma_r^2), 1/sigma_r^2],
q~_i . k~_jr is the log-kernel term, so a fused SDPA kernel computes MGK with O(N) memory (`_mgk_soft_sdpa`).

Torch only (this file travels next to remote-code model files). Shapes: B batch, H heads, M keys per position,
N queries, S keys, D head size, Dv value size.
"""

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "mgk_attention",
    "mgk_attention_reference",
    "mgk_responsibilities",
    "mlk_attention",
    "mlk_attention_reference",
]


def _as_variances(variances, like: torch.Tensor, num_keys: int) -> torch.Tensor:
    # In the caller's precision: a float32 sigma^2 would cap float64 checks at 1e-8.
    var = torch.as_tensor(variances, dtype=like.dtype, device=like.device).reshape(-1)
    if var.numel() != num_keys:
        raise ValueError(f"`variances` must give one sigma^2 per key: got {var.numel()} values for {num_keys} keys")
    if not bool((var > 0).all()):
        raise ValueError(f"`variances` must be positive, got {var.tolist()}")
    return var


def _check_shapes(query, keys, value):
    if keys.dim() != 5:
        raise ValueError(f"`keys` must be (B, H, M, S, D), got shape {tuple(keys.shape)}")
    b, h, _, d = query.shape
    if keys.shape[0] != b or keys.shape[1] != h or keys.shape[-1] != d:
        raise ValueError(f"`keys` {tuple(keys.shape)} does not match `query` {tuple(query.shape)}")
    if value.shape[:2] != (b, h) or value.shape[2] != keys.shape[3]:
        raise ValueError(f"`value` {tuple(value.shape)} does not match `keys` {tuple(keys.shape)}")


def _allowed(attention_mask, is_causal, n, s, device):
    """Bool (B|1, 1, N, S) mask of the (query, key) pairs that may interact, or None when all may.

    For N < S (cached decoding) queries are the last N positions, so the causal mask is bottom-right aligned."""
    allowed = None
    if attention_mask is not None:
        allowed = attention_mask.bool()[:, None, None, :]
    if is_causal:
        causal = torch.ones(n, s, dtype=torch.bool, device=device).tril(diagonal=s - n)[None, None]
        allowed = causal if allowed is None else allowed & causal
    return allowed


def _log_kernel(query, keys, variances, log_prior, *, literal=False):
    """(B, H, M, N, S) log pi_r - |q_i - k_jr|^2 / (2 sigma_r^2): the Eq. 7 terms.

    literal=True forms every difference q_i - k_jr (B*H*M*N*S*D numbers: the plain reference); otherwise
    |q - k|^2 = |q|^2 - 2 q.k + |k|^2 with one matmul per key (the N x N x M fast form)."""
    var = variances.to(query.dtype)[None, None, :, None, None]
    if literal:
        dist2 = (query[:, :, None, :, None, :] - keys[:, :, :, None, :, :]).pow(2).sum(-1)
    else:
        q_sq = query.pow(2).sum(-1)[:, :, None, :, None]
        k_sq = keys.pow(2).sum(-1)[:, :, :, None, :]
        dist2 = q_sq + k_sq - 2 * torch.matmul(query[:, :, None], keys.transpose(-1, -2))
    out = -dist2 / (2 * var)
    if log_prior is not None:
        out = out + log_prior.to(query.dtype)[None, :, :, None, None]
    return out


def _mgk_scores(query, keys, var, log_prior, e_step, literal):
    if e_step == "soft":
        return torch.logsumexp(_log_kernel(query, keys, var, log_prior, literal=literal), dim=2)
    return _log_kernel(query, keys, var, None, literal=literal).amax(dim=2)  # hard: pi plays no role (Remark 3)


def _masked_softmax(scores, allowed):
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1)


def mgk_attention_reference(query, keys, value, *, variances, log_prior=None, e_step="soft",
                            attention_mask=None, is_causal=False, dropout_p=0.0, return_weights=False):
    """The paper's Eq. 7 computed literally, every q_i - k_jr formed: small inputs only (tests)."""
    return _mgk_dense(query, keys, value, variances, log_prior, e_step, attention_mask, is_causal, dropout_p,
                      return_weights, literal=True)


def _mgk_dense(query, keys, value, variances, log_prior, e_step, attention_mask, is_causal, dropout_p,
               return_weights, literal):
    _check_shapes(query, keys, value)
    var = _as_variances(variances, query, keys.shape[2])
    scores = _mgk_scores(query, keys, var, log_prior, e_step, literal)
    weights = _masked_softmax(scores, _allowed(attention_mask, is_causal, query.shape[2], keys.shape[3], query.device))
    out = torch.matmul(F.dropout(weights, p=dropout_p), value)
    return (out, weights) if return_weights else out


def _mgk_soft_sdpa(query, keys, value, var, log_prior, attention_mask, is_causal, dropout_p):
    """Soft E-step as one SDPA call over M*S augmented keys (exact, O(N) memory with the flash kernel)."""
    b, h, m, s, d = keys.shape
    n, dv = query.shape[2], value.shape[-1]
    # PyTorch's CPU flash kernel needs one head size for q/k and v (else a 4-5x slower math path), so every
    # operand is built at `width` directly inside its one concatenation: no separate pad/copy passes.
    width = max(d + 2, dv)
    inv_var = (1.0 / var).to(query.dtype).view(1, 1, m, 1, 1)
    k_scaled = keys * inv_var                                                          # k_jr / sigma_r^2
    bias = (k_scaled * keys).sum(-1, keepdim=True) * -0.5                              # -|k_jr|^2 / (2 sigma_r^2)
    if log_prior is not None:
        bias = bias + log_prior.to(query.dtype).view(1, h, m, 1, 1)
    k_parts = [k_scaled, bias, inv_var.expand(b, h, m, s, 1)]
    q_parts = [query, query.new_ones(b, h, n, 1), query.pow(2).sum(-1, keepdim=True) * -0.5]
    v_parts = [value]
    if width > d + 2:
        k_parts.append(keys.new_zeros(b, h, m, s, width - d - 2))
        q_parts.append(query.new_zeros(b, h, n, width - d - 2))
    if width > dv:
        v_parts.append(value.new_zeros(b, h, s, width - dv))
    k_aug = torch.cat(k_parts, dim=-1).view(b, h, m * s, width)
    q_aug = torch.cat(q_parts, dim=-1)
    v_aug = torch.cat(v_parts, dim=-1).repeat(1, 1, m, 1)                              # key r of position j -> v_j
    allowed = _allowed(attention_mask, is_causal, n, s, query.device)
    if allowed is not None:
        allowed = allowed.repeat(1, 1, 1, m)
    out = F.scaled_dot_product_attention(q_aug, k_aug, v_aug, attn_mask=allowed, dropout_p=dropout_p, scale=1.0)
    return out[..., :dv] if width > dv else out


def mgk_attention(query, keys, value, *, variances, log_prior=None, e_step="soft", attention_mask=None,
                  is_causal=False, dropout_p=0.0, return_weights=False):
    """MGK attention (Eq. 7). query (B,H,N,D), keys (B,H,M,S,D), value (B,H,S,Dv) -> (B,H,N,Dv).

    variances: the M absolute sigma_r^2; log_prior: (H, M) log pi (None = uniform, which cancels in the softmax);
    attention_mask: bool (B, S), True = real token; dropout_p: dropout on the attention probabilities.
    The soft E-step runs as SDPA over augmented keys; the hard E-step and `return_weights` use the N x N x M
    matmul form, the only one that can hand out the (B, H, N, S) mixture attention matrix.
    """
    if e_step not in ("soft", "hard"):
        raise ValueError(f"`e_step` must be 'soft' or 'hard', got {e_step!r}")
    if e_step == "hard" or return_weights:
        return _mgk_dense(query, keys, value, variances, log_prior, e_step, attention_mask, is_causal, dropout_p,
                          return_weights, literal=False)
    _check_shapes(query, keys, value)
    var = _as_variances(variances, query, keys.shape[2])
    return _mgk_soft_sdpa(query, keys, value, var, log_prior, attention_mask, is_causal, dropout_p)


@torch.no_grad()
def mgk_responsibilities(query, keys, *, variances, log_prior=None, attention_mask=None, is_causal=False):
    """Mean soft-E-step responsibility of each key over valid (query, key) pairs: the M-step pi_r, shape (H, M).

    Eq. 8: gamma_ijr = pi_r N(q_i | k_jr, sigma_r^2) / sum_r' pi_r' N(q_i | k_jr', sigma_r'^2); the paper's
    pi_jr = N_jr / N becomes, with pi shared over positions, the mean of gamma over all valid (i, j).
    Pairs whose responsibilities are not finite (a NaN or inf in that query or key, e.g. one bad row of a
    batch) are left out, so they cannot reach pi; a head with no finite valid pair gets NaN (keep its old pi)."""
    var = _as_variances(variances, query, keys.shape[2])
    log_gamma = torch.log_softmax(_log_kernel(query.float(), keys.float(), var, log_prior), dim=2)  # (B,H,M,N,S)
    gamma = log_gamma.exp()
    used = torch.isfinite(gamma).all(dim=2, keepdim=True)                                        # (B,H,1,N,S)
    allowed = _allowed(attention_mask, is_causal, query.shape[2], keys.shape[3], query.device)
    if allowed is not None:
        used = used & allowed[:, :, None]
    gamma = torch.where(used, gamma, torch.zeros((), dtype=gamma.dtype, device=gamma.device))
    return gamma.sum(dim=(0, 3, 4)) / used.sum(dim=(0, 3, 4)).to(gamma.dtype)


def _elu1(x):
    return F.elu(x) + 1.0


def _mixed_key_features(keys, log_prior):
    """sum_r pi_r phi(k_jr): (B, H, S, D). MLK is linear attention on this one mixed key feature."""
    m = keys.shape[2]
    if log_prior is None:
        prior = torch.full((1, 1, m, 1, 1), 1.0 / m, dtype=keys.dtype, device=keys.device)
    else:
        prior = log_prior.exp().to(keys.dtype)[None, :, :, None, None]
    return (_elu1(keys) * prior).sum(dim=2)


def _float32(*tensors):
    """Half-precision tensors as float32 (float64 kept; None passed through): MLK's sums over N positions."""
    return [None if t is None else t.to(torch.promote_types(t.dtype, torch.float32)) for t in tensors]


def mlk_attention_reference(query, keys, value, *, log_prior=None, attention_mask=None, is_causal=False,
                            return_weights=False):
    """MLK (Sec. 2.4) with the explicit N x S matrix a_ij = phi(q_i).sum_r pi_r phi(k_jr), row-normalised.

    Computed in float32 for half inputs, as `mlk_attention`; the output is the returned (rounded) weights times
    the values, so the weights stay in the autograd graph (gradient-based attribution)."""
    _check_shapes(query, keys, value)
    with torch.autocast(query.device.type, enabled=False):
        q, k, v, log_prior = _float32(query, keys, value, log_prior)
        kernel = torch.matmul(_elu1(q), _mixed_key_features(k, log_prior).transpose(-1, -2))
        allowed = _allowed(attention_mask, is_causal, query.shape[2], keys.shape[3], query.device)
        if allowed is not None:
            kernel = kernel * allowed
        weights = (kernel / kernel.sum(-1, keepdim=True).clamp_min(torch.finfo(kernel.dtype).tiny)).to(query.dtype)
        out = torch.matmul(weights.to(v.dtype), v).to(query.dtype)
    return (out, weights) if return_weights else out


def mlk_attention(query, keys, value, *, log_prior=None, attention_mask=None, is_causal=False,
                  return_weights=False):
    """Mixture of linear keys, phi = elu + 1, in O(N): h_i = phi(q_i)^T KV / phi(q_i)^T Z.

    Non-causal: KV = sum_j phi_j v_j^T and Z = sum_j phi_j; causal: the same as prefix sums over j.
    The sums run in float32 whatever the input dtype or autocast (output in the query's dtype): Z and the
    normaliser phi(q_i)^T Z grow with N and overflow float16 from N ~ 1k (outputs 0 or NaN), and bfloat16
    prefix sums lose the later terms."""
    _check_shapes(query, keys, value)
    if return_weights:
        return mlk_attention_reference(query, keys, value, log_prior=log_prior, attention_mask=attention_mask,
                                       is_causal=is_causal, return_weights=True)
    n, s = query.shape[2], keys.shape[3]
    with torch.autocast(query.device.type, enabled=False):
        q, k, value, log_prior = _float32(query, keys, value, log_prior)
        phi_q = _elu1(q)
        phi_k = _mixed_key_features(k, log_prior)
        if attention_mask is not None:
            phi_k = phi_k * attention_mask[:, None, :, None].to(phi_k.dtype)
        tiny = torch.finfo(phi_q.dtype).tiny
        if not is_causal:
            kv = torch.matmul(phi_k.transpose(-1, -2), value)                            # (B,H,D,Dv)
            z = phi_k.sum(dim=2)                                                          # (B,H,D)
            num = torch.matmul(phi_q, kv)
            den = (phi_q * z[:, :, None, :]).sum(-1, keepdim=True)
        else:
            # Prefix sums; queries are the last N of S positions (bottom-right alignment for cached decoding).
            kv = torch.cumsum(phi_k[..., :, None] * value[..., None, :], dim=2)[:, :, s - n:]  # (B,H,N,D,Dv)
            z = torch.cumsum(phi_k, dim=2)[:, :, s - n:]
            num = torch.einsum("bhnd,bhnde->bhne", phi_q, kv)
            den = (phi_q * z).sum(-1, keepdim=True)
        return (num / den.clamp_min(tiny)).to(query.dtype)
    # Prefix sums; queries are the last N of S positions (bottom-right alignment for cached decoding).
    kv = torch.cumsum(phi_k[..., :, None] * value[..., None, :], dim=2)[:, :, s - n:]     # (B,H,N,D,Dv)
    z = torch.cumsum(phi_k, dim=2)[:, :, s - n:]
    num = torch.einsum("bhnd,bhnde->bhne", phi_q, kv)
    den = (phi_q * z).sum(-1, keepdim=True)
    return num / den.clamp_min(tiny)
