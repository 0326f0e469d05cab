"""`attn_implementation` tells the truth. The softmax baselines run through transformers' attention
implementations like stock models (eager, sdpa, anything registered in AttentionInterface); the other attention
types are their own kernels: no `_supports_*` flag claims otherwise, they run as "eager" (so
`config.output_attentions = True` works), and asking them for another implementation warns once."""

import warnings

import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask, sdpa_mask

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
from hf_mgk import modeling_common
import tiny

BERT = tiny.bert()
FAMILIES = {  # family: (model class, config class, config fields, its other attention type)
    "mgk": (MGKBertModel, MGKBertConfig, BERT, "mgk"),
    "fish": (FiSHGPT2Model, FiSHGPT2Config, tiny.gpt2(num_global_heads=2), "fish"),
    "mgk-gpt2": (MGKGPT2Model, MGKGPT2Config, tiny.gpt2(), "mgk"),
    "nprf": (NPRFRobertaModel, NPRFRobertaConfig, tiny.roberta(pad_token_id=1, num_random_features=16), "nprf"),
}


def build(family, attention_type, **fields):
    model_class, config_class, base, _ = FAMILIES[family]
    return model_class(config_class(**base, **fields, attention_type=attention_type)).eval()


def padded():
    ids = torch.randint(3, 99, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    return ids, mask


def run(model, ids, mask, **kwargs):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, **kwargs)


@pytest.fixture
def fresh_notes(monkeypatch):
    """Forget which (class, attention type) pairs were already warned about."""
    monkeypatch.setattr(modeling_common, "_NOTED_TYPES", set())


@pytest.fixture
def registered():
    """A user's own attention function, registered under 'counting' with the sdpa mask builder; and one under
    'padded_only' with flash attention's (a padding mask), which records the masks it gets."""
    seen = []

    def counting(module, query, key, value, attention_mask, **kwargs):
        seen.append(("counting", attention_mask))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    def padded_only(module, query, key, value, attention_mask, **kwargs):
        seen.append(("padded_only", attention_mask))
        allowed = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        if kwargs.get("is_causal"):
            n, s = query.shape[2], key.shape[2]
            causal = torch.ones(n, s, dtype=torch.bool).tril(s - n)
            allowed = causal if allowed is None else allowed & causal
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=allowed,
                                                               scale=kwargs.get("scaling"))
        return out.transpose(1, 2), None

    AttentionInterface.register("counting", counting)
    AttentionMaskInterface.register("counting", sdpa_mask)
    AttentionInterface.register("padded_only", padded_only)
    AttentionMaskInterface.register("padded_only", flash_attention_mask)
    AttentionInterface.register("no_mask_builder", counting)
    return seen


@pytest.mark.parametrize("family", list(FAMILIES))
def test_softmax_baseline_honours_every_implementation(family, registered):
    model = build(family, "softmax")
    assert model._supports_sdpa and model._supports_flash_attn and model._supports_flex_attn
    assert model.config._attn_implementation == "sdpa"  # the default, as for stock models
    ids, mask = padded()
    expected = run(model, ids, mask).last_hidden_state
    with pytest.raises(ValueError, match="output_attentions"):  # transformers' own refusal under sdpa
        model.config.output_attentions = True
    model.set_attn_implementation("eager")
    model.config.output_attentions = True
    out = run(model, ids, mask)
    assert_close(out.last_hidden_state, expected, rtol=1e-5)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 4, 7, 7)
    model.config.output_attentions = False
    for name in ("counting", "padded_only"):
        model.set_attn_implementation(name)
        registered.clear()
        assert_close(run(model, ids, mask).last_hidden_state, expected, rtol=1e-5, msg=name)
        assert [n for n, _ in registered] == [name, name]  # once per layer: the function really ran
        got = registered[0][1]
        if name == "counting":  # the sdpa builder's form: bool (B, 1, N, S)
            assert got.dtype == torch.bool and got.shape == (2, 1, 7, 7)
            assert torch.equal(got[:, 0, -1], mask.bool())
        else:  # flash attention's form: the padding mask
            assert torch.equal(got.bool(), mask.bool())
    with pytest.raises(ValueError, match="only a \\(batch, sequence_length\\) padding mask"):
        run(model, ids, mask.bool()[:, None, None, :].expand(2, 1, 7, 7))
    model.set_attn_implementation("no_mask_builder")
    with pytest.raises(ValueError, match="no mask builder in transformers' AttentionMaskInterface"):
        run(model, ids, mask)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_other_attention_types_run_as_eager_and_say_so_once(family, fresh_notes, tmp_path):
    other = FAMILIES[family][3]
    model = build(family, other)
    cls = type(model)
    assert not (model._supports_sdpa or model._supports_flash_attn or model._supports_flex_attn)
    assert cls._supports_sdpa  # the class: its softmax models do
    assert model.config._attn_implementation == "eager"
    ids, mask = padded()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning when nothing else was asked for
        asked = run(model, ids, mask, output_attentions=True)
    model.config.output_attentions = True  # transformers refused this while the model claimed sdpa
    by_config = run(model, ids, mask)
    assert len(by_config.attentions) == 2
    for a, b in zip(by_config.attentions, asked.attentions):
        assert torch.equal(a, b)
    model.config.output_attentions = False
    model.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match=f"attention_type='{other}' chooses its own kernel") as record:
        loaded = cls.from_pretrained(tmp_path, attn_implementation="sdpa")
        loaded.set_attn_implementation("sdpa")
        cls.from_pretrained(tmp_path, attn_implementation="flash_attention_2")
    assert len([w for w in record if "chooses its own kernel" in str(w.message)]) == 1  # once
    assert loaded.config._attn_implementation == "eager"
    assert_close(run(loaded, ids, mask).last_hidden_state, run(model, ids, mask).last_hidden_state, rtol=1e-6)


@pytest.mark.slow
def test_softmax_baseline_runs_flex_attention():
    model = build("mgk", "softmax")
    ids, mask = padded()
    expected = run(model, ids, mask).last_hidden_state
    model.set_attn_implementation("flex_attention")
    assert_close(run(model, ids, mask).last_hidden_state, expected, rtol=1e-5)
