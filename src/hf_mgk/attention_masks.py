"""Which (query, key) pairs may interact, and scores with the others hidden: the masking every kernel shares.

Masks come in three forms: None (every pair), a padding mask bool (B, S) (True = a real token), or a caller's whole
mask (B or 1, 1, N, S), bool (True = may attend) or additive float. Causal masks are bottom-right aligned: with a
key/value cache the N queries are the last N of the S positions, so query i sees the keys j <= i + S - N.

Torch only: this file travels next to the remote-code model files.
"""

import torch

__all__ = ["allowed_pairs", "causal_mask", "is_tracing", "mask_kind", "masked_scores", "rows_with_keys"]


def is_tracing():
    """Whether the call is being traced or compiled (torch.export, torch.onnx, torch.compile, torch.jit.trace).

    A Python branch that reads tensor values must not run then: the graph would keep the one answer of the example
    inputs (the TorchScript tracer), or the trace fails on it (torch.export, fullgraph compile)."""
    return torch.jit.is_tracing() or torch.compiler.is_compiling()


def mask_kind(attention_mask):
    """None, "pairs" (a whole 4-D mask) or "padding" (a (B, S) padding mask): what the backend rules look at."""
    if attention_mask is None:
        return None
    return "pairs" if attention_mask.dim() == 4 else "padding"


def causal_mask(n, s, device):
    """bool (n, s), True where query i may see key j: j <= i + s - n (bottom-right aligned)."""
    return torch.ones(n, s, dtype=torch.bool, device=device).tril(s - n)


def allowed_pairs(attention_mask, is_causal, n, s, device):
    """Which (query, key) pairs may interact: None (all), or a (B or 1, 1, N, S) mask, bool (True = may attend) or
    additive float. A whole 4-D `attention_mask` is returned as it is (it already says which keys each query sees);
    a (B, S) padding mask is combined with the causal mask when `is_causal`."""
    if attention_mask is not None and attention_mask.dim() == 4:
        return attention_mask
    allowed = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
    if is_causal:
        causal = causal_mask(n, s, device)[None, None]
        allowed = causal if allowed is None else allowed & causal
    return allowed


def masked_scores(scores, allowed):
    """`scores` with the pairs `allowed` (from `allowed_pairs`) hides set to the dtype's minimum, or an additive mask
    added."""
    if allowed is None:
        return scores
    if allowed.dtype == torch.bool:
        return scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return scores + allowed.to(scores.dtype)


def rows_with_keys(valid, n, is_causal, offset):
    """bool (B, 1, N, 1): does query i, at position offset + i, see at least one valid key? valid: bool (B, S)
    padding mask. Computed from prefix counts, O(S) memory (no N x S mask)."""
    if is_causal:
        seen = valid.cumsum(-1) > 0
        return seen[:, offset + torch.arange(n, device=valid.device), None][:, None]
    return valid.any(-1)[:, None, None, None].expand(valid.shape[0], 1, n, 1)
