"""MGK-GPT2: the MGK attention in causal form against Eq. 7 written out, no causal leak (the EM prior included),
the KV cache, left padding, GPT-2 parity and warm start with head selection, saving, gradient checkpointing."""

import copy
import math

import pytest
import torch
from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

import eq7
from conftest import assert_close, left_padded, positions
from hf_mgk import MGKGPT2Config, MGKGPT2ForSequenceClassification, MGKGPT2LMHeadModel, MGKGPT2Model
from tiny import gpt2 as tiny_gpt2

TINY = tiny_gpt2(dropout=False, special_ids=True)
# (attention_type, e_step, prior): every MGK type, both E-steps, the three priors
VARIANTS = [("softmax", "soft", "learned")] + [
    (t, e, p) for t in ("mgk", "smgk") for e in ("soft", "hard") for p in ("learned", "em", "uniform")
    if not (e == "hard" and p != "learned")  # the hard E-step has no prior
] + [(t, "soft", p) for t in ("mlk", "smlk") for p in ("learned", "em", "uniform")]
IDS = [f"{t}-{e}-{p}" for t, e, p in VARIANTS]


def tiny(attention_type="mgk", e_step="soft", mgk_prior="learned", **kw):
    return MGKGPT2Config(**{**TINY, "attention_type": attention_type, "e_step": e_step, "mgk_prior": mgk_prior, **kw})


def make(variant, cls=MGKGPT2LMHeadModel, **kw):
    """A model of this variant with a prior that is not uniform (so that pi matters in every comparison)."""
    model = cls(tiny(*variant, **kw)).eval()
    with torch.no_grad():
        for block in model.base_model.h:
            att = block.attn
            if att.prior_type == "learned":
                att.prior_logits.normal_()
            elif att.prior_type == "em":
                att.prior.copy_(torch.softmax(torch.randn_like(att.prior), -1))
            if hasattr(att, "key_shift"):
                att.key_shift.normal_(std=0.3)
    return model


# ---------------------------------------------------------------------------------------------- Eq. 7 written out
def eq7_reference(att, x, real):
    """The attention block's output (before the residual) for hidden states x (B, N, d), from the paper's formulas
    written out one query at a time (tests/eq7.py): query i sees the real positions j <= i; MGK (Eq. 7, soft or
    hard E-step), MLK (Sec. 2.4) or the softmax baseline, over this block's own projections, keys (option A's extra
    key projections, or sMGK's key shifts) and prior pi. sigma_r^2 = mgk_variances[r] * sqrt(D). Rows of padded
    queries are zero (they are not compared)."""
    config = att.config
    b, n, _ = x.shape
    h, d, m = att.num_heads, att.head_dim, att.num_keys
    inner = h * d
    w, bias = att.c_attn.weight, att.c_attn.bias

    def heads(t):
        return t.view(b, n, h, d).transpose(1, 2)

    q = heads(x @ w[:, :inner] + bias[:inner])
    k = heads(x @ w[:, inner:2 * inner] + bias[inner:2 * inner])
    v = heads(x @ w[:, 2 * inner:] + bias[2 * inner:])
    kind = config.attention_type
    if kind in ("mgk", "mlk"):
        keys = torch.stack([k] + [heads(x @ e.weight + e.bias) for e in att.extra_keys], 2)
    elif kind in ("smgk", "smlk"):
        keys = eq7.shifted_keys(k, att.key_shift)
    if att.prior_type == "learned":
        pi = torch.softmax(att.prior_logits, -1)
    elif att.prior_type == "em":
        pi = att.prior
    else:
        pi = torch.full((h, m), 1.0 / m)
    mask = dict(attention_mask=real, is_causal=True)
    if kind == "softmax":
        out, _ = eq7.dot_product(q, k, v, **mask)
    elif kind in ("mlk", "smlk"):
        out, _ = eq7.mlk(q, keys, v, log_prior=pi.log(), **mask)
    else:
        var = [s * math.sqrt(d) for s in config.mgk_variances[:m]]
        out, _ = eq7.mgk(q, keys, v, variances=var, log_prior=pi.log(), e_step=config.e_step, **mask)
    return att.c_proj(out.transpose(1, 2).reshape(b, n, inner))


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_causal_attention_is_eq7_written_out_with_padding(variant):
    torch.manual_seed(0)
    att = make(variant).transformer.h[0].attn.double()
    x = torch.randn(2, 7, 32, dtype=torch.float64, requires_grad=True)
    real = torch.ones(2, 7, dtype=torch.bool)
    real[1, :3] = False  # left padding
    out, _ = att(x, None, real)
    expected = eq7_reference(att, x, real)
    rows = real[..., None].double()
    assert_close(out * rows, expected * rows, rtol=1e-10, atol=1e-12)
    probe = torch.randn_like(out) * rows
    leaves = [x] + [p for p in att.parameters()]
    ours = torch.autograd.grad((out * probe).sum(), leaves, allow_unused=True)
    theirs = torch.autograd.grad((expected * probe).sum(), leaves, allow_unused=True)
    for (name, _), g, r in zip([("x", x)] + list(att.named_parameters()), ours, theirs, strict=True):
        if r is None:  # a weight the reference does not use (the prior of the hard E-step has none)
            assert g is None or not g.any(), name
            continue
        assert_close(g, r, rtol=1e-9, atol=1e-12, msg=name)


# --------------------------------------------------------------------------------------------------- no causal leak
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_no_causal_leak_in_training_including_the_em_prior(variant):
    """A later token changed: every earlier logit bit-identical, in training mode (the EM prior's M-step runs in
    that forward, but its pi is used only from the next forward on); the loss of the earlier positions' gradient
    is the same too."""
    torch.manual_seed(1)
    model = make(variant).train()
    other = copy.deepcopy(model)
    ids = torch.randint(3, 99, (2, 12))
    changed = ids.clone()
    changed[:, 8] = (changed[:, 8] + 1) % 99
    before = {k: v.clone() for k, v in model.state_dict().items()}
    logits = model(ids).logits
    logits_changed = other(changed).logits
    assert torch.equal(logits[:, :8], logits_changed[:, :8])
    assert not torch.equal(logits[:, 8:], logits_changed[:, 8:])
    if variant[2] == "em" and variant[1] == "soft":
        prior = "transformer.h.0.attn.prior"
        assert not torch.equal(model.state_dict()[prior], before[prior])  # the M-step ran ...
        assert not torch.equal(model.state_dict()[prior], other.state_dict()[prior])  # ... on all tokens, for later
        # the next forward uses it: the pi estimated now changes the next forward's logits
        assert not torch.equal(model(ids).logits, logits)


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_gradients_of_earlier_positions_do_not_depend_on_later_tokens(variant):
    torch.manual_seed(2)
    model = make(variant).train()
    ids = torch.randint(3, 99, (2, 10))
    changed = ids.clone()
    changed[:, 7:] = (changed[:, 7:] + 5) % 99
    grads = []
    for batch in (ids, changed):
        m = copy.deepcopy(model)
        m(batch).logits[:, :7].pow(2).sum().backward()
        grads.append({n: p.grad for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        if "wte" in name or "lm_head" in name:  # the later tokens' own embedding rows get no gradient either way
            continue
        assert_close(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-7, msg=name)


# ---------------------------------------------------------------------------------------------------- the KV cache
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_token_by_token_decoding_equals_the_full_forward(variant):
    torch.manual_seed(3)
    model = make(variant)
    ids = torch.randint(3, 99, (2, 10))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :4], use_cache=True)
        steps = [out.logits]
        for t in range(4, 10):
            out = model(ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
    assert_close(torch.cat(steps, 1), full, rtol=1e-5)
    cache = out.past_key_values
    if variant[0] in ("mgk", "mlk"):  # the cache holds the M keys of each position (side by side) and its value
        keys = cache.layers[0].keys if hasattr(cache, "layers") else cache.key_cache[0]
        assert keys.shape == (2, 4, 10, 2 * 8)


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_cached_generation_equals_uncached_and_left_padded_rows_equal_rows_alone(variant):
    torch.manual_seed(4)
    model = make(variant)
    ids, mask = left_padded()
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        cached = model.generate(ids, attention_mask=mask, **kw)
        uncached = model.generate(ids, attention_mask=mask, use_cache=False, **kw)
        assert torch.equal(cached, uncached)
        batch_logits = model(ids, attention_mask=mask, position_ids=positions(mask)).logits
        for row in range(ids.shape[0]):
            real = mask[row].bool()
            alone = model(ids[row:row + 1, real]).logits
            assert_close(batch_logits[row:row + 1, real], alone, rtol=1e-5)
            generated = model.generate(ids[row:row + 1, real], **kw)
            assert torch.equal(cached[row, ids.shape[1]:], generated[0, int(real.sum()):])


def test_static_cache_generation_equals_dynamic():
    torch.manual_seed(5)
    for variant in [("mgk", "soft", "learned"), ("smgk", "hard", "learned"), ("mlk", "soft", "em")]:
        model = make(variant)
        ids, mask = left_padded(b=2, pad=(0, 2))
        kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
        with torch.no_grad():
            assert torch.equal(model.generate(ids, cache_implementation="static", **kw), model.generate(ids, **kw))


# ------------------------------------------------------------------------------------- GPT-2 parity and warm start
@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    torch.manual_seed(6)
    path = tmp_path_factory.mktemp("gpt2")
    GPT2LMHeadModel(GPT2Config(**{**TINY, "attn_pdrop": 0.0})).save_pretrained(path)
    return path


def test_softmax_from_a_stock_checkpoint_is_gpt2(gpt2_dir):
    gpt2 = GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()
    ours = MGKGPT2LMHeadModel.from_pretrained(gpt2_dir, attention_type="softmax")
    ids, mask = left_padded()
    with torch.no_grad():
        assert torch.equal(ours(ids, attention_mask=mask, position_ids=positions(mask)).logits,
                           gpt2(ids, attention_mask=mask, position_ids=positions(mask)).logits)
        kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert torch.equal(ours.generate(ids, **kw), gpt2.generate(ids, **kw))
    cls_gpt2 = GPT2ForSequenceClassification.from_pretrained(gpt2_dir, num_labels=3).eval()
    cls_ours = MGKGPT2ForSequenceClassification.from_pretrained(gpt2_dir, num_labels=3, attention_type="softmax")
    cls_ours.score.load_state_dict(cls_gpt2.score.state_dict())
    with torch.no_grad():
        assert_close(cls_ours(ids, attention_mask=mask).logits, cls_gpt2(ids, attention_mask=mask).logits, rtol=1e-6)


def test_warm_start_with_fewer_heads_is_gpt2_without_the_dropped_heads(gpt2_dir):
    """Softmax with heads [1, 3] of 4 kept computes GPT-2 whose other heads' output rows are zero."""
    kept = [[1, 3], [2, 0]]
    ours, info = MGKGPT2LMHeadModel.from_pretrained(gpt2_dir, attention_type="softmax", keep_heads=kept,
                                                    output_loading_info=True)
    assert info["kept_heads"] == kept and ours.config.n_head == 2 and ours.config.head_dim == 8
    gpt2 = GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()
    with torch.no_grad():
        for layer, heads in enumerate(kept):
            dropped = [h for h in range(4) if h not in heads]
            for h in dropped:
                gpt2.transformer.h[layer].attn.c_proj.weight[h * 8:(h + 1) * 8] = 0
        ids = torch.randint(3, 99, (2, 11))
        assert_close(ours(ids).logits, gpt2(ids).logits, rtol=1e-5)


def test_warm_start_mgk_extra_keys_start_from_the_kept_keys(gpt2_dir, caplog):
    stock = GPT2LMHeadModel.from_pretrained(gpt2_dir).state_dict()
    with caplog.at_level("WARNING"):
        model, info = MGKGPT2LMHeadModel.from_pretrained(gpt2_dir, num_attention_heads=2, num_keys=3,
                                                         output_loading_info=True)
    assert "kept heads [0, 1] of 4" in caplog.text
    assert model.config.attention_type == "mgk" and model.config.mgk_variances == [1.0, 3.0, 5.0]
    assert {k for k in info["missing_keys"] if "prior_logits" not in k} == set()
    att = model.transformer.h[1].attn
    w = stock["transformer.h.1.attn.c_attn.weight"]
    key = w[:, 32:48]  # heads 0, 1 of the key block
    assert torch.equal(att.c_attn.weight[:, 16:32], key)
    for extra in att.extra_keys:
        diff = extra.weight - key
        assert 0 < diff.abs().max() < 0.1 * 0.02 * 6  # the key plus noise of a tenth of the init scale
        assert torch.equal(extra.bias, stock["transformer.h.1.attn.c_attn.bias"][32:48])
    assert not torch.equal(att.extra_keys[0].weight, att.extra_keys[1].weight)


@pytest.mark.parametrize("kwargs,message", [
    (dict(keep_heads=[0, 4]), "out of range"),
    (dict(n_head=5), "n_head=5 is more than"),
    (dict(n_head=2, head_dim=4), "head size"),
    (dict(keep_heads=[[0, 1]]), "one list per layer"),
])
def test_warm_start_errors_name_the_problem(gpt2_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        MGKGPT2LMHeadModel.from_pretrained(gpt2_dir, **kwargs)


def test_keep_heads_needs_a_stock_checkpoint(tmp_path):
    MGKGPT2LMHeadModel(tiny()).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="keep_heads chooses which heads of a stock GPT-2"):
        MGKGPT2LMHeadModel.from_pretrained(tmp_path, keep_heads=[0, 1])


# --------------------------------------------------------------------------------------- config, saving, training
@pytest.mark.parametrize("kw,field", [
    (dict(attention_type="mgkk"), "attention_type"), (dict(num_keys=0), "num_keys"), (dict(e_step="x"), "e_step"),
    (dict(mgk_prior="x"), "mgk_prior"), (dict(n_head=5), "n_embd"), (dict(head_dim=0), "head_dim"),
    (dict(mgk_variances=[1.0]), "mgk_variances"), (dict(mgk_variances=[1.0, -1.0]), "mgk_variances"),
    (dict(attention_type="mlk", e_step="hard"), "e_step"), (dict(n_positions=0), "n_positions"),
])
def test_config_errors_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        tiny(**kw)


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_save_and_reload_gives_identical_logits(variant, tmp_path):
    torch.manual_seed(7)
    model = make(variant)
    model.save_pretrained(tmp_path)
    again = MGKGPT2LMHeadModel.from_pretrained(tmp_path)
    ids, mask = left_padded()
    with torch.no_grad():
        assert torch.equal(again(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)
    assert type(MGKGPT2Model.from_pretrained(tmp_path)) is MGKGPT2Model


def test_head_dim_fixes_the_head_size_whatever_the_heads():
    model = MGKGPT2LMHeadModel(tiny(n_head=3, head_dim=16))
    att = model.transformer.h[0].attn
    assert att.c_attn.weight.shape == (32, 3 * 48) and att.c_proj.weight.shape == (48, 32)
    assert att.extra_keys[0].weight.shape == (32, 48)
    assert model(torch.randint(3, 99, (1, 5))).logits.shape == (1, 5, 99)


@pytest.mark.parametrize("variant", [("mgk", "soft", "em"), ("smgk", "soft", "em"), ("mlk", "soft", "em"),
                                     ("mgk", "hard", "learned")])
def test_gradient_checkpointing_is_exact_and_the_em_step_runs_once(variant):
    torch.manual_seed(8)
    model = make(variant).train()
    other = copy.deepcopy(model)
    other.gradient_checkpointing_enable()
    ids = torch.randint(3, 99, (2, 10))
    for m in (model, other):
        m(ids, labels=ids).loss.backward()
    for (name, p), (_, q) in zip(model.named_parameters(), other.named_parameters(), strict=True):
        assert_close(q.grad, p.grad, rtol=1e-6, atol=1e-9, msg=name)
    for (name, b), (_, c) in zip(model.named_buffers(), other.named_buffers(), strict=True):
        assert torch.equal(b, c), name


def test_sequence_classification_reads_the_last_real_token():
    torch.manual_seed(9)
    model = make(("mgk", "soft", "learned"), cls=MGKGPT2ForSequenceClassification, num_labels=3)
    ids, mask = left_padded()
    with torch.no_grad():
        logits = model(ids, attention_mask=mask, position_ids=positions(mask)).logits
        for row in range(ids.shape[0]):
            alone = model(ids[row:row + 1, mask[row].bool()]).logits
            assert_close(logits[row:row + 1], alone, rtol=1e-5)
    labels = torch.tensor([0, 2, 1])
    loss = model(ids, attention_mask=mask, position_ids=positions(mask), labels=labels).loss
    assert_close(loss, torch.nn.functional.cross_entropy(logits, labels), rtol=1e-5)


def test_a_hooked_projection_is_not_bypassed():
    """MGK-GPT2 option A fuses Q, V and the M keys into one product only while c_attn and the extra keys are bare
    layers: a forward hook on one changes the outputs; a hook that changes nothing gives the fused outputs."""
    import hf_mgk
    import tiny

    torch.manual_seed(0)
    model = hf_mgk.MGKGPT2Model(hf_mgk.MGKGPT2Config(**tiny.gpt2(dropout=False), num_keys=2)).eval()
    ids = torch.randint(5, 99, (2, 7))
    with torch.no_grad():
        fused = model(input_ids=ids).last_hidden_state
        for module in (model.h[0].attn.c_attn, model.h[0].attn.extra_keys[0]):
            handle = module.register_forward_hook(lambda m, args, out: out)
            assert torch.allclose(model(input_ids=ids).last_hidden_state, fused, atol=1e-6)
            handle.remove()
            handle = module.register_forward_hook(lambda m, args, out: out * 2)
            changed = model(input_ids=ids).last_hidden_state
            handle.remove()
            assert not torch.allclose(changed, fused, atol=1e-3)
