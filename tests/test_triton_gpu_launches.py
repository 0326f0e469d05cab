"""The Triton kernels at the launches a GPU takes (the blocks, the backward's rows and warps that
attention_fish_triton.launch_configs and attention_mgk_triton.block_sizes choose on CUDA in half precision, forced
here in Triton's interpreter, in float32), at lengths that end inside a block: padded and not, causal and not,
N != S, N under and over a block. Outputs and the gradient of every leaf (q, k, v, the mixing, sigma, each network
parameter, the keys' shifts, the prior) against the float64 reference, as exact as the reference in float32
(conftest.assert_exact); a gradient that should be about 0 (GFiSH's b2) is held to the largest gradient's scale.

The interpreter's own blocks (16 or 32) divide the other tests' lengths differently: a key block that passes S
without padding is one such case, where keys past S took weight in the backward's unmasked row blocks."""

import pytest
import torch

pytest.importorskip("triton")

import test_attention_fish_triton as fish_tests  # noqa: E402
import test_attention_mgk_triton as mgk_tests  # noqa: E402
from conftest import assert_exact  # noqa: E402
from hf_mgk import attention_fish_triton as aft  # noqa: E402
from hf_mgk import attention_mgk_triton as amt  # noqa: E402
from hf_mgk import attention_triton as at  # noqa: E402
from hf_mgk.attention_fish import fish_attention  # noqa: E402

pytestmark = [pytest.mark.exactness,  # run again under other CPU kernels by CI (.ci/run)
              pytest.mark.skipif(not at.interpreting(), reason="forces GPU launches in the interpreter")]

# (N, S, causal, padded): keys ending inside a block of 32, 64 and 128, unpadded and not causal (the case the
# backward's unmasked row blocks got wrong), N > S causal (rows that see no key), N under every block, N != S padded
LENGTHS = [(70, 100, False, False), (100, 70, True, False), (20, 37, False, False), (37, 90, True, True),
           (130, 130, False, True)]
LENGTH_IDS = ["70x100", "100x70-causal", "20x37", "37x90-causal-padded", "130x130-padded"]


def _fish_gpu(monkeypatch, gpu_dtype):
    """launch_configs as on a CUDA GPU (an H100's shared memory) for `gpu_dtype`, whatever the device and dtype:
    in bfloat16 the studied LAUNCHES; the launches chosen are listed in the list returned."""
    real = aft.launch_configs
    chosen = []

    def gpu(device_type, num_global, head_size, value_size, dtype=None, shared=None, *kind):
        launches = real("cuda", num_global, head_size, value_size, gpu_dtype, 232448, *kind)
        chosen.append(launches)
        return launches

    monkeypatch.setattr(aft, "launch_configs", gpu)
    return chosen


@pytest.fixture
def fish_gpu_launches(monkeypatch):
    return _fish_gpu(monkeypatch, torch.bfloat16)


def _kind(variant):
    return ("network noise" if variant == "gfish" else "network") if variant.endswith("gfish") else (
        "linear" if variant == "hard_fish" else "noise")


@pytest.mark.parametrize("n,s,causal,padded", LENGTHS, ids=LENGTH_IDS)
@pytest.mark.parametrize("variant", ["hard_fish", "fish", "mish_noise", "hard_gfish", "gfish"])
def test_fish_at_the_gpu_launches(fish_gpu_launches, variant, n, s, causal, padded):
    args, kwargs, leaves = fish_tests._case(variant, 2, n, s, 16, 16, padded, "cpu")
    out = fish_attention(*args, **kwargs, is_causal=causal, generator=torch.Generator().manual_seed(5),
                         backend="triton")
    assert fish_gpu_launches == [aft.LAUNCHES[_kind(variant), False]]  # the studied GPU launch of this kind ran
    reference = fish_tests._reference(args, dict(kwargs, is_causal=causal), fish_tests._noise(variant, args, 5))
    assert_exact(out, fish_tests._grads(out, leaves), reference, fish_tests._names(variant), cancelling={"b2"})


@pytest.mark.parametrize("n,s,causal,padded", LENGTHS, ids=LENGTH_IDS)
@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
@pytest.mark.parametrize("e_step", ["soft", "hard"])
@pytest.mark.parametrize("m", [2, 4])
def test_mgk_at_the_gpu_launches(monkeypatch, e_step, shared, m, n, s, causal, padded):
    """block_sizes as on a CUDA GPU in bfloat16: 128 x 64 (M = 4 MGK: 64 x 32), the dK / dV program over
    dkv_rows of the keys."""
    real = amt.block_sizes
    monkeypatch.setattr(amt, "block_sizes", lambda device_type, head_size, value_size, dtype=None, key_tiles=1:
                        real("cuda", head_size, value_size, torch.bfloat16, key_tiles))
    assert amt.block_sizes("cpu", 16, 16, torch.float32, 1 if shared else m) == (
        (64, 32) if m == 4 and not shared else (128, 64))
    prior = "learned" if e_step == "soft" else "uniform"
    leaves, lp, mask = mgk_tests._inputs(n, s, m, 16, 16, shared, prior, "cpu")
    kw = dict(variances=mgk_tests._variances(m, 16), e_step=e_step, attention_mask=mask if padded else None,
              is_causal=causal)
    out = mgk_tests._call(mgk_tests.mgk_attention, leaves, lp, shared, backend="triton", **kw)
    with_prior = e_step == "soft"
    grads = mgk_tests._grads(out, leaves + ([lp] if with_prior else []))
    assert_exact(out, grads, mgk_tests._reference(leaves, lp, shared, kw, with_prior),
                 mgk_tests._names(shared, with_prior), cancelling={"log_prior"})


@pytest.mark.parametrize("variant", ["hard_fish", "fish", "hard_gfish", "gfish"])
def test_fish_dropout_at_the_gpu_launches(fish_gpu_launches, variant):
    """The GPU's launches with dropout (linear: 64 x 64 forwards and 16-row backwards; a network 128 x 32 and 32 x 64),
    keys ending inside a block, unpadded: with V the identity the output is the dropped weights, so the reference's
    weights times the kernels' own mask, times V, is what they compute, gradients included."""
    n, p = 50, 0.3  # V the identity: Dv = S, within the studied launches' 64, ending inside their key blocks
    args, kwargs, leaves = fish_tests._case(variant, 2, n, n, 16, n, False, "cpu")
    with torch.no_grad():
        args[2].copy_(torch.eye(n).expand_as(args[2]))
    out = fish_attention(*args, **kwargs, dropout_p=p, generator=torch.Generator().manual_seed(5), backend="triton")
    assert fish_gpu_launches == [aft.LAUNCHES[_kind(variant), True]]
    kept = (out.detach() != 0).float() / (1 - p)
    assert abs((out.detach() == 0).float().mean().item() - p) < 0.03  # 10,000 draws: the sd is 0.005
    reference = fish_tests._reference(args, kwargs, fish_tests._noise(variant, args, 5), weights=kept)
    assert_exact(out, fish_tests._grads(out, leaves), reference, fish_tests._names(variant), cancelling={"b2"})


@pytest.mark.parametrize("variant", ["fish", "gfish"])
def test_fish_at_the_gpu_float32_launches(monkeypatch, variant):
    """float32 on a GPU takes other blocks (halved to fit shared memory: attention_triton.fitted) and one head a
    network program: keys ending inside them, unpadded and padded."""
    chosen = _fish_gpu(monkeypatch, torch.float32)
    for n, s, causal, padded in [(70, 100, False, False), (37, 90, True, True)]:
        args, kwargs, leaves = fish_tests._case(variant, 2, n, s, 16, 16, padded, "cpu")
        out = fish_attention(*args, **kwargs, is_causal=causal, generator=torch.Generator().manual_seed(5),
                             backend="triton")
        reference = fish_tests._reference(args, dict(kwargs, is_causal=causal), fish_tests._noise(variant, args, 5))
        assert_exact(out, fish_tests._grads(out, leaves), reference, fish_tests._names(variant), cancelling={"b2"})
    assert chosen[0] not in aft.LAUNCHES.values()  # not the half-precision launches


@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
@pytest.mark.parametrize("e_step", ["soft", "hard"])
def test_mgk_dropout_at_the_gpu_launches(monkeypatch, e_step, shared):
    """128 x 64 blocks with dropout, keys ending inside a block: with V the identity the output is the dropped
    weights, so the reference's weights times the kernels' own mask, times V, is what they compute."""
    real = amt.block_sizes
    monkeypatch.setattr(amt, "block_sizes", lambda device_type, head_size, value_size, dtype=None, key_tiles=1:
                        real("cuda", head_size, value_size, torch.bfloat16, key_tiles))
    n, p = 50, 0.3
    leaves, lp, mask = mgk_tests._inputs(n, n, 2, 16, n, shared, "learned", "cpu")
    with torch.no_grad():
        leaves[-1].copy_(torch.eye(n).expand_as(leaves[-1]))
    kw = dict(variances=mgk_tests._variances(2, 16), e_step=e_step, attention_mask=mask, is_causal=True)
    out = mgk_tests._call(mgk_tests.mgk_attention, leaves, lp, shared, backend="triton", dropout_p=p, **kw)
    kept = (out.detach() != 0).float() / (1 - p)
    with_prior = e_step == "soft"

    def reference(dtype):
        (_, w), xs = mgk_tests._reference(leaves, lp, shared, dict(kw, return_weights=True), with_prior)(dtype)
        return torch.matmul(w * kept.to(dtype), xs[-2 if with_prior else -1]), xs

    grads = mgk_tests._grads(out, leaves + ([lp] if with_prior else []))
    assert_exact(out, grads, reference, mgk_tests._names(shared, with_prior), cancelling={"log_prior"})
