"""FiSH attention: a finite admixture of shared heads, as plain torch functions.

Where the math comes from: Nguyen et al., "Improving Transformer with an Admixture of Attention Heads"
(NeurIPS 2022, openreview.net/forum?id=0VFQhPGF1M3), first circulated as "FiSHformer: Transformer with a Finite
Admixture of Shared Heads", whose section and equation numbers are used here:

* M global query/key heads give the global attention matrices G_k = Q_k K_k^T (§2.2, Def. 1), scaled by
  1/sqrt(D) *before* mixing, as the authors' machine-translation code does.
* H local heads mix them. FiSH (Eqn. 9, with the "discriminative relaxation" of Remark 3: p_kj are free
  learned weights):   A_j = sum_k p_kj (G_k + sigma_k eps_jk),  eps ~ N(0, I), training only.
  Hard FiSH (Eqn. 10): the same without noise.  MiSH (Eqn. 11, Remark 4): one weight vector p_k shared by
  all local heads.  GFiSH / hard GFiSH (§2.4, Eqn. 12 and the authors' code): a small network
  Linear(M, H) -> ReLU -> Linear(H, H) applied along the head axis of G + sigma eps.
* out_j = softmax(A_j + mask) V_j for the H local value heads; masks act on the mixed scores (a
  causal mask is applied after mixing).

Four exact backends compute it (`choose_backend` picks one for backend="auto"):
  fused       linear mixing without noise as one SDPA call over H heads of query size M*D (_fused_attention);
  recomputed  blocks of query rows with a hand-written backward (fish_recomputed, attention_fish_recomputed.py),
              which keeps the blocks' scores and weights for backward up to a byte budget and recomputes them
              above (O(N) memory without noise; the noisy types keep their drawn noise, N x S numbers per call,
              for backward);
  blocked     the formula on blocks of query rows through autograd (_blocked_attention); with return_weights in
              one piece, the output computed from the returned weights;
  triton      fused Triton kernels in the flash pattern, forward and backward (attention_fish_triton.py): CUDA tensors,
              or CPU tensors in Triton's interpreter (TRITON_INTERPRET=1 set before triton is imported). Its noise
              is drawn inside the kernels (counter-based, from one seed drawn from `generator`): the same
              distribution as the other backends', other numbers.
A fifth, "compiled" (torch.compile / inductor), was measured slower than the eager ones everywhere and removed;
asking for it is a ValueError that says so.
The plain reference the tests hold these to is in `hf_mgk.reference` (not part of this file).

This file imports only the standard library, torch and its siblings, so it can be copied next to HuggingFace
"remote code" model files.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .attention_autotune import fall_back, timed
from .attention_blocks import autocast_enabled, records_grad, resolve_backend, row_blocks
from .attention_fish_recomputed import RecomputedFiSH, mix
from .attention_fish_triton import MAX_GLOBAL_HEADS, counters, fish_triton
from .attention_masks import allowed_pairs, is_tracing, mask_kind, masked_scores
from .attention_triton import MAX_COUNTER, deterministic_refusal, length_refusal
from .attention_triton import available as triton_available
from .attention_triton import refusal as triton_refusal

__all__ = ["BACKENDS", "choose_backend", "fish_attention", "make_gfish_mixing"]

BACKENDS = ("fused", "recomputed", "blocked", "triton")
# Query rows per block of the blocked and recomputed paths; bounds the memory without autograd to B*H*rows*S
# scores (hf-mgk's docs/benchmarks/kernel-notes.md#fish-block-rows).
BLOCK_ROWS = 128
# The recomputed path keeps its blocks' scores and weights for backward while they take at most this many bytes
# per call (see fish_recomputed).
KEEP_BYTES = 2**28

def choose_backend(*, mixing, noise, dropout, return_weights, device_type, dtype, autocast, requires_grad, tracing,
                   mask=None, triton=False, head_size=64, num_global=2, counter=0, length=0):
    """The backend `fish_attention` runs with backend="auto", from plain facts about the call: mixing "heads" (an
    (M, H) tensor, H > 1), "shared" (an (M, 1) tensor: MiSH), "gfish" (the network of make_gfish_mixing) or
    "module" (any other network); noise, dropout: whether they are on; autocast: on for the query's device;
    requires_grad: autograd records the call; tracing: traced or compiled (the plain differentiable formulas run
    there, not the hand-written backward, whose in-place block writes the TorchScript-based ONNX exporter
    mistranslates); mask: None, "padding" or "pairs" (a whole 4-D mask); triton: whether Triton is installed;
    head_size: the larger of q / k's and v's; num_global: M; counter: the largest counter of the call's random
    draws (attention_fish_triton.counters); length: max(N, S) (the kernels' grids bound it).

    Every backend is exact; the rule is about speed and memory
    (hf-mgk's docs/benchmarks/kernel-notes.md#fish-path-rule):
    * on a CUDA GPU with Triton, the calls the kernels cover (`_triton_refusal`): triton;
    * no dropout or weights, an (M, H) tensor without noise, no autograd or on an accelerator: fused (flash
      kernels, O(N) memory);
    * with autograd, float32/64 outside autocast: an (M, H) tensor, MiSH with noise, and on the CPU the GFiSH
      network: recomputed;
    * everything else (MiSH without noise, whose H heads share one softmax computed once; other networks; dropout;
      weights; autocast): blocked."""
    if device_type == "cuda" and _triton_refusal(
            mixing=mixing, return_weights=return_weights, device_type=device_type, dtype=dtype, tracing=tracing,
            mask=mask, triton=triton, head_size=head_size, num_global=num_global, counter=counter,
            requires_grad=requires_grad, length=length) is None:
        return "triton"
    linear = mixing in ("heads", "shared") and not dropout and not return_weights
    training = requires_grad and not tracing
    if linear and mixing == "heads" and not noise and (device_type != "cpu" or not training):
        return "fused"
    by_hand = (linear and (mixing == "heads" or noise)) or (
        mixing == "gfish" and not dropout and not return_weights and device_type == "cpu")
    if by_hand and training and dtype in (torch.float32, torch.float64) and not autocast:
        return "recomputed"
    return "blocked"


def _triton_refusal(*, mixing, return_weights, device_type, dtype, tracing, mask, triton, head_size, num_global,
                    counter, requires_grad=False, length=0, **_):
    """Why the Triton kernels cannot run a call (None: they can); `triton`: whether they can be used at all."""
    family = deterministic_refusal(requires_grad) or (  # the backward adds dq by atomics (one pass)
        "return_weights (only 'blocked' forms the weights)" if return_weights
        else "a mixing network other than make_gfish_mixing's" if mixing == "module"
        else f"{num_global} global heads (the kernels take up to {MAX_GLOBAL_HEADS})"
        if num_global > MAX_GLOBAL_HEADS
        else f"sequences this long (the kernels' random draws count N x S positions, x M for a network's "
             f"noise, in 32 bits: {counter} >= 2^31)" if counter >= MAX_COUNTER else length_refusal(length))
    return triton_refusal(device_type, head_size, installed=triton, family=family, mask=mask, tracing=tracing,
                          dtype=dtype)


def _refusals(*, mixing, noise, dropout, return_weights, dtype, autocast, tracing, mask=None, **facts):
    """Why each backend cannot run a call (None: it can); mask: None, "padding" or "pairs" (a whole 4-D mask)."""
    either = ("return_weights (only 'blocked' forms the weights)" if return_weights
              else "dropout" if dropout else None)
    fused = either or ("noise" if noise else None) or (
        None if mixing == "heads" else "a mixing other than an (M, H) tensor with H > 1")
    recomputed = either or (
        "a mixing network other than make_gfish_mixing's" if mixing == "module"
        else "MiSH without noise (its H heads share one softmax)" if mixing == "shared" and not noise
        else "half precision" if dtype not in (torch.float32, torch.float64)
        else "autocast" if autocast else "tracing or compiling" if tracing else None)
    triton = _triton_refusal(mixing=mixing, return_weights=return_weights, dtype=dtype, tracing=tracing, mask=mask,
                             **facts)  # facts holds requires_grad
    return {"fused": fused, "recomputed": recomputed, "blocked": None, "triton": triton}


def _mixing_kind(mixing):
    if isinstance(mixing, torch.Tensor):
        return "heads" if mixing.shape[1] > 1 else "shared"
    return "gfish" if _is_gfish_network(mixing) else "module"


def _requires_grad(query, key, value, mixing, noise_std):
    """Whether autograd records this call (a mixing network through its parameters)."""
    mixing = list(mixing.parameters()) if isinstance(mixing, nn.Module) else [mixing]
    return records_grad(query, key, value, *mixing, noise_std)

def fish_attention(query, key, value, mixing, *, scale=None, noise_std=None, attention_mask=None,
                   is_causal=False, return_weights=False, dropout_p=0.0, generator=None, backend="auto",
                   block_rows=BLOCK_ROWS, keep_bytes=KEEP_BYTES):
    """FiSH / hard FiSH / MiSH / (hard) GFiSH attention, computed on an exact backend.

    Args:
        query: (B, M, N, D), the M global query heads.
        key: (B, M, S, D), the M global key heads.
        value: (B, H, S, Dv), the H local value heads.
        mixing: how local heads are made from global ones:
            a tensor (M, H) of p_kj (FiSH, hard FiSH);
            a tensor (M, 1): one weight vector shared by all local heads (MiSH);
            an nn.Module mapping the last axis from M to H (GFiSH), e.g. ``make_gfish_mixing(M, H)``;
            it is applied to the scores moved to the last axis, shape (B, N, S, M) -> (B, N, S, H).
        scale: multiplies G_k = Q_k K_k^T before mixing; default 1/sqrt(D).
        noise_std: None (no noise, evaluation / hard variants) or a (M,) tensor of sigma_k (training).
            Noise is drawn here, from ``generator`` if given.
        attention_mask: bool (B, S), True = real token, or None; or a whole (B or 1, 1, N, S) mask for the
            pairs, bool (True = may attend) or additive float (added to the mixed scores), which is used as
            it is (with is_causal=False: it says which keys each query sees).
        is_causal: query i sees keys j <= i + S - N (bottom-right aligned: with a KV cache the N
            queries are the last N positions), applied after mixing.
        return_weights: also return the (B, H, N, S) attention probabilities (after dropout).
        dropout_p: attention dropout on the probabilities (training only; the caller passes 0 in eval).
        generator: torch.Generator for the FiSH noise, so runs can be reproduced. The noise is drawn per block of
            `block_rows` query rows (`_draw_noise`), whatever the backend.
        backend: "auto" (`choose_backend`) or one of BACKENDS ("fused", "recomputed", "blocked", "triton"; module
            docstring); a ValueError names one that cannot run the call (or a removed one, "compiled").
        block_rows: query rows per block (blocked and recomputed paths, and the noise's blocks).
        keep_bytes: the recomputed path keeps its blocks' scores and weights for backward up to this many bytes,
            and recomputes them above.

    Returns:
        out (B, H, N, Dv), and with ``return_weights`` also the weights (B, H, N, S).
        Query rows that see no key at all (all keys padded) get zero weights and a zero output.
    """
    _, M, N, D, S, H, Dv = _check_shapes(query, key, value, mixing, noise_std, attention_mask)
    scale = D ** -0.5 if scale is None else float(scale)
    kind = _mixing_kind(mixing)
    facts = dict(mixing=kind, noise=noise_std is not None, dropout=dropout_p != 0.0,
                 return_weights=return_weights, device_type=query.device.type, dtype=query.dtype,
                 autocast=autocast_enabled(query.device.type),
                 requires_grad=_requires_grad(query, key, value, mixing, noise_std), tracing=is_tracing(),
                 mask=mask_kind(attention_mask), triton=triton_available(), head_size=max(D, Dv), num_global=M,
                 counter=counters(M, N, S, kind == "gfish", noise_std is not None), length=max(N, S))
    measured = _timed(query, key, value, mixing, scale, noise_std, attention_mask, is_causal, dropout_p, block_rows,
                      keep_bytes, kind)
    backend = resolve_backend(backend, choose_backend(**facts), _refusals(**facts), device_type=query.device.type,
                              timed=lambda: measured(choose_backend(**{**facts, "triton": False})))
    if backend == "triton":
        try:
            return fish_triton(query, key, value, mixing, scale, noise_std, attention_mask, is_causal, dropout_p,
                               generator)
        except Exception as error:  # noqa: BLE001 - a chosen kind's new launch failing: fall_back says, or raises
            backend = fall_back(measured, error)
    if backend == "fused":
        return _fused_attention(query, key, value, mixing, scale, attention_mask, is_causal)
    eps = _draw_noise(query, mixing, noise_std, H, S, is_causal, generator, block_rows)
    if backend == "recomputed":
        return fish_recomputed(query, key, value, mixing, scale, noise_std, eps, attention_mask, is_causal,
                                     block_rows, keep_bytes)
    out, weights = _blocked_attention(query, key, value, mixing, scale, noise_std, eps, attention_mask,
                                      is_causal, dropout_p, return_weights, block_rows)
    return (out, weights) if return_weights else out


def _timed(query, key, value, mixing, scale, noise_std, attention_mask, is_causal, dropout_p, block_rows,
           keep_bytes, kind):
    """attention_autotune.timed's `Measured` for a fish_attention call: its kind, and how to run it on a named
    backend (the noise from torch's generator: the user's `generator` is not advanced by the trial; exact: without
    noise or dropout)."""
    def call(name, q, k, v, p, sigma, mask, exact=False):
        if exact and name != "triton":
            name = "blocked"  # runs any call; the eager path chosen with noise may refuse it without (MiSH)
        return fish_attention(q, k, v, p, scale=scale, noise_std=None if exact else sigma, attention_mask=mask,
                              is_causal=is_causal, dropout_p=0.0 if exact else dropout_p, backend=name,
                              block_rows=block_rows, keep_bytes=keep_bytes)
    module = isinstance(mixing, nn.Module)
    b, m, n, d = query.shape
    h, s, dv = value.shape[1:]
    return timed(f"fish {kind}", call, (query, key, value, mixing, noise_std, attention_mask), query.device,
                 modules=(mixing,) if module else (), dtype=query.dtype, batch=b, lengths=(n, s),
                 M=m, H=h, D=d, Dv=dv, mask=mask_kind(attention_mask), causal=bool(is_causal), dropout=dropout_p > 0,
                 noise=noise_std is not None)


def _materialised(query, key, value, mixing, noise_std, eps, allowed, empty, dropout_p, every_head=False):
    """The formula itself (module docstring), for a query already multiplied by the scale; allowed and
    empty come from _visible. Returns out (B, H, N, Dv) and weights (B, H or 1, N, S); (B, H, N, S) with
    ``every_head``, the tensor the output is computed from."""
    B, _, N, _ = query.shape
    S = key.shape[2]
    g = torch.matmul(query, key.transpose(-1, -2))  # (B, M, N, S): the global G_k, scaled
    if isinstance(mixing, nn.Module):
        if noise_std is not None:  # GFiSH: the noise goes into the network's input
            g = g + noise_std.to(g.dtype)[:, None, None] * eps
        scores = mixing(g.movedim(1, -1)).movedim(-1, 1)  # (B, H, N, S)
    else:
        p = mixing.to(g.dtype)
        # MiSH (p of shape (M, 1)) gives one shared matrix (B, 1, N, S), broadcast over V's heads below.
        scores = mix(p, g)
        if noise_std is not None:
            # sum_k p_kj sigma_k eps_jk with independent eps_jk ~ N(0, 1) is exactly N(0, sum_k p_kj^2
            # sigma_k^2) per element and independent over j, so one draw per local head scaled by that
            # std is the same distribution, costs H*N*S instead of H*M*N*S random numbers, and keeps
            # gradients to p and sigma (reparameterisation, Eqn. 9). vector_norm has a zero gradient
            # (not NaN) where the std is 0, e.g. sigma initialised to 0.
            std = torch.linalg.vector_norm(p * noise_std.to(g.dtype)[:, None], dim=0)  # (H,)
            scores = scores + std[:, None, None] * eps
    scores = masked_scores(scores, allowed)
    # softmax in float32 even when the scores are bf16/fp16 (as HF's eager attention does)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    if empty is not None:
        weights = weights.masked_fill(empty, 0.0)
    if dropout_p > 0.0 or every_head:
        weights = weights.expand(B, value.shape[1], N, S)
    if dropout_p > 0.0:  # independent per local head, also where MiSH shares one matrix
        weights = F.dropout(weights, p=dropout_p)
    return torch.matmul(weights, value), weights


def _blocked_attention(query, key, value, mixing, scale, noise_std, eps, attention_mask, is_causal,
                       dropout_p, return_weights, block_rows):
    """_materialised on blocks of `block_rows` query rows. With is_causal, the keys after the last one
    a block can see (row i sees keys j <= i + S - N) are cut off instead of masked, which skips about
    half the work. Scaling and masks are computed once for all blocks: on a CPU shared with other
    work every extra small op per block can cost a scheduler time slice."""
    N, S = query.shape[2], key.shape[2]
    query = query * scale
    allowed, empty = _visible(N, S, attention_mask, is_causal, query.device)
    if return_weights:  # all N x S weights are handed out anyway: one block, the output computed from them
        return _materialised(query, key, value, mixing, noise_std, _whole_noise(eps, S), allowed, empty, dropout_p,
                             every_head=True)
    outs = []
    for i, (rows, end, _) in enumerate(row_blocks(N, S, is_causal, block_rows, keep_empty=True)):
        out, _ = _materialised(
            query[:, :, rows], key[:, :, :end], value[:, :, :end], mixing, noise_std,
            None if eps is None else eps[i],
            None if allowed is None else allowed[:, :, rows, :end],
            None if empty is None else empty[:, :, rows], dropout_p)
        outs.append(out)
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)), None


def fish_recomputed(query, key, value, mixing, scale, noise_std, eps, attention_mask, is_causal, block_rows,
                          keep_bytes):
    """Training with autograd on the CPU (FiSH, hard FiSH, MiSH with noise, (hard) GFiSH with the network of
    make_gfish_mixing): blocks of rows with a hand-written backward.

    Per block only the keys the block may see are used (causal: about half the pairs), and only the block's
    diagonal tile is masked when causality is the only mask. Backward needs each block's global scores (the
    network's input and hidden layer for GFiSH) and softmax weights: they are kept from the forward while they
    take at most `keep_bytes` per call (faster), else recomputed per block like flash attention, so memory stays
    O(N) at any length without noise. With noise (fish, mish, gfish) the call's noise, drawn once up front
    (_draw_noise), is kept for backward: N x S numbers per call (half of them causal), whatever keep_bytes. Against autograd through _blocked_attention it also avoids the per-block zero-filled
    full-size gradients of the K and V slices and keeps fewer score-sized tensors: far fewer memory passes
    (timings: hf-mgk's docs/benchmarks/kernel-notes.md#fish-recomputed-path).
    """
    B, M, N, _ = query.shape
    S, H = key.shape[2], value.shape[1]
    tile_only = is_causal and attention_mask is None and N <= S  # causality alone: masks in the diagonal tiles
    hidden, empty = (None, None) if tile_only else _visible(N, S, attention_mask, is_causal, query.device,
                                                             hidden=True)
    if isinstance(mixing, nn.Module):  # Linear(M, H) -> ReLU -> Linear(H, H); noise on its input
        params = tuple(t.to(query.dtype) for t in (mixing[0].weight, mixing[0].bias, mixing[2].weight,
                                                   mixing[2].bias))
        std, kept_heads = noise_std, M + 2 * H
    else:
        params, kept_heads = (mixing.to(query.dtype),), M + H
        std = None
        if noise_std is not None:  # the std of sum_k p_kj sigma_k eps_jk, as in _materialised
            std = torch.linalg.vector_norm(mixing * noise_std.to(query.dtype)[:, None], dim=0)
    pairs = sum((rows.stop - rows.start) * end for rows, end, _ in row_blocks(N, S, is_causal, block_rows, True))
    keep = B * kept_heads * pairs * query.element_size() <= keep_bytes
    out = RecomputedFiSH.apply(query * scale, key, value, std, eps, hidden, is_causal, tile_only, keep, block_rows,
                                *params)
    return out if empty is None else out.masked_fill(empty, 0.0)


def _is_gfish_network(mixing):
    """Whether mixing is the network of make_gfish_mixing (the one RecomputedFiSH differentiates by hand)."""
    return (isinstance(mixing, nn.Sequential) and len(mixing) == 3 and type(mixing[1]) is nn.ReLU
            and all(type(m) is nn.Linear and m.bias is not None for m in (mixing[0], mixing[2])))


def _fused_attention(query, key, value, p, scale, attention_mask, is_causal):
    """Linear mixing without noise as one scaled_dot_product_attention call.

    A_j = sum_k p_kj scale Q_k K_k^T = concat_k(p_kj scale Q_k) @ concat_k(K_k)^T, so local head j is
    ordinary attention with query head size M*D; the key is the same for all local heads (an expand, no
    copy). PyTorch's CPU flash kernel runs only when q/k and v have one head size (otherwise a slower math
    path: hf-mgk's docs/benchmarks/kernel-notes.md#fish-path-rule), so the smaller side is padded with zeros, which
    changes no dot product, and the output is sliced back to Dv.
    """
    B, M, N, D = query.shape
    S = key.shape[2]
    H = p.shape[1]
    Dv = value.shape[-1]
    w = (p * scale).t().to(query.dtype)  # (H, M)
    # contiguous before the reshapes: with M = 1 they would be views with the transposes' strides, which
    # torch.compile traces from its fake tensors' strides, not the run's ("view size is not compatible"); for
    # M > 1 the reshapes copy anyway
    q = (query.unsqueeze(1) * w[:, :, None, None]).transpose(2, 3).contiguous().reshape(B, H, N, M * D)
    k = key.transpose(1, 2).contiguous().reshape(B, 1, S, M * D)
    size = max(M * D, Dv)
    if size > M * D:
        q, k = F.pad(q, (0, size - M * D)), F.pad(k, (0, size - M * D))
    v = F.pad(value, (0, size - Dv)) if size > Dv else value
    k = k.expand(B, H, S, size)
    allowed = empty = None
    if attention_mask is not None or (is_causal and N != S and N > 1):
        allowed, empty = _visible(N, S, attention_mask, is_causal, query.device)
    # SDPA's own is_causal is top-left aligned: use it only where that equals bottom-right (N == S).
    # A single query (N = 1, bottom-right aligned) sees every key, so needs no causal mask at all.
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                         scale=1.0, is_causal=is_causal and N == S and allowed is None)
    out = out[..., :Dv] if size > Dv else out
    return out if empty is None else out.masked_fill(empty, 0.0)


def _visible(N, S, attention_mask, is_causal, device, hidden=False):
    """Which keys each query may see: (allowed, empty).

    allowed: from `allowed_pairs`, with the rows that see no key at all opened to every key (so no path ever
    computes a softmax over nothing, which is NaN, with NaN gradients, on some backends), or None when every key is
    visible; a whole additive mask as it is (float, added to the scores); with `hidden` the complement (True =
    hidden), for in-place fills. empty: bool (B or 1, 1, N, 1), True on the rows that see no key, or None; the
    caller sets their output to zero. (No test for whether such rows exist: a traced or compiled graph must not
    depend on the mask's values.) Both expanded (views) to N query rows, so that query blocks can slice them.
    """
    allowed = allowed_pairs(attention_mask, is_causal, N, S, device)
    if allowed is None or allowed.is_floating_point():
        return allowed, None
    empty = ~allowed.any(dim=-1, keepdim=True)
    allowed = ~(allowed | empty) if hidden else allowed | empty
    return allowed.expand(-1, -1, N, -1), empty.expand(-1, -1, N, -1)


def _draw_noise(query, mixing, noise_std, H, S, is_causal, generator, block_rows):
    """eps ~ N(0, 1), drawn once for the whole call so every path sees the same numbers, as one tensor per block
    of `block_rows` query rows (`row_blocks`, blocks whose rows see no key kept) over the keys that block may see:
    (B, M, rows, end) for a network (noise on G), (B, H, rows, end) for linear mixing (one draw per local head).
    Causal: noise for keys no row of a block can see is not drawn (random numbers are costly: half of a causal
    step's noise)."""
    if noise_std is None:
        return None
    B, M, N, _ = query.shape
    heads = M if isinstance(mixing, nn.Module) else H
    return [torch.randn((B, heads, rows.stop - rows.start, end), generator=generator, device=query.device,
                        dtype=query.dtype) for rows, end, _ in row_blocks(N, S, is_causal, block_rows, True)]


def _whole_noise(blocks, S):
    """The blocks of _draw_noise as one (B, heads, N, S) tensor, zero where no noise was drawn (hidden keys)."""
    if blocks is None:
        return None
    return torch.cat([F.pad(e, (0, S - e.shape[-1])) for e in blocks], dim=2)


def _check_shapes(query, key, value, mixing, noise_std, attention_mask):
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError("query (B, M, N, D), key (B, M, S, D) and value (B, H, S, Dv) must be 4-d")
    B, M, N, D = query.shape
    _, H, S, Dv = value.shape
    if key.shape != (B, M, S, D):
        raise ValueError(f"key must be (B, M, S, D) = {(B, M, S, D)}, got {tuple(key.shape)}")
    if value.shape[0] != B:
        raise ValueError(f"value batch {value.shape[0]} != query batch {B}")
    if isinstance(mixing, torch.Tensor):
        if mixing.dim() != 2 or mixing.shape[0] != M or mixing.shape[1] not in (1, H):
            raise ValueError(f"mixing tensor must be (M, H) = ({M}, {H}) or (M, 1), "
                             f"got {tuple(mixing.shape)}")
    elif not isinstance(mixing, nn.Module):
        raise TypeError("mixing must be a tensor (M, H) / (M, 1) or an nn.Module mapping M -> H")
    if noise_std is not None and tuple(noise_std.shape) != (M,):
        raise ValueError(f"noise_std must be (M,) = ({M},), got {tuple(noise_std.shape)}")
    if attention_mask is not None and tuple(attention_mask.shape) != (B, S) and not (
            attention_mask.dim() == 4 and attention_mask.shape[0] in (1, B) and attention_mask.shape[1:] == (1, N, S)):
        raise ValueError(f"attention_mask must be bool (B, S) = {(B, S)} or a whole mask (B, 1, N, S) = "
                         f"{(B, 1, N, S)}, got {tuple(attention_mask.shape)}")
    return B, M, N, D, S, H, Dv


def make_gfish_mixing(num_global_heads, num_heads):
    """The GFiSH network of the authors' code: Linear(M, H) -> ReLU -> Linear(H, H), PyTorch default
    init, applied along the head axis (pass it as ``mixing``)."""
    return nn.Sequential(nn.Linear(num_global_heads, num_heads), nn.ReLU(),
                         nn.Linear(num_heads, num_heads))
