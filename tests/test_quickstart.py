"""The main job (scripts/quickstart.py) end to end on a tiny budget: real MiniLM BERT checkpoint, Shakespeare,
the movie-review polarity task, the softmax baselines (pruned to MGK's kept heads, and every head) beside MGK, the
timing phase, export and reload without hf_mgk."""

import csv
import json
import os
import sys

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertForSequenceClassification

from hf_mgk import bundled
from hf_mgk import reproduce as R

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import quickstart  # noqa: E402

pytestmark = pytest.mark.slow  # the main job end to end (three arms, timing, export)

# The smallest budget the checks below need: 2 adaptation steps (the control's weights stay within 1e-3 of the
# kept heads'), 40 held-out sentences to compare; batches of 4 and blocks of 16 tokens, since each arm's steps cost
# seconds with the real 22M-parameter checkpoint (the timing phase alone runs 3 arms x 2 stages x 7 rounds of them).
TINY = ["--adapt_steps", "2", "--finetune_steps", "2", "--max_train_samples", "16", "--max_eval_samples", "40",
        "--max_seq_length", "16", "--batch_size", "4", "--timing_rounds", "2"]


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
    for name in ("mgk", "softmax-pruned", "softmax"):
        folder = summary[name]["folder"]
        with open(os.path.join(folder, "eval_results.json")) as f:
            saved = json.load(f)
        assert saved["eval_samples"] == 40
        assert summary[name]["eval_accuracy"] == saved["eval_accuracy"]
        assert summary[name]["eval_accuracy"] == pytest.approx(accuracy_of(folder, held_out), abs=1e-9)
        assert summary[name]["adapt_ms_per_step"] > 0 and summary[name]["finetune_ms_per_step"] > 0


def test_main_job_control_is_softmax_with_mgks_kept_heads(mgk_run):
    """The pruned control starts from the checkpoint's heads that MGK keeps: passed to both as --keep_heads, and
    its adapted query/key/value/output weights per head are those heads' (2 small steps from them)."""
    from transformers import AutoModelForMaskedLM, BertModel

    summary, out = mgk_run
    kept_heads = [0, 2, 4, 6, 8, 10]  # spread evenly, as the mgk-warmstart reproduction keeps them
    assert summary["mgk"]["kept_heads"] == summary["softmax-pruned"]["kept_heads"] == kept_heads
    assert summary["softmax"]["kept_heads"] is None and summary["softmax-pruned"]["heads"] == 6
    assert summary["control"].startswith("softmax-pruned")
    for name in ("mgk", "softmax-pruned"):
        run = json.load(open(os.path.join(out, name, "adapt", "hf_mgk_run.json")))
        assert run["identity"]["keep_heads"] == "0,2,4,6,8,10" == R.WARMSTART_KEEP
    assert json.load(open(os.path.join(out, "softmax", "adapt", "hf_mgk_run.json")))["identity"]["keep_heads"] is None
    config = json.load(open(os.path.join(summary["softmax-pruned"]["folder"], "config.json")))
    assert (config["attention_type"], config["num_attention_heads"], config["head_dim"]) == ("softmax", 6, 32)

    stock = BertModel.from_pretrained(bundled.bert_checkpoint_dir()).encoder.layer
    control = AutoModelForMaskedLM.from_pretrained(os.path.join(out, "softmax-pruned", "adapt"))
    control = control.base_model.encoder.layer
    for layer in (0, len(stock) - 1):
        for part in ("self.query", "self.key", "self.value", "output.dense"):
            theirs = stock[layer].attention.get_submodule(part).weight.detach()
            ours = control[layer].attention.get_submodule(part).weight.detach()
            if part == "output.dense":  # its input is the concatenated heads
                theirs, ours = theirs.T, ours.T
            for head in range(6):
                kept, other = (theirs[h * 32:(h + 1) * 32] for h in (kept_heads[head], kept_heads[head] + 1))
                block = ours[head * 32:(head + 1) * 32]
                assert (block - kept).abs().max() < 1e-3 < (block - other).abs().max(), (layer, part, head)


def test_main_job_times_the_arms_in_one_phase(mgk_run):
    summary, _ = mgk_run
    timing = summary["timing"]
    assert (timing["timed_rounds"], timing["warmup_rounds"], timing["threads"]) == (2, 5, torch.get_num_threads())
    assert "alternating" in timing["how"] and "not the training runs' wall time" in timing["how"]
    for name in ("mgk", "softmax-pruned", "softmax"):
        for stage in ("adapt", "finetune"):
            ms = summary[name][f"{stage}_ms_per_step"]
            assert ms > 0
            assert summary[name][f"{stage}_ms_ratio_to_softmax"] == pytest.approx(
                ms / summary["softmax"][f"{stage}_ms_per_step"])
    assert summary["softmax"]["finetune_ms_ratio_to_softmax"] == 1.0


def test_timing_alternates_the_arms_and_takes_the_median():
    """One step of every arm per round, in turn; warm-up rounds untimed; the median of the clock's differences."""
    now, calls = [0.0], []
    # Seconds per round: with the warm-up rounds, or as a mean or a minimum, the numbers would differ.
    cost = {"a": [9, 9, 1, 2, 3], "b": [9, 9, 10, 30, 20], "c": [9, 9, 5, 5, 100]}

    def step_of(name):
        def step(r):
            calls.append((name, r))
            now[0] += cost[name][r]
        return step

    medians = quickstart.median_step_ms({n: step_of(n) for n in cost}, rounds=3, warmup_rounds=2,
                                        clock=lambda: now[0])
    assert calls == [(n, r) for r in range(5) for n in ("a", "b", "c")]
    assert medians == {"a": 2000, "b": 20000, "c": 5000}


def test_timing_advances_its_progress_once_per_round():
    """The timing phase takes minutes on a loaded machine: its bar moves after every round, once every arm has
    taken its step, warm-up rounds included."""
    calls, updates = [], []

    class Bar:
        def update(self, n=1):
            updates.append((len(calls), n))

    steps = {name: (lambda r, name=name: calls.append((name, r))) for name in ("a", "b", "c")}
    quickstart.median_step_ms(steps, rounds=3, warmup_rounds=2, progress=Bar())
    assert updates == [(3 * r, 1) for r in range(1, 6)]


def test_timing_phase_draws_one_bar_per_stage_on_stderr(tmp_path, capsys):
    """The bars go to stderr: stdout keeps the stage headers (and, in main, the table) for whoever reads it."""
    from types import SimpleNamespace

    from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertTokenizerFast

    import tiny

    vocab = tmp_path / "vocab.txt"  # a tiny vocabulary: the real one's 30,522-row output layer costs seconds
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "film", "to", "be"]) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(vocab))
    config = BertConfig(**tiny.bert(), id2label={0: "negative", 1: "positive"},
                        label2id={"negative": 0, "positive": 1})
    folders = {"adapt": str(tmp_path / "adapt"), "finetune": str(tmp_path / "finetune")}
    for model, folder in ((BertForMaskedLM(config), folders["adapt"]),
                          (BertForSequenceClassification(config), folders["finetune"])):
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    results = {"mgk": {"folders": folders}}  # one arm: what is checked here is where the bars go
    reviews = tmp_path / "train.csv"
    reviews.write_text("sentence,label\na fine film,positive\na dull one,negative\n", encoding="utf-8")
    text = tmp_path / "text.txt"
    text.write_text("To be, or not to be, that is the question.\n" * 4, encoding="utf-8")
    args = SimpleNamespace(family="mgk-bert", attention_type="mgk", batch_size=2, max_seq_length=8,
                           learning_rate=1e-4, timing_rounds=1)

    ms = quickstart.timing_phase(args, results, str(reviews), str(text))
    assert set(ms) == {"adapt", "finetune"} and ms["adapt"]["mgk"] > 0 and ms["finetune"]["mgk"] > 0
    out, err = capsys.readouterr()
    total = quickstart.WARMUP_ROUNDS + 1
    for stage in ("adapt", "finetune"):
        assert f"== timing {stage} steps" in out
        assert f"timing {stage}: 100%" in err and f"{total}/{total}" in err
    assert "%|" not in out

def test_main_job_arms_and_what_the_skip_flags_skip(tmp_path):
    def arms(*flags):
        args = quickstart.parse_args([*flags, "--output_dir", str(tmp_path / "unused")])
        return [(name, quickstart.arm_overrides(args, attention, kept), kept)
                for name, attention, kept in quickstart.arms(args)]

    half = [0, 2, 4, 6, 8, 10]
    assert arms("--attention_overrides", "num_keys=3") == [
        ("mgk", "attention_type=mgk,num_attention_heads=6,num_keys=3", half),
        ("softmax-pruned", "attention_type=softmax,num_attention_heads=6", half),
        ("softmax", "attention_type=softmax", None)]
    assert [a[0] for a in arms("--skip_control")] == ["mgk", "softmax"]
    assert [a[0] for a in arms("--skip_baseline")] == ["mgk"]
    assert arms("--all_heads") == [("mgk", "attention_type=mgk", None), ("softmax", "attention_type=softmax", None)]
    assert arms("--heads", "12")[0][2] is None and len(arms("--heads", "12")) == 2  # every head: nothing to prune
    assert arms("--heads", "4")[1] == ("softmax-pruned", "attention_type=softmax,num_attention_heads=4", [0, 3, 6, 9])
    assert arms("--keep_heads", "0,1,2") == [
        ("mgk", "attention_type=mgk,num_attention_heads=3", [0, 1, 2]),
        ("softmax-pruned", "attention_type=softmax,num_attention_heads=3", [0, 1, 2]),
        ("softmax", "attention_type=softmax", None)]
    for bad in ("0,12", "1,1", "a,b"):  # out of range, twice the same head, not numbers
        with pytest.raises(SystemExit, match="--keep_heads"):
            arms("--keep_heads", bad)
    with pytest.raises(SystemExit):  # one way to say the heads
        arms("--keep_heads", "0,1", "--heads", "2")


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
    from conftest import write_play_split
    from test_run_lm import save_tiny_stock_gpt2

    stock = save_tiny_stock_gpt2(tmp_path / "gpt2")
    # a few hundred lines of one play to adapt on (what these checks need; the main job's test above runs the
    # default three plays): tokenizing the plays took most of each arm's adaptation stage
    play = write_play_split(tmp_path, (0, 600), (600, 900))
    summary = quickstart.main(["--family", family, "--model_name_or_path", stock, "--output_dir",
                               str(tmp_path / "run"), "--adapt_files", play["train"], play["validation"]] + TINY)
    config = json.load(open(os.path.join(summary[attention]["folder"], "config.json")))
    assert (config["model_type"], config["attention_type"], config["n_head"]) == (family, attention, heads)
    baseline = json.load(open(os.path.join(summary["softmax"]["folder"], "config.json")))
    assert (baseline["model_type"], baseline["attention_type"], baseline["n_head"]) == (family, "softmax", 4)
    if family == "mgk-gpt2":
        assert config["head_dim"] == 8 and summary[attention]["heads"] == 2
        control = json.load(open(os.path.join(summary["softmax-pruned"]["folder"], "config.json")))
        assert (control["attention_type"], control["n_head"], control["head_dim"]) == ("softmax", 2, 8)
        assert summary["softmax-pruned"]["kept_heads"] == summary[attention]["kept_heads"] == [0, 2]
    else:  # FiSH keeps every head: no pruned control
        assert "softmax-pruned" not in summary and summary["control"].startswith("none: fish-gpt2 hard_fish keeps")
    assert summary[attention]["parameters"] < summary["softmax"]["parameters"]
    assert summary["exported"]["agreeing_predictions"] == 40


@pytest.mark.parametrize("family, attention", [("fish-llama", "hard_fish"), ("mgk-llama", "mgk")])
def test_main_job_llama_families_from_a_stock_llama(family, attention, tmp_path):
    """The Llama families keep every head of the checkpoint (their conversion selects none): no pruned control;
    the baseline is the same family with softmax attention, stock Llama's function."""
    from conftest import write_play_split
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from hf_mgk import bundled
    import tiny

    tokenizer = AutoTokenizer.from_pretrained(bundled.gpt2_tokenizer_dir())
    torch.manual_seed(0)
    stock = str(tmp_path / "llama")
    LlamaForCausalLM(LlamaConfig(**tiny.llama(vocab_size=len(tokenizer)))).save_pretrained(stock)
    tokenizer.save_pretrained(stock)
    play = write_play_split(tmp_path, (0, 600), (600, 900))
    summary = quickstart.main(["--family", family, "--model_name_or_path", stock, "--output_dir",
                               str(tmp_path / "run"), "--adapt_files", play["train"], play["validation"]] + TINY)
    config = json.load(open(os.path.join(summary[attention]["folder"], "config.json")))
    assert (config["model_type"], config["attention_type"], config["num_attention_heads"]) == (family, attention, 4)
    baseline = json.load(open(os.path.join(summary["softmax"]["folder"], "config.json")))
    assert (baseline["model_type"], baseline["attention_type"]) == (family, "softmax")
    assert "softmax-pruned" not in summary
    assert summary["exported"]["agreeing_predictions"] == 40
