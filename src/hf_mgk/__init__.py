"""hf-mgk: MGK, FiSH and NPRF attention as ordinary HuggingFace Transformers models.

Importing the package registers every family of `hf_mgk.families` (its configuration and models) with the Auto
classes; each model's `save_pretrained` writes an `auto_map` naming all of them (remote code)."""

from .attention_fish import fish_attention
from .attention_mgk import mgk_attention, mlk_attention, smgk_attention
from .attention_nprf import nprf_attention
from .configuration_fish_gpt2 import FiSHGPT2Config
from .configuration_nprf_roberta import NPRFRobertaConfig
from .configuration_mgk_bert import MGKBertConfig
from .configuration_mgk_gpt2 import MGKGPT2Config
from .configuration_mgk_llama import MGKLlamaConfig
from .configuration_fish_llama import FiSHLlamaConfig
from .modeling_mgk_bert import (
    MGKBertForMaskedLM,
    MGKBertForQuestionAnswering,
    MGKBertForSequenceClassification,
    MGKBertForTokenClassification,
    MGKBertModel,
)
from .modeling_mgk_gpt2 import MGKGPT2ForSequenceClassification, MGKGPT2LMHeadModel, MGKGPT2Model
from .modeling_fish_gpt2 import FiSHGPT2ForSequenceClassification, FiSHGPT2LMHeadModel, FiSHGPT2Model
from .modeling_mgk_llama import MGKLlamaForCausalLM, MGKLlamaForSequenceClassification, MGKLlamaModel
from .modeling_fish_llama import FiSHLlamaForCausalLM, FiSHLlamaForSequenceClassification, FiSHLlamaModel
from .modeling_nprf_roberta import (
    NPRFRobertaForCausalLM,
    NPRFRobertaForMaskedLM,
    NPRFRobertaForQuestionAnswering,
    NPRFRobertaForSequenceClassification,
    NPRFRobertaModel,
)
from .families import FAMILIES
from .registration import register_family

__version__ = "0.1.0"

# The tooling's modules, loaded on first use (`hf_mgk.flops.fish_cost(...)` after `import hf_mgk`), so that
# `import hf_mgk` loads the models alone: the modules and packages that the model classes do not import.
_LAZY_SUBMODULES = ("analysis", "benchmark", "bundled", "flops", "folders", "hub", "lm_eval", "metrics", "qa",
                    "reference", "reproduce", "scripts", "training")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_LAZY_SUBMODULES})

# Every family of the registry (hf_mgk.families), each model under the Auto class its `_auto_map` names.
for _family in FAMILIES.values():
    register_family(_family.config_class, _family.auto_map)
del _family

__all__ = [
    "nprf_attention",
    "NPRFRobertaConfig",
    "NPRFRobertaModel",
    "NPRFRobertaForMaskedLM",
    "NPRFRobertaForCausalLM",
    "NPRFRobertaForSequenceClassification",
    "NPRFRobertaForQuestionAnswering",
    "fish_attention",
    "FiSHGPT2Config",
    "FiSHGPT2Model",
    "FiSHGPT2LMHeadModel",
    "FiSHGPT2ForSequenceClassification",
    "mgk_attention",
    "mlk_attention",
    "smgk_attention",
    "MGKBertConfig",
    "MGKBertModel",
    "MGKBertForMaskedLM",
    "MGKBertForSequenceClassification",
    "MGKBertForTokenClassification",
    "MGKBertForQuestionAnswering",
    "MGKGPT2Config",
    "MGKGPT2Model",
    "MGKGPT2LMHeadModel",
    "MGKGPT2ForSequenceClassification",
    "MGKLlamaConfig",
    "MGKLlamaModel",
    "MGKLlamaForCausalLM",
    "MGKLlamaForSequenceClassification",
    "FiSHLlamaConfig",
    "FiSHLlamaModel",
    "FiSHLlamaForCausalLM",
    "FiSHLlamaForSequenceClassification",
]
