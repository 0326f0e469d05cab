"""Spearman rank-order correlation between predictions and references, and optionally its p-value.

Definition: `scipy.stats.spearmanr` (Virtanen et al., "SciPy 1.0: Fundamental Algorithms for Scientific Computing
in Python", Nature Methods 17, 2020; Kokoska and Zwillinger, "CRC Standard Probability and Statistics Tables and
Formulae", 2000). Name, inputs and outputs (`{"spearmanr"}`, plus `"spearmanr_pvalue"` with return_pvalue=True) are
those of the `spearmanr` metric on the evaluate Hub.
"""

import datasets
import evaluate
from scipy.stats import spearmanr

_CITATION = (
    "Virtanen et al., SciPy 1.0: Fundamental Algorithms for Scientific Computing in Python, Nature Methods 17, 2020."
)
_INPUTS = """
Args:
    predictions (list of float): predicted scores.
    references (list of float): gold scores.
    return_pvalue (bool, default False): also return the p-value of the test of no correlation.
Returns:
    spearmanr (float), and spearmanr_pvalue (float) with return_pvalue=True
"""


class Spearmanr(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": datasets.Value("float"), "references": datasets.Value("float")}),
            reference_urls=["https://docs.scipy.org/doc/scipy/reference/generated/scipy.stats.spearmanr.html"],
        )

    def _compute(self, predictions, references, return_pvalue=False):
        statistic, pvalue = spearmanr(references, predictions)
        out = {"spearmanr": float(statistic)}
        if return_pvalue:
            out["spearmanr_pvalue"] = float(pvalue)
        return out
