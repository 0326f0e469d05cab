"""SQuAD v1.1: exact match and token F1 on 0-100, maximised over each question's gold answers.

Source: the official evaluation script `evaluate-v1.1.py` of Rajpurkar et al., "SQuAD: 100,000+ Questions for
Machine Comprehension of Text", EMNLP 2016 (https://rajpurkar.github.io/SQuAD-explorer/); the definitions are
written out in `hf_mgk.metrics.squad_scoring`. Name, inputs and output `{"exact_match", "f1"}` are those of the
`squad` metric on the evaluate Hub. Unlike the script, ids that do not match between predictions and references
raise a ValueError instead of being scored 0.
"""

import datasets
import evaluate
from hf_mgk.metrics.squad_scoring import squad_v1_scores

_CITATION = (
    "Rajpurkar, Zhang, Lopyrev and Liang, SQuAD: 100,000+ Questions for Machine Comprehension of Text, EMNLP 2016."
)
_INPUTS = """
Args:
    predictions (list of dict): {"id": str, "prediction_text": str} per question.
    references (list of dict): {"id": str, "answers": {"text": [str, ...], "answer_start": [int, ...]}}.
Returns:
    exact_match (float, 0-100), f1 (float, 0-100)
"""


class Squad(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=datasets.Features(
                {
                    "predictions": {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")},
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

    def _compute(self, predictions, references):
        return squad_v1_scores(predictions, references)
