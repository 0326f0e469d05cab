"""The Triton kernels inside the models, as `auto` runs them on a CUDA GPU: here the backend rules are asked as if the
tensors were on a GPU (their own rule, only the device changed), so that every call the kernels cover runs them in
Triton's interpreter on the CPU. The models' outputs, loss and every parameter's gradient then equal those of the
CPU paths (float32), with padded batches; the kernels must actually have run. Tiny configs: the interpreter is slow."""

import pytest
import torch

pytest.importorskip("triton")

import hf_mgk  # noqa: E402
import tiny  # noqa: E402
from conftest import assert_close  # noqa: E402
from hf_mgk import attention_fish as af  # noqa: E402
from hf_mgk import attention_mgk as am  # noqa: E402
from hf_mgk import attention_triton as at  # noqa: E402

pytestmark = [pytest.mark.slow,  # whole models in the interpreter (the kernels' own tests are the fast tier's)
              pytest.mark.skipif(not at.interpreting(), reason="needs Triton's interpreter (TRITON_INTERPRET=1)")]


def _as_on_a_gpu(monkeypatch, module, kernel_name):
    """module.choose_backend answers as on a CUDA GPU with Triton; returns the list of the kernel's calls."""
    real_rule, real_kernel = module.choose_backend, getattr(module, kernel_name)
    calls = []

    def rule(**facts):
        choice = real_rule(**{**facts, "device_type": "cuda", "triton": True})
        return choice if choice == "triton" else real_rule(**facts)

    def kernel(*args, **kwargs):
        calls.append(1)
        return real_kernel(*args, **kwargs)

    monkeypatch.setattr(module, "choose_backend", rule)
    monkeypatch.setattr(module, kernel_name, kernel)
    return calls


def _loss_and_grads(model, ids, mask):
    torch.manual_seed(0)
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask, labels=ids)
    out.loss.backward()
    return out.logits.detach(), out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                                   if p.grad is not None}


def _batch(vocab=99, length=12):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (2, length), generator=g)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, -4:] = 0  # the second sequence padded at the end
    return ids, mask


def _compare(model, monkeypatch, module, kernel_name):
    ids, mask = _batch()
    want = _loss_and_grads(model, ids, mask)
    calls = _as_on_a_gpu(monkeypatch, module, kernel_name)
    got = _loss_and_grads(model, ids, mask)
    assert calls, "the Triton kernels did not run"
    keep = mask.bool()[:, :, None]  # padded positions' logits are not compared (no query of theirs is used)
    assert_close(got[0] * keep, want[0] * keep, msg="logits")
    assert_close(got[1], want[1], msg="loss")
    assert got[2].keys() == want[2].keys()
    for name, grad in want[2].items():
        assert_close(got[2][name], grad, atol=1e-6 + 1e-5 * grad.abs().max().item(), msg=name)


@pytest.mark.parametrize("attention_type", ["hard_fish", "hard_gfish"])
def test_fish_gpt2_training_step_on_the_kernels(attention_type, monkeypatch):
    config = hf_mgk.FiSHGPT2Config(**tiny.gpt2(dropout=False), attention_type=attention_type, num_global_heads=2)
    torch.manual_seed(0)
    _compare(hf_mgk.FiSHGPT2LMHeadModel(config), monkeypatch, af, "fish_triton")


@pytest.mark.parametrize("attention_type", ["mgk", "smgk"])
def test_mgk_bert_training_step_on_the_kernels(attention_type, monkeypatch):
    config = hf_mgk.MGKBertConfig(**tiny.bert(dropout=False), attention_type=attention_type)
    torch.manual_seed(0)
    _compare(hf_mgk.MGKBertForMaskedLM(config), monkeypatch, am, "mgk_triton")


def test_mgk_gpt2_training_step_on_the_kernels(monkeypatch):
    config = hf_mgk.MGKGPT2Config(**tiny.gpt2(dropout=False), attention_type="mgk")
    torch.manual_seed(0)
    _compare(hf_mgk.MGKGPT2LMHeadModel(config), monkeypatch, am, "mgk_triton")


@pytest.mark.parametrize("attention_type", ["mgk", "smgk"])
def test_mgk_llama_training_step_on_the_kernels(attention_type, monkeypatch):
    """Rotated keys, grouped key/value heads (sMGK's shifted keys made whole before the kernels)."""
    config = hf_mgk.MGKLlamaConfig(**tiny.llama(dropout=False), attention_type=attention_type)
    torch.manual_seed(0)
    _compare(hf_mgk.MGKLlamaForCausalLM(config), monkeypatch, am, "mgk_triton")


def test_fish_llama_training_step_on_the_kernels(monkeypatch):
    config = hf_mgk.FiSHLlamaConfig(**tiny.llama(dropout=False), attention_type="hard_fish", num_global_heads=2)
    torch.manual_seed(0)
    _compare(hf_mgk.FiSHLlamaForCausalLM(config), monkeypatch, af, "fish_triton")


def test_fish_gpt2_noisy_training_step_runs_on_the_kernels_and_repeats(monkeypatch):
    """FiSH's noise is drawn in the kernels (other numbers than the CPU paths'): a seeded step repeats, the
    gradients are finite and reach sigma and the mixing."""
    config = hf_mgk.FiSHGPT2Config(**tiny.gpt2(dropout=False), attention_type="fish", num_global_heads=2)
    torch.manual_seed(0)
    model = hf_mgk.FiSHGPT2LMHeadModel(config)
    calls = _as_on_a_gpu(monkeypatch, af, "fish_triton")
    ids, mask = _batch()
    first, again = _loss_and_grads(model, ids, mask), _loss_and_grads(model, ids, mask)
    assert calls and torch.equal(first[1], again[1])
    noisy = [n for n in first[2] if "noise" in n or "mixing" in n]
    assert noisy and all(torch.isfinite(g).all() and g.abs().max() > 0 for n, g in first[2].items() if n in noisy)
