"""A model saved from FSDP2 is a checkpoint like any other. torch's `fully_shard` makes the model an `FSDP<Class>`
defined in torch's own module, and `save_pretrained` took the Auto map and the code files from the model's class:
the folder named torch's module and carried torch's files. Here each family is sharded with `fully_shard` on its
`_no_split_modules` layers and the root, on 2 gloo ranks on the CPU, saved as Trainer does (the full state dict,
gathered to rank 0, which saves) by `save_pretrained`, by Trainer's own save and by the Hub export (which gathers
the weights itself), and each folder is loaded in a process where hf_mgk cannot be imported, with the logits of the
model before sharding. The export's model card names the family's head too."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hf_mgk.hub import run_without_package

pytestmark = pytest.mark.slow  # two ranks, and a process without hf_mgk per family

FAMILIES = {  # class, config class, tiny fields
    "mgk-bert": ("MGKBertForMaskedLM", "MGKBertConfig", "bert", {"attention_type": "mgk"}),
    "mgk-gpt2": ("MGKGPT2LMHeadModel", "MGKGPT2Config", "gpt2", {"attention_type": "mgk"}),
    "fish-gpt2": ("FiSHGPT2LMHeadModel", "FiSHGPT2Config", "gpt2",
                  {"attention_type": "hard_fish", "num_global_heads": 2}),
    "nprf-roberta": ("NPRFRobertaForMaskedLM", "NPRFRobertaConfig", "roberta", {}),
    "mgk-llama": ("MGKLlamaForCausalLM", "MGKLlamaConfig", "llama", {"attention_type": "mgk"}),
    "fish-llama": ("FiSHLlamaForCausalLM", "FiSHLlamaConfig", "llama", {"attention_type": "hard_fish"}),
}

_RANKS = '''
import json, os, socket, sys
import torch
import torch.distributed as dist

def rank_main(rank, world, out, port, families):
    # as torchrun sets them: Trainer's arguments read them (without, every rank thinks it is alone and saves)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import hf_mgk, hf_mgk.hub, tiny
    from transformers import Trainer, TrainingArguments
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard
    ids = torch.arange(3, 3 + 2 * 10).reshape(2, 10) % 90 + 3
    for family, (cls, config_cls, fields, extra) in families.items():
        torch.manual_seed(0)
        config = getattr(hf_mgk, config_cls)(**getattr(tiny, fields)(dropout=False), **extra)
        model = getattr(hf_mgk, cls)(config).eval()
        with torch.no_grad():
            want = model(input_ids=ids).logits
        for module in list(model.modules()):
            if type(module).__name__ in model._no_split_modules:
                fully_shard(module)
        fully_shard(model)
        assert type(model).__name__ == "FSDP" + cls, type(model)
        # The full state dict, as accelerate's get_state_dict gathers it for FSDP2 (every rank takes part).
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        folder = os.path.join(out, family)
        if rank == 0:
            model.save_pretrained(os.path.join(folder, "save_pretrained"), state_dict=dict(state))  # (it empties it)
        hf_mgk.hub.save_for_hub(model, os.path.join(folder, "hub"))  # every rank: it gathers the weights
        # Trainer's save under FSDP with a full state dict: save_model hands that state to _save, which calls the
        # sharded model's save_pretrained (writing on rank 0). Trainer enables FSDP only on accelerators, so its
        # FSDP2 wrapping is torch's fully_shard above.
        args = TrainingArguments(os.path.join(folder, "trainer-run"), use_cpu=True, report_to=[])
        Trainer(model=model, args=args)._save(os.path.join(folder, "trainer"), state_dict=state)
        if rank == 0:
            torch.save({"ids": ids, "logits": want}, os.path.join(folder, "want.pt"))
        dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    out, families = sys.argv[1], json.loads(sys.argv[2])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(rank_main, args=(2, out, port, families), nprocs=2)
'''


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp2")
    script = out / "ranks.py"
    script.write_text(textwrap.dedent(_RANKS))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script), str(out), json.dumps(FAMILIES)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.mark.parametrize("route", ["save_pretrained", "trainer", "hub"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_model_saved_from_fsdp2_loads_without_hf_mgk(saved, family, route):
    folder = saved / family / route
    cls = FAMILIES[family][0]
    config = json.loads((folder / "config.json").read_text())
    assert all(not entry.startswith("_fsdp") for entry in config["auto_map"].values()), config["auto_map"]
    assert config["auto_map"]["AutoConfig"].startswith("configuration_")
    assert config["architectures"] == [cls]
    files = sorted(os.listdir(folder))
    assert not [f for f in files if f.startswith("_fsdp")] and any(f.startswith("modeling_") for f in files)
    auto = next(auto for auto, name in config["auto_map"].items() if name.endswith("." + cls))
    if route == "hub":
        card = (folder / "README.md").read_text()
        assert f"{auto}.from_pretrained" in card  # the card's snippet loads the family's head, not the wrapper's
    got = run_without_package(f"""
        import json, torch, transformers
        want = torch.load("../want.pt")
        model = getattr(transformers, {auto!r}).from_pretrained(".", trust_remote_code=True).eval()
        assert type(model).__name__ == {cls!r} and type(model).__module__.startswith("transformers_modules")
        with torch.no_grad():
            logits = model(input_ids=want["ids"]).logits
        print(json.dumps((logits - want["logits"]).abs().max().item()))
        """, cwd=str(folder))
    assert got <= 1e-6
