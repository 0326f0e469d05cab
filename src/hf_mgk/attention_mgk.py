"""Mixture of Gaussian Keys (MGK) and Mixture of Linear Keys (MLK) attention.

Nguyen et al., "Improving Transformers with Probabilistic Attention Keys" (ICML 2022, arXiv:2110.08678), Sec. 2
and App. A.1.
Every key position j carries M keys k_j1..k_jM with prior pi_r and fixed variance sigma_r^2:

    score(i, j) = log sum_r pi_r exp(-|q_i - k_jr|^2 / (2 sigma_r^2))     soft E-step (Eq. 7)
    score(i, j) = max_r (-|q_i - k_jr|^2 / (2 sigma_r^2))                 hard E-step (Sec. 2.3)
    h_i = sum_j softmax_j(score(i, j) + mask) v_j

Four exact backends compute it (`choose_backend` picks one for backend="auto"):
  dense    the N x N x M matmul form; the only one that hands out the (B, H, N, S) weights.
  sdpa     the soft E-step as softmax attention over N*M keys whose values repeat v_j: with q~_i = [q_i, 1,
           -|q_i|^2/2] and k~_jr = [k_jr/sigma_r^2, log pi_r - |k_jr|^2/(2 sigma_r^2), 1/sigma_r^2], q~_i . k~_jr is
           the log-kernel term, so one fused SDPA call computes MGK with O(N) memory.
  blocked  per block of query rows, the M keys' log-kernel terms from one product (sMGK: one q.k for all M
           shifted keys), the keys' exponentials summed and multiplied by V once, with a hand-written backward
           (attention_mgk_blocked.py).
  triton   fused Triton kernels in the flash pattern, forward and backward (attention_mgk_triton.py): CUDA tensors,
           or CPU tensors in Triton's interpreter (TRITON_INTERPRET=1 set before triton is imported).
A fourth, "compiled" (torch.compile / inductor), was measured slower than these everywhere and removed; asking
for it is a ValueError that says so.
The plain references the tests hold these to are in `hf_mgk.reference` (not part of this file).

Torch only (this file travels next to remote-code model files). Shapes: B batch, H heads, M keys per position,
N queries, S keys, D head size, Dv value size.
"""

import torch
import torch.nn.functional as F

from .attention_autotune import fall_back, timed
from .attention_blocks import autocast_enabled, records_grad, resolve_backend
from .attention_mgk_blocked import BLOCK_ROWS, KEEP_BYTES, MIN_ROW_SUM, mgk_blocked
from .attention_mgk_triton import mgk_triton
from .attention_triton import MAX_COUNTER, deterministic_refusal, length_refusal
from .attention_mgk_triton import available as triton_available
from .attention_mgk_triton import refusal as triton_refusal
from .attention_masks import allowed_pairs, causal_mask, is_tracing, mask_kind, masked_scores

__all__ = [
    "BACKENDS",
    "MLK_BACKENDS",
    "choose_backend",
    "choose_mlk_backend",
    "mgk_attention",
    "mgk_responsibilities",
    "mgk_responsibility_totals",
    "mlk_attention",
    "smgk_attention",
]

BACKENDS = ("dense", "sdpa", "blocked", "triton")
MLK_BACKENDS = ("dense", "linear")
# The most keys per position the Triton kernels take: the M they are tested for (1 to 4).
MAX_TRITON_KEYS = 4
# Chunk length of causal MLK (`_causal_linear`).
MLK_CHUNK = 64


def choose_backend(*, e_step, return_weights, device_type, dtype, autocast, tracing, mask, triton=False,
                   head_size=64, variance_grad=False, num_keys=2, counter=0, requires_grad=False, length=0):
    """The backend `mgk_attention` / `smgk_attention` run with backend="auto", from plain facts about the call:
    e_step "soft" / "hard"; device_type e.g. "cpu"; dtype the query's; autocast: whether autocast is on for that
    device; tracing: traced or compiled; mask: None, "padding" (B, S) or "pairs" (a whole 4-D mask); triton:
    whether Triton is installed; head_size: the larger of the q / k and v head sizes;
    variance_grad: the variances are a tensor that needs a gradient; num_keys: M; counter: the largest counter
    of the call's dropout draws (N x S with dropout, else 0; the kernels count in 32 bits); requires_grad:
    autograd records the call (the hard E-step's kernels add gradients by atomics: not under
    torch.use_deterministic_algorithms); length: max(N, S) (the kernels' grids bound it).

    The weights come from the dense form only. On the CPU in float32 / float64 outside autocast (a padding mask or
    none, not traced: its Python loop reads tensor values) the blocked path, with or without autograd, so that
    training and evaluation compute bit for bit the same function. On a CUDA GPU with Triton the fused kernels,
    for the calls they cover (`_refusals`: a padding mask or none, not traced, fixed variances, M <= MAX_TRITON_KEYS, head
    sizes up to attention_mgk_triton.MAX_HEAD_SIZE, float32 / bfloat16 / float16); never on the CPU (there they run
    only in Triton's interpreter, for tests).
    Elsewhere (other accelerators, half precision, autocast, and what the kernels do not cover) the soft E-step as
    one SDPA call, the hard E-step in the dense form.
    Why (timings): hf-mgk's docs/benchmarks/kernel-notes.md#mgk-path-rule."""
    if return_weights:
        return "dense"
    if (device_type == "cpu" and dtype in (torch.float32, torch.float64) and not autocast and not tracing
            and mask != "pairs"):
        return "blocked"
    if device_type == "cuda" and triton and _triton_refusal(
            e_step=e_step, return_weights=return_weights, device_type=device_type, dtype=dtype, tracing=tracing,
            mask=mask, triton=triton, head_size=head_size, variance_grad=variance_grad, num_keys=num_keys,
            counter=counter, requires_grad=requires_grad, length=length) is None:
        return "triton"
    return "dense" if e_step == "hard" else "sdpa"


def _triton_refusal(*, return_weights, device_type, dtype, tracing, mask, triton, head_size, variance_grad,
                    num_keys=2, counter=0, e_step="soft", requires_grad=False, length=0, **_):
    """Why the Triton kernels cannot run a call (None: they can); `triton`: whether they can be used at all."""
    family = deterministic_refusal(e_step == "hard" and requires_grad) or (
        "return_weights (only 'dense' forms the weights)" if return_weights
        else "variances that need a gradient (sigma is fixed in the Triton kernels)" if variance_grad
        else f"{num_keys} keys per position (the kernels are tested for M = 1 to {MAX_TRITON_KEYS})"
        if num_keys > MAX_TRITON_KEYS
        else f"dropout on sequences this long (the kernels' dropout draws count N x S positions in 32 bits: "
             f"{counter} >= 2^31)" if counter >= MAX_COUNTER else length_refusal(length))
    return triton_refusal(device_type, head_size, installed=triton, family=family, mask=mask, tracing=tracing,
                          dtype=dtype)


def _refusals(*, e_step, return_weights, device_type, dtype, autocast, tracing, mask, triton=False, head_size=64,
              variance_grad=False, num_keys=2, counter=0, requires_grad=False, length=0):
    """Why each backend cannot run a call (None: it can)."""
    blocked = ("return_weights (only 'dense' forms the weights)" if return_weights
               else "a whole 4-D mask" if mask == "pairs"
               else "half precision" if dtype not in (torch.float32, torch.float64)
               else "autocast" if autocast
               else "tracing or compiling (its Python loop reads tensor values)" if tracing else None)
    sdpa = ("the hard E-step" if e_step == "hard"
            else "return_weights (only 'dense' forms the weights)" if return_weights else None)
    triton_ = _triton_refusal(e_step=e_step, return_weights=return_weights, device_type=device_type, dtype=dtype,
                              tracing=tracing, mask=mask, triton=triton, head_size=head_size,
                              variance_grad=variance_grad, num_keys=num_keys, counter=counter,
                              requires_grad=requires_grad, length=length)
    return {"dense": None, "sdpa": sdpa, "blocked": blocked, "triton": triton_}


def _backend(backend, query, value, variances, attention_mask, e_step, return_weights, dropout_p=0.0, timed=None,
             tensors=()):
    """The backend a call runs (resolve_backend); timed: `_timed`'s function for this call, or None; tensors: the
    call's other inputs (keys, shifts, prior), for whether autograd records it."""
    facts = dict(e_step=e_step, return_weights=return_weights, device_type=query.device.type, dtype=query.dtype,
                 autocast=autocast_enabled(query.device.type), tracing=is_tracing(),
                 mask=mask_kind(attention_mask), triton=triton_available(),
                 head_size=max(query.shape[-1], value.shape[-1]),
                 variance_grad=isinstance(variances, torch.Tensor) and variances.requires_grad,
                 num_keys=len(variances) if not isinstance(variances, torch.Tensor) else variances.numel(),
                 counter=query.shape[-2] * value.shape[-2] if dropout_p > 0 else 0,
                 requires_grad=records_grad(query, value, *tensors), length=max(query.shape[-2], value.shape[-2]))
    measured = None if timed is None else (lambda: timed(choose_backend(**{**facts, "triton": False})))
    return resolve_backend(backend, choose_backend(**facts), _refusals(**facts), device_type=query.device.type,
                           timed=measured)


def _timed(function, query, keys, key_shift, value, variances, log_prior, e_step, attention_mask, is_causal,
           dropout_p):
    """attention_autotune.timed's `Measured` for an MGK (key_shift None) or sMGK call of `function`: the call's
    kind, and how to run it on a named backend (exact: without dropout), asked only where resolve_backend times the
    kernels (on a GPU where they can run the call)."""
    def call(name, q, k, shift, v, prior, mask, exact=False):
        args = (q, k, v) if shift is None else (q, k, shift, v)
        return function(*args, variances=variances, log_prior=prior, e_step=e_step, attention_mask=mask,
                        is_causal=is_causal, dropout_p=0.0 if exact else dropout_p, backend=name)

    b, h, n, d = query.shape
    s, dv = value.shape[2:]
    m = keys.shape[2] if key_shift is None else key_shift.shape[1]
    family = ("mgk " if key_shift is None else "smgk ") + e_step
    return timed(family, call, (query, keys, key_shift, value, log_prior, attention_mask), query.device,
                 dtype=query.dtype, batch=b, lengths=(n, s), H=h, M=m, D=d, Dv=dv, mask=mask_kind(attention_mask),
                 causal=bool(is_causal), dropout=dropout_p > 0, prior=log_prior is not None)


def _as_variances(variances, like: torch.Tensor, num_keys: int) -> torch.Tensor:
    # In the caller's precision: a float32 sigma^2 would cap float64 checks at 1e-8.
    var = torch.as_tensor(variances, dtype=like.dtype, device=like.device).reshape(-1)
    if var.numel() != num_keys:
        raise ValueError(f"`variances` must give one sigma^2 per key: got {var.numel()} values for {num_keys} keys")
    # Checked on the numbers given (the models pass a list); a tensor's values only outside tracing, where a check
    # that reads them cannot be part of the graph.
    if isinstance(variances, torch.Tensor) and is_tracing():
        return var
    positive = bool((var > 0).all()) if isinstance(variances, torch.Tensor) else all(v > 0 for v in variances)
    if not positive:
        raise ValueError(f"`variances` must be positive, got {var.tolist()}")
    return var


def _check_e_step(e_step):
    if e_step not in ("soft", "hard"):
        raise ValueError(f"`e_step` must be 'soft' or 'hard', got {e_step!r}")


def _check_shapes(query, keys, value):
    if keys.dim() != 5:
        raise ValueError(f"`keys` must be (B, H, M, S, D), got shape {tuple(keys.shape)}")
    b, h, _, d = query.shape
    if keys.shape[0] != b or keys.shape[1] != h or keys.shape[-1] != d:
        raise ValueError(f"`keys` {tuple(keys.shape)} does not match `query` {tuple(query.shape)}")
    if value.shape[:2] != (b, h) or value.shape[2] != keys.shape[3]:
        raise ValueError(f"`value` {tuple(value.shape)} does not match `keys` {tuple(keys.shape)}")


def _log_kernel(query, keys, variances, log_prior):
    """(B, H, M, N, S) log pi_r - |q_i - k_jr|^2 / (2 sigma_r^2): the Eq. 7 terms, with
    |q - k|^2 = |q|^2 - 2 q.k + |k|^2 from one matmul per key."""
    var = variances.to(query.dtype)[None, None, :, None, None]
    q_sq = query.pow(2).sum(-1)[:, :, None, :, None]
    k_sq = keys.pow(2).sum(-1)[:, :, :, None, :]
    dist2 = q_sq + k_sq - 2 * torch.matmul(query[:, :, None], keys.transpose(-1, -2))
    out = -dist2 / (2 * var)
    if log_prior is not None:
        out = out + log_prior.to(query.dtype)[None, :, :, None, None]
    return out


def _mgk_dense(query, keys, value, var, log_prior, e_step, attention_mask, is_causal, dropout_p, return_weights):
    """The N x N x M form: scores, masked softmax, dropout on a_ij, product with V."""
    if e_step == "soft":
        scores = torch.logsumexp(_log_kernel(query, keys, var, log_prior), dim=2)
    else:
        scores = _log_kernel(query, keys, var, None).amax(dim=2)  # hard: pi plays no role (Remark 3)
    allowed = allowed_pairs(attention_mask, is_causal, query.shape[2], keys.shape[3], query.device)
    weights = torch.softmax(masked_scores(scores, allowed), dim=-1)
    out = torch.matmul(F.dropout(weights, p=dropout_p), value)
    return (out, weights) if return_weights else out


def _mgk_soft_sdpa(query, keys, value, var, log_prior, attention_mask, is_causal, dropout_p):
    """Soft E-step as one SDPA call over M*S augmented keys (exact, O(N) memory with the flash kernel)."""
    b, h, m, s, d = keys.shape
    n, dv = query.shape[2], value.shape[-1]
    # PyTorch's CPU flash kernel needs one head size for q/k and v (else a slower math path: kernel notes, "MGK path
    # rule"), so every operand is built at `width` directly inside its one concatenation: no separate pad/copy passes.
    # On GPUs the fused SDPA kernels (flash, memory-efficient) take head sizes that are multiples of 8 only: D + 2 =
    # 66 would fall back to the math kernel, which forms the N x M*S scores (measured: padded to 72, 2.77x -> 1.79x
    # SDPA with 8 heads at N = 4096, bf16, H100). This is the path where Triton is absent.
    width = max(d + 2, dv)
    if query.device.type != "cpu":
        width = -(-width // 8) * 8
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
    allowed = allowed_pairs(attention_mask, is_causal, n, s, query.device)
    if allowed is not None:
        allowed = allowed.repeat(1, 1, 1, m)
    out = F.scaled_dot_product_attention(q_aug, k_aug, v_aug, attn_mask=allowed, dropout_p=dropout_p, scale=1.0)
    return out[..., :dv] if width > dv else out


def mgk_attention(query, keys, value, *, variances, log_prior=None, e_step="soft", attention_mask=None,
                  is_causal=False, dropout_p=0.0, return_weights=False, backend="auto", block_rows=BLOCK_ROWS,
                  keep_bytes=KEEP_BYTES, min_row_sum=MIN_ROW_SUM):
    """MGK attention (Eq. 7). query (B,H,N,D), keys (B,H,M,S,D), value (B,H,S,Dv) -> (B,H,N,Dv).

    variances: the M absolute sigma_r^2; log_prior: (H, M) log pi (None = uniform, which cancels in the softmax);
    attention_mask: bool (B, S), True = real token, or a whole (B or 1, 1, N, S) mask (bool, or additive float);
    is_causal: query i sees keys j <= i + S - N (bottom-right aligned); dropout_p: dropout on a_ij.

    backend: "auto" (`choose_backend`) or one of BACKENDS ("dense", "sdpa", "blocked", "triton"; module docstring);
    every one is exact, and a ValueError names one that cannot run the call (or a removed one, "compiled"). With
    dropout the blocked and dense paths drop a_ij itself; SDPA over the augmented keys drops each key's share of it
    independently (the same mean, not the same distribution); the Triton kernels drop a_ij with a mask drawn in the
    kernels (from one seed of torch's generator). block_rows, keep_bytes, min_row_sum: the blocked
    path's block size, the bytes of block probabilities it keeps for backward (above: recomputed), and the row sum
    below which a block is redone shifted.
    """
    _check_e_step(e_step)
    _check_shapes(query, keys, value)
    var = _as_variances(variances, query, keys.shape[2])
    measured = _timed(mgk_attention, query, keys, None, value, variances, log_prior, e_step, attention_mask,
                      is_causal, dropout_p)
    backend = _backend(backend, query, value, variances, attention_mask, e_step, return_weights, dropout_p,
                       measured, (keys, log_prior))
    if backend == "triton":
        try:
            return mgk_triton(query, keys, None, value, variances, log_prior, e_step, attention_mask, is_causal,
                              dropout_p)
        except Exception as error:  # noqa: BLE001 - a chosen kind's new launch failing: fall_back says, or raises
            backend = fall_back(measured, error)
    if backend == "blocked":
        return mgk_blocked(query, keys, None, value, var, log_prior, e_step, attention_mask, is_causal, dropout_p,
                            block_rows, keep_bytes, min_row_sum)
    if backend == "sdpa":
        return _mgk_soft_sdpa(query, keys, value, var, log_prior, attention_mask, is_causal, dropout_p)
    return _mgk_dense(query, keys, value, var, log_prior, e_step, attention_mask, is_causal, dropout_p,
                      return_weights)


def smgk_attention(query, key, key_shift, value, *, variances, log_prior=None, e_step="soft", attention_mask=None,
                   is_causal=False, dropout_p=0.0, return_weights=False, backend="auto", block_rows=BLOCK_ROWS,
                   keep_bytes=KEEP_BYTES, min_row_sum=MIN_ROW_SUM):
    """sMGK (option B of the paper): MGK with the M keys k_jr = k_j + b_r of one key projection and a learned
    shift per key and head. key (B,H,S,D), key_shift (H,M,D); the rest as `mgk_attention`, which this equals
    with keys = key + key_shift. The blocked path computes q.k once for all M keys (attention_mgk_blocked.py); the
    other backends run `mgk_attention` on the M shifted keys."""
    if key.dim() != 4 or key.shape != query.shape[:2] + key.shape[2:3] + query.shape[3:]:
        raise ValueError(f"`key` must be (B, H, S, D) matching `query` {tuple(query.shape)}, got {tuple(key.shape)}")
    if key_shift.dim() != 3 or key_shift.shape[0] != query.shape[1] or key_shift.shape[2] != query.shape[3]:
        raise ValueError(f"`key_shift` must be (H, M, D) = ({query.shape[1]}, M, {query.shape[3]}), "
                         f"got {tuple(key_shift.shape)}")
    _check_e_step(e_step)
    _check_shapes(query, key[:, :, None].expand(-1, -1, key_shift.shape[1], -1, -1), value)  # shapes only (a view)
    var = _as_variances(variances, query, key_shift.shape[1])
    measured = _timed(smgk_attention, query, key, key_shift, value, variances, log_prior, e_step, attention_mask,
                      is_causal, dropout_p)
    backend = _backend(backend, query, value, variances, attention_mask, e_step, return_weights, dropout_p,
                       measured, (key, key_shift, log_prior))
    if backend == "triton":
        try:
            return mgk_triton(query, key, key_shift, value, variances, log_prior, e_step, attention_mask, is_causal,
                              dropout_p)
        except Exception as error:  # noqa: BLE001 - a chosen kind's new launch failing: fall_back says, or raises
            backend = fall_back(measured, error)
    if backend == "blocked":
        return mgk_blocked(query, key, key_shift, value, var, log_prior, e_step, attention_mask, is_causal,
                            dropout_p, block_rows, keep_bytes, min_row_sum)
    return mgk_attention(query, key[:, :, None] + key_shift[None, :, :, None, :], value, variances=variances,
                         log_prior=log_prior, e_step=e_step, attention_mask=attention_mask, is_causal=is_causal,
                         dropout_p=dropout_p, return_weights=return_weights, backend=backend)


@torch.no_grad()
def mgk_responsibilities(query, keys, *, variances, log_prior=None, attention_mask=None, is_causal=False):
    """Mean soft-E-step responsibility of each key over valid (query, key) pairs: the M-step pi_r, shape (H, M).

    Eq. 8: gamma_ijr = pi_r N(q_i | k_jr, sigma_r^2) / sum_r' pi_r' N(q_i | k_jr', sigma_r'^2); the paper's
    pi_jr = N_jr / N becomes, with pi shared over positions, the mean of gamma over all valid (i, j).
    Pairs whose responsibilities are not finite (a NaN or inf in that query or key, e.g. one bad row of a
    batch) are left out, so they cannot reach pi; a head with no finite valid pair gets NaN (keep its old pi)."""
    total, pairs = mgk_responsibility_totals(query, keys, variances=variances, log_prior=log_prior,
                                             attention_mask=attention_mask, is_causal=is_causal)
    return total / pairs


@torch.no_grad()
def mgk_responsibility_totals(query, keys, *, variances, log_prior=None, attention_mask=None, is_causal=False):
    """The sums behind `mgk_responsibilities`: (sum of gamma over the finite valid pairs (H, M) in float32, their
    count (H, 1)). Sums add up across shards of a batch (data-parallel ranks); the mean of one shard would not."""
    var = _as_variances(variances, query, keys.shape[2])
    log_gamma = torch.log_softmax(_log_kernel(query.float(), keys.float(), var, log_prior), dim=2)  # (B,H,M,N,S)
    gamma = log_gamma.exp()
    used = torch.isfinite(gamma).all(dim=2, keepdim=True)                                        # (B,H,1,N,S)
    allowed = allowed_pairs(attention_mask, is_causal, query.shape[2], keys.shape[3], query.device)
    if allowed is not None:
        if not allowed.dtype == torch.bool:  # an additive mask: the pairs it does not push to the minimum
            allowed = allowed > torch.finfo(allowed.dtype).min
        used = used & allowed[:, :, None]
    gamma = torch.where(used, gamma, torch.zeros((), dtype=gamma.dtype, device=gamma.device))
    return gamma.sum(dim=(0, 3, 4)), used.sum(dim=(0, 3, 4)).to(gamma.dtype)


# ------------------------------------------------------------------------------------------------ MLK (Sec. 2.4)
def choose_mlk_backend(*, return_weights, mask, is_causal, tracing):
    """The backend `mlk_attention` runs with backend="auto": "dense" (the explicit N x S matrix) for the weights, a
    whole 4-D mask (mask="pairs", which sums over keys cannot apply) and causal calls in a traced or compiled graph
    (the chunks' padding to a multiple of the chunk length cannot stay symbolic: torch.export with a dynamic length
    fails on its guards); otherwise "linear", O(N)."""
    return "dense" if return_weights or mask == "pairs" or (is_causal and tracing) else "linear"


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


def _nonzero(den):
    """The normaliser with 1 where it is 0: a query that sees no key (padding, or before the first position) has a
    zero numerator too, so its output is 0, and its gradients are 0 (dividing by a clamped tiny value instead gives
    0 / tiny^2 = NaN in backward)."""
    return torch.where(den > 0, den, torch.ones((), dtype=den.dtype, device=den.device))


def _float32(*tensors):
    """Half-precision tensors as float32 (float64 kept; None passed through): MLK's sums over N positions."""
    return [None if t is None else t.to(torch.promote_types(t.dtype, torch.float32)) for t in tensors]


def _mlk_dense(query, keys, value, log_prior, attention_mask, is_causal, return_weights):
    """The explicit N x S matrix a_ij = phi(q_i).sum_r pi_r phi(k_jr), row-normalised, in float32 for half inputs;
    the output is the returned (rounded) weights times the values, so the weights stay in the autograd graph
    (gradient-based attribution)."""
    with torch.autocast(query.device.type, enabled=False):
        q, k, v, log_prior = _float32(query, keys, value, log_prior)
        kernel = torch.matmul(_elu1(q), _mixed_key_features(k, log_prior).transpose(-1, -2))
        allowed = allowed_pairs(attention_mask, is_causal, query.shape[2], keys.shape[3], query.device)
        if allowed is not None:
            kernel = kernel * (allowed if allowed.dtype == torch.bool else allowed.exp())
        weights = (kernel / _nonzero(kernel.sum(-1, keepdim=True))).to(query.dtype)
        out = torch.matmul(weights.to(v.dtype), v).to(query.dtype)
    return (out, weights) if return_weights else out


def mlk_attention(query, keys, value, *, log_prior=None, attention_mask=None, is_causal=False,
                  return_weights=False, backend="auto", chunk_size=MLK_CHUNK):
    """Mixture of linear keys, phi = elu + 1: h_i = phi(q_i)^T KV / phi(q_i)^T Z, KV = sum_j phi_j v_j^T and
    Z = sum_j phi_j with phi_j = sum_r pi_r phi(k_jr) (causal: sums over j <= i + S - N).

    backend: "auto" (`choose_mlk_backend`), "dense" (the explicit N x S matrix, the only one with the weights) or
    "linear" (O(N): the sums, causal as prefix sums evaluated in chunks of `chunk_size` positions, `_causal_linear`,
    so that memory stays O(N (C + D Dv / C)) instead of O(N D Dv)).
    The sums run in float32 whatever the input dtype or autocast (output in the query's dtype): Z and the
    normaliser phi(q_i)^T Z grow with N and overflow float16 from N ~ 1k (outputs 0 or NaN), and bfloat16
    prefix sums lose the later terms."""
    _check_shapes(query, keys, value)
    mask = mask_kind(attention_mask)
    linear = ("return_weights (only 'dense' forms the weights)" if return_weights
              else "a whole 4-D mask" if mask == "pairs" else None)
    backend = resolve_backend(backend, choose_mlk_backend(return_weights=return_weights, mask=mask,
                                                          is_causal=is_causal, tracing=is_tracing()),
                              {"dense": None, "linear": linear})
    if backend == "dense":
        return _mlk_dense(query, keys, value, log_prior, attention_mask, is_causal, return_weights)
    with torch.autocast(query.device.type, enabled=False):
        q, k, value, log_prior = _float32(query, keys, value, log_prior)
        phi_q = _elu1(q)
        phi_k = _mixed_key_features(k, log_prior)
        if attention_mask is not None:
            phi_k = phi_k * attention_mask[:, None, :, None].to(phi_k.dtype)
        if not is_causal:
            kv = torch.matmul(phi_k.transpose(-1, -2), value)                            # (B,H,D,Dv)
            z = phi_k.sum(dim=2)                                                          # (B,H,D)
            num = torch.matmul(phi_q, kv)
            den = (phi_q * z[:, :, None, :]).sum(-1, keepdim=True)
            return (num / _nonzero(den)).to(query.dtype)
        return _causal_linear(phi_q, phi_k, value, chunk_size).to(query.dtype)


def _causal_linear(phi_q, phi_k, value, c):
    """Causal linear attention h_i = phi_q_i^T sum_{j <= p_i} phi_k_j v_j^T / phi_q_i^T sum_{j <= p_i} phi_k_j,
    the N queries being the last N of the S positions (p_i = i + S - N: bottom-right alignment for cached
    decoding), in chunks of c positions. Prefix sums of phi_k v^T per position would hold N x D x Dv numbers per
    head (gigabytes at N = 2048); here the keys of a query's own chunk come from a masked C x C product and all
    earlier keys from the state sum_{j before the chunk} phi_k_j v_j^T, one (D, Dv) per chunk.
    Causal linear attention as prefix sums: Katharopoulos et al., "Transformers are RNNs" (ICML 2020), Sec. 3.3;
    the chunked evaluation: Hua et al., "Transformer Quality in Linear Time" (ICML 2022), mixed chunk attention."""
    n, s = phi_q.shape[2], phi_k.shape[2]
    if s < n:  # queries before position 0 see nothing: positions with no key (phi = 0) put in front
        phi_k, value = (F.pad(t, (0, 0, n - s, 0)) for t in (phi_k, value))
        s = n
    past = s - n  # keys every query sees in full
    kv0 = torch.matmul(phi_k[:, :, :past].transpose(-1, -2), value[:, :, :past])        # (B, H, D, Dv)
    z0 = phi_k[:, :, :past].sum(2)                                                       # (B, H, D)
    # the queries' own positions, padded at the end to whole chunks (later than every real query: unseen)
    pad = -n % c
    q, k, v = (F.pad(t[:, :, t.shape[2] - n:], (0, 0, 0, pad)).unflatten(2, (-1, c)) for t in (phi_q, phi_k, value))
    kv = torch.matmul(k.transpose(-1, -2), v)                                            # (B, H, chunks, D, Dv)
    z = k.sum(3)                                                                         # (B, H, chunks, D)
    # state before each chunk: an exclusive prefix sum over chunks, starting from the past keys' sums
    kv_state = torch.cat([kv0[:, :, None], kv[:, :, :-1]], 2).cumsum(2)
    z_state = torch.cat([z0[:, :, None], z[:, :, :-1]], 2).cumsum(2)
    own = causal_mask(c, c, q.device)                                                    # key j <= query i
    scores = torch.matmul(q, k.transpose(-1, -2)).masked_fill(~own, 0.0)                 # (B, H, chunks, C, C)
    num = torch.matmul(scores, v) + torch.matmul(q, kv_state)
    den = scores.sum(-1, keepdim=True) + torch.matmul(q, z_state[..., None])
    return (num / _nonzero(den)).flatten(2, 3)[:, :, :n]
