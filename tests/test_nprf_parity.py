"""NPRF-RoBERTa against independent references (SPEC §0, §3).

1. attention_type="softmax" is stock RoBERTa: every task head loads a stock checkpoint folder through
   `from_pretrained` with no missing or unexpected key and gives the stock model's outputs and losses.
2. attention_type="nprf" with output_attentions=True returns the matrices of SPEC §3 written out plainly here
   from the layer's own projections, W and bias table (T5 buckets taken from transformers' T5, not from
   hf_mgk), and those matrices applied to V give the layer's output, also where the model takes a fast path.
"""

import pytest
import torch
from transformers import (
    RobertaConfig,
    RobertaForCausalLM,
    RobertaForMaskedLM,
    RobertaForQuestionAnswering,
    RobertaForSequenceClassification,
    RobertaModel,
)
from transformers.models.t5.modeling_t5 import T5Attention

import tiny
from conftest import assert_close, roberta_padded_batch as padded_batch
from hf_mgk import (
    NPRFRobertaConfig,
    NPRFRobertaForCausalLM,
    NPRFRobertaForMaskedLM,
    NPRFRobertaForQuestionAnswering,
    NPRFRobertaForSequenceClassification,
    NPRFRobertaModel,
    attention_nprf,
    modeling_nprf_roberta,
)
from hf_mgk.attention_masks import mask_kind

ROBERTA = tiny.roberta(dropout=False, num_labels=3,
                       initializer_range=0.2)  # 10x the default: attention is not lost beside the residual


# ------------------------------------------------------------------ 1. softmax = stock RoBERTa, every head
def _lm_labels(ids, mask):
    return ids.masked_fill(mask == 0, -100)


HEADS = {  # stock class, ours, stock config overrides, labels for the loss, output fields compared
    "base": (RobertaModel, NPRFRobertaModel, {}, lambda ids, mask: {},
             ("last_hidden_state", "pooler_output")),
    "masked-lm": (RobertaForMaskedLM, NPRFRobertaForMaskedLM, {},
                  lambda ids, mask: {"labels": _lm_labels(ids, mask)}, ("logits",)),
    "sequence-classification": (RobertaForSequenceClassification, NPRFRobertaForSequenceClassification, {},
                                lambda ids, mask: {"labels": torch.tensor([0, 2, 1])}, ("logits",)),
    "question-answering": (RobertaForQuestionAnswering, NPRFRobertaForQuestionAnswering, {"num_labels": 2},
                           lambda ids, mask: {"start_positions": torch.tensor([1, 4, 2]),
                                              "end_positions": torch.tensor([3, 7, 5])},
                           ("start_logits", "end_logits")),
    "causal-lm": (RobertaForCausalLM, NPRFRobertaForCausalLM, {"is_decoder": True},
                  lambda ids, mask: {"labels": _lm_labels(ids, mask)}, ("logits",)),
}


@pytest.mark.parametrize("head", list(HEADS))
def test_softmax_from_a_stock_folder_reproduces_roberta(head, tmp_path):
    stock_cls, ours_cls, extra, labels, fields = HEADS[head]
    stock = stock_cls(RobertaConfig(**{**ROBERTA, **extra})).eval()
    stock.save_pretrained(tmp_path)
    ours, info = ours_cls.from_pretrained(tmp_path, attention_type="softmax", output_loading_info=True)
    ours.eval()
    assert ours.config.attention_type == "softmax"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info

    ids, mask = padded_batch()
    with torch.no_grad():
        ref = stock(ids, attention_mask=mask)
        out = ours(ids, attention_mask=mask)
        for field in fields:
            assert_close(getattr(out, field), getattr(ref, field), rtol=1e-6, msg=field)
        targets = labels(ids, mask)
        if targets:
            ref_loss = stock(ids, attention_mask=mask, **targets).loss
            assert_close(ours(ids, attention_mask=mask, **targets).loss, ref_loss, rtol=1e-6, msg="loss")


# ------------------------------------------------------------------ 2. output_attentions = SPEC §3, written out
NPRF = dict(ROBERTA, num_random_features=16, rpe_num_buckets=8, rpe_max_distance=16)
# (initializer_range 0.2 also makes q, k large enough for the unnormalised features to vary)
VARIANTS = {  # config overrides, sequence length
    "bidirectional": ({}, 10),
    "causal": ({"is_decoder": True}, 10),
    "unnormalized": ({"normalize_qk": False}, 10),
    "no-rpe": ({"use_rpe": False}, 10),
    # long enough for the band path in a forward without output_attentions
    "bidirectional-long": ({"use_absolute_positions": False}, 240),
    "causal-long": ({"is_decoder": True, "use_absolute_positions": False}, 240),
}


def spec_attention(attn, hidden, mask, bias_table, config):
    """SPEC §3 for one layer, in float64: a_ij ∝ φ(q̂_i)·φ(k̂_j) c_{j−i}, 0 for padded keys and (causal) j > i.

    q̂ = q/‖q‖ (normalize_qk=False: q·D^(−1/4), the PRF ablation's Performer scaling, see NPRFRobertaConfig),
    φ(x) = exp(W x − ‖x‖²/2) / √m, c_{j−i} = exp(b[bucket(j − i)]) (c = 1 without RPE).
    Returns the (B, H, N, N) matrix and the values (B, H, N, D)."""
    B, N, _ = hidden.shape
    H, D = attn.num_heads, attn.head_dim

    def heads(linear):
        return linear(hidden).double().view(B, N, H, D).transpose(1, 2)

    q, k, v = heads(attn.query), heads(attn.key), heads(attn.value)
    if config.normalize_qk:
        q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    else:
        q, k = q * D**-0.25, k * D**-0.25
    W = attn.features.double()

    def phi(x):
        return torch.exp(x @ W.T - (x * x).sum(-1, keepdim=True) / 2) / W.shape[0] ** 0.5

    a = phi(q) @ phi(k).transpose(-1, -2)
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    if bias_table is not None:
        bucket = T5Attention._relative_position_bucket(j - i, bidirectional=not config.is_decoder,
                                                       num_buckets=config.rpe_num_buckets,
                                                       max_distance=config.rpe_max_distance)
        a = a * torch.exp(bias_table.double()[:, bucket])
    a = a.masked_fill(mask[:, None, None, :] == 0, 0.0)
    if config.is_decoder:
        a = a.masked_fill(j > i, 0.0)
    return a / a.sum(-1, keepdim=True), v


def run_with_layer_io(model, ids, mask, **kwargs):
    """The model's output, and per layer the self-attention's input hidden states and its output (B, N, H*D)."""
    seen = []

    def hook(module, args, output):
        seen.append((args[0].detach(), output[0].detach()))

    handles = [layer.attention.self.register_forward_hook(hook) for layer in model.base_model.encoder.layer]
    try:
        with torch.no_grad():
            out = model(ids, attention_mask=mask, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return out, seen


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_output_attentions_are_the_spec_matrices_and_give_the_layer_output(variant, monkeypatch):
    overrides, n = VARIANTS[variant]
    config = NPRFRobertaConfig(**{**NPRF, **overrides})
    model = (NPRFRobertaForCausalLM if config.is_decoder else NPRFRobertaModel)(config).eval()
    rpe = getattr(model.base_model, "relative_position", None)
    assert (rpe is not None) == config.use_rpe
    bias_table = None
    if rpe is not None:
        bias_table = rpe.weight
        with torch.no_grad():
            bias_table.normal_(0.0, 1.0)  # initialised to 0 (c = 1): give the bias something to do
    ids, mask = padded_batch(b=2, n=n, pad_from=n - 3)

    out, seen = run_with_layer_io(model, ids, mask, output_attentions=True)
    assert len(out.attentions) == len(seen) == config.num_hidden_layers
    for layer, weights, (hidden, _) in zip(model.base_model.encoder.layer, out.attentions, seen):
        expected, _ = spec_attention(layer.attention.self, hidden, mask, bias_table, config)
        assert weights.shape == (2, config.num_attention_heads, n, n)
        assert_close(weights.double(), expected, rtol=1e-5, msg=variant)

    # The same matrices applied to V give each layer's output in a plain forward, whatever path the model takes
    # there (the long inputs take the band path: each call's backend recorded as the backend rule names it).
    backends = []

    def recording(query, key, value, rpe_bias, features, **kw):
        backends.append(attention_nprf.choose_backend(
            batch_heads=query.shape[0] * query.shape[1], n=query.shape[2], s=key.shape[2],
            has_bias=rpe_bias is not None, max_distance=kw["max_distance"], return_weights=kw["return_weights"],
            mask=mask_kind(kw["attention_mask"])))
        return attention_nprf.nprf_attention(query, key, value, rpe_bias, features, **kw)

    monkeypatch.setattr(modeling_nprf_roberta, "nprf_attention", recording)
    _, seen = run_with_layer_io(model, ids, mask)
    assert backends.count("band") == (config.num_hidden_layers if variant.endswith("long") else 0)
    heads, head_dim = config.num_attention_heads, config.attention_head_size
    for layer, (hidden, layer_out) in zip(model.base_model.encoder.layer, seen):
        a, v = spec_attention(layer.attention.self, hidden, mask, bias_table, config)
        expected = (a @ v).transpose(1, 2).reshape(2, n, heads * head_dim)
        assert_close(layer_out.double(), expected, rtol=1e-5, msg=variant)
