"""What the package says while it works: the training scripts log like transformers' own examples (info on the
main process, so Trainer's run banner shows), and a supported warm start from a stock checkpoint says what it
converts instead of transformers' "can yield errors" warning, which still shows for a mismatch we do not convert."""

import logging

import pytest
import torch
from transformers import BertConfig, GPT2Config, RobertaConfig
from transformers.utils import logging as tlogging

from hf_mgk import FiSHGPT2Config, MGKBertConfig, MGKGPT2Config, NPRFRobertaConfig
from conftest import write_play_split
from test_run_lm import common, run_mlm
import tiny

MISMATCH = "to instantiate a model of type"


@pytest.fixture
def transformers_records():
    """Every record that reaches transformers' root logger at info and above; verbosity restored after."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    before = tlogging.get_verbosity()
    root = logging.getLogger("transformers")
    handler = Keep()
    root.addHandler(handler)
    tlogging.set_verbosity_info()
    yield records
    root.removeHandler(handler)
    tlogging.set_verbosity(before)


@pytest.mark.parametrize("stock_config, config_cls", [
    (BertConfig(**tiny.bert_size(num_hidden_layers=1)), MGKBertConfig),
    (RobertaConfig(**tiny.bert_size(num_hidden_layers=1)), NPRFRobertaConfig),
    (GPT2Config(**tiny.gpt2_size(n_layer=1)), FiSHGPT2Config),
    (GPT2Config(**tiny.gpt2_size(n_layer=1)), MGKGPT2Config),
])
def test_a_stock_config_converts_without_the_mismatch_warning(stock_config, config_cls, tmp_path,
                                                              transformers_records):
    stock_config.save_pretrained(tmp_path)
    config = config_cls.from_pretrained(tmp_path, num_attention_heads=2) if "bert" in config_cls.model_type \
        else config_cls.from_pretrained(tmp_path)
    assert isinstance(config, config_cls)
    messages = [r.getMessage() for r in transformers_records]
    assert not [m for m in messages if MISMATCH in m]
    said = [r for r in transformers_records if r.getMessage().startswith(f"Converting a {stock_config.model_type} "
                                                                        f"configuration to {config_cls.model_type}")]
    assert len(said) == 1 and said[0].levelno == logging.INFO


def test_an_unsupported_mismatch_still_warns(tmp_path, transformers_records):
    GPT2Config(**tiny.gpt2_size(n_layer=1)).save_pretrained(tmp_path)
    try:
        MGKBertConfig.from_pretrained(tmp_path)
    except (ValueError, TypeError, AttributeError):
        pass  # a GPT-2 config.json is not a BERT one: what matters here is the warning before any error
    warned = [r for r in transformers_records if MISMATCH in r.getMessage()]
    assert warned and warned[0].levelno == logging.WARNING
    assert "gpt2" in warned[0].getMessage() and "mgk-bert" in warned[0].getMessage()


def test_a_warm_started_model_reports_its_heads_not_the_mismatch(tmp_path, transformers_records):
    from transformers import BertForMaskedLM

    from hf_mgk import MGKBertForMaskedLM

    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(**tiny.bert_size(vocab_size=50, num_hidden_layers=1))).save_pretrained(tmp_path)
    MGKBertForMaskedLM.from_pretrained(tmp_path, num_attention_heads=2)
    messages = [r.getMessage() for r in transformers_records]
    assert not [m for m in messages if MISMATCH in m]
    assert [m for m in messages if "kept" in m and "head" in m]


@pytest.mark.slow
def test_training_scripts_log_the_run_banner(tmp_path, transformers_records):
    """setup_logging puts transformers at info on the main process (transformers' examples do the same; the
    default log_level 'passive' would keep warnings only): the records reach transformers' own handler."""
    tlogging.set_verbosity_warning()  # what a fresh process has
    texts = write_play_split(tmp_path, (200, 300), (300, 330))
    overrides = tiny.overrides(tiny.bert_size(num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64))
    run_mlm.main(["--model_type", "mgk-bert", "--tokenizer_name", _bert_dir(), "--config_overrides", overrides,
                  *common(texts, tmp_path / "out", tmp_path, steps=1),
                  "--do_train", "--max_seq_length", "32"])
    messages = [r.getMessage() for r in transformers_records]
    assert "***** Running training *****" in messages
    assert any(m.strip() == "Total train batch size (w. parallel, distributed & accumulation) = 4" for m in messages)


def _bert_dir():
    from hf_mgk import bundled

    return bundled.bert_checkpoint_dir()
