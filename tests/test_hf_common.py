"""transformers' own common model tests on every family: the contract every transformers model keeps.

`ModelTesterMixin` comes from `tests/test_modeling_common.py` of the installed transformers release's source
distribution, which `scripts/setup.sh` extracts into `.hf-tests/transformers-<version>/tests` (nothing is fetched
here). Each family gets a small model tester, as transformers' own `tests/models/*/test_modeling_*.py` do (tiny
config, `prepare_config_and_inputs_for_common`), once per attention type: MGK-BERT softmax / mgk, FiSH-GPT2
softmax / fish / hard_fish, MGK-GPT2 softmax / mgk / smgk with the hard E-step and the EM prior, NPRF-RoBERTa
softmax / nprf (encoder classes, and the causal LM as a decoder), MGK-Llama softmax / mgk / smgk with the hard
E-step and the EM prior, FiSH-Llama softmax / fish / hard_fish.

The sdist ships `test_modeling_common.py` without two files it imports: `tests/exporters/test_export.py`
(`ExportTesterMixin`, the base of `ModelTesterMixin`, which adds the export tests) and
`tests/generation/test_utils.py` (`GenerationTesterMixin`). Empty stand-ins take their place, so neither the
export tests nor transformers' generation tests run here (the suite's own export and generation tests cover
those). The tests that do not apply to an attention by design are skipped with the reason (the README's
"transformers' common tests" lists them), as is the one that needs GenerationTesterMixin."""

import importlib
import os
import sys
import types
import unittest
import warnings

import pytest
import transformers

import hf_mgk
from hf_mgk.families import FAMILIES
import tiny

pytestmark = pytest.mark.slow  # about 1,300 tests: 3-5 minutes on 2 cores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF_TESTS = os.path.join(ROOT, ".hf-tests", f"transformers-{transformers.__version__}", "tests")
PACKAGE = "hf_common_tests"  # transformers' tests/ imported under its own name (ours is `tests` too)

# The task of each of our classes, as transformers' name maps (`MODEL_FOR_*_MAPPING_NAMES`) give it for a built-in
# model: the common tests add labels and choose checks by these maps. Only the loaded test module's copies change.
AUTO_MAPPING_NAMES = {
    "AutoModel": "MODEL_MAPPING_NAMES", "AutoModelForMaskedLM": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "AutoModelForCausalLM": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "AutoModelForSequenceClassification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "AutoModelForTokenClassification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "AutoModelForQuestionAnswering": "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"}
# From the family registry (each family's `_auto_map`): a new family's classes get their task here by themselves.
TASKS = {mapping: {name: family.pretrained_class._auto_map[auto] for name, family in FAMILIES.items()
                   if auto in family.pretrained_class._auto_map}
         for auto, mapping in AUTO_MAPPING_NAMES.items()}


def load_common_tests():
    """transformers' `test_modeling_common` module, imported from the extracted sdist with stand-ins for the two
    files the sdist lacks."""
    if PACKAGE + ".test_modeling_common" in sys.modules:
        return sys.modules[PACKAGE + ".test_modeling_common"]
    package = types.ModuleType(PACKAGE)
    package.__path__ = [HF_TESTS]
    sys.modules[PACKAGE] = package
    for sub, mixin in (("exporters.test_export", "ExportTesterMixin"), ("generation.test_utils", "GenerationTesterMixin")):
        parent = f"{PACKAGE}.{sub.split('.')[0]}"
        sys.modules.setdefault(parent, types.ModuleType(parent)).__path__ = []
        stand_in = types.ModuleType(f"{PACKAGE}.{sub}")
        setattr(stand_in, mixin, type(mixin, (), {"__doc__": "stand-in: this file is not in the sdist"}))
        sys.modules[stand_in.__name__] = stand_in
    with warnings.catch_warnings():  # its marks (flash_attn_test, ...) are registered by transformers' conftest
        warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
        common = importlib.import_module(PACKAGE + ".test_modeling_common")
    for name, classes in TASKS.items():
        setattr(common, name, {**getattr(common, name), **classes})
    return common


if not os.path.isfile(os.path.join(HF_TESTS, "test_modeling_common.py")):
    def test_common_tests_present():
        pytest.fail(f"transformers' common tests are not at {HF_TESTS}: run `bash scripts/setup.sh` (it extracts "
                    f"them from the transformers=={transformers.__version__} sdist)")
else:
    common = load_common_tests()
    ids_tensor, random_attention_mask = common.ids_tensor, common.random_attention_mask

    class FamilyModelTester:
        """A small model of one family, as transformers' `BertModelTester` builds one."""

        batch_size, seq_length, vocab_size = 3, 7, 99
        hidden_size, num_hidden_layers, num_attention_heads, intermediate_size = 32, 2, 4, 37
        is_training = True

        def __init__(self, parent, config_class, fields, token_type_ids=False):
            self.parent, self.config_class, self.fields, self.token_type_ids = parent, config_class, fields, token_type_ids

        def get_config(self):
            return self.config_class(**self.fields)

        def prepare_config_and_inputs_for_common(self):
            # ids from 3 on: none is a pad / bos / eos id; the random mask leaves every row's first token real
            ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size - 3) + 3
            inputs = {"input_ids": ids, "attention_mask": random_attention_mask([self.batch_size, self.seq_length])}
            if self.token_type_ids:
                inputs["token_type_ids"] = ids_tensor([self.batch_size, self.seq_length], 2)
            return self.get_config(), inputs

    BERT = tiny.bert(type_vocab_size=2)
    GPT2 = tiny.gpt2(n_inner=37, special_ids=True)
    ROBERTA = tiny.roberta(special_ids=True, max_position_embeddings=64, type_vocab_size=1, num_random_features=16)
    LLAMA = tiny.llama(hidden_size=32, head_dim=8, pad_token_id=0, bos_token_id=1, eos_token_id=2)

    SDPA_TEST = "test_eager_matches_sdpa_inference"
    # Tests that do not apply to the attention types other than softmax, by design: {name or name prefix: reason}.
    OWN_KERNEL = {
        SDPA_TEST: (
            "attention_type, not attn_implementation, chooses this attention's kernel: eager and sdpa would run the "
            "same code, so there is nothing to compare"),
        "test_sdpa_can_dispatch_non_composite_models": (
            "this attention type runs as 'eager' whatever attn_implementation asks (attention_type chooses its "
            "kernel, which returns its weights on every path); only the softmax baseline dispatches to sdpa"),
    }
    # Every family's softmax baseline is modeling_common.softmax_attention: eager against sdpa (24 dtype / padding
    # cases) runs on MGK-BERT's (bidirectional) and FiSH-GPT2's (causal); NPRF-RoBERTa's would repeat them.
    REPEATED = {SDPA_TEST: (
        "the same softmax_attention as the MGK-BERT (bidirectional) and FiSH-GPT2 (causal) softmax baselines, where "
        "this test runs")}
    # Skipped everywhere: the test needs a file the sdist lacks.
    NOT_IN_SDIST = {
        "test_generation_tester_mixin_inheritance": (
            "GenerationTesterMixin (tests/generation/test_utils.py) is not in the transformers sdist, so transformers' "
            "generation tests cannot run here; generate() is tested by tests/test_fish_gpt2.py, "
            "tests/test_mgk_gpt2.py and tests/test_nprf_roberta.py"),
    }

    def eager_matches_sdpa_on_base_model(case):
        """transformers' eager-vs-sdpa test for parameterized case number `case`, on the base model only: every
        class runs the same attention (the heads add none), and each class costs a save and two loads per case."""

        def test(self):
            self.all_model_classes = self.all_model_classes[:1]
            common._test_eager_matches_sdpa_inference(self, *common.TEST_EAGER_MATCHES_SDPA_INFERENCE_PARAMETERIZATION[case])

        return test

    def family_case(name, config_class, fields, model_classes, skips=None, **tester_kwargs):
        """A TestCase running ModelTesterMixin on `model_classes` with the tiny config `fields`; the tests named or
        prefixed (parameterized tests) in `skips` or NOT_IN_SDIST are skipped with their reason."""

        def setUp(self):
            self.model_tester = FamilyModelTester(self, config_class, fields, **tester_kwargs)

        attrs = {"all_model_classes": model_classes, "setUp": setUp, "__module__": __name__}
        for test in dir(common.ModelTesterMixin):
            if test.startswith(SDPA_TEST + "_"):  # its cases are named test_..._<case number>_<case name>
                case = int(test[len(SDPA_TEST) + 1:].split("_")[0])
                assert test.endswith(common.TEST_EAGER_MATCHES_SDPA_INFERENCE_PARAMETERIZATION[case][0]), test
                attrs[test] = eager_matches_sdpa_on_base_model(case)
            for key, reason in {**(skips or {}), **NOT_IN_SDIST}.items():
                if test == key or test.startswith(key + "_"):
                    attrs[test] = unittest.skip(reason)(lambda self: None)
        return type(name, (common.ModelTesterMixin, unittest.TestCase), attrs)

    # The softmax baseline of each family runs every class; the heads are the same code for every attention type,
    # so the other types run the base model and the language-model head.
    # Every class of a family, from the registry, base model and LM head first (the cases below test those two
    # with the family's own attention); NPRF-RoBERTa's causal LM runs in its decoder cases.
    MGK, FISH, MGK_GPT2 = (tuple(FAMILIES[f].auto_map.values()) for f in ("mgk-bert", "fish-gpt2", "mgk-gpt2"))
    NPRF = tuple(c for c in FAMILIES["nprf-roberta"].auto_map.values() if c is not hf_mgk.NPRFRobertaForCausalLM)
    MGK_LLAMA, FISH_LLAMA = (tuple(FAMILIES[f].auto_map.values()) for f in ("mgk-llama", "fish-llama"))

    MGKBertSoftmaxTest = family_case("MGKBertSoftmaxTest", hf_mgk.MGKBertConfig,
                                     dict(BERT, attention_type="softmax"), MGK, token_type_ids=True)
    MGKBertMGKTest = family_case("MGKBertMGKTest", hf_mgk.MGKBertConfig, dict(BERT, attention_type="mgk"), MGK[:2],
                                 OWN_KERNEL, token_type_ids=True)
    FiSHGPT2SoftmaxTest = family_case("FiSHGPT2SoftmaxTest", hf_mgk.FiSHGPT2Config,
                                      dict(GPT2, attention_type="softmax"), FISH)
    FiSHGPT2FiSHTest = family_case("FiSHGPT2FiSHTest", hf_mgk.FiSHGPT2Config, dict(GPT2, attention_type="fish"),
                                   FISH[:2], OWN_KERNEL)
    FiSHGPT2HardFiSHTest = family_case("FiSHGPT2HardFiSHTest", hf_mgk.FiSHGPT2Config,
                                       dict(GPT2, attention_type="hard_fish"), FISH[:2], OWN_KERNEL)
    MGKGPT2SoftmaxTest = family_case("MGKGPT2SoftmaxTest", hf_mgk.MGKGPT2Config, dict(GPT2, attention_type="softmax"),
                                     MGK_GPT2)
    MGKGPT2MGKTest = family_case("MGKGPT2MGKTest", hf_mgk.MGKGPT2Config, dict(GPT2, attention_type="mgk"),
                                 MGK_GPT2[:2], OWN_KERNEL)
    MGKGPT2HardSMGKEMTest = family_case("MGKGPT2HardSMGKEMTest", hf_mgk.MGKGPT2Config,
                                        dict(GPT2, attention_type="smgk", e_step="hard", mgk_prior="em"),
                                        MGK_GPT2[:2], OWN_KERNEL)
    NPRFRobertaSoftmaxTest = family_case("NPRFRobertaSoftmaxTest", hf_mgk.NPRFRobertaConfig,
                                         dict(ROBERTA, attention_type="softmax"), NPRF, REPEATED)
    NPRFRobertaNPRFTest = family_case("NPRFRobertaNPRFTest", hf_mgk.NPRFRobertaConfig, ROBERTA, NPRF[:2], OWN_KERNEL)
    NPRFRobertaCausalSoftmaxTest = family_case("NPRFRobertaCausalSoftmaxTest", hf_mgk.NPRFRobertaConfig,
                                               dict(ROBERTA, attention_type="softmax", is_decoder=True),
                                               (hf_mgk.NPRFRobertaForCausalLM,), REPEATED)
    NPRFRobertaCausalNPRFTest = family_case("NPRFRobertaCausalNPRFTest", hf_mgk.NPRFRobertaConfig,
                                            dict(ROBERTA, is_decoder=True), (hf_mgk.NPRFRobertaForCausalLM,), OWN_KERNEL)
    MGKLlamaSoftmaxTest = family_case("MGKLlamaSoftmaxTest", hf_mgk.MGKLlamaConfig,
                                      dict(LLAMA, attention_type="softmax"), MGK_LLAMA, REPEATED)
    MGKLlamaMGKTest = family_case("MGKLlamaMGKTest", hf_mgk.MGKLlamaConfig, dict(LLAMA, attention_type="mgk"),
                                  MGK_LLAMA[:2], OWN_KERNEL)
    MGKLlamaHardSMGKEMTest = family_case("MGKLlamaHardSMGKEMTest", hf_mgk.MGKLlamaConfig,
                                         dict(LLAMA, attention_type="smgk", e_step="hard", mgk_prior="em"),
                                         MGK_LLAMA[:2], OWN_KERNEL)
    FiSHLlamaSoftmaxTest = family_case("FiSHLlamaSoftmaxTest", hf_mgk.FiSHLlamaConfig,
                                       dict(LLAMA, attention_type="softmax"), FISH_LLAMA, REPEATED)
    FiSHLlamaFiSHTest = family_case("FiSHLlamaFiSHTest", hf_mgk.FiSHLlamaConfig, dict(LLAMA, attention_type="fish"),
                                    FISH_LLAMA[:2], OWN_KERNEL)
    FiSHLlamaHardFiSHTest = family_case("FiSHLlamaHardFiSHTest", hf_mgk.FiSHLlamaConfig,
                                        dict(LLAMA, attention_type="hard_fish"), FISH_LLAMA[:2], OWN_KERNEL)
