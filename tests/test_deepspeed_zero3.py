"""Models built under DeepSpeed ZeRO-3 equal the models built alone.

With `--deepspeed` at stage 3, Trainer builds the model inside `deepspeed.zero.Init`: every parameter is partitioned
across the ranks (an empty tensor on each) while `from_pretrained` or `from_config` runs. A warm start that reads the
first key to start MGK's extra keys, or converts a stock GPT-2 state dict, reads nothing there unless it gathers it.
Here two gloo ranks on the CPU build every case with ZeRO-3 active, gather the whole model and save it; the test
builds the same case in one process without DeepSpeed, from the same seed.

A warm start gives identical tensors. That covers the family's own random starts too (extra-key noise, sMGK's
shifts, FiSH's mixing, a new classifier): they are drawn in module order from the RNG as the caller left it, however
the model was built. A new model cannot: inside zero.Init each layer draws as it is built and partitioned, so a
stock BERT's random weights differ from its weights built alone too. There every tensor must follow the same rule:
the same constants, and random tensors of the same mean and spread (a weight left at torch's default init, or a
mixing that missed its start, differs by far more)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import hf_mgk
import tiny

pytestmark = pytest.mark.slow  # two DeepSpeed ranks building a dozen models
pytest.importorskip("deepspeed", reason="DeepSpeed is in the dev extra on Linux only")

STOCK = {  # stock class, tiny fields
    "bert": ("BertForMaskedLM", "BertConfig", "bert"),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", "gpt2"),
    "roberta": ("RobertaForMaskedLM", "RobertaConfig", "roberta"),
    "llama": ("LlamaForCausalLM", "LlamaConfig", "llama"),
}

# name: (class, stock checkpoint or None for a new model from the config, keywords or config fields)
CASES = {
    "mgk-bert-mgk-warm": ("MGKBertForMaskedLM", "bert", {"attention_type": "mgk"}),
    "mgk-bert-smgk-warm": ("MGKBertForMaskedLM", "bert", {"attention_type": "smgk"}),
    "mgk-bert-classifier-warm": ("MGKBertForSequenceClassification", "bert", {"attention_type": "mgk",
                                                                             "num_labels": 3}),
    "mgk-gpt2-mgk-warm": ("MGKGPT2LMHeadModel", "gpt2", {"attention_type": "mgk", "n_head": 2}),
    "mgk-gpt2-smgk-warm": ("MGKGPT2LMHeadModel", "gpt2", {"attention_type": "smgk"}),
    "fish-gpt2-fish-warm": ("FiSHGPT2LMHeadModel", "gpt2", {"attention_type": "fish", "num_global_heads": 2}),
    "fish-gpt2-gfish-warm": ("FiSHGPT2LMHeadModel", "gpt2", {"attention_type": "gfish", "num_global_heads": 2}),
    "fish-gpt2-classifier-warm": ("FiSHGPT2ForSequenceClassification", "gpt2",
                                  {"attention_type": "hard_fish", "num_global_heads": 2, "num_labels": 2}),
    "nprf-roberta-warm": ("NPRFRobertaForMaskedLM", "roberta", {}),
    "mgk-llama-mgk-warm": ("MGKLlamaForCausalLM", "llama", {"attention_type": "mgk", "num_keys": 3}),
    "fish-llama-fish-warm": ("FiSHLlamaForCausalLM", "llama", {"attention_type": "fish", "num_global_heads": 2}),
}
NEW = {
    "mgk-bert-smgk-new": ("MGKBertForMaskedLM", None, dict(tiny.bert(), attention_type="smgk")),
    "mgk-gpt2-mgk-new": ("MGKGPT2LMHeadModel", None, dict(tiny.gpt2(), attention_type="mgk")),
    "fish-gpt2-gfish-new": ("FiSHGPT2LMHeadModel", None, dict(tiny.gpt2(), attention_type="gfish",
                                                              num_global_heads=2)),
    "nprf-roberta-new": ("NPRFRobertaForMaskedLM", None, tiny.roberta()),
    "mgk-llama-smgk-new": ("MGKLlamaForCausalLM", None, dict(tiny.llama(), attention_type="smgk")),
    "fish-llama-gfish-new": ("FiSHLlamaForCausalLM", None, dict(tiny.llama(), attention_type="gfish")),
}

_RANKS = '''
import json, os, socket, sys
import torch

def build(name, cls, stock, fields, stock_folders):
    """One case, as the scripts build it (`from_pretrained`, or `_from_config` as `from_config` does)."""
    import hf_mgk
    torch.manual_seed(0)
    model_cls = getattr(hf_mgk, cls)
    if stock is None:
        return model_cls._from_config(model_cls.config_class(**fields))
    return model_cls.from_pretrained(stock_folders[stock], **fields)

def rank_main(rank, world, out, port, cases, stock_folders):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    import deepspeed
    from transformers.integrations import HfDeepSpeedConfig
    deepspeed.init_distributed(dist_backend="gloo")
    # Kept alive for the whole run: transformers reads ZeRO-3 from this object, as under Trainer's --deepspeed.
    ds = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1,
                            "train_batch_size": world})
    for name, (cls, stock, fields) in cases.items():
        model = build(name, cls, stock, fields, stock_folders)
        params = list(model.parameters())
        assert all(p.numel() == 0 for p in params), name + ": not partitioned"  # ZeRO-3 was on
        with deepspeed.zero.GatheredParameters(params):
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if rank == 0:
            torch.save(state, os.path.join(out, name + ".pt"))
        torch.distributed.barrier()

if __name__ == "__main__":
    out, cases, stock_folders = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(rank_main, args=(2, out, port, cases, stock_folders), nprocs=2)
'''


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import transformers

    out = tmp_path_factory.mktemp("zero3")
    folders = {}
    for name, (cls, config_cls, fields) in STOCK.items():
        torch.manual_seed(1)
        stock = getattr(transformers, cls)(getattr(transformers, config_cls)(**getattr(tiny, fields)()))
        folders[name] = str(out / f"stock-{name}")
        stock.save_pretrained(folders[name])
    script = out / "ranks.py"
    script.write_text(textwrap.dedent(_RANKS))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script), str(out), json.dumps({**CASES, **NEW}), json.dumps(folders)],
                          env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return out, folders


def _alone(cls, stock, fields, folders):
    torch.manual_seed(0)
    model_cls = getattr(hf_mgk, cls)
    if stock is None:
        return model_cls._from_config(model_cls.config_class(**fields))
    return model_cls.from_pretrained(folders[stock], **fields)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_warm_start_under_zero3_equals_the_warm_start_alone(built, name):
    out, folders = built
    cls, stock, fields = CASES[name]
    want = _alone(cls, stock, fields, folders).state_dict()
    got = torch.load(out / f"{name}.pt")
    assert sorted(got) == sorted(want)
    differ = [k for k in want if not torch.equal(got[k], want[k])]
    assert not differ, f"{name}: {differ}"


@pytest.mark.parametrize("name", sorted(NEW))
def test_a_new_model_under_zero3_is_initialised_by_the_same_rules(built, name):
    out, folders = built
    want = _alone(*NEW[name], folders).state_dict()
    got = torch.load(out / f"{name}.pt")
    assert sorted(got) == sorted(want)
    for key, w in want.items():
        g, w = got[key].double(), w.double()
        assert g.shape == w.shape, key
        if w.numel() == 1 or w.std() == 0 or not w.is_floating_point():
            assert torch.equal(g, w), f"{name}: {key} is a constant start"
            continue
        assert torch.equal(g == 0, w == 0), f"{name}: {key}'s zeros (sMGK's first shift) moved"
        spread = 6 / w.numel() ** 0.5  # six standard errors of the estimates
        assert abs(g.std() / w.std() - 1) <= spread, f"{name}: {key} spread {g.std():.4g}, alone {w.std():.4g}"
        assert abs(g.mean() - w.mean()) <= spread * w.std(), f"{name}: {key} mean {g.mean():.4g}, alone {w.mean():.4g}"
