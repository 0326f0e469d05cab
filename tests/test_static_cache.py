"""generate(cache_implementation="static") for the causal LMs, as for stock GPT-2: the same tokens and logits as
with the dynamic cache, left padding included. FiSH caches M global keys and H values, and MGK-GPT2 M keys per
position beside one value, which a static cache (one shape for both) takes packed; NPRF's relative positions follow the queries' places, which a static
cache's free slots no longer tell."""

import pytest
import torch
from transformers import StaticCache

from conftest import assert_close
from hf_mgk import (FiSHGPT2Config, FiSHGPT2LMHeadModel, FiSHLlamaConfig, FiSHLlamaForCausalLM, MGKGPT2Config,
                    MGKGPT2LMHeadModel, MGKLlamaConfig, MGKLlamaForCausalLM, NPRFRobertaConfig, NPRFRobertaForCausalLM)
import tiny

GPT2 = tiny.gpt2(dropout=False, special_ids=True)
LLAMA = tiny.llama(dropout=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
ROBERTA = tiny.roberta(dropout=False, special_ids=True, max_position_embeddings=64, num_random_features=16,
                       is_decoder=True)

CASES = {
    "fish-softmax": lambda: FiSHGPT2LMHeadModel(FiSHGPT2Config(**GPT2, attention_type="softmax")),
    "fish-fish": lambda: FiSHGPT2LMHeadModel(FiSHGPT2Config(**GPT2, num_global_heads=2)),  # M = 2 < H = 4
    "fish-gfish-3": lambda: FiSHGPT2LMHeadModel(FiSHGPT2Config(**GPT2, attention_type="gfish", num_global_heads=3)),
    "mgkgpt2-softmax": lambda: MGKGPT2LMHeadModel(MGKGPT2Config(**GPT2, attention_type="softmax")),
    # option A caches M keys per position (M * D wide), option B its one key
    "mgkgpt2-mgk-3": lambda: MGKGPT2LMHeadModel(MGKGPT2Config(**GPT2, num_keys=3)),
    "mgkgpt2-smgk-hard": lambda: MGKGPT2LMHeadModel(MGKGPT2Config(**GPT2, attention_type="smgk", e_step="hard")),
    "mgkgpt2-mlk": lambda: MGKGPT2LMHeadModel(MGKGPT2Config(**GPT2, attention_type="mlk")),
    "nprf-softmax": lambda: NPRFRobertaForCausalLM(NPRFRobertaConfig(**ROBERTA, attention_type="softmax")),
    "nprf-nprf": lambda: NPRFRobertaForCausalLM(NPRFRobertaConfig(**ROBERTA)),
    # Llama's: grouped key/value heads, rotary positions; MGK's M keys per key/value head, FiSH's M global keys
    # beside the value heads
    "mgkllama-mgk": lambda: MGKLlamaForCausalLM(MGKLlamaConfig(**LLAMA, num_keys=3)),
    "mgkllama-smgk": lambda: MGKLlamaForCausalLM(MGKLlamaConfig(**LLAMA, attention_type="smgk")),
    "fishllama-hard": lambda: FiSHLlamaForCausalLM(FiSHLlamaConfig(**LLAMA, attention_type="hard_fish",
                                                                   num_global_heads=1)),
}


def model_for(case):
    model = CASES[case]().eval()
    rpe = getattr(model.base_model, "relative_position", None)
    if rpe is not None:  # a relative-position bias that matters (it starts at zero)
        with torch.no_grad():
            rpe.weight.normal_()
    return model


def left_padded(pad_id):
    ids = torch.randint(3, 99, (3, 8))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :5] = 0
    ids[mask == 0] = pad_id
    return ids, mask


@pytest.mark.parametrize("case", list(CASES))
def test_static_cache_generation_equals_dynamic(case):
    model = model_for(case)
    ids, mask = left_padded(model.config.pad_token_id)
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=model.config.pad_token_id,
                  return_dict_in_generate=True, output_logits=True)
    dynamic = model.generate(ids, **kwargs)
    static = model.generate(ids, cache_implementation="static", **kwargs)
    assert torch.equal(static.sequences, dynamic.sequences)
    assert_close(torch.stack(static.logits), torch.stack(dynamic.logits), rtol=1e-5)


@pytest.mark.parametrize("case", ["fish-fish", "mgkgpt2-mgk-3", "nprf-nprf"])
def test_forward_with_a_static_cache_and_a_padding_mask(case):
    """Called by hand (no generate(), so no 4-D mask made for it), a static cache's free slots stay hidden and the
    positions stay right: prefill and two steps give the logits of the whole sequence without a cache."""
    model = model_for(case)
    pad = model.config.pad_token_id
    ids, mask = left_padded(pad)
    more = torch.randint(3, 99, (3, 2))
    full_ids, full_mask = torch.cat([ids, more], 1), torch.cat([mask, torch.ones_like(more)], 1)
    # positions as generate() counts them: GPT-2 from 0 at the first real token, RoBERTa from pad_id + 1
    counted = full_mask.cumsum(-1)
    positions = counted * full_mask + pad if case.startswith("nprf") else (counted - 1).clamp_min(0)
    cache = StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        expected = model(full_ids, attention_mask=full_mask, position_ids=positions, use_cache=False).logits
        got = [model(ids, attention_mask=mask, position_ids=positions[:, :8], past_key_values=cache).logits]
        for step in range(2):
            got.append(model(more[:, step:step + 1], attention_mask=full_mask[:, :9 + step],
                             position_ids=positions[:, 8 + step:9 + step], past_key_values=cache).logits)
    real = full_mask.bool()
    assert_close(torch.cat(got, 1)[real], expected[real], rtol=1e-5)


@pytest.mark.slow  # compiles
@pytest.mark.parametrize("case", ["mgkllama-mgk", "fishllama-hard", "mgkgpt2-mgk-3", "fish-fish"])
def test_compiled_static_cache_generation_equals_eager(case):
    """generate() with a static cache and the forward compiled (as transformers compiles it for a static cache):
    the eager tokens and logits."""
    model = model_for(case)
    ids, mask = left_padded(model.config.pad_token_id)
    kwargs = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=model.config.pad_token_id,
                  cache_implementation="static", return_dict_in_generate=True, output_logits=True)
    eager = model.generate(ids, **kwargs)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend="aot_eager")
    try:
        compiled = model.generate(ids, **kwargs)
    finally:
        torch._dynamo.reset()
    assert torch.equal(compiled.sequences, eager.sequences)
    assert_close(torch.stack(compiled.logits), torch.stack(eager.logits), rtol=1e-5)
