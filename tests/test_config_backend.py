"""The `backend` field of every family's config: checked, saved, and reaching the attention call."""

import pytest
import torch

import hf_mgk
from hf_mgk import attention_fish, attention_mgk, attention_nprf
from hf_mgk.configuration_fish import FISH_BACKENDS
from hf_mgk.configuration_mgk import MGK_BACKENDS
from hf_mgk.configuration_nprf_roberta import NPRF_BACKENDS
import tiny


def test_the_config_names_are_the_attention_functions_backends():
    assert MGK_BACKENDS["mgk"] == MGK_BACKENDS["smgk"] == attention_mgk.BACKENDS
    assert MGK_BACKENDS["mlk"] == MGK_BACKENDS["smlk"] == attention_mgk.MLK_BACKENDS
    assert FISH_BACKENDS == attention_fish.BACKENDS
    assert NPRF_BACKENDS == attention_nprf.BACKENDS


CONFIGS = {
    "mgk-bert": lambda **kw: hf_mgk.MGKBertConfig(**tiny.bert(dropout=False), **kw),
    "mgk-gpt2": lambda **kw: hf_mgk.MGKGPT2Config(**tiny.gpt2(dropout=False), **kw),
    "fish-gpt2": lambda **kw: hf_mgk.FiSHGPT2Config(**tiny.gpt2(dropout=False), **kw),
    "nprf-roberta": lambda **kw: hf_mgk.NPRFRobertaConfig(**tiny.roberta(dropout=False), num_random_features=8,
                                                           **kw),
}
FORCED = {"mgk-bert": "dense", "mgk-gpt2": "dense", "fish-gpt2": "blocked", "nprf-roberta": "explicit"}


@pytest.mark.parametrize("family", CONFIGS)
def test_backend_defaults_to_auto_is_checked_and_saved(family, tmp_path):
    make = CONFIGS[family]
    assert make().backend == "auto"
    with pytest.raises(ValueError, match=r"backend \(for attention_type=.*\) must be one of 'auto', .*; got 'fast'"):
        make(backend="fast")
    make(backend=FORCED[family]).save_pretrained(tmp_path)
    assert type(make()).from_pretrained(tmp_path).backend == FORCED[family]
    # the softmax baseline has no such paths: it accepts the family's names (one config for both) and ignores them
    assert make(attention_type="softmax", backend=FORCED[family]).backend == FORCED[family]


def test_mgk_backend_names_follow_the_attention_type():
    with pytest.raises(ValueError, match=r"attention_type='mlk'\) must be one of 'auto', 'dense', 'linear'; "
                                         r"got 'blocked'"):
        CONFIGS["mgk-bert"](attention_type="mlk", backend="blocked")
    assert CONFIGS["mgk-bert"](attention_type="mlk", backend="linear").backend == "linear"


MODELS = {"mgk-bert": hf_mgk.MGKBertModel, "mgk-gpt2": hf_mgk.MGKGPT2Model, "fish-gpt2": hf_mgk.FiSHGPT2Model,
          "nprf-roberta": hf_mgk.NPRFRobertaModel}


@pytest.mark.parametrize("family", CONFIGS)
def test_a_forced_backend_reaches_the_attention_and_computes_the_same(family):
    """The same weights with backend "auto" and a forced path give the same hidden states (every path is exact),
    and a path that cannot run the call says so: the field reached the attention."""
    torch.manual_seed(0)
    ids = torch.randint(5, 99, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    auto = MODELS[family](CONFIGS[family]()).eval()
    forced = MODELS[family](CONFIGS[family](backend=FORCED[family])).eval()
    forced.load_state_dict(auto.state_dict())
    with torch.no_grad():
        a = auto(input_ids=ids, attention_mask=mask).last_hidden_state
        b = forced(input_ids=ids, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    torch.testing.assert_close(b[keep], a[keep], rtol=1e-5, atol=1e-5)

    refused = {"mgk-bert": (dict(e_step="hard", backend="sdpa"), "backend 'sdpa' cannot run this call: the hard E-step"),
               "mgk-gpt2": (dict(e_step="hard", backend="sdpa"), "backend 'sdpa' cannot run this call: the hard E-step"),
               "fish-gpt2": (dict(backend="fused"), "backend 'fused' cannot run this call: noise"),
               "nprf-roberta": (dict(backend="fft"), "backend 'fft' cannot run this call: return_weights")}[family]
    model = MODELS[family](CONFIGS[family](**refused[0]))
    with pytest.raises(ValueError, match=refused[1]):
        if family == "fish-gpt2":  # noise is drawn in training
            model.train()(input_ids=ids)
        elif family == "nprf-roberta":
            model.eval()(input_ids=ids, output_attentions=True)
        else:
            model.eval()(input_ids=ids)
