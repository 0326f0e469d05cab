"""F1: the harmonic mean of precision and recall, 2 * P * R / (P + R).

Definition: scikit-learn's `sklearn.metrics.f1_score` (Pedregosa et al., "Scikit-learn: Machine Learning in
Python", JMLR 12, 2011), with its `labels`, `pos_label`, `average` and `sample_weight` arguments. Name, inputs,
configs ("default", "multilabel") and output `{"f1": float, or an array of per-class scores when average=None}`
are those of the `f1` metric on the evaluate Hub.
"""

import datasets
import evaluate
import numpy as np
from sklearn.metrics import f1_score

_CITATION = "Pedregosa et al., Scikit-learn: Machine Learning in Python, JMLR 12, pp. 2825-2830, 2011."
_INPUTS = """
Args:
    predictions (list of int; list of list of int with the "multilabel" config): predicted labels.
    references (same shape as predictions): gold labels.
    labels (list of int, optional): labels to include when average != "binary", and their order if average=None.
    pos_label (int, default 1): the positive class when average="binary".
    average (str or None, default "binary"): "binary", "micro", "macro", "weighted", "samples", or None for
        one score per class.
    sample_weight (list of float, optional): weight of each example.
Returns:
    f1 (float, or numpy array of per-class scores when average=None)
"""


class F1(evaluate.Metric):
    def _info(self):
        def label():
            value = datasets.Value("int32")
            return datasets.Sequence(value) if self.config_name == "multilabel" else value

        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": label(), "references": label()}),
            reference_urls=["https://scikit-learn.org/stable/modules/generated/sklearn.metrics.f1_score.html"],
        )

    def _compute(self, predictions, references, labels=None, pos_label=1, average="binary", sample_weight=None):
        score = f1_score(
            references, predictions, labels=labels, pos_label=pos_label, average=average, sample_weight=sample_weight
        )
        # Recent scikit-learn returns a plain float for one score, an array for several.
        return {"f1": float(score) if np.size(score) == 1 else score}
