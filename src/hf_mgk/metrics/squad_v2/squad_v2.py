"""SQuAD v2.0: exact match and F1 with unanswerable questions, their HasAns / NoAns split and the best threshold.

Source: the official evaluation script `evaluate-v2.0.py` of Rajpurkar, Jia and Liang, "Know What You Don't Know:
Unanswerable Questions for SQuAD", ACL 2018 (https://rajpurkar.github.io/SQuAD-explorer/); the definitions are
written out in `hf_mgk.metrics.squad_scoring`. A question counts as abstained (empty answer) when its
`no_answer_probability` exceeds `no_answer_threshold` (default 1.0, the script's --na-prob-thresh). Name, inputs,
the `no_answer_threshold` argument and the output keys are those of the `squad_v2` metric on the evaluate Hub.
Unlike the script, ids that do not match between predictions and references raise a ValueError.
"""

import datasets
import evaluate
from hf_mgk.metrics.squad_scoring import squad_v2_scores

_CITATION = "Rajpurkar, Jia and Liang, Know What You Don't Know: Unanswerable Questions for SQuAD, ACL 2018."
_INPUTS = """
Args:
    predictions (list of dict): {"id": str, "prediction_text": str, "no_answer_probability": float}; an
        empty prediction_text means "no answer".
    references (list of dict): {"id": str, "answers": {"text": [str, ...], "answer_start": [int, ...]}}, empty
        lists for an unanswerable question.
    no_answer_threshold (float, default 1.0): abstain where no_answer_probability exceeds it.
Returns (scores on 0-100):
    exact, f1, total; HasAns_exact, HasAns_f1, HasAns_total (if any question has an answer); NoAns_exact,
    NoAns_f1, NoAns_total (if any has none); best_exact, best_exact_thresh, best_f1, best_f1_thresh (the best
    score over no-answer thresholds and that threshold).
"""


class SquadV2(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=datasets.Features(
                {
                    "predictions": {
                        "id": datasets.Value("string"),
                        "prediction_text": datasets.Value("string"),
                        "no_answer_probability": datasets.Value("float32"),
                    },
                    "references": {
                        "id": datasets.Value("string"),
                        "answers": datasets.Sequence(
                            {"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}
                        ),
                    },
                }
            ),
            codebase_urls=["https://rajpurkar.github.io/SQuAD-explorer/"],
            reference_urls=["https://rajpurkar.github.io/SQuAD-explorer/"],
        )

    def _compute(self, predictions, references, no_answer_threshold=1.0):
        return squad_v2_scores(predictions, references, no_answer_threshold)
