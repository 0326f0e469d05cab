"""The Triton kernels of MGK / sMGK (backend="triton", attention_mgk_triton.py) against the literal Eq. 7 reference
(hf_mgk.reference): outputs and every gradient (q; the keys, or the key and its shifts; v; the prior) for the soft
and hard E-steps, learned / uniform / EM priors, M = 1 to 4, head sizes 16, 32, 64, 128 (and one that is no power
of two), padding, causal with N < S and N > S, lengths that are not a multiple of the block, hard-E-step ties;
bfloat16 / float16; dropout drawn in the kernels; and the calls the kernels refuse.

Here they run in Triton's interpreter on CPU tensors (conftest sets TRITON_INTERPRET=1 before torch and triton are
imported), so the shapes are tiny. The tests marked `cuda` run again, compiled, on a CUDA GPU:
    HF_MGK_TEST_CUDA=1 pytest -m cuda tests/test_attention_mgk_triton.py
and are skipped where no GPU is present."""

import math
import os

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.exactness  # run again under other CPU kernels by CI (.ci/run)

from conftest import assert_close, assert_exact, check_environment_refusals, cotangent_grads, triton_devices  # noqa: E402,E501
from hf_mgk import attention_mgk as am  # noqa: E402
from hf_mgk import attention_mgk_triton as amt  # noqa: E402
from hf_mgk import attention_triton as at  # noqa: E402
from hf_mgk.attention_mgk import choose_backend, mgk_attention, smgk_attention  # noqa: E402
from hf_mgk.reference import mgk_attention_reference, smgk_attention_reference  # noqa: E402

DEVICES = triton_devices()
B = 2


def _inputs(n, s, m, d, dv, shared, prior, device, dtype=torch.float32, h=1):
    """The leaf tensors (q, keys or key + shifts, v), the log prior (learned: a leaf; em: no gradient; uniform:
    None) and a padding mask that hides the last 3 keys of the second sequence."""
    g = torch.Generator().manual_seed(n * 1000 + s * 10 + m)
    q = torch.randn(B, h, n, d, generator=g)
    keys = ([torch.randn(B, h, s, d, generator=g), 0.5 * torch.randn(h, m, d, generator=g)] if shared
            else [torch.randn(B, h, m, s, d, generator=g)])
    v = torch.randn(B, h, s, dv, generator=g)
    leaves = [t.to(device, dtype).requires_grad_() for t in [q, *keys, v]]
    lp = None if prior == "uniform" else torch.log_softmax(torch.randn(h, m, generator=g), -1).to(device, dtype)
    if prior == "learned":
        lp.requires_grad_()
    mask = torch.ones(B, s, dtype=torch.bool, device=device)
    mask[1, s - 3:] = False
    return leaves, lp, mask


def _call(fn, leaves, lp, shared, **kw):
    """fn = mgk_attention (the fast functions, sMGK: smgk_attention) or mgk_attention_reference."""
    if shared:
        fn = smgk_attention_reference if fn is mgk_attention_reference else smgk_attention
    return fn(*leaves[:-1], leaves[-1], log_prior=lp, **kw) if shared else fn(*leaves, log_prior=lp, **kw)


_grads = cotangent_grads


def _names(shared, with_prior=False):
    return (["q", "key", "shift", "v"] if shared else ["q", "keys", "v"]) + ["log_prior"] * with_prior


def _reference(leaves, lp, shared, kw, with_prior=False):
    """conftest.assert_exact's reference(dtype): the literal reference on the call's inputs cast to dtype, and its
    leaves (the log prior among them `with_prior`)."""
    def reference(dtype):
        xs = [t.detach().to(dtype).requires_grad_() for t in leaves]
        lpx = None if lp is None else lp.detach().to(dtype).requires_grad_(with_prior)
        return _call(mgk_attention_reference, xs, lpx, shared, **kw), xs + ([lpx] if with_prior else [])
    return reference


def _variances(m, d):
    return [math.sqrt(d) * (1 + 2 * r) for r in range(m)]


def _check(shared, e_step, prior, m, n, s, d, dv, causal, padded, device, dtype=torch.float32, rtol=1e-5,
           atol=1e-6, h=1):
    """Triton output and gradients against the reference. float32: as exact as the reference evaluated in float32,
    both against float64 (conftest.assert_exact; the log prior's gradient is a sum of cancelling terms,
    sum_r d/dlog pi_r = 0, of the size of the other gradients, and can be far smaller than they are: its floor is
    theirs). Half precision: against the float64 reference of the same rounded inputs at that precision's
    tolerance (rtol, atol)."""
    leaves, lp, mask = _inputs(n, s, m, d, dv, shared, prior, device, dtype, h)
    kw = dict(variances=_variances(m, d), e_step=e_step, attention_mask=mask if padded else None, is_causal=causal)
    out = _call(mgk_attention, leaves, lp, shared, backend="triton", **kw)
    assert out.dtype == dtype and out.shape == (B, h, n, dv)
    with_prior = prior == "learned" and e_step == "soft"  # hard: pi plays no role
    grads = _grads(out, leaves + ([lp] if with_prior else []))
    names = _names(shared, with_prior)
    reference = _reference(leaves, lp, shared, kw, with_prior)

    if dtype == torch.float32:
        assert_exact(out, grads, reference, names, cancelling={"log_prior"})
        return
    ref64, leaves64 = reference(torch.float64)
    grads64 = _grads(ref64.to(dtype), leaves64)
    assert_close(out.double(), ref64, rtol, atol, msg="output")
    for name, got, want in zip(names, grads, grads64, strict=True):
        tol = rtol * grads[0].abs().max().item() if name == "log_prior" else atol
        assert_close(got.double(), want.double(), rtol, tol, msg=f"grad {name}")


# (prior, M, N, S, D, Dv, causal, padded, heads): the interpreter's blocks are 32 x 32, so 37 and 40 span
# two blocks and end inside one; N < S causal is a cache (bottom-right aligned)
CASES = [
    ("learned", 2, 37, 37, 32, 32, False, True, 1),
    ("learned", 2, 13, 40, 16, 16, True, True, 1),
    ("uniform", 3, 20, 20, 64, 64, True, False, 1),
    ("em", 1, 9, 9, 32, 16, False, True, 2),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
@pytest.mark.parametrize("e_step", ["soft", "hard"])
@pytest.mark.parametrize("prior,m,n,s,d,dv,causal,padded,h", CASES)
def test_triton_matches_reference(device, shared, e_step, prior, m, n, s, d, dv, causal, padded, h):
    _check(shared, e_step, prior, m, n, s, d, dv, causal, padded, device, h=h)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
@pytest.mark.parametrize("e_step", ["soft", "hard"])
def test_triton_half_precision_matches_reference(device, shared, e_step):
    """bfloat16 inputs (float32 accumulation) at bfloat16's tolerance, float16 (one case) at float16's."""
    _check(shared, e_step, "learned", 2, 20, 20, 32, 32, True, True, device, torch.bfloat16, rtol=3e-2,
           atol=1e-3)
    if not shared and e_step == "soft":
        _check(shared, e_step, "learned", 2, 20, 20, 32, 32, True, True, device, torch.float16, rtol=5e-3,
               atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shared,m,d,dv", [(True, 2, 24, 8), (False, 4, 128, 128)])
def test_other_head_sizes_and_four_keys(device, shared, m, d, dv):
    """Head sizes are padded to a power of two inside the kernels (masked loads); the largest head size, and M = 4."""
    _check(shared, "soft", "learned", m, 10, 10, d, dv, False, True, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
@pytest.mark.parametrize("e_step", ["soft", "hard"])
def test_rows_that_see_no_key_give_zero(device, shared, e_step):
    """Causal with N > S (the first N - S rows see no key) and a sequence of padding only: zero output and zero
    gradients from those rows, as the other paths; the rest as the reference."""
    leaves, lp, _ = _inputs(7, 4, 2, 16, 16, shared, "learned", device)
    mask = torch.ones(B, 4, dtype=torch.bool, device=device)
    mask[1] = False
    kw = dict(variances=_variances(2, 16), e_step=e_step, is_causal=True, attention_mask=mask)
    out = _call(mgk_attention, leaves, lp, shared, backend="triton", **kw)
    assert out[:, :, :3].abs().max() == 0 and out[1].abs().max() == 0
    grads = _grads(out, leaves)
    assert all(torch.isfinite(g).all() for g in grads)
    assert_exact(out, grads, _reference(leaves, lp, shared, kw), _names(shared))


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_runs_the_kernels_in_its_dtype(device):
    """float32 inputs under autocast: the kernels run in autocast's dtype, as its matmuls would."""
    leaves, lp, mask = _inputs(8, 8, 2, 16, 16, True, "learned", device)
    kw = dict(variances=_variances(2, 16), attention_mask=mask, backend="triton")
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
        out = _call(mgk_attention, leaves, lp, True, **kw)
    with torch.no_grad():
        half = _call(mgk_attention, [t.bfloat16() for t in leaves[:2]] + leaves[2:3] + [leaves[3].bfloat16()], lp,
                     True, **kw)
    assert out.dtype == torch.bfloat16 and torch.equal(out, half)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
def test_hard_e_step_ties_share_the_gradient(device, shared):
    """Two identical keys (equal shifts / key tensors, equal variances): the gradient is split between them, as
    torch.amax's backward splits it in the reference."""
    leaves, lp, mask = _inputs(6, 6, 2, 16, 16, shared, "uniform", device)
    with torch.no_grad():
        if shared:
            leaves[2][:, 1] = leaves[2][:, 0]
        else:
            leaves[1][:, :, 1] = leaves[1][:, :, 0]
    kw = dict(variances=[3.0, 3.0], e_step="hard", attention_mask=mask)
    out = _call(mgk_attention, leaves, lp, shared, backend="triton", **kw)
    assert_exact(out, _grads(out, leaves), _reference(leaves, lp, shared, kw), _names(shared))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shared", [False, True], ids=["mgk", "smgk"])
@pytest.mark.parametrize("e_step", ["soft", "hard"])
def test_dropout_drops_the_mixture_weights(device, shared, e_step):
    """With V the identity the output is the dropped weights: each a_ij is kept with probability 1 - p and scaled by
    1 / (1 - p); backward uses the same mask (gradients equal the reference's weights times that mask, times V); the
    same seed repeats the draw and another seed changes it."""
    n, p = 32, 0.3
    leaves, lp, mask = _inputs(n, n, 2, 16, n, shared, "learned", device)
    with torch.no_grad():
        leaves[-1].copy_(torch.eye(n, device=device).expand_as(leaves[-1]))
    kw = dict(variances=_variances(2, 16), e_step=e_step, attention_mask=mask, is_causal=True)
    torch.manual_seed(7)
    out = _call(mgk_attention, leaves, lp, shared, backend="triton", dropout_p=p, **kw)
    _, weights = _call(mgk_attention_reference, leaves, lp, shared, return_weights=True, **kw)
    visible = weights.detach() > 0
    kept = (out.detach() != 0).to(weights.dtype) / (1 - p)
    dropped = (out.detach()[visible] == 0).float().mean().item()
    assert abs(dropped - p) < 0.06, dropped  # about 1000 visible pairs: the binomial's sd is 0.015
    with_prior = e_step == "soft"

    def reference(dtype):  # the reference's weights, the kernel's dropout mask, times V
        weights_of = _reference(leaves, lp, shared, dict(kw, return_weights=True), with_prior)
        (_, w), xs = weights_of(dtype)
        return torch.matmul(w * kept.to(dtype), xs[-2 if with_prior else -1]), xs

    grads = _grads(out, leaves + ([lp] if with_prior else []))
    assert_exact(out, grads, reference, _names(shared, with_prior), cancelling={"log_prior"})
    torch.manual_seed(7)
    again = _call(mgk_attention, leaves, lp, shared, backend="triton", dropout_p=p, **kw)
    other = _call(mgk_attention, leaves, lp, shared, backend="triton", dropout_p=p, **kw)
    assert torch.equal(again, out) and not torch.equal(other, out)


@pytest.mark.skipif(not at.interpreting(), reason="CPU tensors need the interpreter (HF_MGK_TEST_CUDA=1)")
def test_triton_refusals(monkeypatch):
    """Asked for where the kernels cannot run, backend="triton" is a ValueError that says why."""
    leaves, lp, mask = _inputs(5, 5, 2, 16, 16, False, "learned", "cpu")
    kw = dict(variances=_variances(2, 16), log_prior=lp, backend="triton")

    def refused(match, *args, **extra):
        with pytest.raises(ValueError, match=f"backend 'triton' cannot run this call: {match}"):
            mgk_attention(*(args or leaves), **{**kw, **extra})

    refused("return_weights", return_weights=True)
    refused("a whole 4-D mask", attention_mask=torch.ones(1, 1, 5, 5, dtype=torch.bool))
    refused("variances that need a gradient", variances=torch.tensor(_variances(2, 16), requires_grad=True))
    refused("head size 256", torch.randn(1, 1, 3, 256), torch.randn(1, 1, 2, 3, 256), torch.randn(1, 1, 3, 8))
    refused("torch.float64", *[t.detach().double() for t in leaves])
    check_environment_refusals(monkeypatch, refused, am)
    # and smgk_attention the same way
    q, key, shift, v = _inputs(5, 5, 2, 16, 16, True, "learned", "cpu")[0]
    with pytest.raises(ValueError, match="backend 'triton' cannot run this call: return_weights"):
        smgk_attention(q, key, shift, v, variances=_variances(2, 16), backend="triton", return_weights=True)


def test_more_than_four_keys_stay_off_the_kernels():
    """The kernels are tested for M = 1 to 4: auto keeps M >= 5 on the torch paths even on a GPU, and asking for
    the kernels says why."""
    call = dict(e_step="soft", return_weights=False, device_type="cuda", dtype=torch.float32, autocast=False,
                tracing=False, mask=None, triton=True)
    assert choose_backend(**call, num_keys=4) == "triton"
    assert choose_backend(**call, num_keys=5) == "sdpa"
    assert choose_backend(**{**call, "e_step": "hard"}, num_keys=5) == "dense"
    q, v = torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8)
    with pytest.raises(ValueError, match=r"backend 'triton' cannot run this call: 5 keys per position \(the "
                                         r"kernels are tested for M = 1 to 4\)"):
        mgk_attention(q, torch.randn(1, 1, 5, 3, 8), v, variances=_variances(5, 8), backend="triton")


def test_a_fallback_from_the_kernels_is_said_once_with_its_reason(monkeypatch, caplog):
    """On a GPU with the kernels installed and switched on, auto taking a torch path because the kernels refuse
    the call says so once per reason, at INFO; nothing is said where the kernels are off or never apply."""
    from hf_mgk import attention_blocks as ab

    monkeypatch.setattr(ab, "_FALLBACKS_SAID", set())
    monkeypatch.setattr(am, "triton_available", lambda: True)
    facts = dict(e_step="soft", return_weights=False, device_type="cuda", dtype=torch.float32, autocast=False,
                 tracing=False, mask="pairs", triton=True)

    def auto(**extra):
        call = {**facts, **extra}
        return ab.resolve_backend("auto", choose_backend(**call), am._refusals(**call), device_type="cuda")

    with caplog.at_level("INFO", logger="hf_mgk.attention_blocks"):
        assert auto() == "sdpa" and auto() == "sdpa"        # a 4-D mask, twice: said once
        assert auto(mask=None, tracing=True) == "sdpa"      # traced / exported
        assert auto(mask=None, variance_grad=True) == "sdpa"
        assert auto(mask=None, return_weights=True) == "dense"
        assert auto(mask=None) == "triton"                  # the kernels run: nothing to say
        assert auto(triton=False) == "sdpa"                 # switched off or not installed: the user's choice
        ab.resolve_backend("auto", "blocked", am._refusals(**{**facts, "device_type": "cpu"}), device_type="cpu")
    said = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    assert len(said) == 4, said
    for reason in ("a whole 4-D mask", "tracing or compiling", "variances that need a gradient", "return_weights"):
        assert sum(reason in line for line in said) == 1, (reason, said)
    assert all("the Triton kernels do not run this attention call" in line for line in said)


def test_auto_never_takes_triton_on_the_cpu():
    """Even in the interpreter, backend="auto" on CPU tensors keeps the CPU paths (the interpreter is for tests)."""
    call = dict(e_step="soft", return_weights=False, device_type="cpu", dtype=torch.float32, autocast=False,
                tracing=False, mask=None, triton=True)
    assert choose_backend(**call) == "blocked"
    assert choose_backend(**{**call, "dtype": torch.bfloat16}) == "sdpa"
    assert choose_backend(**{**call, "device_type": "cuda"}) == "triton"


_COMPILE = """
import itertools, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import os
ARCH = int(os.environ["HF_MGK_TEST_ARCH"])
import hf_mgk.attention_mgk_triton as amt
RUNTIME = {"N": "i32", "S": "i32", "D": "i32", "DV": "i32", "SEED": "i32", "P_DROP": "fp32"}
for dt, (hard, shared) in itertools.product(["bf16"], [(False, False), (True, True), (True, False)]):
    base = dict(DROPOUT=True, M=2, HARD=hard, CAUSAL=True, SHARED=shared, EVEN_N=hard, EVEN_S=hard, EVEN_D=not hard,
                PREC="ieee" if dt == "fp32" else None, BLOCK_M=32, BLOCK_N=32, BLOCK_D=32, BLOCK_DV=32)
    one_pass = amt.is_one_pass(hard, shared, 2)
    for fn, extra in [(amt._fwd_kernel, {}), (amt._bwd_dkv_kernel, {"DQ_ATOMIC": one_pass})] + (
            [] if one_pass else [(amt._bwd_dq_kernel, {})]):
        consts = {**base, **extra}
        sig = {a: "constexpr" if a in consts else RUNTIME.get(a, "*" + dt if a in "Q K V DO O" else "*fp32")
               for a in fn.arg_names}
        triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", ARCH, 32))
print("compiled")
"""


@pytest.mark.slow
@pytest.mark.parametrize("arch", [90, 86, 80])  # H100; RTX 30 (the least shared memory, 99 KB); A100
def test_kernels_compile_for_a_gpu_without_one(arch):
    """The interpreter runs the kernels as Python, so what only the compiler rejects (types of loop-carried values,
    constexpr branches, dot shapes) shows here: the kernels compiled for sm_90, sm_86 and sm_80 (Triton's frontend
    and ptxas, no GPU needed), soft MGK, hard sMGK and hard MGK (one pass) in bfloat16, with dropout and causal masks (float32's IEEE
    products take ~10 s a kernel to compile: checked by hand). Blocks of 32 (the GPU's 64 compile too, in about
    three times as long: checked by hand)."""
    import subprocess
    import sys

    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "HF_MGK_TEST_ARCH": str(arch)}
    done = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]


def test_dropout_past_the_kernels_counters_stays_off_them(monkeypatch):
    """The kernels' dropout draws count N x S positions in 32 bits: past 2^31 auto keeps the torch paths (the
    counters would wrap and repeat masks), and asking for the kernels says why; without dropout nothing is drawn."""
    call = dict(e_step="soft", return_weights=False, device_type="cuda", dtype=torch.float32, autocast=False,
                tracing=False, mask=None, triton=True)
    assert choose_backend(**call, counter=2**31 - 1) == "triton"
    assert choose_backend(**call, counter=2**31) == "sdpa"
    why = am._refusals(**call, counter=2**31)["triton"]
    assert why.startswith("dropout on sequences this long") and "2147483648 >= 2^31" in why
    seen = []
    monkeypatch.setattr(am, "choose_backend", lambda **facts: seen.append(facts["counter"]) or "dense")
    q, v = torch.randn(1, 1, 3, 8), torch.randn(1, 1, 5, 8)
    for p in (0.1, 0.0):
        am.mgk_attention(q, torch.randn(1, 1, 2, 5, 8), v, variances=[1.0, 3.0], dropout_p=p)
    assert seen == [15, 0]  # N x S = 3 x 5 with dropout
