"""Pearson correlation coefficient between predictions and references, and optionally its two-sided p-value.

Definition: `scipy.stats.pearsonr` (Virtanen et al., "SciPy 1.0: Fundamental Algorithms for Scientific Computing
in Python", Nature Methods 17, 2020). Name, inputs and outputs (`{"pearsonr"}`, plus `"p-value"` with
return_pvalue=True) are those of the `pearsonr` metric on the evaluate Hub.
"""

import datasets
import evaluate
from scipy.stats import pearsonr

_CITATION = (
    "Virtanen et al., SciPy 1.0: Fundamental Algorithms for Scientific Computing in Python, Nature Methods 17, 2020."
)
_INPUTS = """
Args:
    predictions (list of float): predicted scores.
    references (list of float): gold scores.
    return_pvalue (bool, default False): also return the p-value of the test of no correlation.
Returns:
    pearsonr (float), and p-value (float) with return_pvalue=True
"""


class Pearsonr(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": datasets.Value("float"), "references": datasets.Value("float")}),
            reference_urls=["https://docs.scipy.org/doc/scipy/reference/generated/scipy.stats.pearsonr.html"],
        )

    def _compute(self, predictions, references, return_pvalue=False):
        statistic, pvalue = pearsonr(references, predictions)
        out = {"pearsonr": float(statistic)}
        if return_pvalue:
            out["p-value"] = float(pvalue)
        return out
