"""The Hub export of a model still wrapped for training: DDP's `.module`, torch.compile's `OptimizedModule`, a peft
model. The folder names the family's own classes, carries the family's code files and a card for the family's
head, and reloads to the wrapped model's logits; a peft model is saved with its adapters merged (the model passed
in keeps them)."""

import json
import os

import peft
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoModelForCausalLM

import hf_mgk
from hf_mgk import hub

from conftest import free_port
import tiny

IDS = torch.arange(3, 3 + 2 * 9).reshape(2, 9) % 90 + 3


@pytest.fixture
def process_group():
    """One gloo rank: what DDP needs to wrap a model."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model():
    torch.manual_seed(0)
    config = hf_mgk.MGKGPT2Config(**tiny.gpt2(dropout=False), attention_type="mgk")
    return hf_mgk.MGKGPT2LMHeadModel(config).eval()


def _lora(model):
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True))
    with torch.no_grad():  # lora_B starts at zero: give the adapters something to merge
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return wrapped.eval()


WRAPS = {
    "ddp": lambda model: DistributedDataParallel(model),
    "compiled": torch.compile,
    "peft": _lora,
}


def _logits(model):
    with torch.no_grad():
        return model(input_ids=IDS).logits


@pytest.mark.parametrize("wrap", sorted(WRAPS))
def test_save_for_hub_saves_the_family_model_inside_its_wrapper(tmp_path, wrap, request):
    if wrap == "ddp":
        request.getfixturevalue("process_group")
    model = _model()
    wrapped = WRAPS[wrap](model)
    # compiled: its forward would compile; the model inside computes the same function
    want = _logits(model if wrap == "compiled" else wrapped)
    hub.save_for_hub(wrapped, tmp_path / "out")

    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_mgk_gpt2.MGKGPT2LMHeadModel"
    assert config["architectures"] == ["MGKGPT2LMHeadModel"]
    files = os.listdir(tmp_path / "out")
    assert "modeling_mgk_gpt2.py" in files and not [f for f in files if "adapter" in f]
    card = (tmp_path / "out" / "README.md").read_text()
    assert "pipeline_tag: text-generation" in card and "AutoModelForCausalLM" in card
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(loaded) is hf_mgk.MGKGPT2LMHeadModel
    torch.testing.assert_close(_logits(loaded), want, rtol=1e-5, atol=1e-5)
    if wrap == "peft":  # the merge was on a copy: the user's model still has its adapters, and their effect
        assert any("lora_A" in name for name, _ in wrapped.named_parameters())
        assert torch.equal(_logits(wrapped), want)
        assert not torch.allclose(_logits(_model()), want, atol=1e-3)  # the adapters did change the function


def test_anything_else_is_refused_by_name(tmp_path):
    with pytest.raises(TypeError, match="expected an hf-mgk model.*got a Linear"):
        hub.save_for_hub(torch.nn.Linear(2, 2), tmp_path / "out")
    assert not (tmp_path / "out").exists()
