"""GLUE task metrics, one config per task, as the GLUE benchmark defines them.

Source: Wang et al., "GLUE: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding",
ICLR 2019 (Table 1 and Section 4): CoLA is scored with the Matthews correlation; STS-B with the Pearson and
Spearman correlations; MRPC and QQP with accuracy and F1 of the positive class; the other tasks (SST-2, MNLI
matched / mismatched, QNLI, RTE, WNLI, and HANS, McCoy et al., ACL 2019) with accuracy. The diagnostic set AX is
scored with R3, the three-class Matthews correlation (Gorodkin 2004), reported as `matthews_correlation`; its
accuracy is given too. The statistics are scikit-learn's and scipy's. Config names, inputs and output keys are
those of the `glue` metric on the evaluate Hub (which has no "ax").
"""

import datasets
import evaluate
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

_CITATION = (
    "Wang, Singh, Michael, Hill, Levy and Bowman, GLUE: A Multi-Task Benchmark and Analysis Platform for "
    "Natural Language Understanding, ICLR 2019."
)
_INPUTS = """
Args:
    predictions (list of int; list of float for "stsb"): predicted labels (scores for stsb).
    references (same type): gold labels.
Returns, by config:
    cola: matthews_correlation; stsb: pearson, spearmanr; mrpc, qqp: accuracy, f1;
    ax: matthews_correlation, accuracy; sst2, mnli, mnli_matched, mnli_mismatched, qnli, rte, wnli, hans: accuracy.
"""

# Each statistic as (references, predictions) -> number.
_STATISTICS = {
    "accuracy": accuracy_score,
    "f1": f1_score,
    "matthews_correlation": matthews_corrcoef,
    "pearson": lambda refs, preds: pearsonr(preds, refs)[0],
    "spearmanr": lambda refs, preds: spearmanr(preds, refs)[0],
}
TASK_METRICS = {
    "sst2": ("accuracy",),
    "mnli": ("accuracy",),
    "mnli_mismatched": ("accuracy",),
    "mnli_matched": ("accuracy",),
    "cola": ("matthews_correlation",),
    "stsb": ("pearson", "spearmanr"),
    "mrpc": ("accuracy", "f1"),
    "qqp": ("accuracy", "f1"),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
    "hans": ("accuracy",),
    "ax": ("matthews_correlation", "accuracy"),
}


class Glue(evaluate.Metric):
    def _info(self):
        if self.config_name not in TASK_METRICS:
            raise ValueError(
                f"glue needs a task as config_name, got {self.config_name!r}; choose one of {', '.join(TASK_METRICS)}"
            )
        dtype = "float32" if self.config_name == "stsb" else "int64"
        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": datasets.Value(dtype), "references": datasets.Value(dtype)}),
            reference_urls=["https://gluebenchmark.com/"],
            format="numpy",
        )

    def _compute(self, predictions, references):
        return {name: float(_STATISTICS[name](references, predictions)) for name in TASK_METRICS[self.config_name]}
