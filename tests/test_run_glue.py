"""scripts/run_glue.py end to end on tiny local files in the GLUE column layout of every task.

Each run trains 2 steps of a tiny model; its saved metrics are checked against metrics computed here, with
scikit-learn / scipy, from the saved model's own predictions on the same file, and its prediction files against
those predictions."""

import csv
import importlib.util
import json
import logging
import os
import random

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import hf_mgk
from hf_mgk import bundled, hub
from hf_mgk.scripts import run_glue
import tiny

pytestmark = pytest.mark.slow  # the script end to end on GLUE / MNLI-format files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MAX_LEN = 32
# The Hub GLUE layout, written out here (not taken from the script): input columns, label names in id order.
LAYOUT = {
    "cola": (("sentence",), ["unacceptable", "acceptable"]),
    "sst2": (("sentence",), ["negative", "positive"]),
    "mrpc": (("sentence1", "sentence2"), ["not_equivalent", "equivalent"]),
    "qqp": (("question1", "question2"), ["not_duplicate", "duplicate"]),
    "stsb": (("sentence1", "sentence2"), None),
    "mnli": (("premise", "hypothesis"), ["entailment", "neutral", "contradiction"]),
    "qnli": (("question", "sentence"), ["entailment", "not_entailment"]),
    "rte": (("sentence1", "sentence2"), ["entailment", "not_entailment"]),
    "wnli": (("sentence1", "sentence2"), ["not_entailment", "entailment"]),
}
# File type of each task's files, and whether its labels are written as names (else as the Hub's ids).
FORMAT = {"cola": ("tsv", False), "sst2": ("csv", False), "mrpc": ("tsv", False), "qqp": ("csv", True),
          "stsb": ("tsv", False), "mnli": ("tsv", True), "qnli": ("jsonl", True), "rte": ("csv", True),
          "wnli": ("json", False)}
SUBMISSION = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B", "mnli": "MNLI-m",
              "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
AS_NAMES = {"mnli", "qnli", "rte"}  # the GLUE server reads label names for these, 0/1 for the others
WORDS = ("the a cat dog bird sat ran on under big small red blue house river quickly slowly not never always "
         "happy sad film movie good bad question answer why who").split()
TINY_BERT = tiny.overrides(tiny.bert_size(max_position_embeddings=tiny.POSITIONS))  # --config_overrides text
COMMON = ["--use_cpu", "--report_to", "none", "--max_steps", "2", "--per_device_train_batch_size", "4",
          "--per_device_eval_batch_size", "8", "--save_strategy", "no", "--max_seq_length", str(MAX_LEN),
          "--disable_tqdm", "true"]


# ---------------------------------------------------------------- data and models written by the tests


def sentence(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))


def make_rows(task, n, rng, labelled=True, first_idx=0):
    keys, labels = LAYOUT[task]
    rows = []
    for i in range(n):
        row = {k: sentence(rng) for k in keys}
        if labelled:  # unbalanced classes, so a label mix-up changes the accuracy
            row["label"] = (round(rng.uniform(0, 5), 1) if labels is None
                            else rng.choices(labels, weights=[4, 2, 1][: len(labels)])[0])
        else:
            row["label"] = -1
        row["idx"] = first_idx + i
        rows.append(row)
    return rows


def write_rows(path, rows, as_names, labels):
    """A file of the GLUE layout; class labels as names or as their ids, test labels -1 as the Hub has them."""
    def label(value):
        return value if labels is None or value == -1 or as_names else labels.index(value)

    rows = [{**row, "label": label(row["label"])} for row in rows]
    ext = path.rsplit(".", 1)[-1]
    with open(path, "w", newline="", encoding="utf-8") as f:
        if ext in ("json", "jsonl"):
            f.writelines(json.dumps(row) + "\n" for row in rows)
        else:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t" if ext == "tsv" else ",")
            writer.writeheader()
            writer.writerows(rows)
    return path


def task_files(folder, task, n_train=16, n_eval=12, n_test=6):
    """(option -> path, split -> rows) for a task; MNLI also with its mismatched files and AX."""
    ext, as_names = FORMAT[task]
    labels = LAYOUT[task][1]
    rng = random.Random(task)
    splits = {"train": make_rows(task, n_train, rng), "validation": make_rows(task, n_eval, rng),
              "test": make_rows(task, n_test, rng, labelled=False, first_idx=100)}
    if task == "mnli":
        splits.update(validation_mismatched=make_rows(task, n_eval - 2, rng),
                      test_mismatched=make_rows(task, n_test - 1, rng, labelled=False, first_idx=200),
                      ax=make_rows(task, 5, rng, labelled=False, first_idx=0))
    os.makedirs(folder, exist_ok=True)
    options = {f"--{split}_file": write_rows(os.path.join(folder, f"{split}.{ext}"), rows, as_names, labels)
               for split, rows in splits.items()}
    return options, splits


def as_args(options):
    return [x for pair in options.items() for x in pair]


@pytest.fixture(scope="module")
def bert_tokenizer_dir():
    return bundled.bert_checkpoint_dir()


@pytest.fixture(scope="module")
def gpt2_tokenizer_dir():
    return bundled.gpt2_tokenizer_dir()


@pytest.fixture(scope="module")
def stock_roberta_dir(tmp_path_factory):
    """A tiny stock RoBERTa (masked LM) with a byte-level BPE tokenizer laid out as RoBERTa's (<s> <pad> </s>
    <unk> first, <mask> last)."""
    from transformers import AutoTokenizer, RobertaConfig, RobertaForMaskedLM

    folder = tmp_path_factory.mktemp("stock-roberta")
    tokenizer = AutoTokenizer.from_pretrained(bundled.roberta_tokenizer_dir())
    assert (tokenizer.pad_token_id, tokenizer.mask_token_id, len(tokenizer)) == (1, 50261, 50262)
    config = RobertaConfig(**tiny.roberta(special_ids=True, vocab_size=len(tokenizer),
                                          max_position_embeddings=MAX_LEN + 2, initializer_range=0.3))
    RobertaForMaskedLM(config).save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    return str(folder / "model")


def centre_classifier(model, tokenizer):
    """Centre and scale a random BERT classifier on its pooled outputs of random sentences (single and pairs).
    A random BERT's pooled outputs barely vary, so its predictions would hardly depend on the input; they must,
    for a label mix-up or a wrong metric to show in the tests."""
    rng = random.Random(0)
    singles = tokenizer([sentence(rng) for _ in range(32)], padding=True, return_tensors="pt")
    pairs = tokenizer([sentence(rng) for _ in range(32)], [sentence(rng) for _ in range(32)], padding=True,
                      return_tensors="pt")
    model.eval()
    with torch.no_grad():
        pooled = torch.cat([model.bert(**batch).pooler_output for batch in (singles, pairs)])
        logits = model.classifier(pooled)
        scale = 2.0 / logits.std(0)
        model.classifier.weight.mul_(scale[:, None])
        model.classifier.bias.copy_(-(logits.mean(0) - model.classifier.bias) * scale)
    return model


@pytest.fixture(scope="module")
def stock_mrpc_bert_dir(tmp_path_factory, bert_tokenizer_dir):
    """A tiny stock BERT MRPC classifier whose labels are in the other order than GLUE's."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(1)
    names = ["equivalent", "not_equivalent"]
    config = BertConfig(**tiny.bert(vocab_size=30522, id2label=dict(enumerate(names)),
                                    label2id={n: i for i, n in enumerate(names)}, initializer_range=0.3))
    tokenizer = AutoTokenizer.from_pretrained(bert_tokenizer_dir)
    model = centre_classifier(BertForSequenceClassification(config), tokenizer)
    folder = str(tmp_path_factory.mktemp("stock-bert-mrpc"))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def mgk_classifier(tmp_path_factory, bert_tokenizer_dir):
    """num_labels -> a saved tiny MGK-BERT classifier (unnamed labels LABEL_i, centred head) to fine-tune. Weights
    drawn with a std of 0.3: with BERT's 0.02 the pooled outputs vary by 3e-4 over inputs and the centred head is
    so steep that two training steps make it constant again."""
    folders = {}

    def get(num_labels):
        if num_labels not in folders:
            torch.manual_seed(num_labels)
            config = hf_mgk.MGKBertConfig(**tiny.bert(vocab_size=30522, num_labels=num_labels, initializer_range=0.3))
            tokenizer = AutoTokenizer.from_pretrained(bert_tokenizer_dir)
            model = centre_classifier(hf_mgk.MGKBertForSequenceClassification(config), tokenizer)
            folders[num_labels] = str(tmp_path_factory.mktemp(f"mgk-bert-{num_labels}-labels"))
            model.save_pretrained(folders[num_labels])
            tokenizer.save_pretrained(folders[num_labels])
        return folders[num_labels]

    return get


def new_mgk_bert(tokenizer_dir):
    return ["--model_type", "mgk-bert", "--config_overrides", TINY_BERT, "--tokenizer_name", tokenizer_dir]


# ---------------------------------------------------------------- the independent check


def predict(model_dir, rows, keys):
    """Logits of the saved model (loaded here through the Auto classes) on rows, tokenized here."""
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = [[row[k] for row in rows] for k in keys]
    batch = tokenizer(*texts, padding=True, truncation=True, max_length=MAX_LEN, return_tensors="pt")
    with torch.no_grad():
        return model, model(**batch).logits.numpy()


def expected_metrics(task, labels, gold, logits, id2label):
    """The task's GLUE metrics, computed here with scikit-learn / scipy."""
    if labels is None:
        scores = logits[:, 0]
        result = {"pearson": pearsonr(scores, gold)[0], "spearmanr": spearmanr(scores, gold)[0]}
    else:
        predicted = [labels.index(id2label[int(i)]) for i in logits.argmax(-1)]
        gold = [labels.index(g) for g in gold]
        if task == "cola":
            result = {"matthews_correlation": matthews_corrcoef(gold, predicted)}
        elif task in ("mrpc", "qqp"):
            result = {"accuracy": accuracy_score(gold, predicted), "f1": f1_score(gold, predicted)}
        else:
            result = {"accuracy": accuracy_score(gold, predicted)}
    if len(result) > 1:
        result["combined_score"] = float(np.mean(list(result.values())))
    return result


def read_tsv(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines[0], [tuple(line.split("\t")) for line in lines[1:]]


def check_predictions(out, task, name, rows, logits, id2label):
    """predict_results_<name>.txt (index, label name) and the GLUE server's file (idx, its label form)."""
    labels = LAYOUT[task][1]
    if labels is None:
        shown = [f"{s:.3f}" for s in logits[:, 0]]
        submitted = shown
    else:
        shown = [id2label[int(i)] for i in logits.argmax(-1)]
        submitted = shown if name in AS_NAMES | {"mnli-mm", "ax"} else [str(labels.index(s)) for s in shown]
    header, lines = read_tsv(os.path.join(out, f"predict_results_{name}.txt"))
    assert header == "index\tprediction"
    assert [i for i, _ in lines] == [str(i) for i in range(len(rows))]
    header, server = read_tsv(os.path.join(out, "glue_submission",
                                           {"mnli-mm": "MNLI-mm", "ax": "AX"}.get(name, SUBMISSION.get(name)) + ".tsv"))
    assert header == "index\tprediction"
    assert [i for i, _ in server] == [str(row["idx"]) for row in rows]
    if labels is None:  # printed with 3 decimals: equal up to the rounding of float32 noise
        for (_, got), (_, got2), want in zip(lines, server, shown):
            assert abs(float(got) - float(want)) <= 2e-3 and got == got2
    else:
        assert [p for _, p in lines] == shown
        assert [p for _, p in server] == submitted
        if name not in AS_NAMES | {"mnli-mm", "ax"}:
            assert set(submitted) <= {"0", "1"}


def check_eval(out, results, task, rows, suffix="", logits_and_model=None):
    keys, labels = LAYOUT[task]
    model, logits = logits_and_model or predict(out, rows, keys)
    gold = [row["label"] for row in rows]
    want = expected_metrics(task, labels, gold, logits, model.config.id2label)
    with open(os.path.join(out, "eval_results.json")) as f:
        saved = json.load(f)
    with open(os.path.join(out, "all_results.json")) as f:
        every = json.load(f)
    for key, value in want.items():
        name = f"eval_{key}{suffix}"
        assert saved[name] == pytest.approx(value, abs=1e-4), name
        assert every[name] == saved[name] and results[name] == saved[name]
    assert saved[f"eval_samples{suffix}"] == len(rows)
    # No other metric: the keys of this evaluation are the task's metrics and Trainer's usual ones.
    mine = [k[len("eval_"): len(k) - len(suffix)] for k in saved
            if k.startswith("eval_") and k.endswith(suffix) and (suffix or not k.endswith("_mm"))]
    assert set(mine) - {"loss", "runtime", "samples", "samples_per_second", "steps_per_second"} == set(want)
    return model


# ---------------------------------------------------------------- every GLUE task


@pytest.fixture(scope="module")
def task_runs(tmp_path_factory, mgk_classifier):
    """task -> (output folder, rows by split, main's results): one tiny MGK-BERT run per task, shared."""
    cache = {}

    def run(task):
        if task not in cache:
            folder = tmp_path_factory.mktemp(task)
            options, rows = task_files(str(folder / "data"), task)
            out = str(folder / "out")
            labels = LAYOUT[task][1]
            start = mgk_classifier(1 if labels is None else len(labels))
            results = run_glue.main(["--model_name_or_path", start, "--task_name", task] + as_args(options)
                                    + ["--do_train", "--do_eval", "--do_predict", "--output_dir", out] + COMMON)
            cache[task] = out, rows, results
        return cache[task]

    return run


@pytest.mark.parametrize("task", list(LAYOUT))
def test_every_glue_task_trains_evaluates_and_predicts(task, task_runs):
    out, rows, results = task_runs(task)
    keys, labels = LAYOUT[task]
    model = check_eval(out, results, task, rows["validation"])
    if labels is not None:  # the predictions depend on the input, so that the metrics tell something
        assert len(set(predict(out, rows["validation"], keys)[1].argmax(-1))) > 1
    config = model.config
    assert config.model_type == "mgk-bert" and config.finetuning_task == task
    if labels is None:
        assert config.num_labels == 1 and not os.path.exists(os.path.join(out, "glue_submission", "AX.tsv"))
    else:  # the Hub dataset's label names, in its order
        assert [config.id2label[i] for i in range(len(labels))] == labels
    with open(os.path.join(out, "train_results.json")) as f:
        assert json.load(f)["train_samples"] == len(rows["train"])
    with open(os.path.join(out, "hf_mgk_run.json")) as f:
        info = json.load(f)
    assert (info["task"], info["family"], info["base_model"]) == ("text-classification", "mgk-bert", None)
    _, logits = predict(out, rows["test"], keys)
    check_predictions(out, task, task, rows["test"], logits, config.id2label)
    files = sorted(os.listdir(os.path.join(out, "glue_submission")))
    if task == "mnli":
        assert files == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
        check_eval(out, results, task, rows["validation_mismatched"], suffix="_mm")
        for name, split in (("mnli-mm", "test_mismatched"), ("ax", "ax")):
            _, logits = predict(out, rows[split], keys)
            check_predictions(out, task, name, rows[split], logits, config.id2label)
    else:
        assert files == [SUBMISSION[task] + ".tsv"]


def test_glue_as_the_hub_serves_it(monkeypatch, tmp_path, mgk_classifier):
    """`--dataset_name glue --dataset_config_name mnli`: the Hub's layout (ClassLabel ids, validation_matched /
    _mismatched, test_matched / _mismatched with labels -1, AX from the "ax" config), faked here (no Hub)."""
    import datasets

    _, rows = task_files(str(tmp_path / "data"), "mnli")
    names = LAYOUT["mnli"][1]
    features = datasets.Features({"premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=names), "idx": datasets.Value("int32")})

    def hub(split):
        return datasets.Dataset.from_list(
            [{**r, "label": -1 if r["label"] == -1 else names.index(r["label"])} for r in rows[split]], features)

    calls = []

    def load_dataset(name, config=None, split=None, **kwargs):
        calls.append((name, config, split))
        if config == "ax":
            return hub("ax")
        return datasets.DatasetDict({"train": hub("train"), "validation_matched": hub("validation"),
                                     "validation_mismatched": hub("validation_mismatched"),
                                     "test_matched": hub("test"), "test_mismatched": hub("test_mismatched")})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    out = str(tmp_path / "out")
    results = run_glue.main(["--model_name_or_path", mgk_classifier(3), "--dataset_name", "glue",
                             "--dataset_config_name", "mnli", "--do_train", "--do_eval", "--do_predict",
                             "--output_dir", out] + COMMON)
    assert calls == [("glue", "mnli", None), ("glue", "ax", "test")]
    check_eval(out, results, "mnli", rows["validation"])
    check_eval(out, results, "mnli", rows["validation_mismatched"], suffix="_mm")
    model, logits = predict(out, rows["ax"], LAYOUT["mnli"][0])
    check_predictions(out, "mnli", "ax", rows["ax"], logits, model.config.id2label)
    with open(os.path.join(out, "hf_mgk_run.json")) as f:
        assert json.load(f)["dataset"] == "glue/mnli"


def test_task_name_alone_reads_nyu_mll_glue(tmp_path):
    _, data_args, _ = hf_mgk.training.parse_args(run_glue.DataTrainingArguments, [
        "--model_type", "mgk-bert", "--task_name", "SST2", "--output_dir", str(tmp_path)])
    assert (data_args.task_name, data_args.dataset_name, data_args.dataset_config_name) == (
        "sst2", "nyu-mll/glue", "sst2")


# ---------------------------------------------------------------- the other families, warm starts, own tasks


LLAMA_SIZE = "hidden_size=32,num_hidden_layers=2,num_attention_heads=4,num_key_value_heads=2,intermediate_size=37"


@pytest.mark.parametrize("family, fields", [
    ("fish-gpt2", "n_embd=32,n_layer=2,n_head=4,num_global_heads=2,n_positions=64"),
    ("mgk-gpt2", "n_embd=32,n_layer=2,n_head=4,num_keys=2,n_positions=64"),
    ("mgk-llama", LLAMA_SIZE + ",num_keys=2"), ("fish-llama", LLAMA_SIZE + ",num_global_heads=2")])
def test_decoder_families_from_scratch_pad_with_end_of_text(family, fields, tmp_path, gpt2_tokenizer_dir, caplog):
    """A decoder's classifier reads the last token that is not padding: every decoder family (GPT-2's, Llama's,
    with GPT-2's tokenizer, which has no padding token) gets the pad id."""
    options, rows = task_files(str(tmp_path / "data"), "rte")
    out = str(tmp_path / "out")
    with caplog.at_level(logging.INFO):
        results = run_glue.main(
            ["--model_type", family, "--config_overrides", f"{fields},initializer_range=0.3",
             "--tokenizer_name", gpt2_tokenizer_dir, "--task_name", "rte", "--do_train", "--do_eval",
             "--no_pad_to_max_length", "--log_level", "info", "--output_dir", out]
            + as_args(options) + COMMON)
    assert "no padding token" in caplog.text and "end-of-text token '<|endoftext|>' (id 50256)" in caplog.text
    model = check_eval(out, results, "rte", rows["validation"])
    assert model.config.model_type == family and model.config.pad_token_id == 50256
    assert AutoTokenizer.from_pretrained(out).pad_token == "<|endoftext|>"


def test_nprf_roberta_warm_start_from_stock_roberta(tmp_path, stock_roberta_dir):
    options, rows = task_files(str(tmp_path / "data"), "mrpc")
    out = str(tmp_path / "out")
    results = run_glue.main(["--model_name_or_path", stock_roberta_dir, "--task_name", "mrpc", "--do_train",
                             "--do_eval", "--output_dir", out] + as_args(options) + COMMON)
    model = check_eval(out, results, "mrpc", rows["validation"])
    assert model.config.model_type == "nprf-roberta"
    with open(os.path.join(out, "hf_mgk_run.json")) as f:
        assert json.load(f)["base_model"] == stock_roberta_dir  # a warm start from a local stock folder
    run = hub.read_run(out)  # the card says it in words, not as Hub metadata
    card = hub.model_card(model, run)
    assert f"warm-started from the checkpoint `{os.path.basename(stock_roberta_dir)}`" in card
    assert "continued from" not in card and hub.card_data(model, run).base_model is None


def test_warm_start_from_a_stock_bert_classifier_keeps_its_label_order(tmp_path, stock_mrpc_bert_dir):
    """Same labels in another order: the checkpoint's head keeps its meaning (its order is kept), and F1 is still
    that of "equivalent"; evaluated before training (against the stock model itself) and after."""
    options, rows = task_files(str(tmp_path / "data"), "mrpc")
    out = str(tmp_path / "eval")
    results = run_glue.main(["--model_name_or_path", stock_mrpc_bert_dir, "--attention_overrides",
                             "attention_type=softmax", "--task_name", "mrpc", "--do_eval", "--output_dir", out,
                             "--validation_file", options["--validation_file"]] + COMMON)
    stock, logits = predict(stock_mrpc_bert_dir, rows["validation"], LAYOUT["mrpc"][0])
    assert stock.config.model_type == "bert"
    want = expected_metrics("mrpc", LAYOUT["mrpc"][1], [r["label"] for r in rows["validation"]], logits,
                            stock.config.id2label)
    assert 0 < want["f1"] < 1 and want["f1"] != want["accuracy"]
    for key, value in want.items():
        assert results[f"eval_{key}"] == pytest.approx(value), key

    out = str(tmp_path / "train")
    results = run_glue.main(["--model_name_or_path", stock_mrpc_bert_dir, "--task_name", "mrpc", "--do_train",
                             "--do_eval", "--output_dir", out] + as_args(options) + COMMON)
    model = check_eval(out, results, "mrpc", rows["validation"])
    assert model.config.model_type == "mgk-bert" and model.config.attention_type == "mgk"
    assert model.config.id2label == {0: "equivalent", 1: "not_equivalent"}


def write_custom(folder, regression):
    rng = random.Random(7)
    names = ["mid", "neg", "pos"]
    os.makedirs(folder, exist_ok=True)
    paths, splits = {}, {}
    for split, n in (("train", 16), ("validation", 10), ("test", 5)):
        rows = [{"text": sentence(rng), "context": sentence(rng),
                 "label": round(rng.uniform(-1, 1), 2) if regression else rng.choice(names)} for i in range(n)]
        paths[split] = write_rows(os.path.join(folder, f"{split}.csv"), rows, True, None)
        splits[split] = rows
    return paths, splits


def test_own_task_from_a_json_arguments_file(tmp_path, bert_tokenizer_dir):
    """No --task_name: labels from the data (sorted), accuracy, predict_results.txt, no GLUE submission."""
    paths, rows = write_custom(str(tmp_path / "data"), regression=False)
    out = str(tmp_path / "out")
    args = {"model_type": "mgk-bert", "config_overrides": TINY_BERT, "tokenizer_name": bert_tokenizer_dir,
            "train_file": paths["train"], "validation_file": paths["validation"], "test_file": paths["test"],
            "do_train": True, "do_eval": True, "do_predict": True, "output_dir": out, "use_cpu": True,
            "report_to": "none", "max_steps": 2, "per_device_train_batch_size": 4, "save_strategy": "no",
            "max_seq_length": MAX_LEN}
    (tmp_path / "args.json").write_text(json.dumps(args))
    results = run_glue.main([str(tmp_path / "args.json")])
    # Upstream's choice of inputs: the first two columns that are not the label.
    model, logits = predict(out, rows["validation"], ("text", "context"))
    assert model.config.id2label == {0: "mid", 1: "neg", 2: "pos"}
    predicted = [model.config.id2label[int(i)] for i in logits.argmax(-1)]
    assert results["eval_accuracy"] == pytest.approx(accuracy_score([r["label"] for r in rows["validation"]],
                                                                    predicted))
    _, logits = predict(out, rows["test"], ("text", "context"))
    header, lines = read_tsv(os.path.join(out, "predict_results.txt"))
    assert [p for _, p in lines] == [model.config.id2label[int(i)] for i in logits.argmax(-1)]
    assert not os.path.exists(os.path.join(out, "glue_submission"))


def test_own_task_with_float_labels_is_a_regression(tmp_path, bert_tokenizer_dir):
    paths, rows = write_custom(str(tmp_path / "data"), regression=True)
    out = str(tmp_path / "out")
    results = run_glue.main(new_mgk_bert(bert_tokenizer_dir) + [
        "--train_file", paths["train"], "--validation_file", paths["validation"], "--do_train", "--do_eval",
        "--output_dir", out] + COMMON)
    model, logits = predict(out, rows["validation"], ("text", "context"))
    assert model.config.num_labels == 1
    gold = np.array([r["label"] for r in rows["validation"]])
    assert results["eval_mse"] == pytest.approx(float(np.mean((logits[:, 0] - gold) ** 2)), abs=1e-5)


# ---------------------------------------------------------------- options and errors


def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_glue.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    from dataclasses import fields

    for cls in (run_glue.DataTrainingArguments, hf_mgk.training.ModelArguments):
        for f in fields(cls):
            assert f"--{f.name}" in text, f.name
    for option in ("--validation_mismatched_file", "--test_mismatched_file", "--ax_file", "--no_pad_to_max_length"):
        assert option in text
    assert "cola, mnli, mrpc, qnli, qqp, rte, sst2, stsb, wnli" in " ".join(text.split())


def snapshot(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))
            if os.path.isfile(os.path.join(folder, name))}


def test_unknown_task_lists_the_nine(capsys, tmp_path):
    with pytest.raises(SystemExit):
        run_glue.main(["--model_type", "mgk-bert", "--task_name", "sst5", "--output_dir", str(tmp_path / "o")])
    err = " ".join(capsys.readouterr().err.split())
    assert "--task_name sst5: not a GLUE task; use one of cola, mnli, mrpc, qnli, qqp, rte, sst2, stsb, wnli" in err


def test_config_overrides_need_model_type(capsys, tmp_path, stock_mrpc_bert_dir):
    with pytest.raises(SystemExit):
        run_glue.main(["--model_name_or_path", stock_mrpc_bert_dir, "--config_overrides", "num_keys=3",
                       "--task_name", "mrpc", "--do_train", "--output_dir", str(tmp_path / "o")])
    assert "--config_overrides goes only with --model_type" in capsys.readouterr().err


def test_missing_column_is_named_and_nothing_is_written(tmp_path, bert_tokenizer_dir):
    options, rows = task_files(str(tmp_path / "data"), "mnli")
    bad = [{k: v for k, v in row.items() if k != "hypothesis"} for row in rows["validation_mismatched"]]
    options["--validation_mismatched_file"] = write_rows(str(tmp_path / "mm.tsv"), bad, True, None)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"--validation_mismatched_file .*mm\.tsv has no column 'hypothesis'"):
        run_glue.main(new_mgk_bert(bert_tokenizer_dir) + ["--task_name", "mnli", "--do_train", "--do_eval",
                                                          "--output_dir", str(out)] + as_args(options) + COMMON)
    assert not out.exists()


def test_mnli_needs_its_mismatched_validation_file(tmp_path, bert_tokenizer_dir):
    options, _ = task_files(str(tmp_path / "data"), "mnli")
    del options["--validation_mismatched_file"]
    with pytest.raises(ValueError, match="--do_eval needs the 'validation_mismatched' split: give "
                                         "--validation_mismatched_file"):
        run_glue.main(new_mgk_bert(bert_tokenizer_dir) + ["--task_name", "mnli", "--do_eval", "--output_dir",
                                                          str(tmp_path / "out")] + as_args(options) + COMMON)


@pytest.mark.parametrize("task, bad, shown", [
    ("mnli", ["maybe", 5], "'maybe'"),
    ("rte", [2], "2"),
    ("stsb", [6.5], "6.5"),
])
def test_labels_outside_the_task_are_refused(task, bad, shown, tmp_path, bert_tokenizer_dir):
    options, rows = task_files(str(tmp_path / "data"), task)
    broken = [dict(row) for row in rows["validation"]]
    for row, label in zip(broken, bad):
        row["label"] = label
    ext = FORMAT[task][0]
    options["--validation_file"] = write_rows(str(tmp_path / f"bad.{ext}"), broken, True, None)
    out = tmp_path / "out"
    expected = "numbers from 0.0 to 5.0" if task == "stsb" else ", ".join(LAYOUT[task][1])
    with pytest.raises(ValueError) as err:
        run_glue.main(new_mgk_bert(bert_tokenizer_dir) + ["--task_name", task, "--do_train", "--do_eval",
                                                          "--output_dir", str(out)] + as_args(options) + COMMON)
    message = str(err.value)
    assert "bad." in message and "labels outside the task's label set" in message
    assert shown in message and expected in message
    assert not out.exists()


def test_a_classifier_for_other_labels_is_refused(tmp_path, task_runs):
    cola_out, _, _ = task_runs("cola")
    options, _ = task_files(str(tmp_path / "data"), "sst2")
    out = tmp_path / "out"
    with pytest.raises(ValueError) as err:
        run_glue.main(["--model_name_or_path", cola_out, "--task_name", "sst2", "--do_train", "--do_eval",
                       "--output_dir", str(out)] + as_args(options) + COMMON)
    message = str(err.value)
    assert "already a sequence classifier for 2 labels (unacceptable, acceptable)" in message
    assert "sst2 has 2 labels (negative, positive)" in message
    assert not out.exists()


def test_an_output_folder_of_another_run_is_refused_and_kept(tmp_path, task_runs, bert_tokenizer_dir):
    cola_out, _, _ = task_runs("cola")
    before = snapshot(cola_out)
    options, _ = task_files(str(tmp_path / "data"), "sst2")
    with pytest.raises(ValueError, match="holds a different run .*task_name: 'cola' there, 'sst2' now"):
        run_glue.main(new_mgk_bert(bert_tokenizer_dir) + ["--task_name", "sst2", "--do_train", "--do_eval",
                                                          "--output_dir", cola_out] + as_args(options) + COMMON)
    assert snapshot(cola_out) == before


def test_a_run_starts_from_results_of_its_own_and_publish_shows_only_those(tmp_path, bert_tokenizer_dir, capsys):
    """--overwrite_output_dir, train only, into a folder of an evaluated run: the old run's eval results
    go, and the card shows no metric for the new model, which was never evaluated."""
    spec = importlib.util.spec_from_file_location("publish", os.path.join(ROOT, "scripts", "publish.py"))
    publish = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(publish)
    options, _ = task_files(str(tmp_path / "data"), "sst2")
    out = str(tmp_path / "out")
    base = new_mgk_bert(bert_tokenizer_dir) + ["--task_name", "sst2", "--output_dir", out] + as_args(options) + COMMON
    run_glue.main(base + ["--do_train", "--do_eval"])
    assert "eval_accuracy" in json.load(open(os.path.join(out, "all_results.json")))
    run_glue.main(base + ["--do_train", "--overwrite_output_dir", "--learning_rate", "1e-3"])
    assert not os.path.exists(os.path.join(out, "eval_results.json"))
    assert not [k for k in json.load(open(os.path.join(out, "all_results.json"))) if k.startswith("eval_")]
    # A results file the run did not write (here: an old run's, put back) is left out of the card, and said so.
    with open(os.path.join(out, "eval_results.json"), "w") as f:
        json.dump({"eval_accuracy": 0.9, "eval_loss": 0.3}, f)
    export = publish.main(["--run_dir", out, "--no_check_remote_code"])["export"]
    assert export["metrics"] == [] and export["ignored_results"] == ["eval_results.json"]
    assert "left out of the card: eval_results.json" in capsys.readouterr().out
    card = open(os.path.join(out, "hub", "README.md")).read()
    assert "No evaluation results were recorded" in card and "0.9" not in card
    # Evaluating the run's own saved model in its folder makes its metrics the run's again.
    evaluated = run_glue.main(["--model_name_or_path", out, "--task_name", "sst2", "--do_eval", "--output_dir", out]
                              + as_args(options) + COMMON)
    export = publish.main(["--run_dir", out, "--no_check_remote_code"])["export"]
    assert export["metrics"] == [("accuracy", "validation", evaluated["eval_accuracy"])]


def test_push_to_hub_ends_with_the_family_card_after_evaluation(tmp_path, mgk_classifier, fake_hub):
    """--push_to_hub (a local stand-in for the Hub's API): the last upload comes after evaluation, with the
    family's model card: text classification, the accuracy this run measured, the GLUE task's dataset."""
    from conftest import check_final_push

    options, _ = task_files(str(tmp_path / "data"), "sst2")
    out = str(tmp_path / "out")
    run_glue.main(["--model_name_or_path", mgk_classifier(2), "--task_name", "sst2"] + as_args(options)
                  + ["--do_train", "--do_eval", "--output_dir", out, "--push_to_hub", "--hub_model_id",
                     "me/tiny-sst2"] + COMMON)
    meta, card = check_final_push(fake_hub, "me/tiny-sst2", "mgk-bert", "text-classification", "accuracy")
    dataset = meta["model-index"][0]["results"][0]["dataset"]["name"]
    assert "train.csv" in dataset, dataset  # the local files this run trained on
