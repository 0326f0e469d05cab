"""Publishing a training run: the Hub-ready folder, its model card, the upload (faked), the offline error, and the
folder loading in a virtualenv without hf_mgk that reproduces the run's accuracy."""

import json
import os
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from transformers import AutoTokenizer, Trainer, TrainingArguments

import hf_mgk
from hf_mgk import bundled, hub, training
from hf_mgk.families import FAMILIES
from hf_mgk.folders import sha256_file
from hf_mgk.modeling_mgk_bert import MGKBertForSequenceClassification

from conftest import assert_kept, plant
import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import publish  # noqa: E402

pytestmark = pytest.mark.slow  # export / card / upload end to end, with virtualenv checks

TINY = tiny.bert_size()  # each test sets vocab_size
LLAMA = {k: v for k, v in tiny.llama().items() if k != "vocab_size"}
GOOD, BAD = ["good", "great", "fine", "lovely", "superb"], ["bad", "awful", "poor", "dull", "boring"]


def sentences(n, offset, flip_every=0):
    """A learnable sentiment task: the label is whether the sentence carries a good or a bad word. With
    `flip_every`, every so many labels are wrong, so that even a model that learnt the task scores below 1."""
    rows = []
    for i in range(offset, offset + n):
        label = i % 2
        word = (GOOD if label else BAD)[(i // 2) % 5]
        wrong = flip_every and i % flip_every == 0
        rows.append({"sentence": f"the film {i % 7} was {word} and long", "label": 1 - label if wrong else label})
    return rows


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished run of a tiny MGK-BERT classifier, laid out as the training scripts leave it."""
    import datasets

    out = str(tmp_path_factory.mktemp("run") / "out")
    tokenizer = AutoTokenizer.from_pretrained(bundled.bert_checkpoint_dir())
    config = hf_mgk.MGKBertConfig(vocab_size=len(tokenizer), max_position_embeddings=32, num_labels=2,
                                  pad_token_id=tokenizer.pad_token_id, **TINY)
    torch.manual_seed(0)
    model = MGKBertForSequenceClassification(config)

    def encode(rows):
        ds = datasets.Dataset.from_list(rows)
        return ds.map(lambda b: tokenizer(b["sentence"]), batched=True, remove_columns=["sentence"])

    eval_rows = sentences(30, 1000, flip_every=5)
    train, evaluation = encode(sentences(64, 0)), encode(eval_rows)
    args = TrainingArguments(output_dir=out, use_cpu=True, report_to="none", max_steps=60, learning_rate=1e-2,
                             per_device_train_batch_size=8, per_device_eval_batch_size=7, save_strategy="no",
                             seed=0, logging_strategy="no")
    identity = {"script": "run_glue", "model_name_or_path": None, "model_type": "mgk-bert",
                "dataset_name": None, "train_file": "/data/train.json", "validation_file": "/data/dev.json"}
    training.write_run_info(args, identity, task="text-classification", dataset="local files train.json, dev.json",
                            base_model=None, family="mgk-bert")

    def accuracy(prediction):
        return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}

    trainer = Trainer(model=model, args=args, train_dataset=train, processing_class=tokenizer,
                      compute_metrics=accuracy)
    training.train_and_save(trainer, None, len(train))
    training.evaluate_and_save(trainer, evaluation, len(evaluation))
    with open(os.path.join(out, "eval_rows.json"), "w") as f:
        json.dump(eval_rows, f)
    return out


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory):
    """The run exported with the remote-code check (in the virtualenv without hf_mgk) on."""
    folder = str(tmp_path_factory.mktemp("export") / "hub")
    summary = hub.export_run(run_dir, folder, repo_id="me/tiny-mgk", revision="v3", check=True)
    return folder, summary


def results(run_dir):
    with open(os.path.join(run_dir, "all_results.json")) as f:
        return json.load(f)


def files(folder):
    return sorted(os.path.relpath(os.path.join(r, n), folder) for r, _, ns in os.walk(folder) for n in ns)


def test_folder_holds_safetensors_full_auto_map_code_tokenizer_and_card(run_dir, exported):
    folder, summary = exported
    names = files(folder)
    assert summary["checked"] and summary["auto_class"] == "AutoModelForSequenceClassification"
    assert "model.safetensors" in names and not [n for n in names if n.endswith((".bin", ".pt", ".pth"))]
    # Nothing of the trainer goes along.
    assert not {"training_args.bin", "all_results.json", "trainer_state.json", "hf_mgk_run.json"} & set(names)
    with open(os.path.join(folder, "config.json")) as f:
        auto_map = json.load(f)["auto_map"]
    assert set(auto_map) == {"AutoConfig", *MGKBertForSequenceClassification._auto_map}
    assert auto_map["AutoModelForSequenceClassification"] == "modeling_mgk_bert.MGKBertForSequenceClassification"
    for reference in auto_map.values():
        assert reference.split(".")[0] + ".py" in names
    # Every sibling a code file imports is there too (remote code is flattened into one folder).
    for name in [n for n in names if n.endswith(".py")]:
        with open(os.path.join(folder, name)) as f:
            for sibling in re.findall(r"^from \.(\w+) import", f.read(), flags=re.M):
                assert f"{sibling}.py" in names, (name, sibling)
    assert {"tokenizer.json", "tokenizer_config.json", "README.md"} <= set(names)
    # The weights are the run's, bit for bit.
    mine, theirs = load_file(os.path.join(folder, "model.safetensors")), load_file(
        os.path.join(run_dir, "model.safetensors"))
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_card_metadata_metrics_and_pinned_snippet(run_dir, exported):
    folder, _ = exported
    card = ModelCard.load(os.path.join(folder, "README.md"))
    data = card.data
    assert data.library_name == "transformers" and data.pipeline_tag == "text-classification"
    assert data.tags[:4] == ["custom_code", "hf-mgk", "mgk-bert", "mgk"] and "mixture-of-gaussian-keys" in data.tags
    assert data.license == "apache-2.0"
    assert data.base_model is None and data.datasets is None  # trained from scratch on local files
    expected = {k[len("eval_"):]: v for k, v in results(run_dir).items()
                if k.startswith("eval_") and k not in ("eval_loss", "eval_runtime", "eval_samples_per_second",
                                                       "eval_steps_per_second", "eval_samples")}
    assert set(expected) == {"accuracy"}
    got = {r.metric_name: r.metric_value for r in data.eval_results}
    assert got == expected
    assert {(r.task_type, r.dataset_split, r.metric_type) for r in data.eval_results} == {
        ("text-classification", "validation", "accuracy")}
    assert card.data.to_dict()["model-index"][0]["name"] == "tiny-mgk"
    for line in ('model = AutoModelForSequenceClassification.from_pretrained("me/tiny-mgk", revision="v3", '
                 'trust_remote_code=True)', 'AutoTokenizer.from_pretrained("me/tiny-mgk", revision="v3", trust_remote_code=True)'):
        assert line in card.text
    assert "{{" not in card.text and "ORG/NAME" not in card.text
    assert f"| accuracy | validation | {expected['accuracy']:.6g} |" in card.text
    assert "trained from scratch by `run_glue` on local files train.json, dev.json" in card.text


def test_exported_folder_reproduces_the_accuracy_in_a_virtualenv_without_hf_mgk(run_dir, exported, tmp_path):
    folder, _ = exported
    python = hub.clean_python()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([python, "-c", "import hf_mgk"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'hf_mgk'" in probe.stderr
    # The card's own snippet, with the local folder for the repo (a local folder ignores `revision`).
    card = ModelCard.load(os.path.join(folder, "README.md")).text
    snippet = re.search(r"```python\n(.*?)```", card, flags=re.S).group(1).replace("me/tiny-mgk", folder)
    got = hub.run_without_package(snippet + f"""
import json, sys
import torch, transformers
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
rows = json.load(open({os.path.join(run_dir, "eval_rows.json")!r}))
batch = tokenizer([r["sentence"] for r in rows], padding=True, return_tensors="pt")
with torch.no_grad():
    predictions = model(**batch).logits.argmax(-1)
correct = sum(int(p) == r["label"] for p, r in zip(predictions.tolist(), rows))
print(json.dumps({{"accuracy": correct / len(rows), "executable": sys.executable}}))
""", cwd=str(tmp_path), python=python)
    assert got["executable"] == python
    assert got["accuracy"] == results(run_dir)["eval_accuracy"]
    assert 0.5 < got["accuracy"] < 1  # the model learnt something, and wrong predictions count too


def make_run(tmp_path, model, info, metrics):
    """A run folder with a model, the bundled BERT tokenizer and the given records, as the scripts write them."""
    run = tmp_path / "run"
    model.save_pretrained(run)
    AutoTokenizer.from_pretrained(bundled.bert_checkpoint_dir()).save_pretrained(run)
    (run / "all_results.json").write_text(json.dumps(metrics))
    # Recorded as this run's results, as training.save_metrics does.
    info = {**info, "results": {"all_results.json": sha256_file(run / "all_results.json")}}
    (run / "hf_mgk_run.json").write_text(json.dumps(info))
    return str(run)


@pytest.mark.parametrize("family, cls, config_kwargs, pipeline", [
    ("mgk-bert", hf_mgk.MGKBertForMaskedLM, TINY, "fill-mask"),
    ("fish-gpt2", hf_mgk.FiSHGPT2LMHeadModel, tiny.gpt2_size(num_global_heads=2), "text-generation"),
    ("mgk-gpt2", hf_mgk.MGKGPT2LMHeadModel, tiny.gpt2_size(e_step="hard"), "text-generation"),
    ("nprf-roberta", hf_mgk.NPRFRobertaForQuestionAnswering, dict(TINY, num_random_features=8),
     "question-answering"),
    ("mgk-llama", hf_mgk.MGKLlamaForCausalLM, LLAMA, "text-generation"),
    ("fish-llama", hf_mgk.FiSHLlamaForSequenceClassification, dict(LLAMA, num_global_heads=2),
     "text-classification"),
])
def test_each_family_card_warm_start_and_hub_dataset(tmp_path, family, cls, config_kwargs, pipeline):
    config_class = FAMILIES[family].config_class
    model = cls(config_class(vocab_size=30522, **config_kwargs))
    info = {"identity": {"script": "run_x", "model_name_or_path": "bert-base-uncased", "dataset_name": "wikitext",
                         "dataset_config_name": "wikitext-2-raw-v1"},
            "base_model": "bert-base-uncased", "family": family, "task": pipeline}
    metrics = {"epoch": 1.0, "eval_loss": 2.5, "eval_runtime": 0.5, "eval_samples": 10, "perplexity": 12.18,
               "eval_accuracy": 0.25, "eval_accuracy_mm": 0.375, "eval_exact": 50.0, "eval_total": 10,
               "eval_best_f1_thresh": 0.1, "train_loss": 3.0, "train_samples": 40}
    folder = str(tmp_path / "hub")
    # With the check: the family's head loads through its Auto class in the virtualenv without hf_mgk.
    summary = hub.export_run(make_run(tmp_path, model, info, metrics), folder, repo_id="me/m", check=True)
    assert summary["pipeline_tag"] == pipeline and summary["checked"]
    card = ModelCard.load(os.path.join(folder, "README.md"))
    assert card.data.pipeline_tag == pipeline and family in card.data.tags
    assert f"with **{FAMILIES[family].title}** (`model_type: {family}`" in card.text
    assert card.data.base_model == "bert-base-uncased" and card.data.datasets == ["wikitext"]
    got = {(r.metric_name, r.dataset_split): (r.metric_type, r.metric_value) for r in card.data.eval_results}
    assert got == {("perplexity", "validation"): ("perplexity", 12.18),
                   ("accuracy", "validation"): ("accuracy", 0.25),
                   ("accuracy", "validation_mismatched"): ("accuracy", 0.375),
                   ("exact", "validation"): ("exact_match", 50.0)}
    assert {(r.dataset_type, r.dataset_config) for r in card.data.eval_results} == {
        ("wikitext", "wikitext-2-raw-v1")}
    assert 'revision="v1"' in card.text and "warm-started from [bert-base-uncased]" in card.text
    assert "optimizer steps" not in card.text and "training examples: 40" in card.text
    # A warm start from a local folder is said in words, never put in the metadata (not a Hub id).
    info["base_model"] = str(tmp_path)
    shutil.rmtree(tmp_path / "run")
    hub.export_run(make_run(tmp_path, model, info, metrics), folder, repo_id="me/m", check=False, overwrite=True)
    card = ModelCard.load(os.path.join(folder, "README.md"))
    assert card.data.base_model is None and f"warm-started from the checkpoint `{tmp_path.name}`" in card.text


def test_publish_an_mgk_gpt2_language_model_run(tmp_path, capsys):
    """run_clm.py warm-starts MGK-GPT2 from a stock GPT-2 (half its heads), then publish.py --dry_run writes the
    family's card (the MGK paper's WikiText-103 result, this run's perplexity) and checks the folder without
    hf_mgk."""
    from test_run_lm import run_clm, save_tiny_stock_gpt2

    stock = save_tiny_stock_gpt2(tmp_path / "gpt2")
    text = tmp_path / "text.txt"
    with open(bundled.shakespeare_files()[0], encoding="utf-8") as f:
        text.write_text("".join(f.readlines()[200:400]), encoding="utf-8")
    run = tmp_path / "run"
    results = run_clm.main(["--model_name_or_path", stock, "--attention_overrides", "attention_type=mgk,n_head=2",
                            "--train_file", str(text), "--validation_file", str(text), "--block_size", "32",
                            "--do_train", "--do_eval", "--max_steps", "2", "--per_device_train_batch_size", "4",
                            "--output_dir", str(run), "--cache_dir", str(tmp_path / "cache"), "--use_cpu",
                            "--report_to", "none", "--save_strategy", "no"])
    result = publish.main(["--run_dir", str(run), "--hub_model_id", "me/mgk-gpt2-tiny", "--dry_run"])
    out = capsys.readouterr().out
    assert "MGKGPT2LMHeadModel (text-generation)" in out and "checked: transformers.AutoModelForCausalLM" in out
    assert {"modeling_mgk_gpt2.py", "modeling_decoder.py", "modeling_mgk.py", "README.md"} <= {
        rel for rel, _ in result["files"]}
    card = ModelCard.load(os.path.join(result["folder"], "README.md"))
    assert {"mgk-gpt2", "mgk", "gpt2"} <= set(card.data.tags) and card.data.pipeline_tag == "text-generation"
    assert "## MGK-GPT2" in card.text and "Table 3, WikiText-103 perplexity" in card.text
    assert "| `n_head` |" not in card.text and "| `attention_type` | `mgk` |" in card.text
    assert "checkpoint `gpt2` by `run_clm`" in card.text and "{{" not in card.text
    got = {r.metric_name: r.metric_value for r in card.data.eval_results}
    assert got["perplexity"] == results["perplexity"] and got["accuracy"] == results["eval_accuracy"]


def test_refuses_other_runs_and_overwrite_removes_stale_files(run_dir, tmp_path):
    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an export of this run.*overwrite"):
        hub.export_run(run_dir, folder, check=False)
    assert files(folder) == ["notes.txt"]
    # With overwrite: every old file goes, including a stale card and a stale code file.
    (folder / "README.md").write_text("old card")
    (folder / "modeling_old.py").write_text("stale")
    hub.export_run(run_dir, folder, check=False, overwrite=True)
    names = files(folder)
    assert "notes.txt" not in names and "modeling_old.py" not in names
    assert (folder / "README.md").read_text().startswith("---\n") and hub.EXPORT_MARKER in names
    # The same run may be exported again over its own export, with another tag.
    hub.export_run(run_dir, folder, revision="v2", check=False)
    assert 'revision="v2"' in (folder / "README.md").read_text()
    # Another run's export is refused, naming it.
    other = tmp_path / "other_run"
    shutil.copytree(run_dir, other, ignore=shutil.ignore_patterns("hub"))
    with pytest.raises(FileExistsError, match=f"another run \\({re.escape(os.path.realpath(run_dir))}\\)"):
        hub.export_run(other, folder, check=False)
    # Exporting into the run itself (or a folder holding it) is refused even with overwrite.
    for target in (other, tmp_path):
        with pytest.raises(ValueError, match="the export folder .* (is|contains) the run folder"):
            hub.export_run(other, target, check=False, overwrite=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no saved model"):
        hub.export_run(tmp_path / "empty", tmp_path / "x", check=False)


def test_reexport_keeps_the_users_files_and_never_replaces_an_edited_card_silently(run_dir, tmp_path, capsys,
                                                                                    monkeypatch):
    folder = tmp_path / "hub"
    argv = ["--run_dir", run_dir, "--output_dir", str(folder), "--hub_model_id", "me/tiny", "--no_check_remote_code"]
    publish.main(argv)
    user = plant(folder, {"my_eval_notes.md": b"accuracy by hand: 0.8\n", "images/plot.png": bytes(range(256))})
    user["README.md"] = (folder / "README.md").read_bytes() + b"\n## My notes\n\nTrained with care.\n"
    (folder / "README.md").write_bytes(user["README.md"])
    capsys.readouterr()
    # The same export again: the export's own files are rewritten, the user's files and edited card kept, and said.
    publish.main(argv)
    out = capsys.readouterr().out
    assert_kept(folder, user)
    assert "kept your edited README.md" in out and "kept 2 files" in out and "images/plot.png" in out
    # --push_to_hub exports first, then uploads the edited card and the user's files.
    api = RecordingApi()
    monkeypatch.setattr("huggingface_hub.HfApi", lambda *a, **k: api)
    result = publish.main(argv + ["--push_to_hub"])
    assert_kept(folder, user)
    uploaded = {op.path_in_repo for op in api.calls[2][2]["operations"]}
    assert {"README.md", "my_eval_notes.md", "images/plot.png", "model.safetensors"} <= uploaded
    assert uploaded == {rel for rel, _ in result["files"]}
    # A changed card (another tag) would replace the edited one: refused, nothing written.
    with pytest.raises(SystemExit, match="README.md was edited after it was exported.*--overwrite"):
        publish.main(argv + ["--revision_tag", "v2"])
    assert_kept(folder, user)
    # --overwrite asks for the new card, and for the old contents to go.
    publish.main(argv + ["--revision_tag", "v2", "--overwrite"])
    assert 'revision="v2"' in (folder / "README.md").read_text() and not (folder / "my_eval_notes.md").exists()


def test_a_failed_check_leaves_the_folder_as_it_was(run_dir, tmp_path, monkeypatch):
    folder = tmp_path / "hub"
    hub.export_run(run_dir, folder, revision="v1", check=False)
    before = {name: (folder / name).read_bytes() for name in files(folder)}
    first_output = hub.export._first_output
    monkeypatch.setattr(hub.export, "_first_output", lambda out: first_output(out) + 1e-3)  # a reference it cannot match
    with pytest.raises(SystemExit, match=f"check of the exported folder failed, so {folder} was left as it was.*"
                                         "remote-code outputs differ"):
        publish.main(["--run_dir", run_dir, "--output_dir", str(folder), "--revision_tag", "v2"])
    assert {name: (folder / name).read_bytes() for name in files(folder)} == before
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".hf_mgk-export-")]  # no temporary folder left


def test_save_for_hub_overwrite_removes_stale_files(tmp_path):
    folder = tmp_path / "published"
    folder.mkdir()
    (folder / "README.md").write_text("a card of another model")
    (folder / "modeling_stale.py").write_text("stale")
    model = hf_mgk.MGKBertModel(hf_mgk.MGKBertConfig(vocab_size=50, **TINY))
    with pytest.raises(FileExistsError, match="overwrite"):
        hub.save_for_hub(model, folder)
    hub.save_for_hub(model, folder, overwrite=True)
    assert not (folder / "modeling_stale.py").exists()
    assert "another model" not in (folder / "README.md").read_text()
    assert "modeling_mgk_bert.py" in files(folder)


class RecordingApi:
    """Stands in for HfApi: records the calls; `tags` are the repo's existing tags."""

    def __init__(self, tags=()):
        self.calls, self.tags = [], list(tags)

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            if name == "list_repo_refs":
                return SimpleNamespace(tags=[SimpleNamespace(name=t, target_commit="abc") for t in self.tags])
            if name == "create_commit":
                return SimpleNamespace(oid="c0ffee")
        return call


def test_dry_run_lists_exactly_the_upload_and_sends_nothing(run_dir, tmp_path, capsys, monkeypatch):
    api = RecordingApi()
    monkeypatch.setattr("huggingface_hub.HfApi", lambda *a, **k: api)
    folder = tmp_path / "hub"
    result = publish.main(["--run_dir", run_dir, "--output_dir", str(folder), "--hub_model_id", "me/tiny",
                           "--push_to_hub", "--dry_run", "--no_check_remote_code"])
    out = capsys.readouterr().out
    assert api.calls == []
    listed = re.findall(r"^\s+([\d,]+)  (\S+)$", out, flags=re.M)
    on_disk = [n for n in files(folder) if n != hub.EXPORT_MARKER]
    assert [name for _, name in listed] == on_disk == [rel for rel, _ in result["files"]]
    assert all(int(size.replace(",", "")) == os.path.getsize(folder / name) for size, name in listed)
    assert f"would upload {len(on_disk)} files" in out and "nothing was uploaded" in out


def test_push_uploads_the_plan_in_one_commit_and_tags_it(run_dir, tmp_path, capsys, monkeypatch):
    api = RecordingApi()
    monkeypatch.setattr("huggingface_hub.HfApi", lambda *a, **k: api)
    folder = tmp_path / "hub"
    result = publish.main(["--run_dir", run_dir, "--output_dir", str(folder), "--hub_model_id", "me/tiny",
                           "--push_to_hub", "--revision_tag", "v2", "--private", "--no_check_remote_code"])
    assert [c[0] for c in api.calls] == ["create_repo", "list_repo_refs", "create_commit", "create_tag"]
    (_, args, kwargs), commit = api.calls[0], api.calls[2]
    assert args == ("me/tiny",) and kwargs["private"] is True and kwargs["exist_ok"] is True
    operations = commit[2]["operations"]
    assert commit[1] == ("me/tiny",)
    assert [(op.path_in_repo, op.path_or_fileobj) for op in operations] == [
        (rel, os.path.join(str(folder), rel)) for rel, _ in result["files"]]
    assert hub.EXPORT_MARKER not in [op.path_in_repo for op in operations]
    assert api.calls[3][1] == ("me/tiny",) and api.calls[3][2]["tag"] == "v2" and api.calls[3][2]["revision"] == \
        "c0ffee"
    assert 'revision="v2"' in (folder / "README.md").read_text()
    assert "commit c0ffee" in capsys.readouterr().out
    # A tag the repo already has is refused before anything is uploaded.
    api.calls.clear()
    api.tags = ["v2"]
    with pytest.raises(SystemExit, match="already has a tag 'v2'.*--revision_tag"):
        publish.main(["--run_dir", run_dir, "--output_dir", str(folder), "--hub_model_id", "me/tiny",
                      "--push_to_hub", "--revision_tag", "v2", "--no_check_remote_code"])
    assert "create_commit" not in [c[0] for c in api.calls]


def test_no_network_says_so_and_leaves_the_folder_ready(run_dir, tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    folder = tmp_path / "hub"
    argv = ["--run_dir", run_dir, "--output_dir", str(folder), "--hub_model_id", "me/tiny", "--push_to_hub",
            "--no_check_remote_code"]
    # The real script, in its own process, with HF_HUB_OFFLINE=1.
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "publish.py"), *argv], capture_output=True,
                          text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode != 0
    assert "the Hugging Face Hub is unreachable" in proc.stderr and f"The folder {folder} is ready" in proc.stderr
    assert "hf upload me/tiny" in proc.stderr and "hf repos tag create me/tiny v1" in proc.stderr
    assert {"model.safetensors", "config.json", "README.md", "tokenizer.json"} <= set(files(folder))
    # Not offline, but nothing listens: the client's connection error gets the same message.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(SystemExit, match="Hub is unreachable .*ConnectError.* is ready"):
        publish.main(argv)


def test_help_explains_every_option_and_bad_arguments(capsys, run_dir):
    with pytest.raises(SystemExit) as exit_info:
        publish.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--run_dir", "--output_dir", "--overwrite", "--hub_model_id", "--revision_tag", "--push_to_hub",
                   "--private", "--token", "--dry_run", "--check_remote_code", "--no_check_remote_code"):
        assert re.search(rf"{option}\b[^\n]*\n?\s+\S", text), option
    with pytest.raises(SystemExit):
        publish.main(["--run_dir", run_dir, "--push_to_hub"])
    assert "--push_to_hub needs --hub_model_id" in capsys.readouterr().err
