"""The family registry (hf_mgk.families) is the one place the package's facts about a family are written: every
model class a family's modeling module defines is in its `_auto_map`, registered with transformers' Auto classes,
exported by the package, and run by transformers' shared tests; the registry's other facts agree with the
classes and the files they name."""

import importlib
import inspect
import os

import pytest
import transformers
from transformers import AutoConfig, PreTrainedModel

import hf_mgk
from hf_mgk import training
from hf_mgk.families import FAMILIES, STOCK_FAMILIES, TASK_AUTO, family_of_attention

CARDS = os.path.join(os.path.dirname(hf_mgk.__file__), "model_cards")


def model_classes(family):
    """The concrete model classes its modeling module defines (subclasses of its PreTrainedModel)."""
    module = importlib.import_module(family.pretrained_class.__module__)
    return {obj for _, obj in inspect.getmembers(module, inspect.isclass)
            if obj.__module__ == module.__name__ and issubclass(obj, family.pretrained_class)
            and obj is not family.pretrained_class}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_class_is_in_the_auto_map_registered_and_exported(name):
    family = FAMILIES[name]
    defined = model_classes(family)
    assert defined == set(family.auto_map.values()), "a model class of the module is missing from its _auto_map"
    assert AutoConfig.for_model(name).__class__ is family.config_class
    for auto, cls in family.auto_map.items():
        assert getattr(transformers, auto)._model_mapping[family.config_class] is cls, auto
        assert getattr(hf_mgk, cls.__name__) is cls and cls.__name__ in hf_mgk.__all__
        assert cls.config_class is family.config_class
    assert family.config_name in hf_mgk.__all__


def test_every_class_runs_in_transformers_shared_tests():
    """tests/test_hf_common.py builds its cases from the registry: every class of every family is in one."""
    common = pytest.importorskip("test_hf_common")
    if not hasattr(common, "common"):
        pytest.skip("transformers' common tests are not extracted (test_hf_common says so itself)")
    tested = set()
    for obj in vars(common).values():
        if inspect.isclass(obj) and issubclass(obj, common.common.ModelTesterMixin):
            tested.update(obj.all_model_classes)
    registered = {cls for family in FAMILIES.values() for cls in family.auto_map.values()}
    assert registered <= tested, registered - tested
    for mapping, classes in common.TASKS.items():
        for name, cls in classes.items():
            assert cls in FAMILIES[name].pretrained_class._auto_map.values(), (mapping, cls)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_registry_agrees_with_the_classes_and_files(name):
    family = FAMILIES[name]
    assert family.config_class.model_type == name
    assert family.pretrained_class.config_class is family.config_class
    assert family.config_class._stock_model_type == family.stock  # the conversion message (config_checks)
    stock_of_model = getattr(family.pretrained_class, "_stock_model_type", None)  # the encoders' head selection
    assert stock_of_model in (None, family.stock)
    assert family.attention_types[0] == "softmax" and family.default_attention in family.attention_types
    config = family.config_class()
    assert config.attention_type in family.attention_types
    if family.heads_field is not None:
        assert isinstance(getattr(config, family.heads_field), int)
    assert family.half_heads <= (family.heads_field is not None)  # halving needs a head count to set
    assert os.path.isfile(os.path.join(CARDS, family.card))
    assert set(family.classes) <= set(TASK_AUTO) and "base" in family.classes
    # a decoder stack (GPT-2's, Llama's) reads left to right: its causal LM is no encoder made causal
    assert family.decoder == ("clm" in family.classes and not family.causal_lm_is_decoder)
    # positions after the padding index: RoBERTa's fairseq numbering, seen by the scripts' length limit
    limit, why = training.position_limit(family.config_class(pad_token_id=1))
    if family.positions_after_padding:
        assert "padding offset 2" in why and limit == config.max_position_embeddings - 2
    else:
        assert "padding" not in why


def test_stock_types_and_the_attention_that_names_a_family():
    assert STOCK_FAMILIES == {"bert": ("mgk-bert",), "gpt2": ("fish-gpt2", "mgk-gpt2"), "roberta": ("nprf-roberta",),
                              "llama": ("mgk-llama", "fish-llama")}
    gpt2, llama = family_of_attention("gpt2"), family_of_attention("llama")
    assert gpt2["mgk"] == gpt2["smlk"] == "mgk-gpt2" and gpt2["gfish"] == gpt2["mish"] == "fish-gpt2"
    assert llama["mgk"] == llama["smlk"] == "mgk-llama" and llama["gfish"] == llama["mish"] == "fish-llama"
    assert "softmax" not in gpt2 and "softmax" not in llama  # every family has it: names none
    assert family_of_attention("bert")["mgk"] == "mgk-bert"


def test_a_family_without_a_task_says_which_it_has():
    with pytest.raises(ValueError, match="fish-gpt2 has no model for masked language modeling; it has: causal "
                                         "language modeling, sequence classification"):
        training.model_class("fish-gpt2", "mlm")
    assert training.model_class("mgk-bert", "tok-cls") is hf_mgk.MGKBertForTokenClassification
    assert issubclass(training.model_class("nprf-roberta", "clm"), PreTrainedModel)


def test_every_class_and_attention_type_loads_as_remote_code_on_old_releases():
    """tests/test_compat.py saves one folder per case and loads it on old transformers releases: every registered
    class and every attention type of each family must have one."""
    import test_compat

    cases = test_compat._cases()
    names = {class_name for _, class_name, _, _, _ in cases}
    registered = {cls.__name__ for family in FAMILIES.values() for cls in family.auto_map.values()}
    assert registered <= names, registered - names
    for family in FAMILIES.values():
        types = {fields.get("attention_type", family.config_class().attention_type)
                 for _, _, config, fields, _ in cases if config is family.config_class}
        assert set(family.attention_types) <= types, (family.name, set(family.attention_types) - types)
