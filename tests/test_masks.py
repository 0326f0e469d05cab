"""Attention masks as stock models take them: a (batch, length) padding mask, or a custom 3-D (batch, N, S) /
4-D (batch, 1, N, S) mask, bool (True = may attend, 0/1 integers alike) or additive (0 / the dtype's minimum),
which is the whole mask (it replaces the causal one, as in stock models). Every attention that can honour a custom
mask does; NPRF's linear-time paths cannot, and say so."""

import functools

import pytest
import torch

from conftest import assert_close
from hf_mgk import (
    FiSHGPT2Config,
    FiSHGPT2Model,
    MGKBertConfig,
    MGKBertModel,
    MGKGPT2Config,
    MGKGPT2Model,
    NPRFRobertaConfig,
    NPRFRobertaModel,
)
from hf_mgk import attention_nprf, modeling_nprf_roberta
import tiny

BERT = tiny.bert(dropout=False)
GPT2 = tiny.gpt2(dropout=False, use_cache=False)
ROBERTA = tiny.roberta(dropout=False, num_random_features=16, pad_token_id=1)

CASES = {  # name: (model, causal)
    **{f"mgk-{t}": (lambda t=t: MGKBertModel(MGKBertConfig(**BERT, attention_type=t)), False)
       for t in ("softmax", "mgk", "smgk", "mlk", "smlk")},
    "mgk-mgk-hard-causal": (lambda: MGKBertModel(MGKBertConfig(**BERT, e_step="hard", is_decoder=True)), True),
    **{f"fish-{t}": (lambda t=t: FiSHGPT2Model(FiSHGPT2Config(**GPT2, attention_type=t, num_global_heads=2)), True)
       for t in ("softmax", "fish", "gfish", "mish")},
    **{f"mgkgpt2-{t}": (lambda t=t: MGKGPT2Model(MGKGPT2Config(**GPT2, attention_type=t)), True)
       for t in ("softmax", "mgk", "smgk", "mlk", "smlk")},
    "mgkgpt2-mgk-hard": (lambda: MGKGPT2Model(MGKGPT2Config(**GPT2, e_step="hard", num_keys=3)), True),
    "nprf-softmax": (lambda: NPRFRobertaModel(NPRFRobertaConfig(**ROBERTA, attention_type="softmax")), False),
    "nprf-nprf": (lambda: NPRFRobertaModel(NPRFRobertaConfig(**ROBERTA)), False),
    "nprf-nprf-causal": (lambda: NPRFRobertaModel(NPRFRobertaConfig(**ROBERTA, is_decoder=True)), True),
}


def model_for(case):
    build, causal = CASES[case]
    model = build().eval()
    rpe = getattr(model, "relative_position", None)
    if rpe is not None:  # a bias that matters (it starts at zero)
        with torch.no_grad():
            rpe.weight.normal_()
    return model, causal


def padded_batch(n=8):
    ids = torch.randint(3, 99, (3, n))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    return ids, mask


def as_pairs(mask, causal):
    """The bool (B, N, S) mask a padding mask (and causality) stands for."""
    n = mask.shape[1]
    pairs = mask.bool()[:, None, :].expand(-1, n, -1)
    return pairs & torch.ones(n, n, dtype=torch.bool).tril() if causal else pairs


def run(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).last_hidden_state


@pytest.mark.parametrize("case", list(CASES))
def test_3d_and_4d_masks_equal_the_padding_mask(case):
    model, causal = model_for(case)
    ids, mask = padded_batch()
    expected = run(model, ids, mask)
    pairs = as_pairs(mask, causal)
    minimum = torch.finfo(torch.float32).min
    forms = {
        "3-D bool": pairs,
        "3-D 0/1": pairs.long(),
        "4-D bool": pairs[:, None],
        "4-D additive": torch.zeros(pairs[:, None].shape).masked_fill(~pairs[:, None], minimum),
    }
    for name, custom in forms.items():
        assert_close(run(model, ids, custom), expected, rtol=1e-5, msg=name)
    # and the mask is not ignored
    assert (run(model, ids, torch.ones_like(pairs)) - expected).abs().max() > 1e-3


def attention_and_kwargs(model):
    """The first layer's attention module, and what the model passes it besides the mask."""
    if isinstance(model, (FiSHGPT2Model, MGKGPT2Model)):
        return model.h[0].attn, {}
    kwargs = {}
    if isinstance(model, NPRFRobertaModel):
        kwargs["relative_position"] = getattr(model, "relative_position", None)
    return model.encoder.layer[0].attention.self, kwargs


def custom_pattern(b, n, causal):
    """A random bool (B, N, N) pattern, every query seeing itself (and, when causal, nothing after itself)."""
    pattern = torch.rand(b, n, n) < 0.5
    pattern |= torch.eye(n, dtype=torch.bool)
    return pattern & torch.ones(n, n, dtype=torch.bool).tril() if causal else pattern


@pytest.mark.parametrize("case", list(CASES))
def test_custom_pattern_equals_one_padding_mask_per_query(case):
    """Reference for any attention: query i under a custom pattern is query i under the padding mask that hides
    the keys its row of the pattern hides (with causality, for a causal pattern), computed on the 2-D path."""
    model, causal = model_for(case)
    attention, kwargs = attention_and_kwargs(model)
    b, n = 2, 7
    hidden = torch.randn(b, n, model.config.hidden_size)
    pattern = custom_pattern(b, n, causal)
    minimum = torch.finfo(torch.float32).min
    with torch.no_grad():
        out = attention(hidden, attention_mask=pattern[:, None], **kwargs)[0]
        additive = torch.zeros(b, 1, n, n).masked_fill(~pattern[:, None], minimum)
        assert_close(attention(hidden, attention_mask=additive, **kwargs)[0], out, rtol=1e-5)
        for i in range(n):
            row = attention(hidden, attention_mask=pattern[:, i], **kwargs)[0][:, i]
            assert_close(out[:, i], row, rtol=1e-5, msg=f"query {i}")


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_softmax_custom_mask_against_the_formula(implementation):
    """The softmax baseline under a custom pattern and an additive mask with other values than 0 / minimum (a
    bias): softmax(q k^T / sqrt(d) + bias) v, written out."""
    model = MGKBertModel(MGKBertConfig(**BERT, attention_type="softmax")).eval()
    model.set_attn_implementation(implementation)
    attention = model.encoder.layer[0].attention.self
    b, n, h, d = 2, 6, 4, 8
    hidden = torch.randn(b, n, 32)
    bias = torch.randn(b, 1, n, n).masked_fill(~custom_pattern(b, n, False)[:, None], torch.finfo(torch.float32).min)

    def heads(x):
        return x.view(b, n, h, d).transpose(1, 2)

    with torch.no_grad():
        q, k, v = heads(attention.query(hidden)), heads(attention.key(hidden)), heads(attention.value(hidden))
        weights = torch.softmax(q @ k.transpose(-1, -2) / d**0.5 + bias, dim=-1)
        expected = (weights @ v).transpose(1, 2).reshape(b, n, h * d)
        assert_close(attention(hidden, attention_mask=bias)[0], expected, rtol=1e-5)


def test_nprf_linear_time_paths_refuse_a_custom_mask(monkeypatch):
    """A pair mask needs NPRF's explicit path: where that path's weights would not fit, a clear error, while the
    padding mask still runs on the linear-time paths."""
    model, _ = model_for("nprf-nprf")
    ids, mask = padded_batch()
    expected = run(model, ids, mask)
    small = functools.partial(attention_nprf.nprf_attention, explicit_max_weights=16)
    monkeypatch.setattr(modeling_nprf_roberta, "nprf_attention", small)  # the model's kernel, with a small budget
    assert_close(run(model, ids, mask), expected, rtol=1e-4)  # band path now
    with pytest.raises(ValueError, match=r"3-D / 4-D attention mask needs NPRF's explicit path.*padding mask"):
        run(model, ids, as_pairs(mask, False))
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match="explicit path"):
        attention_nprf.nprf_attention(q, q, q, None, torch.randn(16, 4), backend="fft",
                                      attention_mask=torch.ones(1, 1, 8, 8, dtype=torch.bool))


@pytest.mark.parametrize("case", ["fish-fish", "mgkgpt2-mgk"])
def test_mask_of_the_wrong_shape_is_refused_naming_the_shapes(case):
    model, _ = model_for(case)
    ids, _ = padded_batch()
    with pytest.raises(ValueError, match=r"\(3, 1, 8, 8\); got shape \(3, 1, 8, 7\)"):
        run(model, ids, torch.ones(3, 1, 8, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"padding mask of shape \(3, 8\).*got shape \(3, 9\)"):
        run(model, ids, torch.ones(3, 9))
