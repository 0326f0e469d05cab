"""Strided (sliding-window) evaluation of a causal language model: the papers' perplexity.

transformers' "perplexity of fixed-length models" recipe (docs: perplexity.md). The held-out text is one stream of
token ids; a model that takes `block_size` positions reads it in windows of `block_size` tokens whose starts advance
by `stride`. Window k starts at token k * stride and ends at min(k * stride + block_size, len(stream)); it scores only
the tokens no earlier window reached (its last `stride` tokens; the first window all of its own, token 0 excepted,
which has nothing before it). The windows stop with the one that reaches the end of the stream, so the last window
can be shorter: its scored tokens then have exactly the context a full window would have given them, since a
causal model does not look ahead.

With stride < block_size every token 1 .. len - 1 is scored exactly once, with at least block_size - stride tokens of
context (or all the tokens before it, in the first window). stride = 1 is the MGK / FiSH papers' protocol (every
token predicted from the block_size - 1 tokens before it, or all of them early in the stream); stride = block_size is the block evaluation of `run_clm.py` (blocks side by side, each scored alone), whose windows
share no token, so the first token of each window after the first has no prediction either (as in the block
evaluation); the remainder that the block evaluation drops is scored here, as a shorter last window.

Each window is an ordinary forward pass from position 0 (decoders count absolute positions from 0 in every
window; NPRF-RoBERTa from its padding offset, as it does for any input without padding), no cache, no padding:
windows of equal length are batched (left-aligned, no mask needed), the shorter last one runs on its own.
"""

import math

import torch
import torch.nn.functional as F

__all__ = ["strided_eval", "window_spans"]


def window_spans(n_tokens, block_size, stride):
    """[(start, end, n_scored)] of the windows over a stream of `n_tokens` tokens: the window is stream[start:end]
    and its last `n_scored` *predictions* count (positions end - 1 - n_scored .. end - 2, predicting the tokens
    end - n_scored .. end - 1). A window with nothing to score is left out (at stride = block_size, a last window
    of one token). Checks the arguments: 0 < stride <= block_size, block_size >= 2, n_tokens >= 2."""
    _check(n_tokens, block_size, stride)
    spans, scored_until = [], 0  # the stream's tokens before `scored_until` are scored (or token 0)
    for start in range(0, n_tokens, stride):
        end = min(start + block_size, n_tokens)
        n_scored = min(end - scored_until, end - start - 1)  # the window's first token has no prediction
        if n_scored > 0:  # not so only for a last window of one token at stride = block_size
            spans.append((start, end, n_scored))
        scored_until = end
        if end == n_tokens:
            break
    return spans


def _check(n_tokens, block_size, stride):
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2 (a token and the next one); got {block_size}")
    if not 0 < stride <= block_size:
        raise ValueError(f"the stride must be in 1..{block_size} (the block size); got {stride}")
    if n_tokens < 2:
        raise ValueError(f"the token stream has {n_tokens} token(s): nothing to predict")


def strided_eval(model, token_ids, block_size, stride, batch_size=8, device=None):
    """Mean next-token negative log-likelihood of a causal LM over one token stream, read in sliding windows.

    model: a causal LM (`...LMHeadModel` / `...ForCausalLM` of any family here, or stock GPT-2) taking `input_ids`
        and `logits_to_keep`; run in eval mode (its mode is restored after) under `torch.no_grad`, in its own dtype
        (the log-probabilities in float32).
    token_ids: the stream, a 1-D sequence of ints (list, tensor, numpy array).
    block_size: tokens per window (at most what the model's positions take).
    stride: how far each window starts after the previous one, 1 .. block_size; each window scores its last
        `stride` tokens (see the module's docstring). 1 is the papers' protocol and costs one forward per token.
    batch_size: windows per forward pass.
    device: where the windows go; None: the device of the model's first parameter. The model must be there.

    Returns {"loss": mean NLL (nats) over the scored tokens, "perplexity": exp(loss) (inf on overflow),
    "scored_tokens": how many, "windows": how many}. Single process: under torchrun call it on one rank (run_clm.py
    calls it on the main process only); a sharded model (FSDP, DeepSpeed ZeRO-3) is not supported."""
    ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1).cpu()
    spans = window_spans(len(ids), block_size, stride)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    if device is None:
        device = next(model.parameters()).device

    # Group windows that share a length and a number of scored predictions: the first (scores all), the full
    # ones after it (score `stride`, or block_size - 1 at stride = block_size), the shorter last one.
    groups = {}
    for start, end, n_scored in spans:
        groups.setdefault((end - start, n_scored), []).append(start)

    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        with torch.no_grad():
            for (length, n_scored), starts in groups.items():
                for i in range(0, len(starts), batch_size):
                    chunk = torch.tensor(starts[i:i + batch_size])
                    windows = ids[chunk[:, None] + torch.arange(length)].to(device)
                    # The logits of the last n_scored + 1 positions: the first n_scored predict the scored tokens
                    # (the window's last position predicts past it).
                    logits = model(input_ids=windows, use_cache=False, logits_to_keep=n_scored + 1).logits
                    logits = logits[:, -(n_scored + 1):-1].float()
                    targets = windows[:, length - n_scored:]
                    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                          reduction="sum")
                    total += nll.item()
                    count += targets.numel()
    finally:
        model.train(was_training)
    loss = total / count
    try:
        ppl = math.exp(loss)
    except OverflowError:
        ppl = float("inf")
    return {"loss": loss, "perplexity": ppl, "scored_tokens": count, "windows": len(spans)}
