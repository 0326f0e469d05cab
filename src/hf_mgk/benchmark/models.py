"""The whole models the benchmark times: their sizes, how a child process rebuilds one from its kind and JSON
overrides (`BUILDERS`, `make_config`, `build`), and one timed step of it (`model_step`)."""

import contextlib
import importlib

import torch

from hf_mgk.families import FAMILIES as MODEL_FAMILIES

# ------------------------------------------------------------------ precision
# --dtype: fp32 runs as it is; bf16 / fp16 run the models under torch.autocast and give the attention-alone tables
# their inputs in that dtype. main() sets DTYPE, and a child gets it from the parent (measure.child_command).
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE = "fp32"


def compute_dtype():
    return DTYPES[DTYPE]


def autocast():
    """The context a model's step runs in: nothing for fp32, autocast to DTYPE otherwise."""
    if DTYPE == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(torch.get_default_device().type, dtype=compute_dtype())


# ------------------------------------------------------------------ sizes
NPRF_ATTN = dict(heads=8, head_dim=64, features=32)
NPRF_WIDTH = dict(hidden_size=512, num_hidden_layers=2, num_attention_heads=8, intermediate_size=2048,
                  vocab_size=1000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
BERT_SIZE = dict(hidden_size=512, num_hidden_layers=2, intermediate_size=2048, vocab_size=1000,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
GPT2_SIZE = dict(n_embd=512, n_layer=2, n_inner=2048, vocab_size=1000, bos_token_id=0, eos_token_id=0,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
# Llama's shape at the width of the others: 8 query heads of 64 sharing 2 key/value heads, SwiGLU 1408 (~ 8/3 d).
LLAMA_SIZE = dict(hidden_size=512, num_hidden_layers=2, intermediate_size=1408, vocab_size=1000,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=64, bos_token_id=0, eos_token_id=0,
                  attention_dropout=0.0)
FISH_TYPES = ("hard_fish", "fish", "mish", "hard_gfish", "gfish")
FISH_DEFAULT = ("hard_fish", "fish", "mish", "hard_gfish")  # gfish = hard_gfish + noise: --fish-types to add


class Builder(tuple):
    """How to build one kind of model (a tuple, so tests can swap the size): module, config class, model class,
    size, position field, fewest positions, model kwargs, attention implementation or None, extra positions
    (RoBERTa's padding offset), the name of the attention modules (their FLOP share is the formula's scope)."""

    def __new__(cls, module, config, model, size, positions, fewest, model_kwargs, attn, offset=0,
                attention="attention"):
        return super().__new__(cls, (module, config, model, size, positions, fewest, model_kwargs, attn, offset,
                                     attention))


NO_POOLER = {"add_pooling_layer": False}


def _names(family):
    """An hf-mgk family's config and base model class names, from the registry."""
    return MODEL_FAMILIES[family].config_name, MODEL_FAMILIES[family].classes["base"]


# Child processes rebuild a case from its kind and JSON overrides.
BUILDERS = {
    "bert": Builder("transformers", "BertConfig", "BertModel", BERT_SIZE, "max_position_embeddings", 512,
                    NO_POOLER, "sdpa"),
    "mgk": Builder("hf_mgk", *_names("mgk-bert"), BERT_SIZE, "max_position_embeddings", 512,
                   NO_POOLER, None),
    "gpt2": Builder("transformers", "GPT2Config", "GPT2Model", GPT2_SIZE, "n_positions", 1024, {}, "sdpa",
                    attention="attn"),
    "fish_gpt2": Builder("hf_mgk", *_names("fish-gpt2"), GPT2_SIZE, "n_positions", 1024, {}, None,
                         attention="attn"),
    "roberta": Builder("transformers", "RobertaConfig", "RobertaModel", NPRF_WIDTH, "max_position_embeddings", 0,
                       NO_POOLER, "sdpa", offset=2),
    "nprf_roberta": Builder("hf_mgk", *_names("nprf-roberta"),
                            {**NPRF_WIDTH, "use_absolute_positions": False,
                             "num_random_features": NPRF_ATTN["features"]},
                            "max_position_embeddings", 0, NO_POOLER, None, offset=2),
    "longformer": Builder("transformers", "LongformerConfig", "LongformerModel",
                          {**NPRF_WIDTH, "attention_window": 256}, "max_position_embeddings", 0, NO_POOLER, None,
                          offset=2),
    "mgk_gpt2": Builder("hf_mgk", *_names("mgk-gpt2"), GPT2_SIZE, "n_positions", 1024, {}, None,
                        attention="attn"),
    "llama": Builder("transformers", "LlamaConfig", "LlamaModel", LLAMA_SIZE, "max_position_embeddings", 1024, {},
                     "sdpa", attention="self_attn"),
    "mgk_llama": Builder("hf_mgk", *_names("mgk-llama"), LLAMA_SIZE, "max_position_embeddings", 1024, {}, None,
                         attention="self_attn"),
    "fish_llama": Builder("hf_mgk", *_names("fish-llama"), LLAMA_SIZE, "max_position_embeddings", 1024, {}, None,
                          attention="self_attn"),
}


def make_config(kind, overrides, length):
    """The configuration of one case, with room for `length` positions."""
    if kind not in BUILDERS:
        raise ValueError(f"unknown model kind {kind!r}")
    module, config_name, _, size, positions, fewest, _, attn, offset, _ = BUILDERS[kind]
    config = getattr(importlib.import_module(module), config_name)(
        **{**size, positions: max(length + offset, fewest), **overrides})
    if attn is not None:
        config._attn_implementation = attn
    return config


def build(kind, overrides, length):
    """The model for one case, with room for `length` positions."""
    config = make_config(kind, overrides, length)
    module, _, model_name, *_, model_kwargs, _, _, _ = BUILDERS[kind]
    return getattr(importlib.import_module(module), model_name)(config, **model_kwargs)


def model_step(kind, overrides, length, batch, mode):
    """(model, ids, step) of one case: step(on_forward) runs mode "train" (forward, backward and an SGD step) or
    "forward" (a forward in eval mode under no_grad), calling on_forward after the forward; the forward under
    `autocast()` (--dtype)."""
    torch.manual_seed(0)
    model = build(kind, overrides, length).train(mode == "train")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ids = torch.randint(3, model.config.vocab_size, (batch, length))  # ids 0-2 are RoBERTa's special tokens

    def step(on_forward=lambda: None):
        if mode == "forward":
            with torch.no_grad(), autocast():
                model(ids)
            return on_forward()
        opt.zero_grad(set_to_none=True)
        with autocast():
            hidden = model(ids).last_hidden_state
        on_forward()
        hidden.float().pow(2).mean().backward()
        opt.step()

    return model, ids, step
