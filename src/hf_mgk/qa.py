"""Extractive question answering (SQuAD v1.1 / v2.0) for `scripts/run_qa.py`: data, features, answers, Trainer.

The steps are those of transformers' examples/pytorch/question-answering (run_qa.py, utils_qa.py, trainer_qa.py):

- examples -> features: the question with one window of the context, at most `max_seq_length` tokens, windows
  overlapping by `doc_stride` tokens, so a long context gives several features. Training features carry the
  answer's first and last token (the CLS token when the answer is not wholly inside the window, or there is none);
  evaluation features carry their example's id and each context token's character span (None for the question,
  special tokens and padding), to map logits back to text.
- features' logits -> one answer per example: over all windows of the example, the best span by start logit + end
  logit among the `n_best_size` best starts and ends, no longer than `max_answer_length` tokens. With
  unanswerable questions (SQuAD v2.0) the null answer scores CLS start + CLS end, the smallest over the windows
  (every window must agree there is no answer), and wins when it beats the best span by more than
  `null_score_diff_threshold`.
"""

import ast
import collections
import csv
import json
import logging
import math
import os
import time

import numpy as np
from transformers import Trainer
from transformers.trainer_utils import EvalPrediction, PredictionOutput, speed_metrics

from .training import first_bad_line

logger = logging.getLogger("hf_mgk.qa")

# The flat layout every split is brought to (the layout of the `squad` / `squad_v2` datasets on the Hub).
COLUMNS = ("id", "title", "context", "question", "answers")
REQUIRED_COLUMNS = ("id", "context", "question", "answers")
# Columns of evaluation features that only post-processing reads: the model never sees them.
POSTPROCESS_COLUMNS = ("example_id", "offset_mapping", "cls_index")


def _features(with_answers=True):
    from datasets import Features, List, Value

    columns = {"id": Value("string"), "title": Value("string"), "context": Value("string"),
               "question": Value("string")}
    if with_answers:
        columns["answers"] = {"text": List(Value("string")), "answer_start": List(Value("int32"))}
    return Features(columns)


# ---------------------------------------------------------------------------------------------------- local files

def squad_rows(data, where):
    """SQuAD's own JSON layout (`data` = the file's "data": articles with paragraphs of questions) -> flat rows.

    An unanswerable question (`"is_impossible": true`, SQuAD v2.0) gets empty answers; its `plausible_answers` are
    not answers and are dropped, as in the `squad_v2` dataset."""
    rows = []
    try:
        for article in data:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    answers = [] if qa.get("is_impossible", False) else qa["answers"]
                    rows.append({"id": str(qa["id"]), "title": article.get("title", ""),
                                 "context": paragraph["context"], "question": qa["question"],
                                 "answers": {"text": [a["text"] for a in answers],
                                             "answer_start": [a["answer_start"] for a in answers]}})
    except (KeyError, TypeError) as err:
        raise ValueError(f"{where}: not in SQuAD's layout ({{'data': [{{'title', 'paragraphs': [{{'context', "
                         f"'qas': [{{'id', 'question', 'answers': [{{'text', 'answer_start'}}]}}]}}]}}]}}): "
                         f"missing or malformed {err}") from None
    return rows


def _answers(value, where):
    """A flat row's answers -> {"text": [...], "answer_start": [...]}. Accepts that dict, SQuAD's list of
    {"text", "answer_start"}, or either written as a string (a CSV cell, JSON or Python literal)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                raise ValueError(f"{where}: cannot read answers {value!r}; expected "
                                 '{"text": [...], "answer_start": [...]}') from None
    if isinstance(value, list):
        value = {"text": [a["text"] for a in value], "answer_start": [a["answer_start"] for a in value]}
    if not isinstance(value, dict) or set(value) != {"text", "answer_start"}:
        raise ValueError(f'{where}: answers must be {{"text": [...], "answer_start": [...]}}; got {value!r}')
    return {"text": [str(t) for t in value["text"]], "answer_start": [int(s) for s in value["answer_start"]]}


def _read_rows(path):
    ext = path.rsplit(".", 1)[-1].lower()
    try:
        with open(path, encoding="utf-8", newline="" if ext == "csv" else None) as f:
            if ext == "csv":  # strict: a quote that never closes is an error, not one field running to the end
                return list(csv.DictReader(f, strict=True))
            text = f.read()
    except (UnicodeDecodeError, csv.Error) as err:
        reason = first_bad_line(path, "," if ext == "csv" else None) or f"{type(err).__name__}: {err}"
        raise ValueError(f"{path} cannot be read: {reason}") from None
    if ext == "json":
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            obj = None  # JSON lines in a .json file, as datasets' json loader accepts
        if isinstance(obj, dict):
            if not isinstance(obj.get("data"), list):
                raise ValueError(f"{path}: a JSON object file must hold its rows in a \"data\" list (SQuAD's layout)")
            data = obj["data"]
            nested = bool(data) and isinstance(data[0], dict) and "paragraphs" in data[0]
            return squad_rows(data, path) if nested else data
        if isinstance(obj, list):
            return obj
    elif ext != "jsonl":
        raise ValueError(f"{path}: unsupported file type .{ext}; use .json (SQuAD's layout or flat rows), .jsonl or "
                         ".csv")
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is neither JSON nor JSON lines: {err}") from None


def load_file(path, answers_required=True):
    """One local file as a `datasets.Dataset` with the flat columns (id, title, context, question, answers).

    The file is SQuAD's own JSON layout, or flat rows with those columns (.json list or {"data": [...]}, .jsonl,
    .csv; "title" optional). A test file may lack "answers" (`answers_required=False`): it then only gets
    predictions."""
    from datasets import Dataset

    rows = _read_rows(path)
    if not rows:
        raise ValueError(f"{path} holds no examples")
    present = set().union(*(row.keys() for row in rows))
    required = [c for c in REQUIRED_COLUMNS if answers_required or c != "answers"]
    missing = [c for c in required if c not in present]
    if missing:
        raise ValueError(f"{path} has no column {', '.join(repr(c) for c in missing)}; its columns are "
                         f"{', '.join(repr(c) for c in sorted(present))} (expected SQuAD's JSON layout or flat rows "
                         f"with {', '.join(REQUIRED_COLUMNS)})")
    with_answers = "answers" in present
    flat = []
    for i, row in enumerate(rows):
        where = f"{path} row {i}"
        absent = [c for c in required if row.get(c) is None]
        if absent:
            raise ValueError(f"{where} has no {', '.join(repr(c) for c in absent)}")
        out = {"id": str(row["id"]), "title": str(row.get("title") or ""), "context": str(row["context"]),
               "question": str(row["question"])}
        if with_answers:
            out["answers"] = _answers(row["answers"], where)
        flat.append(out)
    return Dataset.from_list(flat, features=_features(with_answers))


def load_local_datasets(files, validation_split_percentage=None):
    """{split: path} -> DatasetDict. Without a validation file, `validation_split_percentage` (when given) of the
    training examples are held out as the validation split."""
    from datasets import DatasetDict

    raw = DatasetDict({split: load_file(path, answers_required=split != "test") for split, path in files.items()})
    if validation_split_percentage is not None and "validation" not in raw and "train" in raw:
        n = len(raw["train"])
        held = max(1, n * validation_split_percentage // 100)
        if held >= n:
            raise ValueError(f"--train_file has {n} examples: too few to hold out a validation split; give "
                             "--validation_file")
        raw["validation"] = raw["train"].select(range(held))
        raw["train"] = raw["train"].select(range(held, n))
    return raw


def check_examples(dataset, version_2_with_negative, where):
    """Clear errors for data the run would silently mistreat: unanswerable questions without
    --version_2_with_negative, answers with unequal text / start lists or empty text, duplicate ids. Answers whose
    text is not at answer_start in the context are counted in a warning (their labels would be wrong)."""
    if "answers" not in dataset.column_names:
        return
    if len(set(dataset["id"])) != len(dataset):
        raise ValueError(f"{where}: question ids must be unique (answers are matched to questions by id)")
    unanswerable = misplaced = 0
    for example_id, context, answers in zip(dataset["id"], dataset["context"], dataset["answers"]):
        texts, starts = answers["text"], answers["answer_start"]
        if len(texts) != len(starts):
            raise ValueError(f"{where}, question {example_id}: answers has {len(texts)} texts but {len(starts)} "
                             "answer_start values")
        if any(not t for t in texts):
            raise ValueError(f"{where}, question {example_id}: an answer text is empty (an unanswerable question "
                             "has no answers at all)")
        unanswerable += not texts
        misplaced += any(context[s:s + len(t)] != t for t, s in zip(texts, starts))
    if unanswerable and not version_2_with_negative:
        raise ValueError(f"{where} has {unanswerable} unanswerable question(s) (no answers): that is SQuAD v2.0 data; "
                         "pass --version_2_with_negative to train and evaluate with the null answer")
    if misplaced:
        logger.warning("%s: %d question(s) have an answer whose text is not found at its answer_start in the context",
                       where, misplaced)


# ---------------------------------------------------------------------------------------------------- features

def require_fast_tokenizer(tokenizer):
    """Features need offset mappings (token -> characters of the context), which only fast tokenizers give."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"run_qa needs a fast tokenizer (backed by the `tokenizers` library) for its offset "
                         f"mappings; {type(tokenizer).__name__} is a slow (Python) tokenizer. Use a checkpoint or "
                         "--tokenizer_name whose tokenizer has a tokenizer.json")


def answer_token_span(sequence_ids, offsets, context_index, start_char, end_char):
    """(first, last) token of the answer characters [start_char, end_char) in one window, or None when the answer
    is not wholly inside the window's context tokens."""
    context = [k for k, s in enumerate(sequence_ids) if s == context_index]
    if not context or offsets[context[0]][0] > start_char or offsets[context[-1]][1] < end_char:
        return None
    first = max(k for k in context if offsets[k][0] <= start_char)
    last = min(k for k in context if offsets[k][1] >= end_char)
    return first, last


class FeatureMaker:
    """Turns batches of examples into model features (`datasets.map(..., batched=True)` functions)."""

    def __init__(self, tokenizer, max_seq_length=384, doc_stride=128, pad_to_max_length=True):
        require_fast_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.max_seq_length = max_seq_length
        self.doc_stride = doc_stride
        self.pad_to_max_length = pad_to_max_length
        # The side the tokenizer pads on decides the order: (question, context) or (context, question), so that
        # truncation and padding both act on the end away from the question.
        self.pad_on_right = tokenizer.padding_side == "right"
        self.context_index = 1 if self.pad_on_right else 0

    def _tokenize(self, examples):
        # Leading whitespace of a question only costs tokens (some SQuAD questions have a lot of it).
        questions = [q.lstrip() for q in examples["question"]]
        self._check_room(questions, examples["id"])
        contexts = examples["context"]
        return self.tokenizer(
            questions if self.pad_on_right else contexts, contexts if self.pad_on_right else questions,
            truncation="only_second" if self.pad_on_right else "only_first", max_length=self.max_seq_length,
            stride=self.doc_stride, return_overflowing_tokens=True, return_offsets_mapping=True,
            padding="max_length" if self.pad_to_max_length else False)

    def _check_room(self, questions, ids):
        # The tokenizers library aborts the process (a Rust panic) or fails vaguely when the question leaves no
        # context window longer than the stride; say which question and what to change instead.
        room = self.max_seq_length - self.tokenizer.num_special_tokens_to_add(pair=True)
        lengths = [len(ids_) for ids_ in self.tokenizer(questions, add_special_tokens=False)["input_ids"]]
        for example_id, n in zip(ids, lengths):
            if room - n <= self.doc_stride:
                raise ValueError(f"question {example_id} takes {n} tokens, which leaves {room - n} of "
                                 f"--max_seq_length {self.max_seq_length} for the context window; it must be more "
                                 f"than --doc_stride {self.doc_stride}. Raise --max_seq_length or lower --doc_stride")

    def cls_index(self, input_ids):
        """Where unanswerable windows point: the CLS token (BOS for tokenizers without one)."""
        for token_id in (self.tokenizer.cls_token_id, self.tokenizer.bos_token_id):
            if token_id is not None and token_id in input_ids:
                return input_ids.index(token_id)
        return 0

    def train_features(self, examples):
        """input ids etc. plus start_positions / end_positions of the first answer (CLS when out of the window)."""
        encoded = self._tokenize(examples)
        sample_map = encoded.pop("overflow_to_sample_mapping")
        all_offsets = encoded.pop("offset_mapping")
        starts, ends = [], []
        for i, offsets in enumerate(all_offsets):
            answers = examples["answers"][sample_map[i]]
            span = None
            if answers["answer_start"]:
                start_char = answers["answer_start"][0]
                span = answer_token_span(encoded.sequence_ids(i), offsets, self.context_index, start_char,
                                         start_char + len(answers["text"][0]))
            if span is None:
                cls = self.cls_index(encoded["input_ids"][i])
                span = (cls, cls)
            starts.append(span[0])
            ends.append(span[1])
        encoded["start_positions"] = starts
        encoded["end_positions"] = ends
        return encoded

    def eval_features(self, examples):
        """input ids etc. plus example_id, offset_mapping (None outside the context) and cls_index."""
        encoded = self._tokenize(examples)
        sample_map = encoded.pop("overflow_to_sample_mapping")
        encoded["example_id"] = [examples["id"][s] for s in sample_map]
        encoded["cls_index"] = [self.cls_index(ids) for ids in encoded["input_ids"]]
        encoded["offset_mapping"] = [
            [o if s == self.context_index else None for o, s in zip(offsets, encoded.sequence_ids(i))]
            for i, offsets in enumerate(encoded["offset_mapping"])]
        return encoded


# ---------------------------------------------------------------------------------------------------- answers

def prediction_file_names(prefix=None, version_2_with_negative=False):
    """predictions.json, nbest_predictions.json (and null_odds.json for v2), with "<prefix>_" in front if given."""
    names = ["predictions", "nbest_predictions"] + (["null_odds"] if version_2_with_negative else [])
    return [f"{prefix}_{n}.json" if prefix else f"{n}.json" for n in names]


def postprocess_qa_predictions(examples, features, predictions, version_2_with_negative=False, n_best_size=20,
                               max_answer_length=30, null_score_diff_threshold=0.0, output_dir=None, prefix=None):
    """Start / end logits of the features -> one answer text per example.

    predictions: (start_logits, end_logits), arrays of shape (len(features), length); `features` need
    example_id and offset_mapping (and cls_index, else 0). Returns (answers {id: text}, nbest {id: [{"text",
    "probability", "start_logit", "end_logit"}, ...]}, null_odds {id: null score - best span score} or None).
    The n-best probabilities are a softmax over the listed candidates' scores. With `output_dir` the three are
    written as JSON (see `prediction_file_names`)."""
    if len(predictions) < 2:
        raise ValueError("predictions must be (start_logits, end_logits)")
    all_start, all_end = predictions[0], predictions[1]
    if len(all_start) != len(features):
        raise ValueError(f"got {len(all_start)} predictions for {len(features)} features")
    offsets_of = list(features["offset_mapping"])
    cls_of = list(features["cls_index"]) if "cls_index" in features.column_names else [0] * len(features)
    by_example = collections.defaultdict(list)
    for i, example_id in enumerate(features["example_id"]):
        by_example[example_id].append(i)

    answers, nbest_json = {}, {}
    null_odds = {} if version_2_with_negative else None
    for example_id, context in zip(examples["id"], examples["context"]):
        candidates, null = [], None
        for f in by_example[example_id]:
            start, end, offsets, cls = all_start[f], all_end[f], offsets_of[f], cls_of[f]
            score = float(start[cls] + end[cls])
            if null is None or score < null["score"]:
                null = {"span": (0, 0), "score": score, "start_logit": float(start[cls]), "end_logit": float(end[cls])}
            # Stable sort so equal logits keep token order; logits past the offsets are padding of the batches.
            best_starts = np.argsort(-start, kind="stable")[:n_best_size]
            best_ends = np.argsort(-end, kind="stable")[:n_best_size]
            for s in best_starts:
                for e in best_ends:
                    if s >= len(offsets) or e >= len(offsets) or offsets[s] is None or offsets[e] is None:
                        continue
                    if e < s or e - s + 1 > max_answer_length:
                        continue
                    candidates.append({"span": (offsets[s][0], offsets[e][1]), "score": float(start[s] + end[e]),
                                       "start_logit": float(start[s]), "end_logit": float(end[e])})
        if null is None:
            raise ValueError(f"example {example_id} has no features")
        if version_2_with_negative:
            candidates.append(null)
        nbest = sorted(candidates, key=lambda c: c["score"], reverse=True)[:n_best_size]
        if version_2_with_negative and not any(c is null for c in nbest):
            nbest.append(null)  # the null answer is always listed in v2: its score decides
        for c in nbest:
            c["text"] = context[c["span"][0]:c["span"][1]]
        if not any(c is not null for c in nbest):
            # No valid span in any window (e.g. every top start is in the question): a placeholder, as upstream.
            nbest.insert(0, {"span": None, "text": "empty", "score": 0.0, "start_logit": 0.0, "end_logit": 0.0})
        scores = np.array([c["score"] for c in nbest])
        probabilities = np.exp(scores - scores.max())
        probabilities /= probabilities.sum()
        best = next(c for c in nbest if c is not null)
        if version_2_with_negative:
            diff = null["score"] - best["start_logit"] - best["end_logit"]
            null_odds[example_id] = diff
            answers[example_id] = "" if diff > null_score_diff_threshold else best["text"]
        else:
            answers[example_id] = best["text"]
        nbest_json[example_id] = [{"text": c["text"], "probability": float(p), "start_logit": c["start_logit"],
                                   "end_logit": c["end_logit"]} for c, p in zip(nbest, probabilities)]

    if output_dir is not None:
        for name, content in zip(prediction_file_names(prefix, version_2_with_negative),
                                 (answers, nbest_json, null_odds)):
            path = os.path.join(output_dir, name)
            logger.info("writing %s", path)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(content, f, indent=4, ensure_ascii=False)
                f.write("\n")
    return answers, nbest_json, null_odds


def metric_inputs(answers, examples, version_2_with_negative):
    """EvalPrediction in the `squad` / `squad_v2` metrics' layout; label_ids None when the examples have no answers."""
    if version_2_with_negative:
        # The null-answer decision is already in the text ("" = no answer), so the metric's own threshold on
        # no_answer_probability must not abstain again.
        predictions = [{"id": k, "prediction_text": v, "no_answer_probability": 0.0} for k, v in answers.items()]
    else:
        predictions = [{"id": k, "prediction_text": v} for k, v in answers.items()]
    references = None
    if "answers" in examples.column_names:
        references = [{"id": i, "answers": a} for i, a in zip(examples["id"], examples["answers"])]
    return EvalPrediction(predictions=predictions, label_ids=references)


class QuestionAnsweringTrainer(Trainer):
    """Trainer whose evaluate / predict turn the features' logits into one answer per example
    (`post_process_function(examples, features, logits, stage)` -> EvalPrediction) before `compute_metrics`.

    Evaluation features keep example_id / offset_mapping / cls_index for post-processing; they are dropped from
    what the model receives, whatever --remove_unused_columns says."""

    def __init__(self, *args, eval_examples=None, post_process_function=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_examples = eval_examples
        self.post_process_function = post_process_function

    def _logits(self, features, ignore_keys, prefix, description):
        inputs = features.remove_columns([c for c in POSTPROCESS_COLUMNS if c in features.column_names])
        dataloader = self.get_test_dataloader(inputs)
        start_time = time.time()
        # The metric needs answers per example, not logits per feature: keep the loop from computing it.
        compute_metrics, self.compute_metrics = self.compute_metrics, None
        try:
            output = self.evaluation_loop(dataloader, description=description, prediction_loss_only=False,
                                          ignore_keys=ignore_keys, metric_key_prefix=prefix)
        finally:
            self.compute_metrics = compute_metrics
        metrics = dict(output.metrics)
        steps = math.ceil(output.num_samples / (self.args.eval_batch_size * self.args.world_size))
        metrics.update(speed_metrics(prefix, start_time, num_samples=output.num_samples, num_steps=steps))
        return output.predictions, metrics

    def _answers(self, examples, features, logits, prefix, metrics):
        if self.post_process_function is None:
            return None
        answers = self.post_process_function(examples, features, logits, prefix)
        if self.compute_metrics is not None and answers.label_ids is not None:
            scores = self.compute_metrics(answers)
            metrics.update({k if k.startswith(f"{prefix}_") else f"{prefix}_{k}": v for k, v in scores.items()})
        return answers

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval", eval_examples=None):
        features = self.eval_dataset if eval_dataset is None else eval_dataset
        examples = self.eval_examples if eval_examples is None else eval_examples
        logits, metrics = self._logits(features, ignore_keys, metric_key_prefix, "Evaluation")
        self._answers(examples, features, logits, metric_key_prefix, metrics)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(self, test_dataset, test_examples=None, ignore_keys=None, metric_key_prefix="predict"):
        if test_examples is None:
            raise ValueError("QuestionAnsweringTrainer.predict needs test_examples (the examples of the features)")
        logits, metrics = self._logits(test_dataset, ignore_keys, metric_key_prefix, "Prediction")
        answers = self._answers(test_examples, test_dataset, logits, metric_key_prefix, metrics)
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics)
        if answers is None:
            return PredictionOutput(predictions=logits, label_ids=None, metrics=metrics)
        return PredictionOutput(predictions=answers.predictions, label_ids=answers.label_ids, metrics=metrics)
