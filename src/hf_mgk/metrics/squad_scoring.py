"""SQuAD answer scoring, shared by the shipped `squad` (v1.1) and `squad_v2` metric modules.

Definitions are those of the official evaluation scripts distributed with the datasets (Rajpurkar et al.,
"SQuAD: 100,000+ Questions for Machine Comprehension of Text", EMNLP 2016, script `evaluate-v1.1.py`;
Rajpurkar, Jia and Liang, "Know What You Don't Know: Unanswerable Questions for SQuAD", ACL 2018, script
`evaluate-v2.0.py`; both at https://rajpurkar.github.io/SQuAD-explorer/):

- an answer is normalised by lower-casing, deleting ASCII punctuation, deleting the words "a", "an", "the",
  and collapsing whitespace; its tokens are the whitespace-separated words of the normalised text;
- exact match is 1 when the normalised prediction equals a normalised gold answer;
- F1 is the harmonic mean of token precision and recall, tokens counted with multiplicity (bag overlap);
- each question scores the maximum over its gold answers; reported numbers are means times 100.

Inputs use the evaluate / `datasets` layout: predictions `{"id", "prediction_text"[, "no_answer_probability"]}`,
references `{"id", "answers": {"text": [...], "answer_start": [...]}}`.
"""

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text):
    """Lower case, no punctuation, no articles, single spaces (the official scripts' `normalize_answer`)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction, gold):
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction, gold, empty_agreement_counts=False):
    """Bag-of-tokens F1 between two answers.

    v1.1 scores 0 whenever nothing overlaps, two empty answers included; v2.0 (`empty_agreement_counts=True`)
    treats an empty answer as "no answer", so an empty prediction for an unanswerable question scores 1."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if empty_agreement_counts and not (pred_tokens and gold_tokens):
        return float(pred_tokens == gold_tokens)
    overlap = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _gold_by_id(predictions, references):
    """{id: gold texts} in reference order, after checking that predictions and references cover the same ids.

    The official scripts skip (v2.0) or score 0 (v1.1) a question without a prediction; through a metric that
    takes paired lists a mismatch is a caller bug, so it is reported instead."""
    gold = {ref["id"]: list(ref["answers"]["text"]) for ref in references}
    pred_ids = [pred["id"] for pred in predictions]
    if not gold:
        raise ValueError("SQuAD scoring needs at least one question; got no references")
    if len(gold) != len(references) or len(set(pred_ids)) != len(pred_ids):
        raise ValueError("SQuAD scoring: question ids must be unique in predictions and in references")
    missing, unknown = gold.keys() - set(pred_ids), set(pred_ids) - gold.keys()
    if missing or unknown:
        raise ValueError(
            f"SQuAD scoring: ids without a prediction {sorted(missing)[:5]}, "
            f"predictions for unknown ids {sorted(unknown)[:5]}"
        )
    return gold


def squad_v1_scores(predictions, references):
    """{"exact_match", "f1"} on 0-100, as `evaluate-v1.1.py`."""
    gold = _gold_by_id(predictions, references)
    text = {pred["id"]: pred["prediction_text"] for pred in predictions}
    exact = f1 = 0.0
    for qid, answers in gold.items():
        if not answers:
            raise ValueError(f"SQuAD v1.1 question {qid!r} has no gold answer (unanswerable questions: use squad_v2)")
        exact += max(exact_match(text[qid], answer) for answer in answers)
        f1 += max(token_f1(text[qid], answer) for answer in answers)
    return {"exact_match": 100.0 * exact / len(gold), "f1": 100.0 * f1 / len(gold)}


def _means(exact, f1, qids):
    return {
        "exact": 100.0 * sum(exact[q] for q in qids) / len(qids),
        "f1": 100.0 * sum(f1[q] for q in qids) / len(qids),
        "total": len(qids),
    }


def _best_threshold(raw, text, no_answer_probability, has_answer):
    """Best mean score over no-answer thresholds t, and that t (`find_best_thresh` of `evaluate-v2.0.py`).

    The system answers the questions whose no-answer probability is at most t and abstains on the rest. Below every
    probability it abstains everywhere, right on each unanswerable question; moving t past a question's
    probability adds its raw score if it has an answer, and loses its point if it has none and the prediction
    is non-empty (raw text, as the official script tests it)."""
    score = best = sum(not has for has in has_answer.values())
    best_thresh = 0.0
    for qid in sorted(no_answer_probability, key=no_answer_probability.get):
        score += raw[qid] if has_answer[qid] else -float(bool(text[qid]))
        if score > best:
            best, best_thresh = score, no_answer_probability[qid]
    return 100.0 * best / len(raw), best_thresh


def squad_v2_scores(predictions, references, no_answer_threshold=1.0):
    """The `evaluate-v2.0.py` summary: exact, f1, total, HasAns_* and NoAns_* (when such questions exist),
    best_exact(_thresh), best_f1(_thresh). A question is treated as abstained (empty answer) when its
    `no_answer_probability` exceeds `no_answer_threshold`."""
    gold = _gold_by_id(predictions, references)
    text = {pred["id"]: pred["prediction_text"] for pred in predictions}
    no_answer_probability = {pred["id"]: pred["no_answer_probability"] for pred in predictions}
    has_answer = {qid: bool(answers) for qid, answers in gold.items()}
    raw_exact, raw_f1 = {}, {}
    for qid, answers in gold.items():
        # Answers that normalise to nothing do not count; with none left the only right answer is the empty one.
        answers = [a for a in answers if normalize_answer(a)] or [""]
        raw_exact[qid] = max(exact_match(text[qid], a) for a in answers)
        raw_f1[qid] = max(token_f1(text[qid], a, empty_agreement_counts=True) for a in answers)

    def abstain_above_threshold(raw):
        return {
            qid: float(not has_answer[qid]) if no_answer_probability[qid] > no_answer_threshold else score
            for qid, score in raw.items()
        }

    exact, f1 = abstain_above_threshold(raw_exact), abstain_above_threshold(raw_f1)
    out = _means(exact, f1, list(gold))
    for prefix, answerable in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid in gold if has_answer[qid] == answerable]
        if qids:
            out.update({f"{prefix}_{key}": value for key, value in _means(exact, f1, qids).items()})
    for key, raw in (("exact", raw_exact), ("f1", raw_f1)):
        out[f"best_{key}"], out[f"best_{key}_thresh"] = _best_threshold(raw, text, no_answer_probability, has_answer)
    return out
