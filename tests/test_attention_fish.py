"""Tests of the FiSH attention math (src/hf_mgk/attention_fish.py) against the plain reference (hf_mgk.reference):
every backend, the backend rule; tiny shapes, CPU, float32 unless noted."""

import math

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from hf_mgk.attention_fish import BACKENDS, BLOCK_ROWS, choose_backend, fish_attention, make_gfish_mixing
from hf_mgk.flops import fish_cost
from hf_mgk.reference import fish_attention_reference

B, M, H = 2, 2, 3
VARIANTS = ["hard_fish", "fish", "mish", "mish_noise", "hard_gfish", "gfish"]


def make_case(variant, N=6, S=6, D=4, Dv=5, seed=0, pad=False):
    """Leaf tensors (and module) for one variant; returns (args, kwargs, leaves)."""
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(B, M, N, D, generator=g).requires_grad_()
    key = torch.randn(B, M, S, D, generator=g).requires_grad_()
    value = torch.randn(B, H, S, Dv, generator=g).requires_grad_()
    leaves = [query, key, value]
    if variant.endswith("gfish"):
        torch.manual_seed(seed)
        mixing = make_gfish_mixing(M, H)
        leaves += list(mixing.parameters())
    else:
        mixing = torch.randn(M, 1 if variant.startswith("mish") else H, generator=g).requires_grad_()
        leaves.append(mixing)
    kwargs = {}
    if variant in ("fish", "mish_noise", "gfish"):
        kwargs["noise_std"] = (0.5 + torch.rand(M, generator=g)).requires_grad_()
        leaves.append(kwargs["noise_std"])
    if pad:
        mask = torch.ones(B, S, dtype=torch.bool)
        mask[0, :2] = False  # left padding: with is_causal the first queries of item 0 see no key
        mask[1, -1] = False
        kwargs["attention_mask"] = mask
    return (query, key, value, mixing), kwargs, leaves


def run(fn, args, kwargs, leaves, seed=123, **extra):
    """Output and gradients of sum(out * fixed random weights), with a fixed noise generator."""
    for t in leaves:
        t.grad = None
    out = fn(*args, **kwargs, generator=torch.Generator().manual_seed(seed), **extra)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    (out * w).sum().backward()
    return out.detach(), [None if t.grad is None else t.grad.clone() for t in leaves]


def assert_rel(actual, expected, tol=1e-5, floor=1e-12):
    """Max error <= tol * max |expected|; floor stands in for that size where the exact value is 0."""
    err = (actual - expected).abs().max().item()
    size = max(expected.abs().max().item(), floor)
    assert err <= tol * size, f"max error {err:.3g} vs size {size:.3g}"


def assert_grads_rel(grads, ref_grads, tol=1e-5):
    # Some gradients are exactly 0 in exact arithmetic (e.g. GFiSH's last bias: softmax ignores a
    # constant shift of a row) and come out as sums of cancelling terms: judge them against 10% of
    # the largest gradient, not against 0.
    floor = 0.1 * max(g.abs().max().item() for g in ref_grads)
    for g, rg in zip(grads, ref_grads):
        assert g is not None and rg is not None
        assert_rel(g, rg, tol, floor)


PATHS = {  # the `path` fixture's names -> fish_attention's keyword arguments
    "default": {}, "blocks": {"block_rows": 2}, "recompute": {"block_rows": 2, "keep_bytes": 0},
    "fused": {"backend": "fused"}, "autograd": {"backend": "blocked", "block_rows": 2}}


@pytest.fixture(params=["blocks", "recompute", "fused", "autograd"])
def path(request):
    """blocks: query blocks of 2 rows, so block slicing is exercised (the hand-written backward for FiSH, hard
    FiSH and MiSH with noise, keeping the blocks' weights; autograd through the materialised blocks for the
    rest); recompute: the same with nothing kept (weights recomputed in backward, as for long sequences); fused:
    the fused SDPA backend for hard FiSH (linear mixing without noise), as on an accelerator; autograd: blocks of 2
    rows through autograd for every variant, as under autocast. See `path_kwargs`."""
    return request.param


def path_kwargs(path, variant, return_weights=False):
    """fish_attention's keyword arguments for `path` (PATHS); "fused" names the fused backend only where it can run
    (hard FiSH, no weights) and leaves the automatic choice elsewhere."""
    kw = dict(PATHS[path])
    if kw.get("backend") == "fused" and (variant != "hard_fish" or return_weights):
        del kw["backend"]
    return kw


def same_noise(kw):
    """The reference's keyword arguments that make it draw fish_attention's noise (the same blocks of rows)."""
    return {"block_rows": kw.get("block_rows", BLOCK_ROWS)}


@pytest.mark.parametrize("N,S", [(6, 6), (3, 7), (1, 7), (5, 3)])  # N < S: cached decoding
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("variant,path", [(v, p) for p in ("default", "blocks") for v in VARIANTS]
                         + [(v, "recompute") for v in ("hard_fish", "fish", "mish_noise", "hard_gfish", "gfish")]
                         + [("hard_fish", "fused")] + [(v, "autograd") for v in ("hard_fish", "fish", "gfish")],
                         indirect=["path"])  # fused: linear, no noise
def test_fast_path_matches_reference(variant, pad, causal, N, S, path):
    args, kwargs, leaves = make_case(variant, N=N, S=S, pad=pad)
    kw = path_kwargs(path, variant)
    out, grads = run(fish_attention, args, kwargs, leaves, is_causal=causal, **kw)
    ref, ref_grads = run(fish_attention_reference, args, kwargs, leaves, is_causal=causal, **same_noise(kw))
    assert out.shape == (B, H, N, 5)
    assert_rel(out, ref)
    assert_grads_rel(grads, ref_grads)


@pytest.mark.parametrize("variant,backend", [  # fused: an (M, H) p without noise; recomputed: not MiSH without noise
    (v, b) for v in VARIANTS for b in BACKENDS  # triton (its own noise): tests/test_attention_fish_triton.py
    if (b != "fused" or v == "hard_fish") and (v, b) != ("mish", "recomputed") and b != "triton"])
@pytest.mark.parametrize("N,S", [(6, 6), (3, 7)])
@pytest.mark.parametrize("causal", [False, True])
def test_every_backend_matches_reference(variant, backend, N, S, causal):
    args, kwargs, leaves = make_case(variant, N=N, S=S, pad=True)
    out, grads = run(fish_attention, args, kwargs, leaves, is_causal=causal, backend=backend, block_rows=2)
    ref, ref_grads = run(fish_attention_reference, args, kwargs, leaves, is_causal=causal, block_rows=2)
    assert_rel(out, ref)
    assert_grads_rel(grads, ref_grads)


@pytest.mark.parametrize("D,Dv", [(4, 5), (2, 6), (4, 8)])  # M*D > Dv, M*D < Dv, M*D == Dv
def test_fused_backend_pads_the_smaller_head_size(D, Dv):
    args, kwargs, leaves = make_case("hard_fish", D=D, Dv=Dv, pad=True)
    out, grads = run(fish_attention, args, kwargs, leaves, is_causal=True, backend="fused")
    ref, ref_grads = run(fish_attention_reference, args, kwargs, leaves, is_causal=True)
    assert out.shape == (B, H, 6, Dv)
    assert_rel(out, ref)
    assert_grads_rel(grads, ref_grads)


FISH_RULE = [  # facts of a call -> the backend backend="auto" takes
    (dict(), "recomputed"),  # CPU training with an (M, H) mixing tensor: the hand-written backward
    (dict(requires_grad=False), "fused"),  # without autograd, linear mixing without noise: fused SDPA
    (dict(device_type="cuda"), "fused"),
    (dict(device_type="cuda", autocast=True), "fused"),
    (dict(tracing=True), "fused"),  # traced: the plain formulas, not the hand-written backward
    (dict(noise=True), "recomputed"),
    (dict(noise=True, device_type="cuda"), "recomputed"),
    (dict(noise=True, requires_grad=False), "blocked"),
    (dict(noise=True, tracing=True), "blocked"),
    (dict(mixing="shared"), "blocked"),  # MiSH without noise: one shared softmax, computed once
    (dict(mixing="shared", requires_grad=False), "blocked"),
    (dict(mixing="shared", noise=True), "recomputed"),
    (dict(mixing="gfish"), "recomputed"),
    (dict(mixing="gfish", device_type="cuda"), "blocked"),
    (dict(mixing="gfish", requires_grad=False), "blocked"),
    (dict(mixing="module"), "blocked"),  # any other mixing network
    (dict(dropout=True), "blocked"),
    (dict(dropout=True, requires_grad=False), "blocked"),
    (dict(return_weights=True), "blocked"),
    (dict(return_weights=True, requires_grad=False), "blocked"),
    (dict(autocast=True), "blocked"),  # the hand-written backward is float32/64 only
    (dict(dtype=torch.bfloat16), "blocked"),
    (dict(dtype=torch.bfloat16, requires_grad=False), "fused"),
]


@pytest.mark.parametrize("facts,expected", FISH_RULE)
def test_backend_rule(facts, expected):
    call = dict(mixing="heads", noise=False, dropout=False, return_weights=False, device_type="cpu",
                dtype=torch.float32, autocast=False, requires_grad=True, tracing=False)
    assert choose_backend(**{**call, **facts}) == expected


@pytest.mark.parametrize("variant,grad,expected", [
    ("hard_fish", True, "recomputed"), ("hard_fish", False, "fused"), ("fish", True, "recomputed"),
    ("fish", False, "blocked"), ("mish", True, "blocked"), ("mish_noise", True, "recomputed"),
    ("gfish", True, "recomputed"), ("hard_gfish", False, "blocked")])
def test_auto_is_the_backend_the_rule_names(variant, grad, expected):
    """backend="auto" computes bit for bit what the backend `choose_backend` names computes."""
    args, kwargs, _ = make_case(variant, pad=True)
    with torch.set_grad_enabled(grad):
        auto, named = (fish_attention(*args, **kwargs, is_causal=True, generator=torch.Generator().manual_seed(2),
                                      **kw) for kw in ({}, {"backend": expected}))
    assert torch.equal(auto, named)


def test_backend_errors_name_the_allowed_ones():
    args, kwargs, _ = make_case("fish")
    with pytest.raises(ValueError, match=r"unknown backend 'sdpa'; allowed: 'auto', 'fused', 'recomputed', 'blocked'"):
        fish_attention(*args, backend="sdpa")
    with pytest.raises(ValueError, match=r"backend 'fused' cannot run this call: noise"):
        fish_attention(*args, **kwargs, backend="fused")
    with pytest.raises(ValueError, match=r"backend 'fused' cannot run this call: a mixing other than"):
        fish_attention(*args[:3], args[3][:, :1], backend="fused")
    with pytest.raises(ValueError, match=r"backend 'recomputed' cannot run this call: MiSH without noise"):
        fish_attention(*args[:3], args[3][:, :1], backend="recomputed")
    with pytest.raises(ValueError, match=r"backend 'recomputed' cannot run this call: return_weights"):
        fish_attention(*args, backend="recomputed", return_weights=True)
    other = nn.Sequential(nn.Linear(M, H), nn.Tanh(), nn.Linear(H, H))
    with pytest.raises(ValueError, match=r"backend 'recomputed' cannot run this call: a mixing network other"):
        fish_attention(*args[:3], other, backend="recomputed")


def test_gfish_without_autograd_inputs():
    """A mixing network with inputs that need no gradient: autograd is decided by its parameters too."""
    args, _, _ = make_case("hard_gfish")
    out = fish_attention(*(a.detach() for a in args[:3]), args[3])
    assert out.requires_grad


def test_reference_is_the_formula():
    """The reference against a literal loop over heads and positions (hard FiSH and hard GFiSH)."""
    N, S, D = 3, 5, 4
    args, kwargs, _ = make_case("hard_fish", N=N, S=S, D=D, pad=True)
    query, key, value, p = (t.detach() for t in args)
    mask = kwargs["attention_mask"]
    gnet = make_gfish_mixing(M, H)
    for mixing in (p, gnet):
        out = fish_attention_reference(query, key, value, mixing, attention_mask=mask, is_causal=True)
        for b in range(B):
            for i in range(N):
                for j in range(H):
                    scores = []
                    for s in range(S):
                        g = torch.stack([query[b, k, i] @ key[b, k, s] / math.sqrt(D) for k in range(M)])
                        a = (g @ p[:, j]) if mixing is p else gnet(g)[j]
                        visible = bool(mask[b, s]) and s <= i + S - N
                        scores.append(a if visible else torch.tensor(-math.inf))
                    w = torch.softmax(torch.stack(scores), 0)
                    expected = w @ value[b, j] if w.isfinite().all() else torch.zeros(value.shape[-1])
                    torch.testing.assert_close(out[b, j, i], expected, rtol=1e-5, atol=1e-6)


def test_mish_equals_fish_with_repeated_column():
    args, kwargs, _ = make_case("mish", pad=True)
    query, key, value, p = args
    out_mish = fish_attention(query, key, value, p, is_causal=True, **kwargs)
    out_fish = fish_attention(query, key, value, p.expand(M, H), is_causal=True, **kwargs)
    assert_rel(out_mish, out_fish)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("N,S", [(7, 7), (3, 7)])
def test_causal_never_sees_later_keys(variant, N, S, path):
    args, kwargs, _ = make_case(variant, N=N, S=S)
    query, key, value, mixing = args
    kw = path_kwargs(path, variant)
    out = fish_attention(*args, **kwargs, is_causal=True, generator=torch.Generator().manual_seed(1), **kw)
    for t in range(S - N, S - 1):  # absolute positions of the queries, all but the last
        key2, value2 = key.detach().clone(), value.detach().clone()
        key2[:, :, t + 1:] = 100 * torch.randn_like(key2[:, :, t + 1:])
        value2[:, :, t + 1:] = 100 * torch.randn_like(value2[:, :, t + 1:])
        out2 = fish_attention(query, key2, value2, mixing, **kwargs, is_causal=True,
                              generator=torch.Generator().manual_seed(1), **kw)
        rows = t - (S - N) + 1  # queries at positions <= t
        torch.testing.assert_close(out[:, :, :rows], out2[:, :, :rows], rtol=1e-6, atol=1e-7)
        assert not torch.allclose(out[:, :, rows:], out2[:, :, rows:])


@pytest.mark.parametrize("variant", ["hard_fish", "mish", "hard_gfish"])
def test_cached_decoding_matches_full_sequence(variant):
    """N < S: the queries are the last N positions (bottom-right causal alignment)."""
    args, kwargs, _ = make_case(variant, N=7, S=7, pad=True)
    query, key, value, mixing = args
    full = fish_attention(*args, **kwargs, is_causal=True)
    for n in (1, 3):
        last = fish_attention(query[:, :, -n:], key, value, mixing, **kwargs, is_causal=True)
        assert_rel(last, full[:, :, -n:])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True])
def test_padded_keys_change_nothing(variant, causal, path):
    args, kwargs, _ = make_case(variant, N=5, S=5, pad=True)
    query, key, value, mixing = args
    padded = ~kwargs["attention_mask"]
    kw = path_kwargs(path, variant)
    out = fish_attention(*args, **kwargs, is_causal=causal, generator=torch.Generator().manual_seed(1), **kw)
    key2, value2 = key.detach().clone(), value.detach().clone()
    key2.permute(0, 2, 1, 3)[padded] = 1e4 * torch.randn(int(padded.sum()), M, key.shape[-1])
    value2.permute(0, 2, 1, 3)[padded] = 1e4 * torch.randn(int(padded.sum()), H, value.shape[-1])
    out2 = fish_attention(query, key2, value2, mixing, **kwargs, is_causal=causal,
                          generator=torch.Generator().manual_seed(1), **kw)
    torch.testing.assert_close(out, out2, rtol=1e-6, atol=1e-7)
    assert out.isfinite().all()
    if causal:  # item 0 is left-padded by 2: its first two queries see no key and output zeros
        assert (out[0, :, :2] == 0).all()


@pytest.mark.parametrize("variant", ["fish", "mish_noise", "gfish"])
def test_noise(variant):
    args, kwargs, leaves = make_case(variant)
    sigma = kwargs["noise_std"]
    out1 = fish_attention(*args, **kwargs)
    out2 = fish_attention(*args, **kwargs)
    assert not torch.allclose(out1, out2), "noise must be drawn anew on every call"
    out1.pow(2).sum().backward()
    assert sigma.grad is not None and sigma.grad.abs().min() > 0
    same1 = fish_attention(*args, **kwargs, generator=torch.Generator().manual_seed(5))
    same2 = fish_attention(*args, **kwargs, generator=torch.Generator().manual_seed(5))
    assert torch.equal(same1, same2)
    no_noise = dict(kwargs, noise_std=None)
    assert torch.equal(fish_attention(*args, **no_noise), fish_attention(*args, **no_noise))


@pytest.mark.parametrize("shared", [False, True])
def test_noise_has_the_admixture_variance(shared):
    """With G = 0 and two keys, logit(weight of key 0) = A_j0 - A_j1 ~ N(0, 2 sum_k p_kj^2 sigma_k^2),
    independent over local heads j: the one-draw-per-head form of sum_k p_kj sigma_k eps_jk."""
    n = 4000
    query = torch.zeros(1, M, n, 4)
    key = torch.randn(1, M, 2, 4)
    value = torch.randn(1, H, 2, 5)
    p = torch.tensor([[0.3], [-1.2]]) if shared else torch.tensor([[0.3, 1.0, 0.0], [-1.2, 0.5, 2.0]])
    sigma = torch.tensor([0.7, 0.4])
    _, w = fish_attention(query, key, value, p, noise_std=sigma, return_weights=True,
                          generator=torch.Generator().manual_seed(0))
    logits = torch.log(w[0, :, :, 0]) - torch.log(w[0, :, :, 1])  # (H, n)
    expected = 2 * (p.expand(M, H) ** 2 * sigma[:, None] ** 2).sum(0)
    torch.testing.assert_close(logits.var(dim=1), expected, rtol=0.1, atol=0)
    corr = torch.corrcoef(logits)
    assert (corr - torch.eye(H)).abs().max() < 0.1


def _fish_node(out):
    """The RecomputedFiSH backward node in out's graph (out may be a masked_fill of it)."""
    nodes = [out.grad_fn]
    while nodes:
        node = nodes.pop()
        if type(node).__name__ == "RecomputedFiSHBackward":
            return node
        nodes += [n for n, _ in node.next_functions if n is not None]
    raise AssertionError("no RecomputedFiSH in the graph")


@pytest.mark.parametrize("variant", ["hard_fish", "fish", "mish_noise", "hard_gfish", "gfish"])
@pytest.mark.parametrize("budget", [0, 2**28])
def test_training_memory_for_backward(variant, budget):
    """CPU training of FiSH / hard FiSH / MiSH with noise / (hard) GFiSH: nothing of size N x S goes through
    autograd's saved tensors; over the keep budget the blocks' scores and weights are not kept either (recomputed
    in backward); under it they are kept for the keys each block sees (GFiSH: also its hidden layer). Causal noise
    is drawn only for the keys a block of rows may see: about half the N x N pairs."""
    N, rows = 64, 16
    args, kwargs, leaves = make_case(variant, N=N, S=N, pad=variant == "hard_fish")
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        out = fish_attention(*args, **kwargs, is_causal=True, block_rows=rows, keep_bytes=budget)
    assert max(math.prod(s) for s in saved) < B * N * N
    _, tiles, kept, eps = _fish_node(out).blocks
    seen = sum(rows * (i + 1) * rows for i in range(N // rows))  # block i sees keys :(i + 1) * rows
    if budget == 0:
        assert kept == []
    else:
        assert sum(w.numel() for _, w in kept) == B * H * seen
        assert sum(sum(t.numel() for t in saved) for saved, _ in kept) == B * (
            M + H if variant.endswith("gfish") else M) * seen
    if variant.startswith("hard"):
        assert eps is None
    else:
        noise_heads = M if variant == "gfish" else H
        assert [e.shape for e in eps] == [(B, noise_heads, rows, (i + 1) * rows) for i in range(N // rows)]
    out.sum().backward()
    assert all(t.grad is not None for t in leaves)


@pytest.mark.parametrize("variant", ["hard_fish", "fish"])
def test_strided_inputs_as_the_model_passes_them(variant):
    """The model's heads are transposed views of one projection (B, N, heads * D): gradients must still land
    in the inputs (a buffer with their strides would make the accumulation write into a copy)."""
    N, D = 5, 4
    g = torch.Generator().manual_seed(0)
    proj = torch.randn(B, N, (2 * M + H) * D, generator=g, requires_grad=True)
    mixing = torch.randn(M, H, generator=g, requires_grad=True)
    sigma = torch.rand(M, generator=g).requires_grad_() if variant == "fish" else None
    leaves = [proj, mixing] + ([sigma] if sigma is not None else [])

    def heads(fn):
        q, k, v = proj.split([M * D, M * D, H * D], dim=-1)
        q, k, v = (x.view(B, N, -1, D).transpose(1, 2) for x in (q, k, v))
        return fn(q, k, v, mixing, noise_std=sigma, attention_mask=None)

    out, grads = run(lambda *a, **kw: heads(lambda *b, **c: fish_attention(*b, **c, **kw)), (), {}, leaves,
                     is_causal=True)
    ref, ref_grads = run(lambda *a, **kw: heads(lambda *b, **c: fish_attention_reference(*b, **c, **kw)), (), {},
                         leaves, is_causal=True)
    assert_rel(out, ref)
    assert_grads_rel(grads, ref_grads)


def test_zero_noise_std_has_finite_gradient():
    args, kwargs, _ = make_case("fish")
    sigma = torch.zeros(M, requires_grad=True)
    fish_attention(*args, noise_std=sigma).sum().backward()
    assert sigma.grad is not None and sigma.grad.isfinite().all()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("N,S", [(5, 5), (2, 5)])
def test_weights(variant, N, S, path):
    args, kwargs, _ = make_case(variant, N=N, S=S, pad=True)
    kw = path_kwargs(path, variant, return_weights=True)
    out, w = fish_attention(*args, **kwargs, is_causal=True, return_weights=True,
                            generator=torch.Generator().manual_seed(3), **kw)
    ref_out, ref_w = fish_attention_reference(*args, **kwargs, is_causal=True, return_weights=True,
                                              generator=torch.Generator().manual_seed(3), **same_noise(kw))
    assert w.shape == (B, H, N, S)
    assert_rel(w, ref_w)
    assert_rel(out, ref_out)
    torch.testing.assert_close(w @ args[2], out, rtol=1e-5, atol=1e-6)
    i = torch.arange(N)[:, None] + S - N
    visible = kwargs["attention_mask"][:, None, None, :] & (torch.arange(S)[None, :] <= i)
    assert (w.masked_select(~visible.expand_as(w)) == 0).all()
    has_key = visible.any(-1)
    sums = w.sum(-1)
    torch.testing.assert_close(sums[has_key.expand_as(sums)], torch.ones(int(has_key.expand_as(sums).sum())))
    assert (sums[~has_key.expand_as(sums)] == 0).all()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["autocast", "bf16"])
def test_bf16_is_finite(variant, mode):
    args, kwargs, leaves = make_case(variant, N=7, S=7, D=8, Dv=8, pad=True)
    if mode == "bf16":
        args = tuple(a.to(torch.bfloat16) for a in args)
        kwargs = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in kwargs.items()}
        if variant.endswith("gfish"):
            args = args[:3] + (make_gfish_mixing(M, H).to(torch.bfloat16),)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
        out = fish_attention(*args, **kwargs, is_causal=True)
    assert out.dtype == torch.bfloat16 and out.isfinite().all()
    out.float().sum().backward()
    # in "bf16" mode the bf16 copies lead back to the float32 leaves; a new GFiSH module is not a leaf
    for t in leaves if mode == "autocast" else leaves[:3]:
        assert t.grad is not None and t.grad.isfinite().all()
    if "noise_std" not in kwargs:  # close to float32 too
        ref = fish_attention_reference(*(a.detach().float() for a in args[:3]), args[3].float(),
                                       attention_mask=kwargs.get("attention_mask"), is_causal=True)
        assert (out.float() - ref).abs().max() < 0.1 * ref.abs().max()


@pytest.mark.parametrize("variant", ["hard_fish", "mish"])
def test_dropout(variant):
    args, kwargs, _ = make_case(variant, pad=True)
    torch.manual_seed(0)
    out, w = fish_attention(*args, **kwargs, dropout_p=0.5, return_weights=True)
    base, base_w = fish_attention(*args, **kwargs, return_weights=True)
    assert not torch.allclose(out, base)
    kept = (w != 0).float()
    torch.testing.assert_close(kept.sum() / (base_w != 0).sum(), torch.tensor(0.5), atol=0.1, rtol=0)
    assert not torch.equal(kept[:, 0], kept[:, 1]), "each local head drops its own entries"
    torch.testing.assert_close(w @ args[2], out, rtol=1e-5, atol=1e-6)


def test_shape_errors():
    args, _, _ = make_case("hard_fish")
    query, key, value, p = args
    with pytest.raises(ValueError):
        fish_attention(query, key[:, :1], value, p)
    with pytest.raises(ValueError):
        fish_attention(query, key, value, p[:, :2])
    with pytest.raises(ValueError):
        fish_attention(query, key, value, p, noise_std=torch.ones(M + 1))
    with pytest.raises(ValueError):
        fish_attention(query, key, value, p, attention_mask=torch.ones(B, 3, dtype=torch.bool))
    with pytest.raises(TypeError):
        fish_attention(query, key, value, "p")


class _CountOps(TorchDispatchMode):
    """Counts arithmetic the way App. D does: an (m x k)(k x n) product is m*n*(2k-1) operations, a bias
    or elementwise addition one per output element."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        aten = torch.ops.aten
        if func in (aten.mm.default, aten.bmm.default):
            self.ops += out.numel() * (2 * args[0].shape[-1] - 1)
        elif func in (aten.addmm.default, aten.baddbmm.default):
            self.ops += out.numel() * 2 * args[1].shape[-1]  # k multiplications, k-1 additions, bias
        elif func == aten.add.Tensor:
            self.ops += out.numel()
        else:
            assert func in (aten.t.default, aten.view.default, aten._unsafe_view.default,
                            aten.transpose.int, aten.expand.default, aten.clone.default,
                            aten.permute.default, aten._reshape_alias.default, aten.relu.default,
                            aten.detach.default, aten.unsqueeze.default, aten.select.int,
                            aten.squeeze.dim, aten.slice.Tensor), f"uncounted op {func}"
        return out


@pytest.mark.parametrize("variant", ["fish", "hard_fish", "mish", "gfish", "hard_gfish"])
def test_fish_cost_matches_a_direct_count(variant):
    Dx, Hh, Mm, D, N = 12, 4, 2, 3, 5
    cost = fish_cost(Dx, Hh, Mm, D, N, variant=variant)
    # App. D's closed forms for the savings (Section 3 / App. D.1-D.2), for the paper's own variant
    if variant == "fish":
        saved = (2 * (Hh - Mm) * D - 2 * Mm * Hh) * N * N + 2 * (Hh - Mm) * D * (2 * Dx - 1) * N
        assert cost["flops_saved"] == saved
        assert cost["params_saved"] == 2 * (Hh - Mm) * D * Dx - Hh * Mm - Mm
    noise = not variant.startswith("hard")

    # the equivalent layers: bias-free Q/K projections, then the attention-matrix computation
    mha = nn.ModuleList([nn.Linear(Dx, Hh * D, bias=False) for _ in range(2)])
    layer = nn.ModuleDict({"q": nn.Linear(Dx, Mm * D, bias=False), "k": nn.Linear(Dx, Mm * D, bias=False)})
    if variant.endswith("gfish"):
        layer["mix"] = make_gfish_mixing(Mm, Hh)
    else:
        layer["mix"] = nn.Linear(Mm, 1 if variant == "mish" else Hh, bias=False)
    params = sum(t.numel() for t in layer.parameters()) + (Mm if noise else 0)  # + sigma_k
    assert cost["fish_params"] == params
    assert cost["mha_params"] == sum(t.numel() for t in mha.parameters())

    x = torch.randn(N, Dx)
    noise_values = torch.randn(Mm, N, N)
    with torch.no_grad(), _CountOps() as counter:
        q = mha[0](x).view(N, Hh, D).transpose(0, 1)
        k = mha[1](x).view(N, Hh, D).transpose(0, 1)
        torch.bmm(q, k.transpose(1, 2))
    assert cost["mha_flops"] == counter.ops
    with torch.no_grad(), _CountOps() as counter:
        q = layer["q"](x).view(N, Mm, D).transpose(0, 1)
        k = layer["k"](x).view(N, Mm, D).transpose(0, 1)
        g = torch.bmm(q, k.transpose(1, 2))  # (M, N, N)
        if noise:
            g = g + noise_values
        layer["mix"](g.permute(1, 2, 0))  # (N, N, M) -> (N, N, H), MiSH (N, N, 1)
    assert cost["fish_flops"] == counter.ops


@pytest.mark.parametrize("variant", ["fish", "mish_noise", "gfish"])
@pytest.mark.parametrize("budget", [0, 2**28])
def test_second_backward_with_retained_graph(variant, budget):
    """backward twice through the hand-written path (retain_graph): the kept or recomputed blocks are unchanged by
    the first, so the second adds the same gradients again."""
    args, kwargs, leaves = make_case(variant, N=5, S=5, pad=True)
    out = fish_attention(*args, **kwargs, is_causal=True, generator=torch.Generator().manual_seed(3), block_rows=2,
                         keep_bytes=budget)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    once = torch.autograd.grad((out * w).sum(), leaves, retain_graph=True)
    twice = torch.autograd.grad((out * w).sum(), leaves)
    for a, b in zip(once, twice):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
