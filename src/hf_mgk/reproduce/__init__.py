"""The papers' claims as experiments: the registry that `scripts/reproduce.py` runs, and the parts of a run that
need no child process (data split, tokenizer, head statistics, statistics, verdicts, report). Nothing here travels
with a checkpoint.

A claim is a comparison the papers make ("MGK with H/2 heads matches softmax with H heads", MGK paper Table 3),
turned into arms (config overrides on one shared base model), one shared recipe (data, tokenizer, steps,
optimizer, schedule, seeds), a metric, the paper's numbers, and checks: each check compares two arms' per-seed
numbers with a stated rule, and the claim's verdict follows from its checks. Every arm, the baseline included,
trains through the package's own `run_clm.py` / `run_mlm.py` code path with the same recipe: no arm is tuned
on its own.

One job per module: `claims` (the registry: arms, checks, the paper's numbers), `recipes` (what every arm of a
claim shares at each scale, and each arm's config), `arms` (what runs in this process: the data split and
tokenizers, the head statistics of trained models), `report` (statistics, verdicts, figures, report.md). Their
public names are gathered here, so `from hf_mgk import reproduce as R; R.CLAIMS, R.judge, ...` reads them all."""

from . import arms, claims, recipes, report
from .arms import *  # noqa: F401,F403 (its __all__)
from .claims import *  # noqa: F401,F403 (its __all__)
from .recipes import *  # noqa: F401,F403 (its __all__)
from .report import *  # noqa: F401,F403 (its __all__)

__all__ = [*arms.__all__, *claims.__all__, *recipes.__all__, *report.__all__]
