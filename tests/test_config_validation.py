"""Every configuration refuses values of the wrong kind with a ValueError naming the field, in the field's own
name (GPT-2: n_embd / n_head / n_positions; BERT and RoBERTa: hidden_size / num_attention_heads /
max_position_embeddings)."""

import pytest

from hf_mgk import FiSHGPT2Config, MGKBertConfig, NPRFRobertaConfig
from hf_mgk.modeling_common import check_sequence_length

GPT2 = dict(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64)
ENCODER = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
               max_position_embeddings=66)


@pytest.mark.parametrize("kw,field", [
    (dict(fish_noise_init=True), "fish_noise_init"),  # a bool is not a number here
    (dict(fish_noise_init=float("nan")), "fish_noise_init"),
    (dict(n_embd=0), "n_embd"), (dict(n_embd=-32), "n_embd"),
    (dict(n_head=0), "n_head"),
    (dict(n_positions=0), "n_positions"),
    (dict(n_head=5), r"n_embd \(32\) is not a multiple of n_head \(5\)"),
])
def test_fish_gpt2_config(kw, field):
    with pytest.raises(ValueError, match=field):
        FiSHGPT2Config(**{**GPT2, **kw})


@pytest.mark.parametrize("config_cls", [MGKBertConfig, NPRFRobertaConfig])
@pytest.mark.parametrize("kw,field", [
    (dict(hidden_size=0), "hidden_size"), (dict(max_position_embeddings=0), "max_position_embeddings"),
    (dict(max_position_embeddings=-1), "max_position_embeddings"), (dict(num_attention_heads=0), "num_attention_heads"),
    (dict(num_attention_heads=5), r"hidden_size \(32\) is not a multiple of num_attention_heads \(5\)"),
])
def test_encoder_configs(config_cls, kw, field):
    with pytest.raises(ValueError, match=field):
        config_cls(**{**ENCODER, **kw})


@pytest.mark.parametrize("field", ["normalize_qk", "use_rpe", "use_absolute_positions"])
@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_nprf_roberta_flags_must_be_bools(field, value):
    with pytest.raises(ValueError, match=field):
        NPRFRobertaConfig(**{**ENCODER, field: value})


def test_valid_values_pass():
    assert FiSHGPT2Config(**GPT2, fish_noise_init=0).fish_noise_init == 0
    assert NPRFRobertaConfig(**ENCODER, normalize_qk=False, use_rpe=False).use_rpe is False
    MGKBertConfig(**ENCODER)


def test_sequence_length_error_names_the_field_and_explains_the_limit():
    with pytest.raises(ValueError, match="n_positions=64"):
        check_sequence_length(65, 64, "n_positions")
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        check_sequence_length(65, 64)
    # RoBERTa: the usable length is the table size minus the padding offset; say both
    with pytest.raises(ValueError, match=r"at most 64 tokens \(max_position_embeddings=66 minus RoBERTa's padding"):
        check_sequence_length(65, 64, why="max_position_embeddings=66 minus RoBERTa's padding offset 2")
    check_sequence_length(64, 64)
