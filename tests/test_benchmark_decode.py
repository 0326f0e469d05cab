"""The benchmark's llama family: the KV cache each model holds per token (against what its layout says: stock
Llama's keys and values per key/value head, MGK's M keys per key/value head, FiSH's M global keys and the value
heads) and the decoding table printed beside the models' table, on tiny models in this process. No timed
assertion: the machine is shared and noisy."""

import pytest
import torch

from hf_mgk.benchmark import cli, measure, models
from hf_mgk.benchmark.decode import measure_decode

from conftest import children_in_process

TINY = dict(hidden_size=32, num_hidden_layers=2, intermediate_size=48, vocab_size=50, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, bos_token_id=0, eos_token_id=0, attention_dropout=0.0)


@pytest.fixture
def tiny_llamas(monkeypatch):
    for kind in ("llama", "mgk_llama", "fish_llama"):
        entry = list(models.BUILDERS[kind])
        entry[3] = TINY
        monkeypatch.setitem(models.BUILDERS, kind, models.Builder(*entry))
    calls = []
    monkeypatch.setattr(measure, "call_child", children_in_process(calls))
    threads = torch.get_num_threads()
    yield calls
    torch.set_num_threads(threads)


def test_cache_bytes_per_token_are_each_layouts(tiny_llamas):
    layers, kv, d, fp32 = 2, 2, 8, 4
    cases = [("llama", {}), ("mgk_llama", {"num_keys": 3}), ("fish_llama", {"num_global_heads": 1,
                                                                          "attention_type": "hard_fish"}),
             ("mgk_llama", {"attention_type": "smgk", "num_keys": 2})]
    got = measure_decode(cases, 12, 2, 1, torch.get_num_threads())
    assert got["bytes_per_token"] == [layers * fp32 * d * n for n in (2 * kv, kv * (3 + 1), 1 + kv, kv * (2 + 1))]
    assert all(s > 0 for s in got["seconds"])


def test_the_llama_family_prints_the_decoding_table_beside_the_models(tiny_llamas, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["benchmark.py", "--family", "llama", "--models-only", "--heads", "4",
                                     "--lengths", "8", "--repeats", "1", "--threads", str(torch.get_num_threads())])
    cli.main()
    out = capsys.readouterr().out
    table = out[out.index("KV cache and one decoding step"):].splitlines()
    rows = {line[10:54].strip(): line[54:].split() for line in table[2:] if line.strip()}  # (name, numbers)
    assert set(rows) == {"Llama, 4 heads, 2 KV heads (SDPA)", "MGK-Llama soft, 4 heads, M=2",
                         "MGK-Llama soft, 2 heads, M=2", "FiSH-Llama hard_fish, 4+2 heads"}
    # bytes per token, x base, decode ms, x base
    head_dim = models.LLAMA_SIZE["hidden_size"] // 4  # the family keeps the benchmark width's head size
    assert rows["Llama, 4 heads, 2 KV heads (SDPA)"][0] == str(2 * 4 * head_dim * 2 * 2) and rows["Llama, 4 heads, 2 KV heads (SDPA)"][1] \
        == rows["Llama, 4 heads, 2 KV heads (SDPA)"][3] == "1.00x"
    assert rows["MGK-Llama soft, 4 heads, M=2"][1] == "1.50x"  # (M + 1) / 2 per key/value head
    assert rows["FiSH-Llama hard_fish, 4+2 heads"][1] == "1.00x"  # M = 2 global keys + 2 value heads
    assert all(float(numbers[2]) > 0 for numbers in rows.values())
    assert [name for name, _, _ in tiny_llamas].count("measure_decode") == 1
