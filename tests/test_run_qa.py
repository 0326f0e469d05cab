"""scripts/run_qa.py and hf_mgk.qa: SQuAD v1.1 / v2.0 features, answer post-processing and end-to-end runs.

EM / F1 are recomputed here with an independent implementation of the official SQuAD definitions."""

import collections
import json
import os
import re
import string

import numpy as np
import pytest
from datasets import Dataset
from transformers import AutoTokenizer, ProphetNetTokenizer

from hf_mgk import bundled, qa
from hf_mgk.scripts import run_qa
import tiny


pytestmark = pytest.mark.slow  # the script end to end on SQuAD-format files

# --config_overrides text: 128 positions (130 for RoBERTa, its positions start after the padding index)
TINY_BERT = tiny.overrides(tiny.bert_size(max_position_embeddings=128))
TINY_ROBERTA = tiny.overrides(tiny.bert_size(max_position_embeddings=130, vocab_size=50262, num_random_features=16))
SHORT = ["--max_seq_length", "64", "--doc_stride", "16"]

RIVER = ("The Aare is the longest river that flows entirely within Switzerland. It rises in the Bernese Alps near "
         "the Grimsel Pass. The river passes through the city of Bern, the federal capital, in a deep loop. Further "
         "downstream it joins the Rhine at Koblenz. Its total length is about 295 kilometres. Many people swim in "
         "the Aare during the warm summer months. The water is famously clear and cold because it comes from "
         "glaciers.")
WHALE = ("The blue whale is the largest animal known to have ever existed. Adults can reach a length of thirty "
         "metres and weigh as much as two hundred tonnes. They feed almost exclusively on tiny crustaceans called "
         "krill. During the summer they feed in polar waters and in winter they migrate towards the equator. Their "
         "calls are among the loudest sounds made by any animal. Commercial whaling reduced their numbers "
         "dramatically in the twentieth century.")
# (context, question, answer or None for unanswerable)
QUESTIONS = [
    (RIVER, "Where does the Aare rise?", "the Bernese Alps"),
    (RIVER, "Which city is the federal capital?", "Bern"),
    (RIVER, "   Where does the Aare join the Rhine?", "Koblenz"),
    (RIVER, "How long is the Aare?", "about 295 kilometres"),
    (RIVER, "Why is the water cold?", "it comes from glaciers"),
    (WHALE, "What do blue whales eat?", "krill"),
    (WHALE, "How heavy can adults be?", "two hundred tonnes"),
    (WHALE, "What reduced their numbers?", "Commercial whaling"),
]
UNANSWERABLE = [(RIVER, "Which river flows into the Aare?", "the Rhine"),
                (WHALE, "What is the name of the oldest blue whale?", "The blue whale")]


def _start(context, text):
    return re.search(r"\b" + re.escape(text) + r"\b", context).start()


def squad_json(version_2=False):
    """SQuAD's own layout: articles -> paragraphs -> qas (v2: is_impossible with plausible_answers)."""
    items = [(c, q, a, False) for c, q, a in QUESTIONS]
    if version_2:
        items += [(c, q, a, True) for c, q, a in UNANSWERABLE]
    data = []
    for title, context in (("Aare", RIVER), ("Blue whale", WHALE)):
        qas = []
        for i, (c, question, answer, impossible) in enumerate(items):
            if c != context:
                continue
            qa_ = {"id": f"{title[:4].lower()}-{i}", "question": question}
            found = {"text": answer, "answer_start": _start(context, answer)}
            if impossible:
                qa_.update(answers=[], is_impossible=True, plausible_answers=[found])
            else:
                qa_["answers"] = [found]
                if version_2:
                    qa_["is_impossible"] = False
            qas.append(qa_)
        data.append({"title": title, "paragraphs": [{"context": context, "qas": qas}]})
    return {"version": "v2.0" if version_2 else "1.1", "data": data}


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    return str(path)


def flat_rows(version_2=False):
    return qa.squad_rows(squad_json(version_2)["data"], "test data")


# ------------------------------------------------------------------ independent EM / F1 (official definitions)

def _normalize(text):
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _f1(prediction, gold, v2):
    p, g = _normalize(prediction).split(), _normalize(gold).split()
    if v2 and (not p or not g):
        return float(p == g)
    same = sum((collections.Counter(p) & collections.Counter(g)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions, gold, v2=False):
    """{id: text} vs {id: [gold texts]} -> exact, f1 (0-100) and for v2 the HasAns / NoAns parts."""
    em, f1 = {}, {}
    for qid, golds in gold.items():
        golds = golds or ([""] if v2 else golds)
        em[qid] = max(float(_normalize(predictions[qid]) == _normalize(g)) for g in golds)
        f1[qid] = max(_f1(predictions[qid], g, v2) for g in golds)
    out = {"exact": 100 * np.mean(list(em.values())), "f1": 100 * np.mean(list(f1.values()))}
    if v2:
        for name, ids in (("HasAns", [q for q in gold if gold[q]]), ("NoAns", [q for q in gold if not gold[q]])):
            out[f"{name}_exact"] = 100 * np.mean([em[q] for q in ids])
            out[f"{name}_f1"] = 100 * np.mean([f1[q] for q in ids])
            out[f"{name}_total"] = len(ids)
    return out


def test_independent_scores_by_hand():
    # "The Cat sat!" -> "cat sat"; gold "a cat sat on" -> "cat sat on": P = 1, R = 2/3, F1 = 0.8; no exact match.
    assert squad_scores({"x": "The Cat sat!"}, {"x": ["a cat sat on"]}) == {"exact": 0.0, "f1": pytest.approx(80.0)}
    assert squad_scores({"x": "Cat, sat."}, {"x": ["nothing", "the cat sat"]})["exact"] == 100.0
    v2 = squad_scores({"x": "", "y": "krill"}, {"x": [], "y": ["tiny krill"]}, v2=True)
    assert v2["NoAns_exact"] == 100.0 and v2["HasAns_exact"] == 0.0 and v2["HasAns_f1"] == pytest.approx(200 / 3)


def gold_answers(path):
    return {r["id"]: r["answers"]["text"] for r in qa.squad_rows(json.load(open(path))["data"], path)}


def test_local_file_layouts_load_the_same_rows(tmp_path):
    import csv

    rows = flat_rows(version_2=True)
    assert len(rows) == len(QUESTIONS) + len(UNANSWERABLE)
    # SQuAD v2.0: is_impossible -> no answers (the plausible answers are not answers).
    assert sum(not r["answers"]["text"] for r in rows) == len(UNANSWERABLE)
    assert all(r["context"][s:s + len(t)] == t for r in rows for t, s in zip(*r["answers"].values()))
    paths = [write_json(tmp_path / "squad.json", squad_json(version_2=True)),
             write_json(tmp_path / "flat.json", {"data": rows}), write_json(tmp_path / "list.json", rows)]
    (tmp_path / "flat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with open(tmp_path / "flat.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["id", "title", "context", "question", "answers"])
        writer.writeheader()
        writer.writerows({**r, "answers": json.dumps(r["answers"])} for r in rows)
    paths += [str(tmp_path / "flat.jsonl"), str(tmp_path / "flat.csv")]
    for path in paths:
        assert qa.load_file(path).to_list() == rows, path


# ------------------------------------------------------------------------------------------ post-processing

def _features(example_ids, offsets, cls_index=None):
    columns = {"example_id": example_ids, "offset_mapping": offsets}
    if cls_index is not None:
        columns["cls_index"] = cls_index
    return Dataset.from_dict(columns)


CONTEXT = "alpha beta gamma delta epsilon zeta eta"
WORDS = [(m.start(), m.end()) for m in re.finditer(r"\w+", CONTEXT)]
# Two windows of one example: [CLS] q q [SEP] ctx... [SEP]; window 2 overlaps window 1 by two words.
# Window 2 has no padding: its logits are longer than its offsets, as after dynamic padding.
WINDOWS = [[None, None, None, None] + [list(w) for w in WORDS[0:4]] + [None, None],
           [None, None, None, None] + [list(w) for w in WORDS[2:7]]]
LENGTH = 10


def _brute_force(start, end, max_answer_length, n_best_size):
    """Every valid span of every window whose start / end are among that window's n_best_size best logits."""
    spans = []
    for f, offsets in enumerate(WINDOWS):
        top_s = set(np.argsort(-start[f])[:n_best_size])
        top_e = set(np.argsort(-end[f])[:n_best_size])
        for s in range(LENGTH):
            for e in range(s, min(LENGTH, s + max_answer_length)):
                if e >= len(offsets) or offsets[s] is None or offsets[e] is None or s not in top_s or e not in top_e:
                    continue
                spans.append((start[f][s] + end[f][e], CONTEXT[offsets[s][0]:offsets[e][1]]))
    return sorted(spans, reverse=True)


def test_postprocess_best_span_across_windows_and_offsets():
    examples = Dataset.from_dict({"id": ["q"], "context": [CONTEXT]})
    start = np.full((2, LENGTH), -5.0, dtype=np.float32)
    end = np.full((2, LENGTH), -5.0, dtype=np.float32)
    start[0, 5], end[0, 5] = 3.0, 3.0  # window 1: "beta" scores 6
    start[1, 6], end[1, 8] = 4.0, 4.5  # window 2: "epsilon zeta eta" scores 8.5
    start[1, 0] = end[1, 0] = 9.0  # CLS and question tokens are never answers
    start[1, 1] = end[1, 2] = 9.0
    answers, nbest, null_odds = qa.postprocess_qa_predictions(examples, _features(["q", "q"], WINDOWS),
                                                              (start, end))
    assert answers == {"q": "epsilon zeta eta"} and null_odds is None
    best = nbest["q"][0]
    assert best["text"] == "epsilon zeta eta" and (best["start_logit"], best["end_logit"]) == (4.0, 4.5)
    probabilities = [c["probability"] for c in nbest["q"]]
    assert sum(probabilities) == pytest.approx(1.0) and probabilities == sorted(probabilities, reverse=True)
    # The offsets map back to the context: every listed answer runs from the start of a word to the end of one.
    word_runs = {CONTEXT[a:b] for a, _ in WORDS for _, b in WORDS if a < b}
    assert all(c["text"] in word_runs for c in nbest["q"]) and len(nbest["q"]) == 20


@pytest.mark.parametrize("max_answer_length,n_best_size", [(2, 20), (3, 3), (1, 4)])
def test_postprocess_matches_brute_force(max_answer_length, n_best_size):
    rng = np.random.default_rng(max_answer_length * 10 + n_best_size)
    start = rng.normal(size=(2, LENGTH)).astype(np.float32)
    end = rng.normal(size=(2, LENGTH)).astype(np.float32)
    examples = Dataset.from_dict({"id": ["q"], "context": [CONTEXT]})
    answers, nbest, _ = qa.postprocess_qa_predictions(
        examples, _features(["q", "q"], WINDOWS), (start, end), n_best_size=n_best_size,
        max_answer_length=max_answer_length)
    expected = _brute_force(start, end, max_answer_length, n_best_size)
    assert expected, "these logits must allow a span"
    assert answers["q"] == expected[0][1]
    assert len(nbest["q"]) == min(n_best_size, len(expected))
    assert [c["text"] for c in nbest["q"]] == [text for _, text in expected[:n_best_size]]
    assert all(len(c["text"].split()) <= max_answer_length for c in nbest["q"])


def test_postprocess_without_any_valid_span_gives_placeholder():
    # The best start of each window is a question token: with n_best_size 1 no span is valid (upstream's "empty").
    start = np.zeros((2, LENGTH), dtype=np.float32)
    start[:, 2] = 1.0
    end = np.ones((2, LENGTH), dtype=np.float32)
    examples = Dataset.from_dict({"id": ["q"], "context": [CONTEXT]})
    answers, nbest, _ = qa.postprocess_qa_predictions(examples, _features(["q", "q"], WINDOWS), (start, end),
                                                      n_best_size=1)
    assert answers == {"q": "empty"} and [c["text"] for c in nbest["q"]] == ["empty"]


def test_postprocess_v2_null_threshold_and_files(tmp_path):
    examples = Dataset.from_dict({"id": ["a", "b"], "context": [CONTEXT, CONTEXT]})
    windows = WINDOWS + WINDOWS
    start = np.zeros((4, LENGTH), dtype=np.float32)
    end = np.zeros((4, LENGTH), dtype=np.float32)
    # Example a: CLS at index 0; null scores 1.0 + 1.5 (window 1) and 2.0 + 2.0 (window 2): the minimum, 2.5,
    # counts. Best span "gamma" in window 2 = 0.75 + 0.5, so null - best = 1.25.
    start[0, 0], end[0, 0], start[1, 0], end[1, 0] = 1.0, 1.5, 2.0, 2.0
    start[1, 4], end[1, 4] = 0.75, 0.5
    # Example b: its CLS sits at index 3 (cls_index), the best span scores more than the null one.
    start[2:, 3], end[2:, 3] = -1.0, -1.0
    start[3, 5], end[3, 6] = 2.0, 1.0  # "delta epsilon" = 3.0; null - best = -5.0
    features = _features(["a", "a", "b", "b"], windows, cls_index=[0, 0, 3, 3])
    for threshold, answer_a in ((1.0, ""), (1.25, "gamma"), (1.5, "gamma"), (-10.0, "")):
        answers, nbest, null_odds = qa.postprocess_qa_predictions(
            examples, features, (start, end), version_2_with_negative=True, null_score_diff_threshold=threshold)
        assert null_odds == {"a": 1.25, "b": -5.0}
        assert answers["a"] == answer_a  # "" exactly when null - best > threshold
        assert answers["b"] == ("" if threshold < -5.0 else "delta epsilon")
    # The null answer is listed in the n-best with its own logits, as the text "".
    null = [c for c in nbest["a"] if c["text"] == ""]
    assert len(null) == 1 and (null[0]["start_logit"], null[0]["end_logit"]) == (1.0, 1.5)

    qa.postprocess_qa_predictions(examples, features, (start, end), version_2_with_negative=True,
                                  output_dir=str(tmp_path), prefix="eval")
    qa.postprocess_qa_predictions(examples, features, (start, end), output_dir=str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["eval_nbest_predictions.json", "eval_null_odds.json",
                                            "eval_predictions.json", "nbest_predictions.json", "predictions.json"]
    assert json.load(open(tmp_path / "eval_null_odds.json")) == {"a": 1.25, "b": -5.0}
    assert json.load(open(tmp_path / "eval_predictions.json")) == {"a": "", "b": "delta epsilon"}
    assert json.load(open(tmp_path / "predictions.json")) == {"a": "gamma", "b": "delta epsilon"}
    assert [c["text"] for c in json.load(open(tmp_path / "nbest_predictions.json"))["b"]][0] == "delta epsilon"


# ---------------------------------------------------------------------------------------------- features

@pytest.fixture(scope="module")
def roberta_dir():
    """A RoBERTa-style byte-level BPE tokenizer from GPT-2's files, with RoBERTa's special ids (<s> 0, <pad> 1,
    </s> 2, <unk> 3), so that RoBERTa's position offset (pad id + 1) holds."""
    return bundled.roberta_tokenizer_dir()


def _tokenizers(roberta_dir):
    bert = AutoTokenizer.from_pretrained(bundled.bert_checkpoint_dir())
    left = AutoTokenizer.from_pretrained(bundled.bert_checkpoint_dir(), padding_side="left")
    return {"bert": bert, "bert-left-padding": left, "roberta": AutoTokenizer.from_pretrained(roberta_dir)}


def test_roberta_tokenizer_has_offsets(roberta_dir):
    tok = AutoTokenizer.from_pretrained(roberta_dir)
    assert tok.is_fast and len(tok) == 50262 and (tok.cls_token_id, tok.pad_token_id) == (0, 1)
    assert not tok.add_prefix_space  # as RoBERTa's: the first word of each text has no leading space token
    enc = tok("Where is it?", RIVER, return_offsets_mapping=True)
    context_tokens = [i for i, s in enumerate(enc.sequence_ids()) if s == 1]
    # Trimmed offsets: each context token covers exactly its word piece, without the space before it.
    for i in context_tokens:
        a, b = enc["offset_mapping"][i]
        assert RIVER[a:b] == tok.convert_tokens_to_string([enc.tokens()[i]]).strip()


@pytest.mark.parametrize("name", ["bert", "bert-left-padding", "roberta"])
def test_train_and_eval_features(name, roberta_dir):
    tok = _tokenizers(roberta_dir)[name]
    examples = Dataset.from_list(flat_rows(version_2=True))
    maker = qa.FeatureMaker(tok, max_seq_length=64, doc_stride=16)
    train = maker.train_features(examples[:])
    evals = maker.eval_features(examples[:])
    n = len(train["input_ids"])
    assert n == len(evals["input_ids"]) and n >= 2 * len(examples)  # long contexts: several windows each
    assert max(collections.Counter(evals["example_id"]).values()) >= 3
    assert all(len(ids) == 64 for ids in train["input_ids"])
    context_seq = 1 if name != "bert-left-padding" else 0
    questions, contexts = [q.lstrip() for q in examples["question"]], list(examples["context"])
    offsets_all = tok(questions if context_seq else contexts, contexts if context_seq else questions,
                      truncation="only_second" if context_seq else "only_first", max_length=64, stride=16,
                      return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length")
    by_id = {r["id"]: r for r in examples}
    labelled = collections.Counter()
    for i in range(n):
        example = by_id[evals["example_id"][i]]
        cls = train["input_ids"][i].index(tok.cls_token_id)
        assert evals["cls_index"][i] == cls
        seq = offsets_all.sequence_ids(i)
        offsets = offsets_all["offset_mapping"][i]
        window = [offsets[k] for k in range(64) if seq[k] == context_seq]
        s, e = train["start_positions"][i], train["end_positions"][i]
        # Eval offsets: the context tokens' spans, None everywhere else (question, special tokens, padding).
        assert evals["offset_mapping"][i] == [o if seq[k] == context_seq else None
                                              for k, o in enumerate(offsets)]
        answers = example["answers"]
        if not answers["text"]:
            assert (s, e) == (cls, cls)
            continue
        a = answers["answer_start"][0]
        b = a + len(answers["text"][0])
        inside = window[0][0] <= a and b <= window[-1][1]
        if not inside:
            assert (s, e) == (cls, cls)
            continue
        assert seq[s] == context_seq and seq[e] == context_seq and s <= e
        assert example["context"][offsets[s][0]:offsets[e][1]] == answers["text"][0]
        labelled[example["id"]] += 1
    # Every answer fits in a window, so every answerable example has at least one labelled feature.
    assert set(labelled) == {r["id"] for r in examples if r["answers"]["text"]}
    if name == "bert-left-padding":  # context first, padding on the left
        assert any(ids[0] == tok.pad_token_id for ids in train["input_ids"])


def test_question_leaving_no_room_is_a_clear_error():
    tok = AutoTokenizer.from_pretrained(bundled.bert_checkpoint_dir())
    batch = {"id": ["long"], "question": ["why " * 50], "context": [RIVER],
             "answers": [{"text": [], "answer_start": []}]}
    with pytest.raises(ValueError, match="question long takes 50 tokens.*--doc_stride"):
        qa.FeatureMaker(tok, 64, 16).eval_features(batch)


# -------------------------------------------------------------------------------------------- end to end

def _common(out, tokenizer_dir=None, model_type="mgk-bert", overrides=TINY_BERT):
    return ["--model_type", model_type, "--config_overrides", overrides,
            "--tokenizer_name", tokenizer_dir or bundled.bert_checkpoint_dir(), *SHORT, "--output_dir", str(out),
            "--use_cpu", "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true", "--seed", "0"]


TRAIN = ["--do_train", "--max_steps", "3", "--per_device_train_batch_size", "4", "--learning_rate", "3e-3",
         "--per_device_eval_batch_size", "16"]


def _predictions_are_spans(predictions, rows):
    contexts = {r["id"]: r["context"] for r in rows}
    assert set(predictions) == set(contexts)
    assert all(text in contexts[qid] for qid, text in predictions.items())


def test_run_qa_v1_end_to_end(tmp_path):
    squad = write_json(tmp_path / "train-v1.1.json", squad_json())
    test_file = tmp_path / "test.jsonl"  # flat rows without answers: predictions only
    rows = flat_rows()
    with open(test_file, "w") as f:
        for r in rows:
            f.write(json.dumps({k: r[k] for k in ("id", "title", "context", "question")}) + "\n")
    out = tmp_path / "out"
    results = run_qa.main(_common(out) + TRAIN + ["--train_file", squad, "--validation_file", squad, "--do_eval",
                                                  "--test_file", str(test_file), "--do_predict"])
    files = set(os.listdir(out))
    assert {"eval_predictions.json", "eval_nbest_predictions.json", "eval_results.json", "predict_predictions.json",
            "predict_nbest_predictions.json", "train_results.json", "model.safetensors"} <= files
    assert not any("null_odds" in f for f in files)
    predictions = json.load(open(out / "eval_predictions.json"))
    _predictions_are_spans(predictions, rows)
    _predictions_are_spans(json.load(open(out / "predict_predictions.json")), rows)
    nbest = json.load(open(out / "eval_nbest_predictions.json"))
    assert all(nbest[q][0]["text"] == predictions[q] and len(nbest[q]) <= 20 for q in predictions)
    saved = json.load(open(out / "eval_results.json"))
    expected = squad_scores(predictions, gold_answers(squad))
    assert saved["eval_exact_match"] == pytest.approx(expected["exact"])
    assert saved["eval_f1"] == pytest.approx(expected["f1"])
    assert saved["eval_samples"] > len(rows)  # features, as upstream
    assert results["eval_f1"] == saved["eval_f1"] and "predict_exact_match" not in results
    run_info = json.load(open(out / "hf_mgk_run.json"))
    assert run_info["task"] == "question-answering" and run_info["family"] == "mgk-bert"


def test_run_qa_v2_end_to_end(tmp_path):
    squad = write_json(tmp_path / "dev-v2.0.json", squad_json(version_2=True))
    out = tmp_path / "out"
    run_qa.main(_common(out) + TRAIN + ["--train_file", squad, "--validation_file", squad, "--do_eval",
                                        "--version_2_with_negative", "--null_score_diff_threshold", "0.0",
                                        "--n_best_size", "5"])
    predictions = json.load(open(out / "eval_predictions.json"))
    null_odds = json.load(open(out / "eval_null_odds.json"))
    _predictions_are_spans(predictions, flat_rows(version_2=True))
    assert set(null_odds) == set(predictions)
    assert all((predictions[q] == "") == (null_odds[q] > 0.0) for q in predictions)
    assert all(len(c) <= 6 for c in json.load(open(out / "eval_nbest_predictions.json")).values())  # 5 + null
    saved = json.load(open(out / "eval_results.json"))
    expected = squad_scores(predictions, gold_answers(squad), v2=True)
    for key in ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1"):
        assert saved[f"eval_{key}"] == pytest.approx(expected[key]), key
    assert saved["eval_HasAns_total"] == len(QUESTIONS) and saved["eval_NoAns_total"] == len(UNANSWERABLE)
    assert {"eval_best_exact", "eval_best_f1"} <= set(saved)

    # Predict alone from the saved model on a test file: the answers evaluate gave, scored (the file has answers).
    pred = tmp_path / "pred"
    run_qa.main(["--model_name_or_path", str(out), "--test_file", squad, "--do_predict", "--version_2_with_negative",
                 "--n_best_size", "5", *SHORT, "--output_dir", str(pred), "--use_cpu", "--report_to", "none",
                 "--disable_tqdm", "true"])
    assert {"predict_predictions.json", "predict_nbest_predictions.json", "predict_null_odds.json",
            "predict_results.json"} <= set(os.listdir(pred))
    assert json.load(open(pred / "predict_predictions.json")) == predictions
    assert json.load(open(pred / "predict_null_odds.json")) == pytest.approx(null_odds)
    assert json.load(open(pred / "predict_results.json"))["predict_f1"] == pytest.approx(expected["f1"])


def test_run_qa_nprf_roberta(tmp_path, roberta_dir):
    squad = write_json(tmp_path / "train.json", squad_json())
    out = tmp_path / "out"
    results = run_qa.main(_common(out, roberta_dir, "nprf-roberta", TINY_ROBERTA) + TRAIN + [
        "--train_file", squad, "--validation_file", squad, "--do_eval", "--pad_to_max_length", "false"])
    predictions = json.load(open(out / "eval_predictions.json"))
    _predictions_are_spans(predictions, flat_rows())
    expected = squad_scores(predictions, gold_answers(squad))
    assert results["eval_exact_match"] == pytest.approx(expected["exact"])
    assert results["eval_f1"] == pytest.approx(expected["f1"])
    assert json.load(open(out / "config.json"))["model_type"] == "nprf-roberta"


# ------------------------------------------------------------------------------------------------ errors

def test_slow_tokenizer_is_refused(tmp_path):
    squad = write_json(tmp_path / "train.json", squad_json())
    slow = tmp_path / "slow_tok"
    ProphetNetTokenizer(vocab_file=os.path.join(bundled.bert_checkpoint_dir(), "vocab.txt")).save_pretrained(slow)
    with pytest.raises(ValueError, match="run_qa needs a fast tokenizer.*ProphetNetTokenizer"):
        run_qa.main(_common(tmp_path / "o1", str(slow)) + ["--do_eval", "--validation_file", squad])
    with pytest.raises(ValueError, match="run_qa needs a fast tokenizer.*--use_fast_tokenizer False"):
        run_qa.main(_common(tmp_path / "o2") + ["--do_eval", "--validation_file", squad,
                                                "--use_fast_tokenizer", "false"])


def test_missing_column_is_named(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "question"} for r in flat_rows()]
    path = tmp_path / "flat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="has no column 'question'"):
        run_qa.main(_common(tmp_path / "out") + ["--do_eval", "--validation_file", str(path)])


def test_unanswerable_questions_need_the_v2_flag(tmp_path):
    squad = write_json(tmp_path / "dev-v2.0.json", squad_json(version_2=True))
    with pytest.raises(ValueError, match="2 unanswerable question.*--version_2_with_negative"):
        run_qa.main(_common(tmp_path / "out") + ["--do_eval", "--validation_file", squad])


def test_fish_gpt2_has_no_qa_head(tmp_path):
    squad = write_json(tmp_path / "train.json", squad_json())
    with pytest.raises(ValueError, match="fish-gpt2 has no model for extractive question answering"):
        run_qa.main(_common(tmp_path / "out", overrides=tiny.overrides(tiny.gpt2_size()), model_type="fish-gpt2")
                    + ["--do_eval", "--validation_file", squad])


def test_sequence_longer_than_the_model_positions_is_refused(tmp_path):
    squad = write_json(tmp_path / "train.json", squad_json())
    args = _common(tmp_path / "out") + ["--do_eval", "--validation_file", squad]
    args[args.index("--max_seq_length") + 1] = "384"  # upstream's default; the tiny model has 128 positions
    with pytest.raises(ValueError, match="--max_seq_length 384 is longer than the model's positions"):
        run_qa.main(args)


def test_push_to_hub_ends_with_the_family_card_after_evaluation(tmp_path, fake_hub):
    """--push_to_hub (a local stand-in for the Hub's API): the last upload comes after evaluation, with the
    family's model card (its exact match and F1 in the model-index) in place of Trainer's draft."""
    from conftest import check_final_push

    squad = write_json(tmp_path / "train-v1.1.json", squad_json())
    out = tmp_path / "out"
    run_qa.main(_common(out) + TRAIN + ["--train_file", squad, "--validation_file", squad, "--do_eval",
                                        "--push_to_hub", "--hub_model_id", "me/tiny-qa"])
    meta, _ = check_final_push(fake_hub, "me/tiny-qa", "mgk-bert", "question-answering", "f1")
    assert any(m["name"] == "exact_match" for entry in meta["model-index"] for r in entry["results"]
               for m in r["metrics"])
