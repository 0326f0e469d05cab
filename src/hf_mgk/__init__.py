"""hf-mgk: MGK, FiSH and NPRF attention as ordinary HuggingFace Transformers models.

Importing the package registers every configuration and model with the Auto classes, and attaches the Auto
mapping to each config class so `save_pretrained` writes an `auto_map` naming all of them (remote code)."""

from .attention_mgk import mgk_attention, mlk_attention
from .configuration_mgk_bert import MGKBertConfig
from .modeling_mgk_bert import (
    MGKBertForMaskedLM,
    MGKBertForQuestionAnswering,
    MGKBertForSequenceClassification,
    MGKBertForTokenClassification,
    MGKBertModel,
)
from . import bundled, hub
from .registration import register_family

__version__ = "0.1.0"

register_family(
    MGKBertConfig,
    {
        "AutoModel": MGKBertModel,
        "AutoModelForMaskedLM": MGKBertForMaskedLM,
        "AutoModelForSequenceClassification": MGKBertForSequenceClassification,
        "AutoModelForTokenClassification": MGKBertForTokenClassification,
        "AutoModelForQuestionAnswering": MGKBertForQuestionAnswering,
    },
)

__all__ = [
    "mgk_attention",
    "mlk_attention",
    "MGKBertConfig",
    "MGKBertModel",
    "MGKBertForMaskedLM",
    "MGKBertForSequenceClassification",
    "MGKBertForTokenClassification",
    "MGKBertForQuestionAnswering",
]
