"""In-process registration with the Auto classes (the Hub side is `AutoMapMixin` in modeling_common.py)."""

import transformers
from transformers import AutoConfig


def register_family(config_class, models):
    """Register `config_class` under its model_type and each model under its Auto class (idempotent).

    models: {"AutoModel": Model, "AutoModelForMaskedLM": ..., ...}."""
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    for auto_name, model_class in models.items():
        getattr(transformers, auto_name).register(config_class, model_class, exist_ok=True)
