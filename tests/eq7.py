"""The MGK paper's attention written out literally, one query at a time: the formulas the tests check the package
against. torch and math only, nothing from hf_mgk (its fast paths and its own vectorised reference share code, so a
mistake there cannot hide here).

    mgk    Eq. 7: h_i = sum_j softmax_j(score_ij) v_j over M keys k_jr per position, sigma_r^2 = variances[r],
               score_ij = log sum_r pi_r exp(-|q_i - k_jr|^2 / (2 sigma_r^2))     (soft E-step)
               score_ij = max_r (-|q_i - k_jr|^2 / (2 sigma_r^2))                    (hard E-step: no prior)
    mlk    Sec. 2.4: h_i = sum_j a_ij v_j, a_ij proportional to phi(q_i) . sum_r pi_r phi(k_jr), phi = elu + 1
    dot_product   the softmax baseline: a_ij = softmax_j(q_i . k_j / sqrt(D))
    shifted_keys  sMGK's keys k_jr = k_j + s_r (one key projection, a learned shift per key r)

Shapes: q (B, H, N, D); keys (B, H, M, S, D), M keys per position (option A's M key projections, or
shifted_keys(key, shift)); v (B, H, S, Dv); log_prior (H, M) log pi_r, or None: no prior term in Eq. 7 (the uniform
prior up to a constant the softmax cancels), pi_r = 1 / M in MLK.

Which keys query i sees: those with attention_mask[b, j] (B, S bool, True = a real token), and if is_causal those
with j <= i + S - N (the queries are the last N of the S positions). A query that sees no key gets zero weights and a
zero output. Each function returns (output (B, H, N, Dv), weights (B, H, N, S)), differentiable in every input."""

import math

import torch


def shifted_keys(key, shift):
    """sMGK: key (B, H, S, D) and shift (H, M, D) -> keys (B, H, M, S, D), k_jr = k_j + s_r."""
    return key[:, :, None] + shift[None, :, :, None, :]


def mgk(q, keys, v, *, variances, log_prior=None, e_step="soft", attention_mask=None, is_causal=False):
    """Eq. 7 (see the module's docstring); `variances` are the M sigma_r^2, log_prior is unused by the hard E-step."""
    if e_step not in ("soft", "hard"):
        raise ValueError(f"e_step must be 'soft' or 'hard', not {e_step!r}")
    m = keys.shape[2]

    def weights(b, h, i, seen):
        qi = q[b, h, i]
        kr = [keys[b, h, r, seen] for r in range(m)]  # M x (|seen|, D)
        terms = torch.stack([-(qi - kr[r]).pow(2).sum(-1) / (2 * variances[r]) for r in range(m)])  # (M, |seen|)
        if e_step == "hard":
            score = terms.max(0).values
        elif log_prior is None:
            score = torch.logsumexp(terms, 0)
        else:
            score = torch.logsumexp(terms + log_prior[h][:, None], 0)
        return torch.softmax(score, 0)

    return _attend(q, v, attention_mask, is_causal, weights)


def mlk(q, keys, v, *, log_prior=None, attention_mask=None, is_causal=False):
    """Sec. 2.4's mixture of linear keys (see the module's docstring)."""
    m = keys.shape[2]
    pi = torch.full((q.shape[1], m), 1.0 / m, dtype=q.dtype) if log_prior is None else log_prior.exp()

    def phi(x):
        return torch.nn.functional.elu(x) + 1

    def weights(b, h, i, seen):
        kernel = sum(pi[h, r] * phi(keys[b, h, r, seen]) for r in range(m)) @ phi(q[b, h, i])  # (|seen|,)
        return kernel / kernel.sum()

    return _attend(q, v, attention_mask, is_causal, weights)


def dot_product(q, k, v, *, attention_mask=None, is_causal=False):
    """The softmax baseline, k (B, H, S, D): a_ij = softmax_j(q_i . k_j / sqrt(D))."""
    d = q.shape[-1]

    def weights(b, h, i, seen):
        return torch.softmax(k[b, h, seen] @ q[b, h, i] / math.sqrt(d), 0)

    return _attend(q, v, attention_mask, is_causal, weights)


def _attend(q, v, attention_mask, is_causal, weights):
    """One query at a time: the keys it sees, weights(b, h, i, seen) over them, their mix of values."""
    nb, nh, n, _ = q.shape
    s, dv = v.shape[2], v.shape[3]
    outs, rows = [], []
    for b in range(nb):
        for h in range(nh):
            for i in range(n):
                seen = [j for j in range(s) if (attention_mask is None or bool(attention_mask[b, j]))
                        and (not is_causal or j <= i + s - n)]
                if not seen:
                    outs.append(v.new_zeros(dv))
                    rows.append(v.new_zeros(s))
                    continue
                a = weights(b, h, i, seen)
                outs.append(a @ v[b, h, seen])
                rows.append(a.new_zeros(s).index_put((torch.tensor(seen),), a))
    return torch.stack(outs).view(nb, nh, n, dv), torch.stack(rows).view(nb, nh, n, s)
