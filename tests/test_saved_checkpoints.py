"""Checkpoints saved before the restructuring (the family registry, the references and backends, the
shared mask and block modules, the hook in run_layers) load strictly with today's code and give the same outputs.

tests/data/families_v1/ was written by tests/data/make_families_v1.py with the package at commit 42782e1: MGK-BERT,
MGK-GPT2 and NPRF-RoBERTa, several attention types, LM heads and classifiers (FiSH-GPT2's are in fish_gpt2_v1/,
tests/test_decoder_stack.py)."""

import os

import pytest
import torch

import hf_mgk
from conftest import assert_close

DATA = os.path.join(os.path.dirname(__file__), "data", "families_v1")
CLASSES = {  # folder -> the class that saved it
    "mgk-bert-mgk": "MGKBertForMaskedLM", "mgk-bert-smgk-hard-em": "MGKBertForMaskedLM",
    "mgk-bert-mlk": "MGKBertForMaskedLM", "mgk-bert-cls-softmax": "MGKBertForSequenceClassification",
    "mgk-gpt2-mgk": "MGKGPT2LMHeadModel", "mgk-gpt2-smgk-em": "MGKGPT2LMHeadModel",
    "mgk-gpt2-smlk": "MGKGPT2LMHeadModel", "mgk-gpt2-cls-mgk": "MGKGPT2ForSequenceClassification",
    "nprf-roberta-nprf": "NPRFRobertaForMaskedLM", "nprf-roberta-prf-no-rpe": "NPRFRobertaForMaskedLM",
    "nprf-roberta-causal": "NPRFRobertaForCausalLM", "nprf-roberta-cls": "NPRFRobertaForSequenceClassification",
}


def test_every_saved_folder_is_tested():
    assert set(CLASSES) == {d for d in os.listdir(DATA) if os.path.isdir(os.path.join(DATA, d))}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_checkpoint_saved_before_the_restructuring_loads_and_computes_the_same(name):
    folder = os.path.join(DATA, name)
    model, info = getattr(hf_mgk, CLASSES[name]).from_pretrained(folder, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    expected = torch.load(os.path.join(folder, "expected.pt"))
    with torch.no_grad():
        out = model.eval()(**torch.load(os.path.join(DATA, "inputs.pt")), output_hidden_states=True,
                           output_attentions=True)
    assert_close(out.logits, expected["logits"], rtol=1e-6)
    for ours, theirs in zip(out.hidden_states, expected["hidden_states"], strict=True):
        assert_close(ours, theirs, rtol=1e-6)
    for ours, theirs in zip(out.attentions, expected["attentions"], strict=True):
        assert_close(ours, theirs, rtol=1e-6)
