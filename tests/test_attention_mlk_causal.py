"""Causal MLK (mixture of linear keys) in chunks: against the explicit N x S reference, with several chunks, N < S
(cached decoding, bottom-right aligned), N > S, padding and gradients; and its memory stays O(N)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hf_mgk.attention_mgk import MLK_CHUNK, mlk_attention
from hf_mgk.reference import mlk_attention_reference

B, H, M, D, DV = 2, 3, 2, 5, 4


def _inputs(n, s, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, D, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(B, H, M, s, D, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(B, H, s, DV, generator=g, dtype=dtype).requires_grad_()
    lp = torch.log_softmax(torch.randn(H, M, generator=g, dtype=dtype), -1).requires_grad_()
    mask = torch.ones(B, s, dtype=torch.bool)
    mask[0, :3] = False  # left padding: with N > S - 3 the first queries of item 0 see no key
    mask[1, s - 2:] = False
    return q, k, v, lp, mask


def _out_and_grads(fn, q, k, v, lp, **kw):
    out = fn(q, k, v, log_prior=lp, is_causal=True, **kw)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    return [out.detach()] + list(torch.autograd.grad((out * w).sum(), (q, k, v, lp)))


@pytest.mark.parametrize("chunk", [1, 4, 64])
@pytest.mark.parametrize("n,s", [(13, 13), (12, 12), (5, 13), (1, 13), (4, 17), (13, 6)])
@pytest.mark.parametrize("padded", [False, True])
def test_chunked_causal_matches_reference(chunk, n, s, padded):
    """Several chunks (4 positions) and a ragged last one, queries the last N of S positions; float64, so the
    only difference is the order of the sums."""
    q, k, v, lp, mask = _inputs(n, s)
    kw = dict(attention_mask=mask if padded else None)
    fast = _out_and_grads(mlk_attention, q, k, v, lp, backend="linear", chunk_size=chunk, **kw)
    ref = _out_and_grads(mlk_attention_reference, q, k, v, lp, **kw)
    for a, b in zip(fast, ref):
        assert a.isfinite().all()  # also for queries that see no key
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    if n > s:  # queries before the first position see nothing: zero output
        assert (fast[0][:, :, : n - s] == 0).all()


def test_float32_round_off():
    """float32 against the float64 reference at a length of many chunks."""
    q, k, v, lp, mask = _inputs(300, 300, dtype=torch.float32)
    out = mlk_attention(q, k, v, log_prior=lp, attention_mask=mask, is_causal=True)
    ref = mlk_attention_reference(q.double(), k.double(), v.double(), log_prior=lp.double(), attention_mask=mask,
                                  is_causal=True)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)


def test_later_keys_change_nothing():
    """Changing the keys and values after query i's position leaves its output as it was (bottom-right: query i
    of N is position i + S - N)."""
    n, s, t = 9, 14, 4
    q, k, v, lp, _ = _inputs(n, s)
    out = mlk_attention(q, k, v, log_prior=lp, is_causal=True)
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, :, :, t + s - n + 1:] = 100 * torch.randn_like(k2[:, :, :, t + s - n + 1:])
    v2[:, :, t + s - n + 1:] = 100 * torch.randn_like(v2[:, :, t + s - n + 1:])
    out2 = mlk_attention(q, k2, v2, log_prior=lp, is_causal=True)
    torch.testing.assert_close(out[:, :, : t + 1], out2[:, :, : t + 1], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(out[:, :, t + 1:], out2[:, :, t + 1:])


class _LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_memory_is_linear_in_n():
    """No tensor of N x D x Dv numbers per head (the prefix sums of phi(k) v^T per position): at N = 1024, D = Dv =
    32 every tensor made, forward and backward, is at most B * H * N * max(C, D, Dv) numbers."""
    n, d = 1024, 32
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, n, d, generator=g, requires_grad=True)
    k = torch.randn(1, 2, M, n, d, generator=g, requires_grad=True)
    v = torch.randn(1, 2, n, d, generator=g, requires_grad=True)
    with _LargestTensor() as mode:
        mlk_attention(q, k, v, is_causal=True).sum().backward()
    assert mode.largest <= 2 * n * max(MLK_CHUNK, M * d), mode.largest
    assert mode.largest < 2 * n * d * d / 8


def test_export_with_a_dynamic_length():
    """torch.export with a symbolic length (the explicit form runs in the graph: the chunk padding would need
    guards on the length) gives the eager chunked result at lengths below, at and above a chunk."""

    class Causal(torch.nn.Module):
        def forward(self, q, k, v):
            return mlk_attention(q, k, v, is_causal=True)

    def inputs(n):
        g = torch.Generator().manual_seed(n)
        return torch.randn(1, 2, n, 8, generator=g), torch.randn(1, 2, M, n, 8, generator=g), torch.randn(
            1, 2, n, 8, generator=g)

    length = torch.export.Dim("length", min=2, max=1024)
    program = torch.export.export(Causal(), inputs(70), dynamic_shapes=({2: length}, {3: length}, {2: length}))
    for n in (5, 64, 133):
        torch.testing.assert_close(program.module()(*inputs(n)), mlk_attention(*inputs(n), is_causal=True),
                                   rtol=1e-5, atol=1e-6)
