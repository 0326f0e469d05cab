"""Accuracy: the fraction of predictions equal to their reference (the count of them with normalize=False).

Definition: scikit-learn's `sklearn.metrics.accuracy_score` (Pedregosa et al., "Scikit-learn: Machine Learning in
Python", JMLR 12, 2011); with the "multilabel" config a row counts only when every label in it is right (subset
accuracy). Name, inputs, configs ("default", "multilabel") and output `{"accuracy": float}` are those of the
`accuracy` metric on the evaluate Hub.
"""

import datasets
import evaluate
from sklearn.metrics import accuracy_score

_CITATION = "Pedregosa et al., Scikit-learn: Machine Learning in Python, JMLR 12, pp. 2825-2830, 2011."
_INPUTS = """
Args:
    predictions (list of int; list of list of int with the "multilabel" config): predicted labels.
    references (same shape as predictions): gold labels.
    normalize (bool, default True): the fraction correct if True, the number correct if False.
    sample_weight (list of float, optional): weight of each example.
Returns:
    accuracy (float)
"""


class Accuracy(evaluate.Metric):
    def _info(self):
        def label():
            value = datasets.Value("int32")
            return datasets.Sequence(value) if self.config_name == "multilabel" else value

        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": label(), "references": label()}),
            reference_urls=["https://scikit-learn.org/stable/modules/generated/sklearn.metrics.accuracy_score.html"],
        )

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        score = accuracy_score(references, predictions, normalize=normalize, sample_weight=sample_weight)
        return {"accuracy": float(score)}
