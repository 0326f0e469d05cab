"""Matthews correlation coefficient (MCC), in [-1, 1]; for K classes the R_K generalisation (Gorodkin 2004).

Definition: scikit-learn's `sklearn.metrics.matthews_corrcoef` (Pedregosa et al., "Scikit-learn: Machine Learning
in Python", JMLR 12, 2011); B. W. Matthews, "Comparison of the predicted and observed secondary structure of T4
phage lysozyme", 1975. The "multilabel" config scores each label column on its own (a list), or their mean with
average="macro". Name, inputs, configs and output `{"matthews_correlation": ...}` are those of the
`matthews_correlation` metric on the evaluate Hub.
"""

import datasets
import evaluate
import numpy as np
from sklearn.metrics import matthews_corrcoef

_CITATION = "Pedregosa et al., Scikit-learn: Machine Learning in Python, JMLR 12, pp. 2825-2830, 2011."
_INPUTS = """
Args:
    predictions (list of int; list of list of int with the "multilabel" config): predicted labels.
    references (same shape as predictions): gold labels.
    average (None or "macro", "multilabel" config only): None gives one score per label, "macro" their mean.
    sample_weight (list of float, optional): weight of each example.
Returns:
    matthews_correlation (float; list of float per label for "multilabel" with average=None)
"""


class MatthewsCorrelation(evaluate.Metric):
    def _info(self):
        def label():
            value = datasets.Value("int32")
            return datasets.Sequence(value) if self.config_name == "multilabel" else value

        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": label(), "references": label()}),
            reference_urls=["https://scikit-learn.org/stable/modules/generated/sklearn.metrics.matthews_corrcoef.html"],
        )

    def _compute(self, predictions, references, average=None, sample_weight=None):
        if self.config_name != "multilabel":
            score = matthews_corrcoef(references, predictions, sample_weight=sample_weight)
            return {"matthews_correlation": float(score)}
        references, predictions = np.asarray(references), np.asarray(predictions)
        if references.ndim != 2 or predictions.ndim != 2:
            raise ValueError("multilabel matthews_correlation needs 2-D predictions and references (examples x labels)")
        if average not in (None, "macro"):
            raise ValueError(f"average must be None or 'macro' for multilabel matthews_correlation, got {average!r}")
        per_label = [
            float(matthews_corrcoef(references[:, j], predictions[:, j], sample_weight=sample_weight))
            for j in range(references.shape[1])
        ]
        return {"matthews_correlation": float(np.mean(per_label)) if average == "macro" else per_label}
