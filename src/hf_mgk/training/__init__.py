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

from .arguments import (
    ModelArguments, DataArguments, HfMgkTrainingArguments, parse_args, setup_logging, parse_overrides,
    check_data_file, check_model_folder, damaged_weights, first_bad_line)
from .models import (
    ModelPlan, plan_model, checkpoint_config, family_of, stock_family, model_class, load_tokenizer, load_model,
    fit_vocabulary, base_model,
    new_model_kwargs, position_limit, sequence_length)
from .run_dir import (
    RUN_FILE, RESULTS_FILES, incomplete_checkpoint, run_identity, prepare_output_dir, read_run_identity,
    write_run_info, save_metrics, recorded_results, train_and_save, evaluate_and_save, close_distributed)
from .data import (
    load_raw_datasets, hub_dataset, require_columns, describe_split, take, dataset_label, group_texts,
    needed_splits, require_text, text_column, map_splits, tokenize_into_blocks, tokenize_texts,
    group_into_blocks, token_stream, predicted_ids, token_accuracy, perplexity)

__all__ = ["ModelArguments", "DataArguments", "HfMgkTrainingArguments", "parse_args", "setup_logging",
           "parse_overrides", "check_data_file", "check_model_folder", "damaged_weights", "first_bad_line",
           "ModelPlan", "plan_model", "checkpoint_config", "family_of", "stock_family", "model_class", "load_tokenizer", "load_model",
           "fit_vocabulary", "base_model", "new_model_kwargs", "position_limit", "sequence_length", "RUN_FILE",
           "RESULTS_FILES", "incomplete_checkpoint", "run_identity", "prepare_output_dir", "read_run_identity",
           "write_run_info", "save_metrics", "recorded_results", "train_and_save", "evaluate_and_save",
           "close_distributed", "load_raw_datasets", "hub_dataset", "require_columns", "describe_split", "take",
           "dataset_label", "group_texts", "needed_splits", "require_text", "text_column", "map_splits",
           "tokenize_into_blocks", "tokenize_texts", "group_into_blocks", "token_stream", "predicted_ids",
           "token_accuracy", "perplexity"]
