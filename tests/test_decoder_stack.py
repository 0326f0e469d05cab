"""The shared GPT-2 stack (modeling_decoder.py): FiSH-GPT2 moved onto it unchanged.

tests/data/fish_gpt2_v1/ holds tiny FiSH-GPT2 checkpoints saved by the code before the move, with the outputs that
code gave (tests/data/make_fish_gpt2_v1.py); today's code must load them strictly and give the same outputs."""

import os

import pytest
import torch
from safetensors import safe_open

from conftest import assert_close
from hf_mgk import FiSHGPT2ForSequenceClassification, FiSHGPT2LMHeadModel

DATA = os.path.join(os.path.dirname(__file__), "data", "fish_gpt2_v1")
LM_TYPES = ["fish", "hard_fish", "gfish", "hard_gfish", "mish", "softmax"]


def _inputs():
    return torch.load(os.path.join(DATA, "inputs.pt"))


@pytest.mark.parametrize("attention_type", LM_TYPES)
def test_fish_checkpoint_saved_before_the_shared_stack_loads_and_computes_the_same(attention_type):
    folder = os.path.join(DATA, f"lm-{attention_type}")
    expected = torch.load(os.path.join(folder, "expected.pt"))
    model, info = FiSHGPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    inputs = _inputs()
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True, output_attentions=True)
        generated = model.generate(inputs["input_ids"][:1, :5], max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert_close(out.logits, expected["logits"], rtol=1e-6)
    for ours, theirs in zip(out.hidden_states, expected["hidden_states"], strict=True):
        assert_close(ours, theirs, rtol=1e-6)
    for ours, theirs in zip(out.attentions, expected["attentions"], strict=True):
        assert_close(ours, theirs, rtol=1e-6)
    assert torch.equal(generated, expected["generated"])
    # and it saves the same tensors under the same names as the checkpoint
    saved = safe_open(os.path.join(folder, "model.safetensors"), "pt").keys()
    assert set(model.state_dict()) - {"lm_head.weight"} == set(saved) - {"lm_head.weight"}


def test_fish_classifier_saved_before_the_shared_stack_loads_and_computes_the_same():
    folder = os.path.join(DATA, "cls-fish")
    model, info = FiSHGPT2ForSequenceClassification.from_pretrained(folder, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    inputs = _inputs()
    with torch.no_grad():
        logits = model(inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    assert_close(logits, torch.load(os.path.join(folder, "expected.pt"))["logits"], rtol=1e-6)
