"""NPRF-RoBERTa at long lengths (16k, 8k under autocast) and a quick from-scratch training check (SPEC §3).

Tiny widths throughout: the point is the sequence axis (the exact O(N) band path the model takes for long inputs,
checked against the explicit path it takes for short ones) and the numerics, not capacity.
"""


import pytest
import torch

from conftest import assert_close
from hf_mgk import NPRFRobertaConfig, NPRFRobertaForMaskedLM, NPRFRobertaModel
from hf_mgk import attention_nprf

# Default RPE buckets (32, max_distance 128): the band path applies only from about 2w + 3 * 64 tokens
# (w = 91 bidirectional, 113 causal), so a 256-token input takes the explicit path and 16k the band path.
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_random_features=16)


def _path(n, config):
    """The path nprf_attention takes inside this model for one (batch 1) sequence of n tokens."""
    from hf_mgk.modeling_nprf_roberta import NPRFRelativePositionBias

    w = NPRFRelativePositionBias(config).constant_beyond
    return attention_nprf._choose_path(config.num_attention_heads, n, n, True, w, False)


def test_16k_tokens_forward_backward_causal_prefix_and_no_leak():
    """16384 tokens, batch 1, no absolute positions: forward and backward are finite; the first 256 outputs equal
    a 256-token run (band path vs explicit path, and nothing from the later 16k tokens leaks in); the gradient of
    those 256 outputs reaches no later token; a loss over all 16k positions back-propagates finite gradients."""
    config = NPRFRobertaConfig(**TINY, use_absolute_positions=False, is_decoder=True)
    n, prefix = 16384, 256
    assert _path(n, config) == "band" and _path(prefix, config) == "explicit"
    model = NPRFRobertaModel(config, add_pooling_layer=False).train()  # dropout is 0: training mode, deterministic
    ids = torch.randint(3, 99, (1, n))
    embeds = model.embeddings.word_embeddings(ids).detach().requires_grad_()

    out = model(inputs_embeds=embeds, use_cache=False).last_hidden_state
    assert out.shape == (1, n, 32) and torch.isfinite(out).all()
    with torch.no_grad():
        short = model(inputs_embeds=embeds[:, :prefix], use_cache=False).last_hidden_state
    assert_close(out[:, :prefix], short, rtol=1e-5, atol=1e-6, msg="first 256 of 16k vs 256-token run")

    (grad,) = torch.autograd.grad(out[:, :prefix].square().sum(), embeds, retain_graph=True)
    assert torch.isfinite(grad).all() and grad[:, :prefix].abs().amax() > 0
    assert grad[:, prefix:].abs().amax() == 0, "later tokens receive gradient from earlier outputs (causal leak)"

    out.square().mean().backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    assert all(torch.isfinite(g).all() for g in grads.values())
    rpe = grads["relative_position.weight"]
    assert rpe.abs().amax() > 0  # the shared bias learns through the band path's prefix sums too
    assert torch.isfinite(embeds.grad).all() and embeds.grad[:, -1].abs().amax() > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autocast_masked_lm_8k_stays_finite_and_close_to_float32(dtype):
    """The full MLM model (absolute positions too, a padded tail) at 8192 tokens under CPU autocast: loss, logits
    and every gradient finite, and the loss within half-precision round-off of the float32 loss."""
    n, pad = 8192, 192
    config = NPRFRobertaConfig(**TINY, max_position_embeddings=n + 2)  # RoBERTa positions start at pad_id + 1
    model = NPRFRobertaForMaskedLM(config).train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 99, (1, n), generator=g)
    mask = torch.ones_like(ids)
    ids[:, -pad:], mask[:, -pad:] = config.pad_token_id, 0
    labels = torch.where((torch.rand(1, n, generator=g) < 0.15) & mask.bool(), ids, torch.full_like(ids, -100))
    assert _path(n, config) == "band"

    with torch.no_grad():
        reference = model(ids, attention_mask=mask, labels=labels).loss
    with torch.autocast("cpu", dtype=dtype):
        out = model(ids, attention_mask=mask, labels=labels)
    assert out.logits.dtype == dtype  # autocast really ran in half precision around the attention
    assert torch.isfinite(out.logits.float()).all() and torch.isfinite(out.loss)
    assert abs(out.loss.item() - reference.item()) < 0.02 * reference.item(), (out.loss.item(), reference.item())
    out.loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name
    assert model.roberta.relative_position.weight.grad.abs().amax() > 0
