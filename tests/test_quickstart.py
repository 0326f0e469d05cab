"""The main job (scripts/quickstart.py) end to end on a tiny budget: real MiniLM BERT checkpoint, Shakespeare,
the movie-review polarity task, the softmax baseline beside MGK, export and reload without hf_mgk."""

import csv
import json
import os
import sys

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertForSequenceClassification

from hf_mgk import bundled

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import quickstart  # noqa: E402

TINY = ["--adapt_steps", "2", "--finetune_steps", "3", "--max_train_samples", "48", "--max_eval_samples", "40",
        "--max_seq_length", "32", "--batch_size", "8"]


def accuracy_of(folder, rows):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        enc = tokenizer([r["sentence"] for r in rows], truncation=True, max_length=64, padding=True,
                        return_tensors="pt")
        predicted = model(**enc).logits.argmax(-1).tolist()
    labels = [model.config.label2id[r["label"]] for r in rows]
    return sum(p == y for p, y in zip(predicted, labels)) / len(rows)


@pytest.fixture(scope="module")
def mgk_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("quickstart") / "run"
    return quickstart.main(TINY + ["--output_dir", str(out)]), out


def test_main_job_compares_half_the_heads_with_the_baseline(mgk_run):
    summary, out = mgk_run
    assert summary["mgk"]["heads"] == 6 and summary["softmax"]["heads"] == 12  # MiniLM has 12 heads of 32
    # The baseline is the stock checkpoint's own classifier, parameter for parameter.
    stock = BertForSequenceClassification.from_pretrained(bundled.bert_checkpoint_dir(), num_labels=2)
    assert summary["softmax"]["parameters"] == sum(p.numel() for p in stock.parameters())
    assert summary["mgk"]["parameters"] < summary["softmax"]["parameters"]
    config = json.load(open(os.path.join(summary["mgk"]["folder"], "config.json")))
    assert (config["attention_type"], config["num_attention_heads"], config["head_dim"]) == ("mgk", 6, 32)

    with open(os.path.join(out, "data", "validation.csv"), encoding="utf-8") as f:
        held_out = list(csv.DictReader(f))[:40]
    for name in ("mgk", "softmax"):
        folder = summary[name]["folder"]
        with open(os.path.join(folder, "eval_results.json")) as f:
            saved = json.load(f)
        assert saved["eval_samples"] == 40
        assert summary[name]["eval_accuracy"] == saved["eval_accuracy"]
        assert summary[name]["eval_accuracy"] == pytest.approx(accuracy_of(folder, held_out), abs=1e-9)
        assert summary[name]["adapt_ms_per_step"] > 0 and summary[name]["finetune_ms_per_step"] > 0


def test_main_job_exports_a_folder_that_reproduces_the_accuracy_without_hf_mgk(mgk_run):
    summary, out = mgk_run
    exported = summary["exported"]
    assert exported["agreeing_predictions"] == 40
    assert exported["accuracy"] == pytest.approx(summary["mgk"]["eval_accuracy"], abs=1e-9)
    files = set(os.listdir(exported["folder"]))
    assert {"model.safetensors", "config.json", "modeling_mgk_bert.py", "tokenizer.json", "README.md"} <= files
    assert not any(name.endswith(".bin") for name in files)


def test_main_job_refuses_a_used_folder_and_a_family_without_checkpoint(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit):
        quickstart.main(TINY + ["--output_dir", str(tmp_path)])
    assert "--overwrite" in capsys.readouterr().err
    assert (tmp_path / "keep.txt").read_text() == "mine"
    with pytest.raises(SystemExit):
        quickstart.main(["--family", "fish-gpt2", "--output_dir", str(tmp_path / "new")])
    assert "needs --model_name_or_path" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        quickstart.main(["--attention_type", "softmax", "--output_dir", str(tmp_path / "new")])
    assert "baseline itself" in capsys.readouterr().err


@pytest.mark.parametrize("family, attention, heads", [("fish-gpt2", "hard_fish", 4), ("mgk-gpt2", "mgk", 2)])
def test_main_job_gpt2_families_from_a_stock_gpt2(family, attention, heads, tmp_path):
    """FiSH-GPT2 keeps the 4 heads (sharing M global query/key heads), MGK-GPT2 half of them (2 heads of the
    checkpoint's size 8); each baseline is the same family with softmax attention and every head."""
    from test_run_lm import save_tiny_stock_gpt2

    stock = save_tiny_stock_gpt2(tmp_path / "gpt2")
    summary = quickstart.main(["--family", family, "--model_name_or_path", stock, "--output_dir",
                               str(tmp_path / "run")] + TINY)
    config = json.load(open(os.path.join(summary[attention]["folder"], "config.json")))
    assert (config["model_type"], config["attention_type"], config["n_head"]) == (family, attention, heads)
    baseline = json.load(open(os.path.join(summary["softmax"]["folder"], "config.json")))
    assert (baseline["model_type"], baseline["attention_type"], baseline["n_head"]) == (family, "softmax", 4)
    if family == "mgk-gpt2":
        assert config["head_dim"] == 8 and summary[attention]["heads"] == 2
    assert summary[attention]["parameters"] < summary["softmax"]["parameters"]
    assert summary["exported"]["agreeing_predictions"] == 40
