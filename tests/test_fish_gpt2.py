"""FiSH-GPT2 as an HF model: config checks, GPT-2 parity, causality, cached generation, saving, noise, sizes."""

import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

from conftest import assert_close, left_padded, positions
from hf_mgk import FiSHGPT2Config, FiSHGPT2ForSequenceClassification, FiSHGPT2LMHeadModel, FiSHGPT2Model
from hf_mgk.flops import fish_cost
from hf_mgk.hub import assert_same_outputs, run_without_package
from tiny import gpt2 as tiny_gpt2

TINY = tiny_gpt2(dropout=False, special_ids=True)
TYPES = ["fish", "hard_fish", "gfish", "hard_gfish", "mish", "softmax"]


def tiny(**kw):
    return FiSHGPT2Config(**{**TINY, **kw})


@pytest.mark.parametrize("kw,field", [
    (dict(attention_type="fishy"), "attention_type"), (dict(num_global_heads=4), "num_global_heads"),
    (dict(num_global_heads=0), "num_global_heads"), (dict(head_dim=-1), "head_dim"),
    (dict(n_head=5), "n_embd"), (dict(fish_noise_init=-1.0), "fish_noise_init"),
])
def test_bad_config_raises_naming_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        tiny(**kw)


def test_softmax_reproduces_gpt2_logits_and_generation():
    gpt2 = GPT2LMHeadModel(GPT2Config(**TINY)).eval()
    ours = FiSHGPT2LMHeadModel(tiny(attention_type="softmax")).eval()
    missing, unexpected = ours.load_state_dict(gpt2.state_dict(), strict=False)
    assert not missing and not unexpected
    ids, mask = left_padded()
    ref = gpt2(ids, attention_mask=mask, position_ids=positions(mask), labels=ids)
    out = ours(ids, attention_mask=mask, position_ids=positions(mask), labels=ids)
    real = mask.bool()
    assert_close(out.logits[real], ref.logits[real], rtol=1e-6)
    assert_close(out.loss, ref.loss, rtol=1e-6)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(ids, **kw), gpt2.generate(ids, **kw))


@pytest.mark.parametrize("attention_type", TYPES)
def test_no_causal_leak(attention_type):
    model = FiSHGPT2LMHeadModel(tiny(attention_type=attention_type)).eval()
    ids = torch.randint(3, 99, (2, 12))
    base = model(ids).logits
    for t in (0, 5, 10):
        changed = ids.clone()
        changed[:, t + 1:] = torch.randint(3, 99, changed[:, t + 1:].shape)
        out = model(changed).logits
        assert_close(out[:, :t + 1], base[:, :t + 1], rtol=1e-6, msg=f"leak at t={t}")
        assert (out[:, t + 1:] - base[:, t + 1:]).abs().max() > 1e-4


@pytest.mark.parametrize("attention_type", TYPES)
def test_padding_is_masked(attention_type):
    """A left-padded row gives the logits of its tokens run alone: padded keys contribute nothing."""
    model = FiSHGPT2LMHeadModel(tiny(attention_type=attention_type)).eval()
    ids, mask = left_padded()
    ids[mask == 0] = torch.randint(3, 99, (int((mask == 0).sum()),))  # padding that would change the outputs if seen
    logits = model(ids, attention_mask=mask, position_ids=positions(mask)).logits
    for row in range(ids.shape[0]):
        real = mask[row].bool()
        alone = model(ids[row, real][None]).logits[0]
        assert_close(logits[row, real], alone, rtol=1e-5, msg=f"row {row}")


@pytest.mark.parametrize("attention_type", TYPES)
def test_output_attentions(attention_type):
    """Per layer (B, H, N, S) weights: nothing on later tokens or padded keys, real rows sum to 1, and asking for
    them does not change the logits."""
    model = FiSHGPT2LMHeadModel(tiny(attention_type=attention_type)).eval()
    ids, mask = left_padded()
    kw = dict(attention_mask=mask, position_ids=positions(mask))
    out = model(ids, output_attentions=True, **kw)
    b, n = ids.shape
    assert len(out.attentions) == model.config.n_layer
    later = torch.ones(n, n, dtype=torch.bool).triu(1)
    real = mask.bool()
    for weights in out.attentions:
        assert weights.shape == (b, model.config.n_head, n, n)
        # Only the real query rows: a padded row sees no key at all (FiSH gives it zeros, softmax spreads it evenly).
        weights = weights * real[:, None, :, None]
        assert (weights[..., later] == 0).all()
        assert (weights.masked_select(~real[:, None, None, :]) == 0).all()
        rows = weights.transpose(1, 2)[real]  # (real rows, H, S)
        assert_close(rows.sum(-1), torch.ones_like(rows[..., 0]), rtol=1e-6)
    assert_close(out.logits[real], model(ids, **kw).logits[real], rtol=1e-5)  # padded positions: undefined


@pytest.mark.parametrize("attention_type", TYPES)
def test_cached_generation_equals_the_uncached_forward_with_left_padding(attention_type):
    model = FiSHGPT2LMHeadModel(tiny(attention_type=attention_type)).eval()
    ids, mask = left_padded()
    generated = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    # token by token without a cache: the whole prefix each time
    seq, seq_mask = ids, mask
    for step in range(6):
        logits = model(seq, attention_mask=seq_mask, position_ids=positions(seq_mask), use_cache=False).logits
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        assert torch.equal(nxt[:, 0], generated[:, ids.shape[1] + step]), f"step {step}"
        seq, seq_mask = torch.cat([seq, nxt], 1), torch.cat([seq_mask, torch.ones_like(nxt)], 1)
    # the cache itself holds M global keys and H values per layer
    out = model(ids, attention_mask=mask, position_ids=positions(mask), use_cache=True)
    layer = out.past_key_values.layers[0]
    heads_qk = model.config.n_head if attention_type == "softmax" else model.config.num_global_heads
    assert layer.keys.shape[1] == heads_qk and layer.values.shape[1] == model.config.n_head
    # and logits with the cache equal logits without it, for a multi-token continuation
    more = torch.randint(3, 99, (3, 3))
    full_mask = torch.cat([mask, torch.ones_like(more)], 1)
    cached = model(more, past_key_values=out.past_key_values, attention_mask=full_mask,
                   position_ids=positions(full_mask)[:, -3:]).logits
    uncached = model(torch.cat([ids, more], 1), attention_mask=full_mask, position_ids=positions(full_mask)).logits
    assert_close(cached, uncached[:, -3:], rtol=1e-5)


@pytest.mark.parametrize("attention_type", ["fish", "hard_gfish"])
def test_sampling_with_cache_matches_sampling_without(attention_type):
    model = FiSHGPT2LMHeadModel(tiny(attention_type=attention_type)).eval()
    ids, mask = left_padded()
    runs = []
    for use_cache in (True, False):
        torch.manual_seed(123)
        runs.append(model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True, top_k=20,
                                   pad_token_id=0, use_cache=use_cache))
    assert torch.equal(runs[0], runs[1])
    torch.manual_seed(124)
    other = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True, top_k=20, pad_token_id=0)
    assert not torch.equal(other, runs[0])  # it really samples


@pytest.mark.parametrize("attention_type", ["fish", "gfish", "mish"])
def test_noise_in_training_only_and_sigma_learns(attention_type):
    model = FiSHGPT2LMHeadModel(tiny(attention_type=attention_type))
    ids = torch.randint(3, 99, (2, 10))
    model.eval()
    a, b = model(ids).logits, model(ids).logits
    assert torch.equal(a, b)  # evaluation is deterministic
    model.train()
    c, d = model(ids).logits, model(ids).logits
    assert (c - d).abs().max() > 1e-5  # the noise changes the scores in training
    _, weights = model.transformer.h[0].attn(model.transformer.wte(ids), output_attentions=True)
    _, weights2 = model.transformer.h[0].attn(model.transformer.wte(ids), output_attentions=True)
    assert (weights - weights2).abs().max() > 1e-6
    model(ids, labels=ids).loss.backward()
    sigma = model.transformer.h[0].attn.noise_std
    assert sigma.grad is not None and sigma.grad.abs().sum() > 0


@pytest.mark.parametrize("attention_type", ["hard_fish", "hard_gfish"])
def test_hard_types_have_no_noise(attention_type):
    model = FiSHGPT2LMHeadModel(tiny(attention_type=attention_type)).train()
    assert not hasattr(model.transformer.h[0].attn, "noise_std")
    ids = torch.randint(3, 99, (2, 10))
    assert torch.equal(model(ids).logits, model(ids).logits)


@pytest.mark.parametrize("attention_type", ["fish", "hard_fish", "mish", "gfish", "hard_gfish"])
def test_attention_parameters_match_app_d(attention_type):
    """App. D.2: Q/K projections of M global heads plus the mixing weights (and sigma for noisy types)."""
    n_embd, n_head, m, head_dim = 64, 8, 2, 16
    config = tiny(attention_type=attention_type, n_embd=n_embd, n_head=n_head, num_global_heads=m,
                  head_dim=head_dim)
    attn = FiSHGPT2Model(config).h[0].attn
    qk_weights = attn.c_attn.weight[:, : 2 * m * head_dim].numel()  # Conv1D (in, out); out = [Q | K | V]
    mixing = sum(p.numel() for p in attn.mixing.parameters()) if isinstance(attn.mixing, torch.nn.Module) \
        and not isinstance(attn.mixing, torch.nn.Parameter) else attn.mixing.numel()
    noise = attn.noise_std.numel() if hasattr(attn, "noise_std") else 0
    cost = fish_cost(n_embd, n_head, m, head_dim, 128, variant=attention_type)
    assert qk_weights + mixing + noise == cost["fish_params"]
    baseline = FiSHGPT2Model(tiny(attention_type="softmax", n_embd=n_embd, n_head=n_head, head_dim=head_dim))
    assert baseline.h[0].attn.c_attn.weight[:, : 2 * n_head * head_dim].numel() == cost["mha_params"]
    # and the whole layer really is smaller by that much (biases of the dropped Q/K heads on top)
    saved = sum(p.numel() for p in baseline.h[0].attn.parameters()) - sum(p.numel() for p in attn.parameters())
    assert saved == cost["params_saved"] + 2 * (n_head - m) * head_dim


def _tiny_stock_gpt2(tmp_path):
    stock = GPT2LMHeadModel(GPT2Config(**TINY)).eval()
    stock.save_pretrained(tmp_path / "gpt2")
    return stock, tmp_path / "gpt2"


def _assert_converted(fish, stock, m=2):
    """`fish` (a FiSHGPT2Model) holds the stock GPT2Model's weights: its first M Q/K heads, every value head."""
    d, md = stock.config.n_embd, m * (stock.config.n_embd // stock.config.n_head)
    for layer, stock_layer in zip(fish.h, stock.h):
        w, w_stock = layer.attn.c_attn.weight, stock_layer.attn.c_attn.weight  # Conv1D (in, out), out = [Q | K | V]
        assert torch.equal(w[:, :md], w_stock[:, :md])  # Q of the first M heads
        assert torch.equal(w[:, md:2 * md], w_stock[:, d:d + md])  # K of the first M heads
        assert torch.equal(w[:, 2 * md:], w_stock[:, 2 * d:])  # all H values
        assert torch.equal(layer.mlp.c_fc.weight, stock_layer.mlp.c_fc.weight)
        assert torch.equal(layer.attn.c_proj.weight, stock_layer.attn.c_proj.weight)
    assert torch.equal(fish.wte.weight, stock.wte.weight) and torch.equal(fish.wpe.weight, stock.wpe.weight)
    assert torch.equal(fish.ln_f.weight, stock.ln_f.weight)


@pytest.mark.parametrize("cls", [FiSHGPT2Model, FiSHGPT2LMHeadModel, FiSHGPT2ForSequenceClassification])
def test_stock_gpt2_checkpoint_converts_into_every_head_class(tmp_path, cls):
    stock, folder = _tiny_stock_gpt2(tmp_path)
    fish = cls.from_pretrained(folder, attention_type="hard_fish", num_global_heads=2, num_labels=3)
    assert type(fish) is cls and fish.config.attention_type == "hard_fish" and fish.config.num_global_heads == 2
    _assert_converted(fish.base_model, stock.transformer)
    if cls is FiSHGPT2LMHeadModel:
        assert fish.lm_head.weight.data_ptr() == fish.transformer.wte.weight.data_ptr()
    if cls is FiSHGPT2ForSequenceClassification:  # a new head, as GPT2ForSequenceClassification from an LM folder
        assert fish.score.weight.shape == (3, 32) and fish.config.num_labels == 3
    ids = torch.randint(3, 99, (2, 7))
    assert torch.isfinite(fish(ids)[0]).all()


def test_stock_gpt2_conversion_keeps_a_stock_head_and_refuses_other_head_sizes(tmp_path):
    stock, folder = _tiny_stock_gpt2(tmp_path)
    ids = torch.randint(3, 99, (2, 7))
    same = FiSHGPT2LMHeadModel.from_pretrained(folder, attention_type="softmax").eval()
    assert_close(same(ids).logits, stock(ids).logits, rtol=1e-6)
    # a stock classifier's trained head comes along
    stock_cls = GPT2ForSequenceClassification(GPT2Config(**TINY, num_labels=3)).eval()
    stock_cls.save_pretrained(tmp_path / "gpt2-cls")
    fish = FiSHGPT2ForSequenceClassification.from_pretrained(tmp_path / "gpt2-cls", attention_type="fish")
    assert torch.equal(fish.score.weight, stock_cls.score.weight)
    _assert_converted(fish.transformer, stock_cls.transformer)
    with pytest.raises(ValueError, match="cannot convert"):
        FiSHGPT2LMHeadModel.from_pretrained(folder, attention_type="fish", head_dim=4)
    with pytest.raises(ValueError, match="cannot convert"):
        FiSHGPT2LMHeadModel.from_pretrained(folder, attention_type="fish", n_head=8)


def test_stock_gpt2_conversion_honours_dtype_and_device_map(tmp_path):
    stock, folder = _tiny_stock_gpt2(tmp_path)
    fish = FiSHGPT2LMHeadModel.from_pretrained(folder, attention_type="fish", dtype=torch.bfloat16, device_map="cpu")
    assert {p.dtype for p in fish.parameters()} == {torch.bfloat16}
    assert fish.dtype == torch.bfloat16 and fish.config.dtype == torch.bfloat16
    assert {p.device.type for p in fish.parameters()} == {"cpu"}
    assert torch.equal(fish.transformer.h[0].mlp.c_fc.weight, stock.transformer.h[0].mlp.c_fc.weight.bfloat16())
    assert fish.lm_head.weight.data_ptr() == fish.transformer.wte.weight.data_ptr()
    with pytest.raises(ValueError, match="device_map"):
        FiSHGPT2LMHeadModel.from_pretrained(folder, attention_type="fish", device_map="auto")


@pytest.mark.parametrize("cls", [FiSHGPT2LMHeadModel, FiSHGPT2ForSequenceClassification])
def test_from_pretrained_with_no_checkpoint_takes_config_and_state_dict(cls):
    """HF's `from_pretrained(None, config=..., state_dict=...)`: nothing to read (before: a Hub look-up for None)."""
    saved = cls(tiny(attention_type="gfish")).eval()
    model, info = cls.from_pretrained(None, config=saved.config, state_dict=saved.state_dict(),
                                      output_loading_info=True)
    assert type(model) is cls and not info["missing_keys"] and not info["unexpected_keys"]
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in saved.state_dict().items())
    ids = torch.randint(3, 99, (2, 7))
    assert torch.equal(model.eval()(ids).logits, saved(ids).logits)
    with pytest.raises(ValueError, match="keep_heads"):  # only a stock GPT-2 checkpoint has heads to choose
        cls.from_pretrained(None, config=saved.config, state_dict=saved.state_dict(), keep_heads=[0, 1])


def test_stock_gpt2_conversion_reports_loading_info(tmp_path):
    _, folder = _tiny_stock_gpt2(tmp_path)
    fish, info = FiSHGPT2LMHeadModel.from_pretrained(folder, attention_type="fish", output_loading_info=True)
    assert info["kept_heads"] == [[0, 1], [0, 1]] and not info["unexpected_keys"]
    assert info["missing_keys"] == {f"transformer.h.{i}.attn.{n}" for i in (0, 1) for n in ("mixing", "noise_std")}
    _, info = FiSHGPT2LMHeadModel.from_pretrained(folder, attention_type="softmax", output_loading_info=True)
    assert not info["missing_keys"] and "kept_heads" not in info


def test_sequence_classification_uses_the_last_real_token():
    model = FiSHGPT2ForSequenceClassification(tiny(num_labels=3)).eval()
    ids, mask = left_padded(pad=(0, 0, 0))
    mask[1, 6:] = 0  # right padding in row 1
    out = model(ids, attention_mask=mask, labels=torch.tensor([0, 1, 2]))
    alone = model(ids[1:2, :6]).logits
    assert_close(out.logits[1:2], alone, rtol=1e-5)
    assert out.loss is not None and torch.isfinite(out.loss)


def test_gradient_checkpointing_same_gradients():
    ids = torch.randint(3, 99, (2, 10))
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = FiSHGPT2LMHeadModel(tiny(attention_type="hard_gfish")).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        model(ids, labels=ids).loss.backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    for k in grads[0]:
        assert_close(grads[1][k], grads[0][k], rtol=1e-5, msg=k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_stays_finite(dtype):
    model = FiSHGPT2LMHeadModel(tiny(attention_type="fish")).train()
    ids = torch.randint(3, 99, (2, 16))
    with torch.autocast("cpu", dtype=dtype):
        out = model(ids, labels=ids)
    assert torch.isfinite(out.logits.float()).all() and torch.isfinite(out.loss)


def test_too_long_input_is_refused_clearly():
    model = FiSHGPT2Model(tiny())
    with pytest.raises(ValueError, match=r"at most 64 tokens \(n_positions=64\)"):
        model(torch.randint(3, 99, (1, 65)))


@pytest.mark.slow
def test_remote_code_without_hf_mgk_gives_identical_logits_and_text(tmp_path):
    """One child process without hf_mgk loads the folders through AutoModelForCausalLM, AutoModel and
    AutoModelForSequenceClassification: same classes, same weights, same outputs, same generated text."""
    model = FiSHGPT2LMHeadModel(tiny(attention_type="gfish")).eval()
    classifier = FiSHGPT2ForSequenceClassification(tiny(attention_type="mish", num_labels=3)).eval()
    folder, cls_folder = tmp_path / "fish", tmp_path / "fish-cls"
    model.save_pretrained(folder)
    classifier.save_pretrained(cls_folder)
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert set(auto_map) == {"AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoModelForSequenceClassification"}
    assert {"modeling_fish_gpt2.py", "attention_fish.py", "configuration_fish_gpt2.py"} <= set(os.listdir(folder))
    assert isinstance(AutoModelForCausalLM.from_pretrained(folder), FiSHGPT2LMHeadModel)
    ids, mask = left_padded()
    kw = dict(attention_mask=mask, position_ids=positions(mask))
    with torch.no_grad():
        expected = {"causal_lm": (model, model(ids, **kw).logits),
                    "base": (model.transformer, model.transformer(ids, **kw).last_hidden_state),
                    "classifier": (classifier, classifier(ids, **kw).logits)}
    text = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    torch.save({"ids": ids, "mask": mask}, tmp_path / "inputs.pt")
    got = run_without_package(f"""
        import json, torch, transformers
        x = torch.load("inputs.pt")
        kw = dict(attention_mask=x["mask"], position_ids=(x["mask"].cumsum(-1) - 1).clamp_min(0))
        load = lambda auto, path: getattr(transformers, auto).from_pretrained(path, trust_remote_code=True).eval()
        models = {{"causal_lm": load("AutoModelForCausalLM", {str(folder)!r}),
                  "base": load("AutoModel", {str(folder)!r}),
                  "classifier": load("AutoModelForSequenceClassification", {str(cls_folder)!r})}}
        with torch.no_grad():
            saved = {{name: {{"out": m(x["ids"], **kw)[0], "state": m.state_dict()}} for name, m in models.items()}}
        text = models["causal_lm"].generate(x["ids"], attention_mask=x["mask"], max_new_tokens=5, do_sample=False,
                                            pad_token_id=0)
        torch.save(saved, "loaded.pt")
        print(json.dumps({{"classes": {{name: [type(m).__module__, type(m).__name__] for name, m in models.items()}},
                          "text": text.tolist()}}))
    """, cwd=str(tmp_path))
    loaded = torch.load(tmp_path / "loaded.pt")
    for name, (ours, output) in expected.items():
        module, class_name = got["classes"][name]
        assert module.startswith("transformers_modules") and class_name == type(ours).__name__, name
        state = ours.state_dict()
        assert loaded[name]["state"].keys() == state.keys(), name
        assert all(torch.equal(loaded[name]["state"][k], v) for k, v in state.items()), name  # the very same weights
        assert_same_outputs(loaded[name]["out"], output, name)  # float32 round-off apart, see hub.assert_same_outputs
    assert got["text"] == text.tolist()


@pytest.mark.parametrize("attention_type", ["fish", "hard_fish", "mish", "gfish", "hard_gfish"])
def test_mixing_init_choices(attention_type):
    """fish_mixing_init="mean": p_kj start at 1/M (+ small noise), GFiSH's network at PyTorch's Linear init;
    "normal" (the authors' LM code): p_kj and the network's weights N(0, initializer_range), biases 0."""
    torch.manual_seed(0)
    big = dict(n_embd=64, n_head=16, num_global_heads=4, n_layer=1)
    mean_model = FiSHGPT2LMHeadModel(tiny(attention_type=attention_type, **big))
    normal_model = FiSHGPT2LMHeadModel(tiny(attention_type=attention_type, fish_mixing_init="normal", **big))
    std = normal_model.config.initializer_range
    mean_mix, normal_mix = (m.transformer.h[0].attn.mixing for m in (mean_model, normal_model))
    if isinstance(mean_mix, torch.nn.Parameter):
        tol = 3 * std / normal_mix.numel() ** 0.5  # MiSH has M = 4 numbers, FiSH M x H = 64
        assert abs(mean_mix.mean().item() - 1 / 4) < tol and abs(normal_mix.mean().item()) < tol
        assert normal_mix.abs().max() < 5 * std and mean_mix.min() > 0.25 - 5 * std
    else:
        first, second = mean_mix[0], mean_mix[2]
        bound = 1 / 4 ** 0.5
        assert first.weight.abs().max() <= bound and first.weight.std() > 0.2  # uniform(-1/2, 1/2): std 0.29
        assert first.bias.abs().max() > 0.1
        for layer in (normal_mix[0], normal_mix[2]):
            assert abs(layer.weight.std().item() - std) < 0.008 and torch.count_nonzero(layer.bias) == 0
    assert normal_model.config.fish_mixing_init == "normal"
    with pytest.raises(ValueError, match="fish_mixing_init"):
        tiny(fish_mixing_init="uniform")


def test_mixing_init_is_not_applied_to_loaded_weights(tmp_path):
    model = FiSHGPT2LMHeadModel(tiny(attention_type="gfish"))
    model.save_pretrained(tmp_path)
    loaded = FiSHGPT2LMHeadModel.from_pretrained(tmp_path, fish_mixing_init="normal")
    for a, b in zip(model.state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(a, b)
