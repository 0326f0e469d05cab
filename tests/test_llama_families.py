"""MGK-Llama and FiSH-Llama: the attention on Llama's terms (rotary positions on the queries and every key, grouped
key/value heads), their caches, and the conversion of a stock Llama checkpoint saved here by the test."""

import pytest
import torch
import transformers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification, LlamaModel

from hf_mgk.configuration_fish_llama import FiSHLlamaConfig
from hf_mgk.configuration_mgk_llama import MGKLlamaConfig
from hf_mgk.modeling_fish_llama import FiSHLlamaForCausalLM, FiSHLlamaForSequenceClassification, FiSHLlamaModel
from hf_mgk.modeling_mgk_llama import MGKLlamaForCausalLM, MGKLlamaForSequenceClassification, MGKLlamaModel

import tiny

LINEAR_ROPE = {"rope_type": "linear", "factor": 2.0}
MGK_TYPES = [dict(attention_type=t, **kw) for t, kw in [
    ("softmax", {}), ("mgk", {}), ("mgk", dict(e_step="hard")), ("smgk", {}), ("mlk", {}), ("smlk", {}),
    ("mgk", dict(mgk_prior="em", num_keys=3))]]
FISH_TYPES = [dict(attention_type=t) for t in ("softmax", "fish", "hard_fish", "gfish", "hard_gfish", "mish")]
CASES = [(MGKLlamaForCausalLM, MGKLlamaConfig, kw) for kw in MGK_TYPES] + \
        [(FiSHLlamaForCausalLM, FiSHLlamaConfig, kw) for kw in FISH_TYPES]


def _id(case):
    cls, _, kw = case
    return cls.__name__[:4] + "-" + "-".join(str(v) for v in kw.values())


def new_model(case, **fields):
    cls, config_cls, kw = case
    torch.manual_seed(0)
    return cls(config_cls(**tiny.llama(dropout=False, **fields), **kw)).eval()


def ids(batch=2, length=11, seed=1):
    return torch.randint(3, 99, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def stock_folders(tmp_path_factory):
    """Stock Llama checkpoints, as `save_pretrained` writes them: a causal LM with linear rope scaling, its base
    model and a sequence classifier (the same body), and a tied causal LM."""
    out = tmp_path_factory.mktemp("stock-llama")
    torch.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(**tiny.llama(dropout=False, rope_scaling=LINEAR_ROPE))).eval()
    lm.save_pretrained(out / "lm")
    lm.model.save_pretrained(out / "base")
    classifier = LlamaForSequenceClassification(LlamaConfig(**tiny.llama(dropout=False, num_labels=3,
                                                                         pad_token_id=0)))
    classifier.model.load_state_dict(lm.model.state_dict())
    classifier.save_pretrained(out / "classifier")
    torch.manual_seed(1)
    LlamaForCausalLM(LlamaConfig(**tiny.llama(dropout=False, tie_word_embeddings=True))).save_pretrained(out / "tied")
    return {name: str(out / name) for name in ("lm", "base", "classifier", "tied")}


def _stock(folder, cls=LlamaForCausalLM):
    return cls.from_pretrained(folder).eval()


# ------------------------------------------------------------------------------------------------- conversion

@pytest.mark.parametrize("family, stock_cls, folder, out", [
    (FiSHLlamaForCausalLM, LlamaForCausalLM, "lm", "logits"),
    (FiSHLlamaModel, LlamaModel, "base", "last_hidden_state"),
    (FiSHLlamaForSequenceClassification, LlamaForSequenceClassification, "classifier", "logits"),
    (FiSHLlamaForCausalLM, LlamaForCausalLM, "tied", "logits"),
])
def test_hard_fish_with_every_head_is_the_stock_model(stock_folders, family, stock_cls, folder, out):
    """num_global_heads = the query heads and hard FiSH: each local head reads its own pooled (= its own) global
    head, so the converted model is the checkpoint's function (grouped values, rotary scaling and all)."""
    stock = _stock(stock_folders[folder], stock_cls)
    model = family.from_pretrained(stock_folders[folder], attention_type="hard_fish", num_global_heads=4)
    x = ids()
    mask = torch.ones_like(x)
    mask[1, :3] = 0  # left padding: the classifier reads the last real token either way
    with torch.no_grad():
        got, want = getattr(model(x, attention_mask=mask), out), getattr(stock(x, attention_mask=mask), out)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert model.config.model_type == "fish-llama" and model.config.tie_word_embeddings == stock.config.tie_word_embeddings


@pytest.mark.parametrize("family", [MGKLlamaForCausalLM, FiSHLlamaForCausalLM])
def test_softmax_is_stock_llama(stock_folders, family):
    stock = _stock(stock_folders["lm"])
    model = family.from_pretrained(stock_folders["lm"], attention_type="softmax")
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, stock(x).logits, rtol=1e-5, atol=1e-5)


def test_fish_global_heads_are_mean_pooled_groups_and_the_mixing_picks_the_group(stock_folders):
    stock = _stock(stock_folders["lm"]).state_dict()
    model = FiSHLlamaForCausalLM.from_pretrained(stock_folders["lm"], attention_type="fish", num_global_heads=2)
    attn = model.model.layers[1].self_attn
    q, k = stock["model.layers.1.self_attn.q_proj.weight"], stock["model.layers.1.self_attn.k_proj.weight"]
    q_heads, k_heads = q.view(4, 16, 64), k.view(2, 16, 64)
    # query heads 0, 1 -> global 0; 2, 3 -> global 1; query head h reads key/value head h // 2
    torch.testing.assert_close(attn.q_proj.weight.view(2, 16, 64), torch.stack([q_heads[:2].mean(0),
                                                                                 q_heads[2:].mean(0)]))
    torch.testing.assert_close(attn.k_proj.weight.view(2, 16, 64), k_heads)
    assert torch.equal(attn.mixing.detach(), torch.tensor([[1.0, 1, 0, 0], [0, 0, 1, 1]]))
    assert torch.equal(attn.v_proj.weight, stock["model.layers.1.self_attn.v_proj.weight"])
    assert torch.equal(attn.noise_std.detach(), torch.full((2,), 0.1))  # the family's own start


def test_fish_pooled_keys_follow_the_query_heads_groups(tmp_path):
    """Four query heads and four key/value heads pooled into two global heads: global key k is the mean of the
    key heads its query heads read."""
    torch.manual_seed(0)
    stock = LlamaForCausalLM(LlamaConfig(**tiny.llama(num_key_value_heads=4)))
    stock.save_pretrained(tmp_path)
    model = FiSHLlamaForCausalLM.from_pretrained(tmp_path, attention_type="hard_fish", num_global_heads=2)
    k = stock.model.layers[0].self_attn.k_proj.weight.view(4, 16, 64)
    torch.testing.assert_close(model.model.layers[0].self_attn.k_proj.weight.view(2, 16, 64),
                               torch.stack([k[:2].mean(0), k[2:].mean(0)]))


def test_mgk_extra_keys_start_from_the_stock_keys(stock_folders):
    stock = _stock(stock_folders["lm"]).state_dict()
    model = MGKLlamaForCausalLM.from_pretrained(stock_folders["lm"], attention_type="mgk", num_keys=3)
    attn = model.model.layers[0].self_attn
    key = stock["model.layers.0.self_attn.k_proj.weight"]
    assert torch.equal(attn.k_proj.weight, key)
    for extra in attn.extra_keys:
        noise = extra.weight.detach() - key
        assert 0 < noise.std() < 0.1 * model.config.initializer_range * 1.5  # a tenth of the init scale
    smgk = MGKLlamaForCausalLM.from_pretrained(stock_folders["lm"], attention_type="smgk")
    shift = smgk.model.layers[0].self_attn.key_shift.detach()
    assert shift.shape == (2, 2, 16) and torch.equal(shift[:, 0], torch.zeros(2, 16)) and shift[:, 1].abs().sum() > 0


def test_mgk_with_one_key_is_stock_attention_less_the_key_norm(stock_folders):
    """MGK's score -||q - k||^2 / (2 sigma^2) with sigma^2 = sqrt(D) is softmax's q.k / sqrt(D) plus -||k||^2 /
    (2 sqrt(D)) per key (the ||q||^2 term cancels): the term docs/usage.md measures the conversion by."""
    import math

    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    stock = _stock(stock_folders["lm"])
    model = MGKLlamaForCausalLM.from_pretrained(stock_folders["lm"], attention_type="mgk", num_keys=1,
                                                mgk_variances=[1.0])
    x = ids(length=10)
    with torch.no_grad():
        got = model.model(x, output_attentions=True).attentions[0]
        hidden = stock.model.layers[0].input_layernorm(stock.model.embed_tokens(x))
        attn = stock.model.layers[0].self_attn
        q = attn.q_proj(hidden).view(2, 10, 4, 16).transpose(1, 2)
        k = attn.k_proj(hidden).view(2, 10, 2, 16).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *stock.model.rotary_emb(hidden, torch.arange(10)[None]))
        k = repeat_kv(k, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(16) - (k * k).sum(-1)[:, :, None] / (2 * math.sqrt(16))
        want = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    (dict(attention_type="fish", num_global_heads=3), "num_global_heads must divide 4"),
    (dict(attention_type="fish", num_attention_heads=2), "num_attention_heads=4 into num_attention_heads=2"),
    (dict(attention_type="fish", hidden_size=32), "hidden_size=64 into hidden_size=32"),
])
def test_a_checkpoint_of_the_wrong_shape_is_a_clear_error(stock_folders, kwargs, message):
    with pytest.raises(ValueError, match=message):
        FiSHLlamaForCausalLM.from_pretrained(stock_folders["lm"], **kwargs)


# --------------------------------------------------------------------------------------- the attention's terms

def _grouped_as_every_head(model):
    """The same model with num_key_value_heads = num_attention_heads: every key/value projection (and sMGK shift)
    copied to each query head of its group. Grouping keys and values is exactly this sharing."""
    config = model.config.to_dict()
    config.update(num_key_value_heads=model.config.num_attention_heads)
    wide = type(model)(type(model.config)(**{k: v for k, v in config.items() if k != "model_type"})).eval()
    state = {}
    for name, tensor in model.state_dict().items():
        if any(f".{p}." in name for p in ("k_proj", "v_proj")) or ".extra_keys." in name:
            if not (isinstance(model, FiSHLlamaForCausalLM) and ".k_proj." in name
                    and model.config.attention_type != "softmax"):
                tensor = tensor.view(2, -1, *tensor.shape[1:]).repeat_interleave(2, 0).flatten(0, 1)
        elif name.endswith("key_shift"):
            tensor = tensor.repeat_interleave(2, 0)
        state[name] = tensor
    wide.load_state_dict(state)
    return wide


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_grouped_keys_and_values_serve_their_query_heads(case):
    model = new_model(case)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, _grouped_as_every_head(model)(x).logits, rtol=1e-5, atol=1e-5)


# Linear attention's features (elu + 1 of the rotated vectors) do not make a score of relative positions alone.
DOT_PRODUCT_CASES = [c for c in CASES if c[2]["attention_type"] not in ("mlk", "smlk")]


@pytest.mark.parametrize("case", DOT_PRODUCT_CASES, ids=_id)
def test_rotary_positions_rotate_every_key(case):
    """Rotary scores depend on relative positions alone: shifting every position by the same amount changes
    nothing, unless some key (one of MGK's M, a shifted sMGK key, a FiSH global key) is left unrotated."""
    model = new_model(case)
    x = ids(length=9)
    positions = torch.arange(9)[None].expand(2, -1)
    with torch.no_grad():
        at_zero = model(x, position_ids=positions).logits
        later = model(x, position_ids=positions + 17).logits
    torch.testing.assert_close(later, at_zero, rtol=1e-4, atol=1e-4)
    if case[2]["attention_type"] != "softmax":  # and the test can tell: an unrotated extra key breaks it
        assert not torch.allclose(model(x, position_ids=positions * 2).logits, at_zero, atol=1e-4)


# ------------------------------------------------------------------------------------------------------ caches

@pytest.mark.parametrize("case", CASES, ids=_id)
def test_cached_generation_equals_uncached_and_left_padded_rows_equal_rows_alone(case):
    model = new_model(case)
    x = ids(length=7)
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)  # (no early end of text)
    cached, uncached = model.generate(x, use_cache=True, **kw), model.generate(x, use_cache=False, **kw)
    assert torch.equal(cached, uncached)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x[1:, :4]], 1)
    both = torch.cat([x[:1], padded])
    mask = (both != 0).long()
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # as generate() numbers left-padded rows
    with torch.no_grad():
        rows = model(both, attention_mask=mask, position_ids=positions).logits
        alone = model(x[1:, :4]).logits
    torch.testing.assert_close(rows[1, 3:], alone[0], rtol=1e-4, atol=1e-4)
    together = model.generate(both, attention_mask=mask, **kw)  # generate() numbers left-padded rows itself
    assert torch.equal(together[1, 7:], model.generate(x[1:, :4], **kw)[0, 4:])


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_static_cache_generation_equals_dynamic(case):
    model = new_model(case)
    x = ids(length=5)
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(x, cache_implementation="static", **kw), model.generate(x, **kw))


@pytest.mark.parametrize("case, keys, values", [
    (CASES[1], (2, 2, 7, 2 * 16), (2, 2, 7, 16)),  # MGK: per key/value head, its M keys side by side
    (CASES[-5], (2, 2, 7, 16), (2, 2, 7, 16)),  # FiSH: the M = 2 global keys and the 2 value heads
], ids=["mgk", "fish"])
def test_the_cache_holds_the_keys_and_the_value_heads_no_more(case, keys, values):
    model = new_model(case)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids(length=7), past_key_values=cache, use_cache=True)
    layer = cache.layers[0]
    assert tuple(layer.keys.shape) == keys and tuple(layer.values.shape) == values


# ------------------------------------------------------------------------------------------ training, saving

@pytest.mark.parametrize("case", CASES, ids=_id)
def test_every_parameter_learns_and_gradient_checkpointing_gives_the_same_gradients(case):
    model = new_model(case).train()
    x = ids()
    torch.manual_seed(5)
    loss = model(x, labels=x).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert all(g.abs().sum() > 0 for n, g in grads.items() if "embed_tokens" not in n), \
        [n for n, g in grads.items() if not g.abs().sum() > 0]
    model = new_model(case).train()  # afresh: the EM prior's M-step moved the first one's prior
    model.gradient_checkpointing_enable()
    torch.manual_seed(5)
    model(x, labels=x).loss.backward()
    noisy = case[2]["attention_type"] in ("fish", "gfish", "mish")  # noise drawn twice under checkpointing
    if not noisy:
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[-4], CASES[-3]], ids=_id)
def test_save_and_reload_gives_identical_logits(case, tmp_path):
    model = new_model(case)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    x = ids()
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, model(x).logits)


def test_sequence_classification_reads_the_last_real_token():
    torch.manual_seed(0)
    model = MGKLlamaForSequenceClassification(MGKLlamaConfig(**tiny.llama(dropout=False, num_labels=2,
                                                                          pad_token_id=0))).eval()
    x = ids(batch=1, length=6)
    padded = torch.cat([x, torch.zeros(1, 3, dtype=torch.long)], 1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, attention_mask=(padded != 0).long()).logits, model(x).logits,
                                   rtol=1e-5, atol=1e-5)
    assert transformers.__version__  # (the stock classes above are the installed release's)


def test_token_types_of_one_segment_are_accepted_and_a_second_one_refused():
    model = new_model(CASES[1])
    x = ids()
    with torch.no_grad():
        assert torch.equal(model(x, token_type_ids=torch.zeros_like(x)).logits, model(x).logits)
    with pytest.raises(ValueError, match="no token type embeddings"):
        model(x, token_type_ids=torch.ones_like(x))


@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[3], CASES[-4], CASES[-3]], ids=_id)
def test_a_whole_4d_mask_is_the_padding_mask_it_spells(case):
    """A caller's (B, 1, N, S) mask, boolean or additive as SDPA takes them, causal and padded: the logits of the
    padding mask it spells out."""
    model = new_model(case)
    x = ids(length=8)
    mask = torch.ones_like(x)
    mask[1, :3] = 0
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    whole = torch.ones(8, 8, dtype=torch.bool).tril()[None, None] & mask.bool()[:, None, None, :]
    additive = torch.zeros(whole.shape).masked_fill(~whole, torch.finfo(torch.float32).min)
    real = mask.bool()
    with torch.no_grad():
        want = model(x, attention_mask=mask, position_ids=positions).logits
        for given in (whole, additive):
            got = model(x, attention_mask=given, position_ids=positions).logits
            torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)


ROPE_TYPES = {  # every rope type of transformers' LlamaRotaryEmbedding, with the fields each needs
    "default": {},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                 "original_max_position_embeddings": 32},
}


@pytest.mark.parametrize("rope", sorted(ROPE_TYPES))
def test_every_rope_type_converts_to_the_stock_function(rope, tmp_path):
    """transformers' own rotary embedding, whatever its type: hard FiSH with every head and MGK's softmax are the
    stock model on a sequence past original_max_position_embeddings (where the scaled types differ)."""
    torch.manual_seed(0)
    stock = LlamaForCausalLM(LlamaConfig(**tiny.llama(dropout=False, rope_scaling=ROPE_TYPES[rope]))).eval()
    stock.save_pretrained(tmp_path)
    x = ids(batch=1, length=40)
    with torch.no_grad():
        want = stock(x).logits
        for family, kw in ((FiSHLlamaForCausalLM, dict(attention_type="hard_fish", num_global_heads=4)),
                           (MGKLlamaForCausalLM, dict(attention_type="softmax"))):
            model = family.from_pretrained(tmp_path, **kw)
            assert model.config.rope_parameters["rope_type"] == stock.config.rope_parameters["rope_type"]
            torch.testing.assert_close(model(x).logits, want, rtol=1e-5, atol=1e-5)


def test_attention_biases_convert_with_their_heads(tmp_path):
    """attention_bias=True (Qwen2's q/k/v biases, here on every projection): hard FiSH with every head is still the
    stock model; pooled global heads pool their biases; MGK's extra keys start from the key bias."""
    torch.manual_seed(0)
    stock = LlamaForCausalLM(LlamaConfig(**tiny.llama(dropout=False, attention_bias=True))).eval()
    with torch.no_grad():
        for p in stock.parameters():
            if p.dim() == 1 and p.abs().sum() == 0:
                p.normal_()  # biases start at zero: give them something to carry
    stock.save_pretrained(tmp_path)
    x = ids()
    with torch.no_grad():
        full = FiSHLlamaForCausalLM.from_pretrained(tmp_path, attention_type="hard_fish", num_global_heads=4)
        torch.testing.assert_close(full(x).logits, stock(x).logits, rtol=1e-5, atol=1e-5)
    pooled = FiSHLlamaForCausalLM.from_pretrained(tmp_path, attention_type="hard_fish", num_global_heads=2)
    q_bias = stock.model.layers[0].self_attn.q_proj.bias.view(4, 16)
    torch.testing.assert_close(pooled.model.layers[0].self_attn.q_proj.bias.view(2, 16),
                               torch.stack([q_bias[:2].mean(0), q_bias[2:].mean(0)]))
    mgk = MGKLlamaForCausalLM.from_pretrained(tmp_path, attention_type="mgk")
    attn = mgk.model.layers[0].self_attn
    assert torch.equal(attn.extra_keys[0].bias, attn.k_proj.bias) and attn.k_proj.bias.abs().sum() > 0
