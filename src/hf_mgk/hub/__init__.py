"""Publishing: a Hub-ready folder (safetensors weights, config with the full `auto_map`, the code files, the
tokenizer, a model card with the run's own metrics), its upload, and the proof that it loads with
`trust_remote_code=True` alone — in a process, or a whole virtualenv, where `hf_mgk` cannot be imported.

One job per module: `card` (the model card, pure functions of the run's numbers), `export` (the folder),
`upload` (to the Hub), `remote_code` (loading without hf_mgk). Their public names are gathered here."""

from .card import ATTENTION_FIELDS, PIPELINES, TESTED_TRANSFORMERS, auto_class_of, card_data, card_metrics, \
    is_hub_id, model_card, usage_snippet
from .export import DEFAULT_REVISION, EXPORT_MARKER, export_run, read_run, save_for_hub
from .remote_code import CHECK_TEXT, assert_same_outputs, check_remote_code, clean_python, run_without_package
from .upload import network_errors, push_folder, upload_plan

__all__ = ["ATTENTION_FIELDS", "CHECK_TEXT", "DEFAULT_REVISION", "EXPORT_MARKER", "PIPELINES", "TESTED_TRANSFORMERS",
           "assert_same_outputs", "auto_class_of", "card_data", "card_metrics", "check_remote_code", "clean_python",
           "export_run", "is_hub_id", "model_card", "network_errors", "push_folder", "read_run", "run_without_package",
           "save_for_hub", "upload_plan", "usage_snippet"]
