"""The tiny model configs the tests build their models from: one place for the sizes.

Each function returns a plain dict of config fields (nothing is imported from transformers or hf_mgk), used as
`MGKBertConfig(**tiny.bert())` or `dict(tiny.gpt2(), attention_type="fish")`. Keyword overrides replace a field in
place or add one at the end (the order matters only to `overrides`' text).

    bert_size()   hidden_size 32, 2 layers, 4 heads (of 8), intermediate_size 37: an encoder's size alone, the
                  vocabulary and the positions left to the caller (a tokenizer's, or the config's defaults)
    bert()        vocab_size 99, bert_size(), max_position_embeddings 64
    roberta()     bert() with max_position_embeddings 66 (ROBERTA_POSITIONS): RoBERTa numbers positions after its
                  padding index 1, so 64 tokens take positions 2..65
    gpt2_size()   n_embd 32, 2 layers, 4 heads (of 8): a decoder's size alone
    gpt2()        vocab_size 99, gpt2_size(), n_positions 64
    llama()       vocab_size 99, hidden_size 64, 2 layers, 4 query heads and 2 key/value heads of 16,
                  intermediate_size 37, max_position_embeddings 64, rope_theta 500 (and a rope_scaling type)

Keywords (not config fields):
    dropout=False      the family's dropout fields set to 0.0: BERT / RoBERTa hidden_dropout_prob and
                       attention_probs_dropout_prob; GPT-2 resid_pdrop, embd_pdrop, attn_pdrop
    special_ids=True   roberta() and gpt2(): the family's special token ids, RoBERTa pad 1 / bos 0 / eos 2 (its
                       tokenizer's), GPT-2 pad 0 / bos 1 / eos 2 (ids the tests' random inputs, drawn from 3 on,
                       never hit)

`overrides(fields)` writes fields as the scripts' --config_overrides text ("hidden_size=32,num_hidden_layers=2,...").
"""

POSITIONS = 64
ROBERTA_POSITIONS = POSITIONS + 2  # RoBERTa's positions start after its padding index (1)

BERT_NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
GPT2_NO_DROPOUT = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
ROBERTA_SPECIAL_IDS = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2)
GPT2_SPECIAL_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _fields(base, overrides, *extra):
    fields = dict(base)
    for more in extra:
        fields.update(more)
    fields.update(overrides)
    return fields


def bert_size(*, dropout=True, **overrides):
    """hidden_size 32, num_hidden_layers 2, num_attention_heads 4, intermediate_size 37 (37: no dimension is
    accidentally equal to another), no vocabulary or positions."""
    return _fields(dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37),
                   overrides, {} if dropout else BERT_NO_DROPOUT)


def bert(*, dropout=True, **overrides):
    """A tiny BERT-shaped encoder (MGK-BERT, and NPRF-RoBERTa where the test needs no RoBERTa positions):
    vocab_size 99, bert_size(), max_position_embeddings 64."""
    return _fields(dict(vocab_size=99, **bert_size(), max_position_embeddings=POSITIONS), overrides,
                   {} if dropout else BERT_NO_DROPOUT)


def roberta(*, dropout=True, special_ids=False, **overrides):
    """bert() with RoBERTa's max_position_embeddings 66; special_ids adds pad 1, bos 0, eos 2."""
    return _fields(bert(max_position_embeddings=ROBERTA_POSITIONS), overrides, {} if dropout else BERT_NO_DROPOUT,
                   ROBERTA_SPECIAL_IDS if special_ids else {})


def gpt2_size(*, dropout=True, **overrides):
    """n_embd 32, n_layer 2, n_head 4, no vocabulary or positions."""
    return _fields(dict(n_embd=32, n_layer=2, n_head=4), overrides, {} if dropout else GPT2_NO_DROPOUT)


def gpt2(*, dropout=True, special_ids=False, **overrides):
    """A tiny GPT-2-shaped decoder (FiSH-GPT2, MGK-GPT2, stock GPT-2): vocab_size 99, gpt2_size(), n_positions 64;
    special_ids adds pad 0, bos 1, eos 2."""
    return _fields(dict(vocab_size=99, **gpt2_size(), n_positions=POSITIONS), overrides,
                   {} if dropout else GPT2_NO_DROPOUT, GPT2_SPECIAL_IDS if special_ids else {})


def llama(*, dropout=True, rope_scaling=None, **overrides):
    """A tiny Llama-shaped decoder (MGK-Llama, FiSH-Llama, stock Llama): vocab_size 99, hidden_size 64, 2 layers,
    4 query heads and 2 key/value heads of 16, intermediate_size 37, max_position_embeddings 64, rope_theta 500;
    rope_scaling: a `rope_parameters` dict of a scaling type (e.g. {"rope_type": "linear", "factor": 2.0}).
    dropout=False sets attention_dropout 0 (Llama's only dropout)."""
    rope = {"rope_theta": 500.0, "rope_type": "default", **(rope_scaling or {})}
    return _fields(dict(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, intermediate_size=37,
                        max_position_embeddings=POSITIONS, rope_parameters=rope,
                        attention_dropout=0.1 if dropout else 0.0), overrides)


def overrides(fields):
    """The fields as --config_overrides text, in their order: {"n_embd": 32, "n_layer": 2} -> "n_embd=32,n_layer=2"."""
    return ",".join(f"{key}={value}" for key, value in fields.items())
