"""Which keys each query sees, written out: the masks the references share (within this package only)."""

import torch


def pair_mask(attention_mask, is_causal, n, s, device, offset=None):
    """(B or 1, 1, N, S): bool, True where query i may attend to key j; or a caller's whole additive float mask.

    Query i sits at position offset + i (default s - n: the last N of the S positions, as with a key/value cache)
    and key j at position j; causal: j <= offset + i. attention_mask: None, bool (B, S) (True = a real token) or a
    whole (B or 1, 1, N, S) mask, which is returned as it is."""
    if attention_mask is not None and attention_mask.dim() == 4:
        return attention_mask
    query_pos = (s - n if offset is None else offset) + torch.arange(n, device=device)
    key_pos = torch.arange(s, device=device)
    mask = torch.ones(1, 1, n, s, dtype=torch.bool, device=device)
    if is_causal:
        mask = mask & (key_pos[None, :] <= query_pos[:, None])
    if attention_mask is not None:
        mask = mask & attention_mask.bool()[:, None, None, :]
    return mask


def softmax_over_visible(scores, mask, dtype=None):
    """softmax_j over the keys `mask` allows (an additive mask: added to the scores), in `dtype` if given. A row
    that sees no key gets all-zero weights (its softmax is taken over every key and then zeroed, so no NaN reaches
    the gradients)."""
    if mask.dtype != torch.bool:
        return torch.softmax(scores + mask.to(scores.dtype), dim=-1, dtype=dtype)
    has_key = mask.any(-1, keepdim=True)
    scores = scores.masked_fill(~(mask | ~has_key), float("-inf"))
    return torch.softmax(scores, dim=-1, dtype=dtype).masked_fill(~has_key, 0.0)
