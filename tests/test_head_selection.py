"""Warm starts with fewer heads than the checkpoint (MGK paper, App. B: e.g. 6 MGK heads from a 12-head BERT).

`from_pretrained(folder, num_attention_heads=H', keep_heads=...)` keeps the first H' heads or the listed ones: their
query/key/value rows and output-projection columns are the checkpoint's, so with softmax attention each kept head
computes exactly what the stock head did. Stock models here are tiny, random, saved to tmp_path; the references are
the stock modules themselves and plain slicing of their weights."""

import json
import logging

import pytest
import torch
from transformers import (
    AutoModelForMaskedLM,
    BertConfig,
    BertForMaskedLM,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    RobertaConfig,
    RobertaModel,
)

from conftest import assert_close
from hf_mgk import (
    FiSHGPT2LMHeadModel,
    MGKBertConfig,
    MGKBertForMaskedLM,
    MGKBertForQuestionAnswering,
    MGKBertForSequenceClassification,
    MGKBertForTokenClassification,
    MGKBertModel,
    NPRFRobertaConfig,
    NPRFRobertaForCausalLM,
    NPRFRobertaForMaskedLM,
    NPRFRobertaForQuestionAnswering,
    NPRFRobertaForSequenceClassification,
    NPRFRobertaModel,
)
from hf_mgk import modeling_warm_start
import tiny

D = 8  # head size of every tiny checkpoint: hidden 32 = 4 heads of 8
TINY = tiny.roberta(dropout=False, initializer_range=0.2)  # 10x the default: attention patterns far from uniform


def rows(heads):
    """Indices of the given heads' blocks in a [head 0 | head 1 | ...] dimension (written out, not hf_mgk's)."""
    return torch.cat([torch.arange(h * D, (h + 1) * D) for h in heads])


@pytest.fixture
def warnings_logged():
    """Records what hf_mgk logs on loading (transformers' loggers do not propagate to pytest's caplog)."""
    records = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = records.append
    modeling_warm_start.logger.addHandler(handler)
    yield lambda: [r.getMessage() for r in records]
    modeling_warm_start.logger.removeHandler(handler)


def stock_folder(tmp_path, family, cls=None, **overrides):
    stock_cls, config_cls = {"bert": (BertModel, BertConfig), "roberta": (RobertaModel, RobertaConfig)}[family]
    stock = (cls or stock_cls)(config_cls(**{**TINY, **overrides})).eval()
    stock.save_pretrained(tmp_path / family)
    return stock, tmp_path / family


FAMILIES = {"mgk-bert": ("bert", MGKBertModel), "nprf-roberta": ("roberta", NPRFRobertaModel)}


def _ids(vocab=99):
    return torch.randint(3, vocab, (2, 9))


# ------------------------------------------------------------------ (a, e) softmax: kept heads = the stock heads
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("keep", [[3, 1], [[3, 1], [2, 0]]], ids=["one-list", "per-layer"])
def test_softmax_kept_heads_compute_the_stock_heads(family, keep, tmp_path):
    stock_family, ours_cls = FAMILIES[family]
    stock, folder = stock_folder(tmp_path, stock_family)
    ours = ours_cls.from_pretrained(folder, attention_type="softmax", keep_heads=keep).eval()
    assert ours.config.num_attention_heads == 2 and ours.config.attention_head_size == D
    per_layer = keep if isinstance(keep[0], list) else [keep, keep]
    with torch.no_grad():
        hidden = stock(_ids(), output_hidden_states=True).hidden_states
        for layer, heads in enumerate(per_layer):
            h = hidden[layer]  # the stock layer's own input, given to both
            stock_attn, ours_attn = stock.encoder.layer[layer].attention, ours.encoder.layer[layer].attention
            stock_ctx = stock_attn.self(h)[0]  # (B, N, 4 * D): per-head outputs before the output projection
            ours_ctx = ours_attn.self(h)[0]
            assert ours_ctx.shape[-1] == 2 * D
            for new, old in enumerate(heads):
                assert_close(ours_ctx[..., new * D:(new + 1) * D], stock_ctx[..., old * D:(old + 1) * D], rtol=1e-5,
                             msg=f"layer {layer} head {old}")
            # the whole attention block: the stock output projection restricted to the kept heads' columns
            dense = stock_attn.output.dense
            cols = rows(heads)
            expected = stock_attn.output.LayerNorm(stock_ctx[..., cols] @ dense.weight[:, cols].T + dense.bias + h)
            assert_close(ours_attn(h)[0], expected, rtol=1e-5, msg=f"layer {layer} attention output")


# ------------------------------------------------------------------ (b) mgk: the kept heads' weights, exactly
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_mgk_keeps_the_first_heads_weights_exactly(dtype, tmp_path):
    stock, folder = stock_folder(tmp_path, "bert", BertForMaskedLM)
    ours = MGKBertForMaskedLM.from_pretrained(folder, attention_type="mgk", num_attention_heads=2, dtype=dtype)
    cast = (lambda t: t.to(dtype)) if dtype is not None else (lambda t: t)
    assert {p.dtype for p in ours.parameters()} == {dtype or torch.float32}
    assert ours.config.num_attention_heads == 2 and ours.config.head_dim == D
    kept = rows([0, 1])
    for stock_layer, layer in zip(stock.bert.encoder.layer, ours.bert.encoder.layer, strict=True):
        s, o = stock_layer.attention.self, layer.attention.self
        for name in ("query", "key", "value"):
            assert torch.equal(getattr(o, name).weight, cast(getattr(s, name).weight[kept])), name
            assert torch.equal(getattr(o, name).bias, cast(getattr(s, name).bias[kept])), name
        dense, stock_dense = layer.attention.output.dense, stock_layer.attention.output.dense
        assert torch.equal(dense.weight, cast(stock_dense.weight[:, kept]))
        assert torch.equal(dense.bias, cast(stock_dense.bias))
        assert torch.equal(layer.intermediate.dense.weight, cast(stock_layer.intermediate.dense.weight))
        # the second key starts from the kept heads' key plus noise of std 0.1 * initializer_range (the existing
        # warm start, sliced)
        noise = o.extra_keys[0].weight.float() - s.key.weight[kept]
        assert 0.5 * 0.02 < noise.std() < 1.5 * 0.02
        assert torch.equal(o.extra_keys[0].bias, cast(s.key.bias[kept]))
    assert torch.equal(ours.bert.embeddings.word_embeddings.weight, cast(stock.bert.embeddings.word_embeddings.weight))
    assert torch.equal(ours.cls.predictions.transform.dense.weight, cast(stock.cls.predictions.transform.dense.weight))


ALL_HEADS = [
    ("bert", MGKBertModel, {}),
    ("bert", MGKBertForMaskedLM, {}),
    ("bert", MGKBertForSequenceClassification, {"num_labels": 3}),
    ("bert", MGKBertForTokenClassification, {"num_labels": 3}),
    ("bert", MGKBertForQuestionAnswering, {}),
    ("roberta", NPRFRobertaModel, {}),
    ("roberta", NPRFRobertaForMaskedLM, {}),
    ("roberta", NPRFRobertaForCausalLM, {"is_decoder": True}),
    ("roberta", NPRFRobertaForSequenceClassification, {"num_labels": 3}),
    ("roberta", NPRFRobertaForQuestionAnswering, {}),
]


@pytest.mark.parametrize("family,cls,extra", ALL_HEADS, ids=[c.__name__ for _, c, _ in ALL_HEADS])
def test_every_head_class_selects_heads(family, cls, extra, tmp_path):
    stock, folder = stock_folder(tmp_path, family)
    model, info = cls.from_pretrained(folder, keep_heads=[2, 3], output_loading_info=True, **extra)
    assert type(model) is cls and model.config.num_attention_heads == 2 and not model.training
    assert info["kept_heads"] == [[2, 3], [2, 3]]
    for stock_layer, layer in zip(stock.encoder.layer, model.base_model.encoder.layer, strict=True):
        assert torch.equal(layer.attention.self.value.weight, stock_layer.attention.self.value.weight[rows([2, 3])])
    assert torch.isfinite(model(_ids())[0]).all()


# ------------------------------------------------------------------ (c) bad keep_heads
@pytest.mark.parametrize("kwargs,message", [
    ({"keep_heads": [1, 1]}, "more than once"),
    ({"keep_heads": [0, 4]}, "out of range"),
    ({"keep_heads": [-1, 0]}, "out of range"),
    ({"keep_heads": [0], "num_attention_heads": 2}, "lists 1 heads but num_attention_heads=2"),
    ({"keep_heads": [[0, 1], [0, 1], [0, 1]]}, "3 lists but the checkpoint has 2 layers"),
    ({"keep_heads": [[0, 1], [0, 0]]}, r"\(layer 1\) names a head more than once"),
    ({"keep_heads": ["0", 1]}, "integer head indices"),
    ({"keep_heads": [True, False]}, "integer head indices"),
    ({"keep_heads": []}, "non-empty"),
    ({"keep_heads": [[], []]}, r"\(layer 0\) is empty"),
])
def test_bad_keep_heads_are_refused_by_name(kwargs, message, tmp_path):
    _, folder = stock_folder(tmp_path, "bert")
    with pytest.raises(ValueError, match=rf"keep_heads.*{message}"):
        MGKBertModel.from_pretrained(folder, attention_type="mgk", **kwargs)


def test_other_head_sizes_and_foreign_checkpoints_are_refused(tmp_path):
    _, folder = stock_folder(tmp_path, "bert")
    with pytest.raises(ValueError, match="head_dim=16 differs from the checkpoint's head size 8"):
        MGKBertModel.from_pretrained(folder, num_attention_heads=2, head_dim=16)
    with pytest.raises(ValueError, match="num_attention_heads must be an integer >= 1"):
        MGKBertModel.from_pretrained(folder, num_attention_heads=0)
    with pytest.raises(ValueError, match="keep_heads selects heads of a 'roberta' or 'nprf-roberta' checkpoint"):
        NPRFRobertaModel.from_pretrained(folder, keep_heads=[0, 1])  # a BERT folder


# ------------------------------------------------------------------ (d) the report
def test_kept_heads_are_logged_and_returned(tmp_path, warnings_logged):
    _, folder = stock_folder(tmp_path, "bert")
    _, info = MGKBertModel.from_pretrained(folder, keep_heads=[3, 1], output_loading_info=True)
    assert info["kept_heads"] == [[3, 1], [3, 1]]
    assert any("kept heads [3, 1] of 4 in each of the 2 layers" in m for m in warnings_logged())
    _, info = MGKBertModel.from_pretrained(folder, keep_heads=[[3, 1], [0, 2]], output_loading_info=True)
    assert info["kept_heads"] == [[3, 1], [0, 2]]
    assert any("layer 0: heads [3, 1] of 4; layer 1: heads [0, 2] of 4" in m for m in warnings_logged())
    # the first H' by default; importance rankings may come as a tensor
    _, info = MGKBertModel.from_pretrained(folder, num_attention_heads=3, output_loading_info=True)
    assert info["kept_heads"] == [[0, 1, 2], [0, 1, 2]]
    _, info = MGKBertModel.from_pretrained(folder, keep_heads=torch.tensor([[1, 0], [3, 2]]), output_loading_info=True)
    assert info["kept_heads"] == [[1, 0], [3, 2]]
    # a config object asking for fewer heads is a request too
    config = MGKBertConfig.from_pretrained(folder, num_attention_heads=2, head_dim=D)
    model, info = MGKBertModel.from_pretrained(folder, config=config, output_loading_info=True)
    assert info["kept_heads"] == [[0, 1], [0, 1]] and model.config.num_attention_heads == 2


def test_every_family_warm_starts_through_one_protocol(tmp_path, warnings_logged):
    """Both stacks run WarmStartMixin's from_pretrained (their hooks differ, not the protocol): the same report,
    and nothing to report when every checkpoint head is kept in order, on either stack."""
    from hf_mgk.families import FAMILIES
    from hf_mgk.modeling_warm_start import WarmStartMixin

    for family in FAMILIES.values():
        assert family.pretrained_class.from_pretrained.__func__ is WarmStartMixin.from_pretrained.__func__, family
    _, folder = stock_folder(tmp_path, "bert")
    _, info = MGKBertModel.from_pretrained(folder, keep_heads=[0, 1, 2, 3], output_loading_info=True)
    assert info["kept_heads"] == [[0, 1, 2, 3]] * 2 and not any("kept heads" in m for m in warnings_logged())


def test_same_heads_load_as_before(tmp_path, warnings_logged):
    """No selection asked (or the checkpoint's own count): HF's loading, untouched, and nothing reported."""
    stock, folder = stock_folder(tmp_path, "bert")
    for kwargs in ({}, {"num_attention_heads": 4}):
        model, info = MGKBertModel.from_pretrained(folder, attention_type="softmax", output_loading_info=True, **kwargs)
        assert "kept_heads" not in info and model.config.head_dim is None
        assert torch.equal(model.encoder.layer[1].attention.self.query.weight,
                           stock.encoder.layer[1].attention.self.query.weight)
    assert not any("kept heads" in m for m in warnings_logged())


# ------------------------------------------------------------------ saved hf-mgk folders: their per-head tensors too
def test_saved_mgk_folder_slices_its_per_head_parameters(tmp_path, warnings_logged):
    config = MGKBertConfig(**TINY, attention_type="smgk", num_keys=3)
    saved = MGKBertModel(config).eval()
    with torch.no_grad():
        for layer in saved.encoder.layer:
            layer.attention.self.prior_logits.normal_()
            layer.attention.self.key_shift.normal_()
    saved.save_pretrained(tmp_path / "saved")
    same = MGKBertModel.from_pretrained(tmp_path / "saved")
    assert all(torch.equal(a, b) for a, b in zip(same.state_dict().values(), saved.state_dict().values(), strict=True))
    assert not warnings_logged()
    small = MGKBertModel.from_pretrained(tmp_path / "saved", keep_heads=[2, 0])
    assert small.config.attention_type == "smgk" and small.config.num_keys == 3
    for layer, old in zip(small.encoder.layer, saved.encoder.layer, strict=True):
        assert torch.equal(layer.attention.self.prior_logits, old.attention.self.prior_logits[[2, 0]])
        assert torch.equal(layer.attention.self.key_shift, old.attention.self.key_shift[[2, 0]])
        assert torch.equal(layer.attention.self.key.weight, old.attention.self.key.weight[rows([2, 0])])


def test_saved_nprf_folder_shares_one_head_choice_for_its_position_table(tmp_path):
    saved = NPRFRobertaModel(NPRFRobertaConfig(**TINY, num_random_features=16, rpe_num_buckets=8,
                                               rpe_max_distance=16)).eval()
    with torch.no_grad():
        saved.relative_position.weight.normal_()
    saved.save_pretrained(tmp_path / "saved")
    small = NPRFRobertaModel.from_pretrained(tmp_path / "saved", keep_heads=[3, 1])
    assert torch.equal(small.relative_position.weight, saved.relative_position.weight[[3, 1]])
    assert torch.equal(small.encoder.layer[0].attention.self.features, saved.encoder.layer[0].attention.self.features)
    with pytest.raises(ValueError, match="keep_heads gives different heads per layer.*relative_position.weight"):
        NPRFRobertaModel.from_pretrained(tmp_path / "saved", keep_heads=[[3, 1], [0, 1]])


def test_nprf_from_stock_roberta_keeps_heads_per_layer(tmp_path):
    """The stock checkpoint has no position table (it starts at zero), so per-layer choices are fine."""
    stock, folder = stock_folder(tmp_path, "roberta")
    model = NPRFRobertaModel.from_pretrained(folder, attention_type="nprf", keep_heads=[[3, 1], [0, 2]])
    for heads, layer, stock_layer in zip([[3, 1], [0, 2]], model.encoder.layer, stock.encoder.layer, strict=True):
        for name in ("query", "key", "value"):
            assert torch.equal(getattr(layer.attention.self, name).weight,
                               getattr(stock_layer.attention.self, name).weight[rows(heads)])
    assert torch.equal(model.relative_position.weight, torch.zeros(2, model.config.rpe_num_buckets))


# ------------------------------------------------------------------ (f) the converted model saves and reloads
@pytest.mark.parametrize("family,cls", [("bert", MGKBertForMaskedLM), ("roberta", NPRFRobertaForMaskedLM)])
def test_converted_model_reloads_identically(family, cls, tmp_path):
    _, folder = stock_folder(tmp_path, family)
    model = cls.from_pretrained(folder, keep_heads=[3, 1]).eval()
    model.save_pretrained(tmp_path / "converted")
    saved = json.loads((tmp_path / "converted" / "config.json").read_text())
    assert "keep_heads" not in saved and "kept_heads" not in saved
    assert saved["num_attention_heads"] == 2 and saved["head_dim"] == D
    assert (tmp_path / "converted" / "modeling_warm_start.py").exists()  # travels with the remote code
    reloaded, info = cls.from_pretrained(tmp_path / "converted", output_loading_info=True)
    assert "kept_heads" not in info and not info["missing_keys"] and not info["unexpected_keys"]
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(reloaded.eval()(ids).logits, model(ids).logits)


def test_auto_classes_pass_the_choice_through_for_a_saved_folder(tmp_path):
    """AutoModel reads the folder's config first and hands it over; keep_heads reaches the model, not the config."""
    saved = MGKBertForMaskedLM(MGKBertConfig(**TINY)).eval()
    saved.save_pretrained(tmp_path / "saved")
    model, info = AutoModelForMaskedLM.from_pretrained(tmp_path / "saved", keep_heads=[1, 2], output_loading_info=True)
    assert type(model) is MGKBertForMaskedLM and info["kept_heads"] == [[1, 2], [1, 2]]
    assert not hasattr(model.config, "keep_heads")
    query = saved.bert.encoder.layer[0].attention.self.query.weight
    assert torch.equal(model.bert.encoder.layer[0].attention.self.query.weight, query[rows([1, 2])])
    model = AutoModelForMaskedLM.from_pretrained(tmp_path / "saved", num_attention_heads=3)
    assert torch.equal(model.bert.encoder.layer[0].attention.self.query.weight, query[rows([0, 1, 2])])


# ------------------------------------------------------------------ FiSH-GPT2: the list choice of global heads
def test_fish_keeps_the_listed_global_heads(tmp_path, warnings_logged):
    config = GPT2Config(**tiny.gpt2(n_positions=32, initializer_range=0.2))
    stock = GPT2LMHeadModel(config).eval()
    stock.save_pretrained(tmp_path / "gpt2")
    fish, info = FiSHGPT2LMHeadModel.from_pretrained(tmp_path / "gpt2", attention_type="fish", keep_heads=[3, 1],
                                                     output_loading_info=True)
    assert fish.config.num_global_heads == 2 and info["kept_heads"] == [[3, 1], [3, 1]]
    assert any(".attn.mixing" in k for k in info["missing_keys"])
    assert any("kept heads [3, 1] of 4 in each of the 2 layers as the global query/key heads" in m
               for m in warnings_logged())
    for layer, stock_layer in zip(fish.transformer.h, stock.transformer.h, strict=True):
        w, w_stock = layer.attn.c_attn.weight, stock_layer.attn.c_attn.weight  # (in, [Q | K | V])
        assert torch.equal(w[:, :2 * D], w_stock[:, rows([3, 1])])
        assert torch.equal(w[:, 2 * D:4 * D], w_stock[:, 32 + rows([3, 1])])
        assert torch.equal(w[:, 4 * D:], w_stock[:, 64:])
    with pytest.raises(ValueError, match="keep_heads.*lists 2 heads but num_global_heads=3"):
        FiSHGPT2LMHeadModel.from_pretrained(tmp_path / "gpt2", num_global_heads=3, keep_heads=[3, 1])
    with pytest.raises(ValueError, match="keep_heads chooses which heads of a stock GPT-2 checkpoint"):
        FiSHGPT2LMHeadModel.from_pretrained(tmp_path / "gpt2", attention_type="softmax", keep_heads=[3, 1])


def test_evenly_spaced_heads():
    from hf_mgk.modeling_warm_start import evenly_spaced_heads

    assert evenly_spaced_heads(12, 6) == [0, 2, 4, 6, 8, 10]
    assert evenly_spaced_heads(12, 5) == [0, 2, 4, 7, 9]
    assert evenly_spaced_heads(4, 4) == [0, 1, 2, 3] and evenly_spaced_heads(8, 1) == [0]
    for count in (0, 13):
        with pytest.raises(ValueError, match="count"):
            evenly_spaced_heads(12, count)
