"""NPRF-RoBERTa as an HF model: config checks, RoBERTa parity, masks, long inputs, saving, generation."""

import json
import os

import pytest
import torch
from transformers import AutoModelForMaskedLM, RobertaConfig, RobertaForMaskedLM

from conftest import assert_close, roberta_padded_batch as batch
from hf_mgk import (
    NPRFRobertaConfig,
    NPRFRobertaForCausalLM,
    NPRFRobertaForMaskedLM,
    NPRFRobertaForQuestionAnswering,
    NPRFRobertaForSequenceClassification,
    NPRFRobertaModel,
)
from hf_mgk.attention_nprf import draw_features
from hf_mgk.hub import assert_same_outputs, run_without_package
from hf_mgk.modeling_nprf_roberta import feature_generator
from tiny import roberta as tiny_roberta

TINY = tiny_roberta(dropout=False, num_random_features=16, rpe_num_buckets=8, rpe_max_distance=16)
VARIANTS = [dict(), dict(normalize_qk=False), dict(use_rpe=False), dict(use_absolute_positions=False),
            dict(head_dim=12, num_attention_heads=3), dict(attention_type="softmax")]
IDS = ["nprf", "unnormalized", "no-rpe", "no-abs-pos", "head-dim", "softmax"]


def tiny(**kw):
    return NPRFRobertaConfig(**{**TINY, **kw})


@pytest.mark.parametrize("kw,field", [
    (dict(attention_type="performer"), "attention_type"), (dict(num_random_features=0), "num_random_features"),
    (dict(rpe_num_buckets=2), "rpe_num_buckets"), (dict(rpe_max_distance=2), "rpe_max_distance"),
    (dict(feature_redraw_interval=-1), "feature_redraw_interval"), (dict(head_dim=0), "head_dim"),
    (dict(normalize_qk="yes"), "normalize_qk"), (dict(num_attention_heads=5), "hidden_size"),
])
def test_bad_config_raises_naming_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        tiny(**kw)


def test_softmax_reproduces_roberta_masked_lm():
    roberta = RobertaForMaskedLM(RobertaConfig(**{k: v for k, v in TINY.items() if not k.startswith(("num_r", "rpe"))})).eval()
    ours = NPRFRobertaForMaskedLM(tiny(attention_type="softmax")).eval()
    missing, unexpected = ours.load_state_dict(roberta.state_dict(), strict=False)
    assert not missing and not unexpected
    ids, mask = batch()
    ref = roberta(ids, attention_mask=mask, labels=ids)
    out = ours(ids, attention_mask=mask, labels=ids)
    assert_close(out.logits[mask.bool()], ref.logits[mask.bool()], rtol=1e-6)
    assert_close(out.loss, ref.loss, rtol=1e-6)


def test_stock_roberta_checkpoint_folder_loads(tmp_path):
    roberta = RobertaForMaskedLM(RobertaConfig(**{k: v for k, v in TINY.items() if not k.startswith(("num_r", "rpe"))}))
    roberta.save_pretrained(tmp_path / "roberta")
    model, info = NPRFRobertaForMaskedLM.from_pretrained(tmp_path / "roberta", output_loading_info=True)
    assert model.config.attention_type == "nprf"
    assert all(k.endswith(("features", "forward_count")) or "relative_position" in k
               for k in info["missing_keys"]), info["missing_keys"]
    assert torch.equal(model.roberta.encoder.layer[1].attention.self.query.weight,
                       roberta.roberta.encoder.layer[1].attention.self.query.weight)


@pytest.mark.parametrize("kw", VARIANTS, ids=IDS)
def test_padding_invariance(kw):
    model = NPRFRobertaForMaskedLM(tiny(**kw)).eval()
    ids, mask = batch(b=2)
    padded = model(ids, attention_mask=mask).logits[1, :6]
    alone = model(ids[1:, :6]).logits[0]
    assert_close(padded, alone, rtol=1e-4)


@pytest.mark.parametrize("kw", VARIANTS, ids=IDS)
def test_output_attentions_give_the_implied_matrix(kw):
    model = NPRFRobertaModel(tiny(**kw)).eval()
    ids, mask = batch()
    out = model(ids, attention_mask=mask, output_attentions=True)
    assert_close(out.last_hidden_state, model(ids, attention_mask=mask).last_hidden_state, rtol=1e-4)
    w = out.attentions[0]
    assert w.shape == (3, model.config.num_attention_heads, 10, 10)
    assert_close(w.sum(-1), torch.ones(w.shape[:-1]), rtol=1e-5)
    assert w[-1, :, :, 6:].abs().max() == 0


def test_rpe_is_shared_by_all_layers_and_learns():
    model = NPRFRobertaForMaskedLM(tiny()).train()
    names = [n for n, _ in model.named_parameters() if "relative_position" in n]
    assert names == ["roberta.relative_position.weight"]
    ids, mask = batch()
    model(ids, attention_mask=mask, labels=ids).loss.backward()
    assert model.roberta.relative_position.weight.grad.abs().sum() > 0


def test_random_features_are_saved_state_and_redraw_only_in_training(tmp_path):
    model = NPRFRobertaForMaskedLM(tiny(feature_redraw_interval=2)).eval()
    ids, mask = batch()
    model.save_pretrained(tmp_path / "m")
    reloaded = AutoModelForMaskedLM.from_pretrained(tmp_path / "m").eval()
    assert torch.equal(reloaded(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)
    att = model.roberta.encoder.layer[0].attention.self
    w0 = att.features.clone()
    for _ in range(3):
        model(ids, attention_mask=mask)
    assert torch.equal(att.features, w0)  # never in evaluation
    model.train()
    model(ids, attention_mask=mask)
    assert torch.equal(att.features, w0)  # first training forward: 1 of 2
    model(ids, attention_mask=mask)
    assert not torch.equal(att.features, w0)  # second: redrawn
    # The redraw is draw 1 of this layer's own stream, and leaves the global RNG alone.
    expected = draw_features(*w0.shape, feature_generator(model.config, 0, 1))
    assert torch.equal(att.features, expected)


def test_every_layer_and_every_seed_has_its_own_features():
    def features(**kw):
        return [layer.attention.self.features for layer in NPRFRobertaModel(tiny(num_hidden_layers=3, **kw)).encoder.layer]

    first = features()
    assert all(not torch.equal(a, b) for i, a in enumerate(first) for b in first[i + 1:])
    assert all(torch.equal(a, b) for a, b in zip(first, features()))  # reproducible from the seed
    assert all(not torch.equal(a, b) for a, b in zip(first, features(random_feature_seed=1)))
    # ... and draws differ from each other and from the other layers' (no (seed, layer, draw) shares a stream).
    config = tiny()
    draws = {(layer, draw): draw_features(16, 8, feature_generator(config, layer, draw))
             for layer in range(4) for draw in range(4)}
    assert len({tuple(w.flatten().tolist()) for w in draws.values()}) == len(draws)


def test_redraws_count_one_forward_under_gradient_checkpointing():
    # Checkpointing re-runs each layer's forward in backward: counting there redrew W between forward and
    # backward (wrong gradients). Counted once per model forward, the gradients equal the plain run's.
    kw = dict(feature_redraw_interval=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    plain = NPRFRobertaForMaskedLM(tiny(**kw)).train()
    checkpointed = NPRFRobertaForMaskedLM(tiny(**kw)).train()
    checkpointed.load_state_dict(plain.state_dict())
    checkpointed.activation_checkpointing_enable()
    ids, mask = batch()
    for step in range(1, 4):
        grads = []
        for model in (plain, checkpointed):
            model.zero_grad()
            model(ids, attention_mask=mask, labels=ids).loss.backward()
            grads.append(model.roberta.encoder.layer[0].attention.self.query.weight.grad.clone())
            assert int(model.roberta.encoder.layer[0].attention.self.forward_count) == step
        assert_close(grads[1], grads[0], rtol=1e-5, msg=f"step {step}")


def test_resumed_training_redraws_at_the_same_steps(tmp_path):
    torch.manual_seed(0)
    model = NPRFRobertaForMaskedLM(tiny(feature_redraw_interval=3, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0)).train()
    ids, mask = batch()
    state = torch.random.get_rng_state()
    for _ in range(4):  # a redraw at forward 3, without touching the global RNG
        model(ids, attention_mask=mask)
    assert torch.equal(torch.random.get_rng_state(), state)
    model.save_pretrained(tmp_path / "m")
    resumed = NPRFRobertaForMaskedLM.from_pretrained(tmp_path / "m").train()
    for step in range(5, 10):  # redraws at forwards 6 and 9 in both
        model(ids, attention_mask=mask)
        resumed(ids, attention_mask=mask)
        for a, b in zip(model.roberta.encoder.layer, resumed.roberta.encoder.layer):
            assert int(b.attention.self.forward_count) == step
            assert torch.equal(a.attention.self.features, b.attention.self.features), step


def test_long_inputs_without_absolute_positions_and_a_clear_error_with_them():
    long_model = NPRFRobertaModel(tiny(use_absolute_positions=False)).eval()
    with torch.no_grad():
        out = long_model(torch.randint(3, 99, (1, 3000))).last_hidden_state
    assert out.shape == (1, 3000, 32) and torch.isfinite(out).all()
    model = NPRFRobertaModel(tiny()).eval()
    with pytest.raises(ValueError, match="at most 64 tokens \\(max_position_embeddings=66 minus RoBERTa's padding offset 2"):
        model(torch.randint(3, 99, (1, 70)))


def test_causal_lm_has_no_leak_and_cached_generation_matches_uncached():
    model = NPRFRobertaForCausalLM(tiny(is_decoder=True)).eval()
    ids = torch.randint(3, 99, (2, 12))
    base = model(ids).logits
    changed = ids.clone()
    changed[:, 7:] = torch.randint(3, 99, (2, 5))
    assert_close(model(changed).logits[:, :7], base[:, :7], rtol=1e-5)
    generated = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=1)
    seq = ids
    for _ in range(5):
        nxt = model(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    assert torch.equal(generated, seq)
    with pytest.raises(ValueError, match="is_decoder"):
        NPRFRobertaForCausalLM(tiny())


def test_cached_generation_with_left_padding_matches_uncached():
    model = NPRFRobertaForCausalLM(tiny(is_decoder=True)).eval()
    ids = torch.randint(3, 99, (3, 9))
    mask = torch.ones_like(ids)
    for row, pad in enumerate((0, 2, 5)):
        ids[row, :pad], mask[row, :pad] = 1, 0
    generated = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=1)
    seq, seq_mask = ids, mask
    for _ in range(4):  # RoBERTa positions come from the pad ids when none are given
        nxt = model(seq, attention_mask=seq_mask, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        seq, seq_mask = torch.cat([seq, nxt], 1), torch.cat([seq_mask, torch.ones_like(nxt)], 1)
    assert torch.equal(generated, seq)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_stays_finite(dtype):
    model = NPRFRobertaForMaskedLM(tiny()).train()
    ids, mask = batch()
    with torch.autocast("cpu", dtype=dtype):
        out = model(ids, attention_mask=mask, labels=ids)
    assert torch.isfinite(out.logits.float()).all() and torch.isfinite(out.loss)
    out.loss.backward()


@pytest.mark.slow
def test_remote_code_without_hf_mgk(tmp_path):
    ids, mask = batch()
    expected = {}
    for auto_name, cls, kw in [("AutoModelForMaskedLM", NPRFRobertaForMaskedLM, {}),
                               ("AutoModelForSequenceClassification", NPRFRobertaForSequenceClassification, {}),
                               ("AutoModelForQuestionAnswering", NPRFRobertaForQuestionAnswering, {}),
                               ("AutoModelForCausalLM", NPRFRobertaForCausalLM, {"is_decoder": True}),
                               ("AutoModel", NPRFRobertaModel, {})]:
        model = cls(tiny(**kw)).eval()
        model.save_pretrained(tmp_path / auto_name)
        out = model(ids, attention_mask=mask)
        expected[auto_name] = (out.start_logits if hasattr(out, "start_logits") else out[0]).tolist()
    auto_map = json.loads((tmp_path / "AutoModel" / "config.json").read_text())["auto_map"]
    assert set(auto_map) == {"AutoConfig", *expected}
    torch.save({"ids": ids, "mask": mask}, tmp_path / "inputs.pt")
    got = run_without_package(f"""
        import json, torch, transformers
        x = torch.load("inputs.pt")
        result = {{}}
        for auto_name in {list(expected)!r}:
            m = getattr(transformers, auto_name).from_pretrained(auto_name, trust_remote_code=True).eval()
            out = m(x["ids"], attention_mask=x["mask"])
            result[auto_name] = (out.start_logits if hasattr(out, "start_logits") else out[0]).tolist()
        print(json.dumps(result))
    """, cwd=str(tmp_path))
    for name, values in got.items():
        assert_same_outputs(torch.tensor(values), torch.tensor(expected[name]), name)
