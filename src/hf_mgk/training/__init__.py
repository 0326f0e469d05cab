"""What the training scripts (`scripts/run_mlm.py`, `run_clm.py`, `run_glue.py`, `run_qa.py`) share, written once.

They follow transformers' example scripts: `ModelArguments` / a `DataArguments` subclass / `TrainingArguments`
through `HfArgumentParser` (or one `.json` file as the only argument), a model from a checkpoint
(`--model_name_or_path`: a stock BERT / GPT-2 / RoBERTa checkpoint warm-starts the family's attention, a saved
hf-mgk folder continues) or from scratch (`--model_type` + `--config_overrides`), datasets from the Hub or local
files, automatic resume from the last checkpoint in `--output_dir`, and `*_results.json` at the end.

Beyond upstream: an output folder that holds a *different* run is refused (the run's identity is written to
`hf_mgk_run.json`), `--config_overrides` values are parsed as JSON and checked against the config's fields (a
typo is an error, not a silently ignored attribute), and `--attention_overrides` / `--keep_heads` choose the
attention of a warm start.

One job per module: `arguments` (parsing and checking the options, logging), `models` (the model factory),
`run_dir` (identity, resume, results files) and `data` (datasets, LM preprocessing and metrics). Their public
names are gathered here for the scripts."""

from . import arguments, models, run_dir, data
from .arguments import *  # noqa: F401,F403 (its __all__)
from .models import *  # noqa: F401,F403 (its __all__)
from .run_dir import *  # noqa: F401,F403 (its __all__)
from .data import *  # noqa: F401,F403 (its __all__)

__all__ = [*arguments.__all__, *models.__all__, *run_dir.__all__, *data.__all__]
