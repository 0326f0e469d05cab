"""The Triton kernels of FiSH (backend="triton", attention_fish_triton.py) against the plain reference
(hf_mgk.reference): outputs and every gradient (q, k, v, the mixing weights or the GFiSH network's weights and biases,
sigma) for FiSH, hard FiSH, MiSH with and without noise, GFiSH and hard GFiSH; padding, causal with N < S and N > S,
M = 1, 2 and 3, head sizes 16, 32 and 64, lengths that are not a multiple of the block; bfloat16 / float16; the
noise and the dropout mask drawn in the kernels; the calls the kernels refuse.

Noise: the kernels draw their own (counter-based) numbers, so the reference is given them (`kernel_noise`, the same
draw written out); that its gradients match shows that backward regenerates the forward's noise.

Here the kernels run in Triton's interpreter on CPU tensors (conftest sets TRITON_INTERPRET=1), so the shapes are
tiny (the interpreter's blocks are 16 x 16). The tests marked `cuda` run again, compiled, on a CUDA GPU:
    HF_MGK_TEST_CUDA=1 pytest -m cuda tests/test_attention_fish_triton.py"""

import os

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.exactness  # run again under other CPU kernels by CI (.ci/run)

from conftest import assert_close, assert_exact, check_environment_refusals, cotangent_grads, triton_devices  # noqa: E402,E501
from hf_mgk import attention_fish as af  # noqa: E402
from hf_mgk import attention_fish_triton as aft  # noqa: E402
from hf_mgk import attention_triton as at  # noqa: E402
from hf_mgk.attention_fish import choose_backend, fish_attention, make_gfish_mixing  # noqa: E402
from hf_mgk.reference import fish_attention_reference  # noqa: E402

DEVICES = triton_devices()
B, H = 2, 2
VARIANTS = ["fish", "hard_fish", "mish_noise", "mish", "gfish", "hard_gfish"]
NOISY = {"fish", "mish_noise", "gfish"}


def _case(variant, m, n, s, d, dv, padded, device, dtype=torch.float32, seed=0):
    """(q, k, v, mixing), the keyword arguments (noise_std, attention_mask) and the leaves whose gradients are
    checked (q, k, v, the mixing tensor or the network's W1, b1, W2, b2, sigma). The padding hides the first two
    keys of the first sequence (with is_causal its first rows see no key) and the last three of the second."""
    g = torch.Generator().manual_seed(seed + 100 * m + n)
    q, k = torch.randn(B, m, n, d, generator=g), torch.randn(B, m, s, d, generator=g)
    v = torch.randn(B, H, s, dv, generator=g)
    q, k, v = (t.to(device, dtype).requires_grad_() for t in (q, k, v))
    if variant.endswith("gfish"):
        torch.manual_seed(seed)
        mixing = make_gfish_mixing(m, H).to(device)
        params = list(mixing.parameters())
    else:
        mixing = torch.randn(m, 1 if variant.startswith("mish") else H, generator=g).to(device).requires_grad_()
        params = [mixing]
    kwargs = {}
    if variant in NOISY:
        kwargs["noise_std"] = (0.5 + torch.rand(m, generator=g)).to(device).requires_grad_()
        params.append(kwargs["noise_std"])
    if padded:
        mask = torch.ones(B, s, dtype=torch.bool, device=device)
        mask[0, :2] = False
        mask[1, s - 3:] = False
        kwargs["attention_mask"] = mask
    return (q, k, v, mixing), kwargs, [q, k, v, *params]


def _noise(variant, args, seed):
    """The noise the kernels draw for a call whose generator was seeded with `seed`."""
    q, _, v, _ = args
    if variant not in NOISY:
        return None
    nseed = aft.noise_seed(torch.Generator().manual_seed(seed), q.device)
    return aft.kernel_noise(nseed, q.shape[0], q.shape[1], v.shape[1], q.shape[2], v.shape[2],
                            variant.endswith("gfish"), q.device)


_grads = cotangent_grads


def _names(variant):
    return ["q", "k", "v"] + (["W1", "b1", "W2", "b2"] if variant.endswith("gfish") else ["mixing"]) + (
        ["sigma"] if variant in NOISY else [])


def _reference(args, kwargs, noise, weights=None):
    """conftest.assert_exact's reference(dtype): the literal reference on the call's inputs cast to dtype (GFiSH's
    network copied at dtype), given the kernels' noise, and its leaves (q, k, v, the mixing tensor or the network's
    parameters, sigma). With `weights` (a dropout mask of the kernel's, scaled), the reference's weights times it,
    times V."""
    def reference(dtype):
        q, k, v = (t.detach().to(dtype).requires_grad_() for t in args[:3])
        mixing = args[3]
        if isinstance(mixing, torch.nn.Module):
            mixing = make_gfish_mixing(mixing[0].in_features, mixing[2].out_features).to(q.device, dtype)
            mixing.load_state_dict(args[3].state_dict())
            params = list(mixing.parameters())
        else:
            mixing = mixing.detach().to(dtype).requires_grad_()
            params = [mixing]
        kw = dict(kwargs)
        if "noise_std" in kw:
            kw["noise_std"] = kwargs["noise_std"].detach().to(dtype).requires_grad_()
            params.append(kw["noise_std"])
        eps = None if noise is None else noise.to(dtype)
        if weights is None:
            return fish_attention_reference(q, k, v, mixing, **kw, noise=eps), [q, k, v, *params]
        _, w = fish_attention_reference(q, k, v, mixing, **kw, noise=eps, return_weights=True)
        return torch.matmul(w * weights.to(dtype), v), [q, k, v, *params]
    return reference


def _check(variant, m, n, s, d, dv, causal, padded, device, dtype=torch.float32, rtol=1e-5, atol=1e-6):
    """Triton against the reference of the same (rounded) inputs, given the kernels' noise. float32: as exact as the
    reference evaluated in float32, both against float64 (conftest.assert_exact); half precision: against float64
    at that precision's tolerance. A gradient that is 0 in exact arithmetic (GFiSH's last bias: softmax ignores a
    shift of a row) comes out as a sum of cancelling terms: judged against the largest gradient's scale (in half
    precision delta = dO . out, from the rounded output, leaves each row's sum off by about the precision's
    epsilon; no other gradient amplifies that, unlike MGK's |q|^2 terms)."""
    args, kwargs, leaves = _case(variant, m, n, s, d, dv, padded, device, dtype)
    out = fish_attention(*args, **kwargs, is_causal=causal, generator=torch.Generator().manual_seed(5),
                         backend="triton")
    assert out.dtype == dtype and out.shape == (B, H, n, dv)
    grads = _grads(out, leaves)
    reference = _reference(args, dict(kwargs, is_causal=causal), _noise(variant, args, 5))
    if dtype == torch.float32:
        assert_exact(out, grads, reference, _names(variant), cancelling={"b2"})
        return
    ref, ref_leaves = reference(torch.float64)
    want = _grads(ref.to(dtype), ref_leaves)
    assert_close(out.double(), ref, rtol, atol, msg=f"{variant} output")
    largest = max(g.abs().max().item() for g in want)
    for name, got, ref_grad in zip(_names(variant), grads, want, strict=True):
        tol = rtol * largest if name == "b2" else atol
        assert_close(got.double(), ref_grad.double(), rtol, tol, msg=f"{variant} grad {name}")


# (M, N, S, D, Dv, causal, padded): blocks of 16 in the interpreter, so 20 and 21 end inside a second block;
# 9 < 21 causal is a cache (bottom-right aligned)
CASES = [(2, 20, 20, 32, 32, True, True), (3, 9, 21, 16, 16, True, False), (1, 18, 18, 64, 64, False, True)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_triton_matches_reference(device, variant):
    _check(variant, *CASES[0], device)


@pytest.mark.slow  # the interpreter's time: the fast tier keeps the first shape, every variant
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", CASES[1:], ids=["m3-cache", "m1-d64"])
def test_triton_matches_reference_more_shapes(device, variant, case):
    _check(variant, *case, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["fish", "hard_gfish"])
def test_triton_half_precision_matches_reference(device, variant):
    """bfloat16 inputs (float32 accumulation and mixing) at bfloat16's tolerance, float16 (one case) at float16's."""
    _check(variant, 2, 20, 20, 32, 32, True, True, device, torch.bfloat16, rtol=3e-2, atol=1e-3)
    if variant == "fish":
        _check(variant, 2, 20, 20, 32, 32, True, True, device, torch.float16, rtol=5e-3, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["fish", "gfish"])
def test_rows_that_see_no_key_give_zero(device, variant):
    """Causal with N > S (the first N - S rows see no key) and a sequence of padding only: zero output and finite
    gradients, the rest as the reference."""
    args, kwargs, leaves = _case(variant, 2, 7, 4, 16, 16, False, device)
    mask = torch.ones(B, 4, dtype=torch.bool, device=device)
    mask[1] = False
    kw = dict(kwargs, attention_mask=mask, is_causal=True)
    out = fish_attention(*args, **kw, generator=torch.Generator().manual_seed(5), backend="triton")
    assert out[:, :, :3].abs().max() == 0 and out[1].abs().max() == 0
    grads = _grads(out, leaves)
    assert all(torch.isfinite(g).all() for g in grads)
    assert_exact(out, grads, _reference(args, kw, _noise(variant, args, 5)), _names(variant), cancelling={"b2"})


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_runs_the_kernels_in_its_dtype(device):
    """float32 inputs under autocast: the kernels run in autocast's dtype, as its matmuls would."""
    args, kwargs, _ = _case("hard_fish", 2, 8, 8, 16, 16, True, device)
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
        out = fish_attention(*args, **kwargs, backend="triton")
    with torch.no_grad():
        half = fish_attention(*(t.bfloat16() for t in args[:3]), args[3], **kwargs, backend="triton")
    assert out.dtype == torch.bfloat16 and torch.equal(out, half)


@pytest.mark.parametrize("device", DEVICES)
def test_noise_is_standard_normal_and_seeded(device):
    """The kernels' draws: mean 0, variance 1, normal tails, uncorrelated between heads and between neighbours;
    the same generator seed gives the same output, another seed another output."""
    eps = aft.kernel_noise(aft.noise_seed(torch.Generator().manual_seed(0), device), 2, 2, 3, 64, 64, False, device)
    assert eps.shape == (2, 3, 64, 64)
    x = eps.flatten().double()  # 24,576 draws: the sd of the mean is 0.0064, of the variance 0.009
    assert abs(x.mean().item()) < 0.03 and abs(x.var().item() - 1) < 0.04
    assert abs((x.abs() > 1.96).double().mean().item() - 0.05) < 0.008  # sd 0.0014
    assert abs(torch.corrcoef(eps[:, :2].reshape(2, -1))[0, 1].item()) < 0.03
    assert abs(torch.corrcoef(torch.stack([eps[..., :-1].flatten(), eps[..., 1:].flatten()]))[0, 1].item()) < 0.03
    net = aft.kernel_noise(aft.noise_seed(torch.Generator().manual_seed(0), device), 2, 3, 2, 32, 32, True, device)
    assert net.shape == (2, 3, 32, 32) and abs(net.double().var().item() - 1) < 0.08
    args, kwargs, _ = _case("fish", 2, 10, 10, 16, 16, False, device)
    run = lambda seed: fish_attention(*args, **kwargs, generator=torch.Generator().manual_seed(seed),  # noqa: E731
                                      backend="triton").detach()
    first = run(3)
    assert torch.equal(first, run(3)) and not torch.allclose(first, run(4))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["hard_fish", "gfish"])
def test_dropout_drops_the_weights(device, variant):
    """With V the identity the output is the dropped weights: each is kept with probability 1 - p and scaled by
    1 / (1 - p), independently per local head; backward uses the same mask (gradients equal the reference's
    weights times that mask, times V); the same seed repeats the draw and another seed changes it."""
    n, p = 32, 0.3
    args, kwargs, leaves = _case(variant, 2, n, n, 16, n, True, device)
    with torch.no_grad():
        args[2].copy_(torch.eye(n, device=device).expand_as(args[2]))
    kw = dict(kwargs, is_causal=True)
    torch.manual_seed(7)
    out = fish_attention(*args, **kw, dropout_p=p, generator=torch.Generator().manual_seed(5), backend="triton")
    _, weights = fish_attention_reference(*args, **kw, return_weights=True, noise=_noise(variant, args, 5))
    visible = weights.detach() > 0
    kept = (out.detach() != 0).to(weights.dtype) / (1 - p)
    dropped = (out.detach()[visible] == 0).float().mean().item()
    assert abs(dropped - p) < 0.05, dropped  # about 1,500 visible pairs: the binomial's sd is 0.012
    assert not torch.equal(kept[:, 0], kept[:, 1])  # each local head its own mask
    reference = _reference(args, kw, _noise(variant, args, 5), weights=kept)
    assert_exact(out, _grads(out, leaves), reference, _names(variant), cancelling={"b2"})
    torch.manual_seed(7)
    again = fish_attention(*args, **kw, dropout_p=p, generator=torch.Generator().manual_seed(5), backend="triton")
    other = fish_attention(*args, **kw, dropout_p=p, generator=torch.Generator().manual_seed(5), backend="triton")
    assert torch.equal(again, out) and not torch.equal(other, out)


@pytest.mark.skipif(not at.interpreting(), reason="CPU tensors need the interpreter (HF_MGK_TEST_CUDA=1)")
def test_what_the_kernels_refuse_is_a_clear_error(monkeypatch):
    args, kwargs, _ = _case("fish", 2, 5, 5, 16, 16, False, "cpu")

    def refused(why, *call, **extra):
        with pytest.raises(ValueError, match=f"backend 'triton' cannot run this call: {why}"):
            fish_attention(*(call or args), **{**kwargs, "backend": "triton", **extra})

    refused("return_weights", return_weights=True)
    refused("a whole 4-D mask", attention_mask=torch.ones(1, 1, 5, 5, dtype=torch.bool))
    other = torch.nn.Sequential(torch.nn.Linear(2, H), torch.nn.Tanh())
    refused("a mixing network other than make_gfish_mixing's", *args[:3], other)
    refused("torch.float64", *(t.detach().double() for t in args[:3]), args[3].detach().double())
    q9, k9 = torch.randn(1, 9, 5, 16), torch.randn(1, 9, 5, 16)
    refused("9 global heads", q9, k9, torch.randn(1, H, 5, 16), torch.randn(9, H), noise_std=None)
    refused("head size 256", torch.randn(1, 2, 5, 256), torch.randn(1, 2, 5, 256), torch.randn(1, H, 5, 8),
            args[3])
    with monkeypatch.context() as patch:
        patch.setattr(af, "counters", lambda *a: 2**31)
        refused("sequences this long")
    check_environment_refusals(monkeypatch, refused, af)


def test_hf_mgk_triton_0_switches_the_kernels_off(monkeypatch):
    """HF_MGK_TRITON=0: auto keeps the torch paths on a GPU too, and asking for the kernels says why they cannot run."""
    monkeypatch.delenv("HF_MGK_TRITON", raising=False)
    assert at.available() == (at.triton is not None)
    monkeypatch.setenv("HF_MGK_TRITON", "0")
    assert not at.available()
    args, kwargs, _ = _case("hard_fish", 2, 5, 5, 16, 16, False, "cpu")
    with pytest.raises(ValueError, match="HF_MGK_TRITON=0 switched the kernels off"):
        fish_attention(*args, **kwargs, backend="triton")
    monkeypatch.setenv("HF_MGK_TRITON", "1")
    assert at.available()


@pytest.mark.parametrize("value, on", [("0", False), ("false", False), ("OFF", False), ("No", False), (" off ", False),
                                       ("1", True), ("true", True), ("On", True), ("YES", True), ("", True)])
def test_hf_mgk_triton_reads_the_ways_users_write_a_switch(monkeypatch, value, on):
    monkeypatch.setenv("HF_MGK_TRITON", value)
    assert at.switched_on() is on
    assert at.available() == (on and at.triton is not None)


@pytest.mark.parametrize("value", ["2", "disable", "fals"])
def test_hf_mgk_triton_other_values_are_an_error_naming_it(monkeypatch, value):
    """A typo must not leave the kernels on: the next attention call says what the variable takes."""
    monkeypatch.setenv("HF_MGK_TRITON", value)
    with pytest.raises(ValueError, match=f"HF_MGK_TRITON='{value}' is not a switch: set it to 0 / false / off"):
        at.available()
    args, kwargs, _ = _case("hard_fish", 2, 5, 5, 16, 16, False, "cpu")
    with pytest.raises(ValueError, match="HF_MGK_TRITON"):
        fish_attention(*args, **kwargs)


def test_auto_takes_triton_on_cuda_for_what_it_covers():
    """backend="auto": the kernels on a CUDA GPU with Triton for every FiSH type, with noise, dropout, padding and
    autocast; today's paths for what they do not cover, and always on the CPU (the interpreter is for tests)."""
    call = dict(mixing="heads", noise=False, dropout=False, return_weights=False, device_type="cuda",
                dtype=torch.float32, autocast=False, requires_grad=True, tracing=False, mask=None, triton=True,
                head_size=64, num_global=2, counter=1024 * 1024)
    for mixing in ("heads", "shared", "gfish"):
        for extra in ({}, {"noise": True}, {"dropout": True}, {"mask": "padding"}, {"autocast": True},
                      {"dtype": torch.bfloat16}, {"requires_grad": False}):
            assert choose_backend(**{**call, "mixing": mixing, **extra}) == "triton", (mixing, extra)
    for extra, fallback in [({"triton": False}, "fused"), ({"device_type": "cpu"}, "recomputed"),
                            ({"return_weights": True}, "blocked"), ({"mask": "pairs"}, "fused"),
                            ({"tracing": True}, "fused"), ({"mixing": "module"}, "blocked"),
                            ({"head_size": 256}, "fused"), ({"num_global": 9}, "fused"),
                            ({"counter": 2**31}, "fused"), ({"dtype": torch.float64}, "fused")]:
        assert choose_backend(**{**call, **extra}) == fallback, extra


_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import os
ARCH = int(os.environ["HF_MGK_TEST_ARCH"])
import hf_mgk.attention_fish_triton as aft
RUNTIME = {"N": "i32", "S": "i32", "D": "i32", "DV": "i32", "M": "i32", "H": "i32", "scale": "fp32",
           "P_DROP": "fp32", "SEED": "i32", "NSEED": "i32"}
for network in (False, True):
    base = dict(MP=2, NETWORK=network, NOISE=True, PADDED=True, CAUSAL=True, DROPOUT=True, PREC=None, BLOCK_M=32,
                BLOCK_N=32, BLOCK_D=32, BLOCK_DV=32, GROUP=2 if network else 1)  # a network: two heads a program
    for fn, extra in [(aft._fwd_kernel, {}), (aft._bwd_kv_kernel, dict(HP=8))]:  # the backward: one pass
        consts = {**base, **extra}
        sig = {a: "constexpr" if a in consts else RUNTIME.get(a, "*bf16" if a in ("Q", "K", "V", "DO", "O")
                                                              else "*fp32") for a in fn.arg_names}
        triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", ARCH, 32))
# M = 1 (a batched dot over one head), and the kernel that writes the noise out
consts = dict(MP=1, NETWORK=False, NOISE=False, PADDED=False, CAUSAL=False, DROPOUT=False, PREC=None, BLOCK_M=32,
              BLOCK_N=32, BLOCK_D=32, BLOCK_DV=32, GROUP=1)
sig = {a: "constexpr" if a in consts else RUNTIME.get(a, "*bf16" if a in ("Q", "K", "V", "O") else "*fp32")
       for a in aft._fwd_kernel.arg_names}
triton.compile(ASTSource(aft._fwd_kernel, sig, constexprs=consts), target=GPUTarget("cuda", ARCH, 32))
consts = dict(NETWORK=True, MP=4, BLOCK_M=16, BLOCK_N=16)
sig = {a: "constexpr" if a in consts else RUNTIME.get(a, "*fp32") for a in aft._noise_kernel.arg_names}
triton.compile(ASTSource(aft._noise_kernel, sig, constexprs=consts), target=GPUTarget("cuda", ARCH, 32))
print("compiled")
"""


@pytest.mark.slow
@pytest.mark.parametrize("arch", [90, 86, 80])  # H100; RTX 30 (the least shared memory, 99 KB); A100
def test_kernels_compile_for_a_gpu_without_one(arch):
    """What only the compiler rejects (types of loop-carried values, constexpr branches, 3-D dot shapes) shows
    here: the kernels compiled for sm_90, sm_86 and sm_80 (Triton's frontend and ptxas, no GPU needed), linear and
    network mixing in bfloat16 with noise, dropout, padding and causal masks; the forward with M = 1; the kernel that
    writes the noise out. Blocks of 32 (12 s for the six main kernels here; the GPU's blocks of 64 compile too, in
    43 s, and float32's "tf32x3" products in ~6 s a kernel: checked by hand, not here)."""
    import subprocess
    import sys

    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "HF_MGK_TEST_ARCH": str(arch)}
    done = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]
