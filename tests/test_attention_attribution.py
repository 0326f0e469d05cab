"""Gradient-based attention attribution: `output_attentions` hands out the very weights the output is computed
from, so `attentions[l].retain_grad()` then `backward()` gives dL/dA, as stock BERT / GPT-2's eager attention does.

For out_h = A_h V_h (every attention here, on its weights path), dL/dA_h = (dL/d out_h) V_h^T: the test takes
dL/d out from the input of the layer's output projection and V from the value projection, and compares. Before,
FiSH and NPRF returned a copy the output did not depend on, so its gradient was None."""

import pytest
import torch

from conftest import assert_close
from hf_mgk import (
    FiSHGPT2Config,
    FiSHGPT2LMHeadModel,
    MGKBertConfig,
    MGKBertForMaskedLM,
    NPRFRobertaConfig,
    NPRFRobertaForCausalLM,
    NPRFRobertaForMaskedLM,
)
import tiny

H, D = 4, 8
ENCODER = tiny.roberta(num_attention_heads=H)  # MGK-BERT's and NPRF-RoBERTa's
CASES = [
    *[("fish", dict(attention_type=t)) for t in ("fish", "hard_fish", "gfish", "hard_gfish", "mish", "softmax")],
    ("nprf", dict(attention_type="nprf")), ("nprf", dict(attention_type="nprf", is_decoder=True)),
    ("nprf", dict(attention_type="nprf", use_rpe=False)), ("nprf", dict(attention_type="softmax")),
    ("mgk", dict(attention_type="mgk")), ("mgk", dict(attention_type="smgk", e_step="hard")),
    ("mgk", dict(attention_type="mlk")), ("mgk", dict(attention_type="softmax")),
]


def _model_and_hooks(family, kw):
    """The model, and per layer: (module whose output holds V, how to take V from it, the output projection)."""
    if family == "fish":
        model = FiSHGPT2LMHeadModel(FiSHGPT2Config(**tiny.gpt2(n_head=H), **kw))
        return model, [(b.attn.c_attn, lambda x: x[..., -H * D:], b.attn.c_proj) for b in model.transformer.h]
    if family == "nprf":
        cls = NPRFRobertaForCausalLM if kw.get("is_decoder") else NPRFRobertaForMaskedLM
        model = cls(NPRFRobertaConfig(**ENCODER, **kw))
    else:
        model = MGKBertForMaskedLM(MGKBertConfig(**ENCODER, **kw))
    layers = model.base_model.encoder.layer
    return model, [(l.attention.self.value, lambda x: x, l.attention.output.dense) for l in layers]


@pytest.mark.parametrize("family,kw", CASES, ids=[f"{f}-{'-'.join(map(str, k.values()))}" for f, k in CASES])
def test_returned_attentions_are_in_the_graph(family, kw):
    model, hooks = _model_and_hooks(family, kw)
    model.eval()
    ids = torch.randint(3, 99, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    values, head_outputs = [], []
    for value_module, take, projection in hooks:
        value_module.register_forward_hook(lambda m, a, out, take=take: values.append(take(out)))
        projection.register_forward_pre_hook(lambda m, args: head_outputs.append(args[0]))
    out = model(ids, attention_mask=mask, output_attentions=True)
    for a, o in zip(out.attentions, head_outputs, strict=True):
        a.retain_grad()
        o.retain_grad()
    torch.manual_seed(1)
    (out.logits * torch.randn_like(out.logits)).sum().backward()
    for a, o, v in zip(out.attentions, head_outputs, values, strict=True):
        assert a.grad is not None and a.grad.abs().max() > 0
        b, n, _ = o.shape
        grad_heads = o.grad.view(b, n, H, D).transpose(1, 2)                       # dL/d out_h (B, H, N, D)
        v_heads = v.view(b, -1, H, D).transpose(1, 2)                               # V_h (B, H, S, D)
        assert_close(a.grad, grad_heads @ v_heads.transpose(-1, -2), rtol=1e-5, atol=1e-7)
    with torch.no_grad():  # the weights path gives what the fast path computes
        assert_close(out.logits.detach(), model(ids, attention_mask=mask).logits, rtol=1e-5, atol=1e-6)
