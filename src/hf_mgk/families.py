"""The one place where the facts about each family are written (not travelling: checkpoints carry their own
`_auto_map` and `auto_map`).

A family is its configuration, its modeling module (whose `PreTrainedModel` holds `_auto_map`: Auto class -> class
name, the source of truth for which models it has), its model card and one `Family` record here. Registration with
the Auto classes (`hf_mgk/__init__.py`), the training scripts, the hub code, the quickstart, the benchmark, the
reproductions and the shared tests all read this registry. Adding a family: docs/maintainers.md."""

from dataclasses import dataclass

from .configuration_fish import FISH_ATTENTION_TYPES
from .configuration_fish_gpt2 import FiSHGPT2Config
from .configuration_mgk import MGK_ATTENTION_TYPES
from .configuration_mgk_bert import MGKBertConfig
from .configuration_fish_llama import FiSHLlamaConfig
from .configuration_mgk_gpt2 import MGKGPT2Config
from .configuration_mgk_llama import MGKLlamaConfig
from .configuration_nprf_roberta import NPRFRobertaConfig
from .modeling_fish_gpt2 import FiSHGPT2PreTrainedModel
from .modeling_mgk_bert import MGKBertPreTrainedModel
from .modeling_fish_llama import FiSHLlamaPreTrainedModel
from .modeling_mgk_gpt2 import MGKGPT2PreTrainedModel
from .modeling_mgk_llama import MGKLlamaPreTrainedModel
from .modeling_nprf_roberta import NPRFRobertaPreTrainedModel

# The scripts' task names -> the Auto class that loads a model for it.
TASK_AUTO = {"base": "AutoModel", "mlm": "AutoModelForMaskedLM", "clm": "AutoModelForCausalLM",
             "seq-cls": "AutoModelForSequenceClassification", "tok-cls": "AutoModelForTokenClassification",
             "qa": "AutoModelForQuestionAnswering"}
TASK_NAMES = {"mlm": "masked language modeling", "clm": "causal language modeling",
              "seq-cls": "sequence classification", "tok-cls": "token classification",
              "qa": "extractive question answering"}


@dataclass(frozen=True)
class Family:
    """What the package needs to know about one family beyond its classes.

    name: the model_type. title: how cards and tables name it. config_class / pretrained_class: its configuration
    and the PreTrainedModel whose `_auto_map` lists its models. stock / stock_title / stock_example: the stock
    model_type it warm-starts from, how to call such a checkpoint, a Hub name of one. attention_types: its
    attention types (softmax first: the baseline). default_attention: the attention compared with softmax by the
    quickstart and the benchmark. heads_field: the config field holding the head count (None: the family keeps the
    checkpoint's heads, FiSH's local heads). half_heads: its paper's claim is H/2 heads (MGK App. B). decoder:
    reads left to right (GPT-2's stack; classifiers read the last real token). positions_after_padding: fairseq
    positions start at pad_token_id + 1 (RoBERTa). causal_lm_is_decoder: a causal LM of it needs is_decoder=True
    (an encoder family made causal)."""

    name: str
    title: str
    config_class: type
    pretrained_class: type
    stock: str
    stock_title: str
    stock_example: str
    attention_types: tuple
    default_attention: str
    heads_field: str = None
    half_heads: bool = False
    decoder: bool = False
    positions_after_padding: bool = False
    causal_lm_is_decoder: bool = False

    @property
    def auto_map(self):
        """Auto class name -> model class, from the modeling class's own `_auto_map`."""
        import importlib

        module = importlib.import_module(self.pretrained_class.__module__)
        return {auto: getattr(module, name) for auto, name in self.pretrained_class._auto_map.items()}

    @property
    def classes(self):
        """Task -> model class name ("base", "mlm", "clm", "seq-cls", "tok-cls", "qa"), for the tasks it has."""
        names = self.pretrained_class._auto_map
        return {task: names[auto] for task, auto in TASK_AUTO.items() if auto in names}

    @property
    def config_name(self):
        return self.config_class.__name__

    @property
    def card(self):
        """Its model card's file name in hf_mgk/model_cards/."""
        return f"{self.name}.md"


FAMILIES = {f.name: f for f in (
    Family("mgk-bert", "MGK-BERT", MGKBertConfig, MGKBertPreTrainedModel, stock="bert", stock_title="BERT",
           stock_example="bert-base-uncased", attention_types=MGK_ATTENTION_TYPES, default_attention="mgk",
           heads_field="num_attention_heads", half_heads=True),
    Family("fish-gpt2", "FiSH-GPT2", FiSHGPT2Config, FiSHGPT2PreTrainedModel, stock="gpt2", stock_title="GPT-2",
           stock_example="gpt2", attention_types=FISH_ATTENTION_TYPES, default_attention="hard_fish",
           decoder=True),
    Family("mgk-gpt2", "MGK-GPT2", MGKGPT2Config, MGKGPT2PreTrainedModel, stock="gpt2", stock_title="GPT-2",
           stock_example="gpt2", attention_types=MGK_ATTENTION_TYPES, default_attention="mgk", heads_field="n_head",
           half_heads=True, decoder=True),
    Family("nprf-roberta", "NPRF-RoBERTa", NPRFRobertaConfig, NPRFRobertaPreTrainedModel, stock="roberta",
           stock_title="RoBERTa", stock_example="roberta-base", attention_types=("softmax", "nprf"),
           default_attention="nprf", heads_field="num_attention_heads", positions_after_padding=True,
           causal_lm_is_decoder=True),
    Family("mgk-llama", "MGK-Llama", MGKLlamaConfig, MGKLlamaPreTrainedModel, stock="llama", stock_title="Llama",
           stock_example="HuggingFaceTB/SmolLM2-135M", attention_types=MGK_ATTENTION_TYPES, default_attention="mgk",
           decoder=True),
    Family("fish-llama", "FiSH-Llama", FiSHLlamaConfig, FiSHLlamaPreTrainedModel, stock="llama",
           stock_title="Llama", stock_example="HuggingFaceTB/SmolLM2-135M", attention_types=FISH_ATTENTION_TYPES,
           default_attention="hard_fish", decoder=True),
)}

# A stock checkpoint's model_type -> the families that warm-start from it, the default (first registered) first.
STOCK_FAMILIES = {}
for _family in FAMILIES.values():
    STOCK_FAMILIES.setdefault(_family.stock, []).append(_family.name)
STOCK_FAMILIES = {stock: tuple(names) for stock, names in STOCK_FAMILIES.items()}


def family_of_attention(stock):
    """For a stock type several families convert: attention type -> the one family that has it ("softmax" and
    types two of them share name none)."""
    owners = {}
    for name in STOCK_FAMILIES.get(stock, ()):
        for attention in FAMILIES[name].attention_types:
            owners.setdefault(attention, []).append(name)
    return {attention: names[0] for attention, names in owners.items() if len(names) == 1}


__all__ = ["FAMILIES", "Family", "STOCK_FAMILIES", "TASK_AUTO", "TASK_NAMES", "family_of_attention"]
