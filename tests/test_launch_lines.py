"""What docs/scripts.md's launch lines rely on: the DeepSpeed and FSDP2 files in scripts/launch are what Trainer
reads (DeepSpeed's "auto" values filled from the training arguments, FSDP2 wrapping a layer class each family
has), and the scripts say what transformers and accelerate do quietly with ranks on a CPU. (That every launcher
flag and file the page names exists: tests/test_docs_commands.py.)"""

import json
import logging
import os

import pytest
import torch
from transformers import TrainingArguments

import hf_mgk
from hf_mgk import training
from hf_mgk.scripts import run_clm

import tiny

LAUNCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "launch")


@pytest.fixture
def kept_environment():
    """TrainingArguments with FSDP or DeepSpeed set accelerate's environment variables: put them back."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("stage", [2, 3])
def test_the_deepspeed_configs_take_trainers_values(tmp_path, stage, kept_environment):
    pytest.importorskip("deepspeed", reason="DeepSpeed is in the dev extra on Linux only")
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled, unset_hf_deepspeed_config

    path = os.path.join(LAUNCH, f"ds_zero{stage}.json")
    try:
        args = TrainingArguments(str(tmp_path), deepspeed=path, use_cpu=True, per_device_train_batch_size=3,
                                 gradient_accumulation_steps=5, max_grad_norm=0.7, report_to=[])
        config = args.hf_deepspeed_config.config
        assert config["zero_optimization"]["stage"] == stage and is_deepspeed_zero3_enabled() == (stage == 3)
        assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"],
                config["train_batch_size"], config["gradient_clipping"]) == (3, 5, 15, 0.7)
        assert not config["bf16"]["enabled"] and not config["fp16"]["enabled"]
        assert "optimizer" not in config and "scheduler" not in config  # Trainer's own
        if stage == 3:  # the saved folder is an ordinary checkpoint
            assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
        left = [k for k, v in json.loads(json.dumps(config)).items() if v == "auto"]
        assert not left, left
    finally:
        unset_hf_deepspeed_config()  # else every model built later in this process would be partitioned


FSDP = {  # file: the families it serves
    "fsdp2_decoders.json": [("MGKGPT2LMHeadModel", "MGKGPT2Config", tiny.gpt2()),
                            ("FiSHGPT2LMHeadModel", "FiSHGPT2Config", dict(tiny.gpt2(), num_global_heads=2))],
    "fsdp2_encoders.json": [("MGKBertForMaskedLM", "MGKBertConfig", tiny.bert()),
                            ("NPRFRobertaForMaskedLM", "NPRFRobertaConfig", tiny.roberta())],
    "fsdp2_llama.json": [("MGKLlamaForCausalLM", "MGKLlamaConfig", tiny.llama()),
                         ("FiSHLlamaForCausalLM", "FiSHLlamaConfig", tiny.llama())],
}


@pytest.mark.parametrize("name", sorted(FSDP))
def test_the_fsdp2_configs_wrap_a_layer_of_each_family(tmp_path, name, kept_environment):
    args = TrainingArguments(str(tmp_path), fsdp=True, fsdp_config=os.path.join(LAUNCH, name), use_cpu=True,
                             report_to=[])
    assert args.fsdp and args.fsdp_config["version"] == 2
    assert args.fsdp_config["state_dict_type"] == "FULL_STATE_DICT"
    (layer,) = args.fsdp_config["transformer_layer_cls_to_wrap"]
    for cls, config_cls, fields in FSDP[name]:
        model = getattr(hf_mgk, cls)(getattr(hf_mgk, config_cls)(**fields))
        layers = [m for m in model.modules() if type(m).__name__ == layer]
        assert len(layers) == model.config.num_hidden_layers and layer in model._no_split_modules, cls


def _clm(tmp_path, *extra):
    (tmp_path / "train.txt").write_text("a line\n")
    return ["--model_type", "fish-gpt2", "--tokenizer_name", "unused", "--train_file", str(tmp_path / "train.txt"),
            "--do_train", "--output_dir", str(tmp_path / "out"), "--report_to", "none", *extra]


@pytest.mark.skipif(torch.cuda.is_available(), reason="ranks with a GPU each are distributed without --use_cpu")
def test_ranks_without_use_cpu_or_accelerators_are_refused(tmp_path, monkeypatch, capsys):
    # A launcher's rank (WORLD_SIZE) on a machine without GPUs, and no --use_cpu: not distributed for transformers.
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exit_info:
        training.parse_args(run_clm.DataTrainingArguments, _clm(tmp_path))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "started as one of 2 ranks" in err and "each rank would train alone" in err and "--use_cpu" in err
    assert not (tmp_path / "out").exists()


def test_fsdp_on_the_cpu_says_it_runs_as_ddp(tmp_path, caplog, kept_environment):
    with caplog.at_level(logging.WARNING, logger="hf_mgk.training"):
        training.parse_args(run_clm.DataTrainingArguments, _clm(tmp_path, "--use_cpu", "--fsdp"))
    assert any("accelerate enables FSDP on accelerators only" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hf_mgk.training"):
        training.parse_args(run_clm.DataTrainingArguments, _clm(tmp_path, "--use_cpu"))
    assert not any("FSDP" in r.getMessage() for r in caplog.records)
