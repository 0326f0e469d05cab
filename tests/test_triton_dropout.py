"""The kernels' dropout mask (attention_triton.keep, shared by MGK and FiSH): element (i, j) of a tile is word
(0, 2, 1, 3)[j % 4] of Philox4x32-10 (Triton's tl.randint4x) at counter i ceil(S / 4) + j // 4 under the key
(seed, 2^31 + batch x head), kept where it is at least p 2^32; so the rate is p, every word of a call is used, the
key-major kernels' transposed draw is the same, and masks are independent across the words of a call, rows, heads
and seeds."""

import pytest
import torch

triton = pytest.importorskip("triton")

from hf_mgk import attention_triton as at  # noqa: E402

tl = triton.language
pytestmark = pytest.mark.skipif(not at.interpreting(), reason="the generator's checks run in the interpreter")

if at.interpreting():  # the kernels are written for the interpreter here (CPU tensors)

    @triton.jit
    def _mask_kernel(OUT, OUT_T, seed, bh, S, p, BM: tl.constexpr, BN: tl.constexpr):
        """keep of block (program 0, program 1): query-major into OUT, and as a key-major kernel draws it (the tile
        of (rows, keys) transposed) into OUT_T (S, N)."""
        offs_m = tl.program_id(0) * BM + tl.arange(0, BM)
        start_n = tl.program_id(1) * BN
        offs_n = start_n + tl.arange(0, BN)
        n_rows = tl.num_programs(0) * BM
        kept = at.keep(seed, bh, offs_m, start_n, S, p, BN)
        tl.store(OUT + offs_m[:, None] * S + offs_n[None, :], kept.to(tl.int8), mask=(offs_n < S)[None, :])
        kept_t = tl.trans(at.keep(seed, bh, offs_m, start_n, S, p, BN))
        tl.store(OUT_T + offs_n[:, None] * n_rows + offs_m[None, :], kept_t.to(tl.int8), mask=(offs_n < S)[:, None])

    @triton.jit
    def _words_kernel(WORDS, seed_key, C, BC: tl.constexpr):
        """Triton's own Philox words (tl.randint4x) for counters 0 .. C under a 64-bit seed: key (low, high word)."""
        offs = tl.arange(0, BC)
        w = tl.randint4x(seed_key, offs)
        for i in tl.static_range(4):
            tl.store(WORDS + i * C + offs, w[i].to(tl.int32, bitcast=True), mask=offs < C)


def _mask(seed, bh, n, s, p, bm=16, bn=32):
    out = torch.full((n, s), -1, dtype=torch.int8)
    out_t = torch.full((s, n), -1, dtype=torch.int8)
    _mask_kernel[(n // bm, triton.cdiv(s, bn))](out, out_t, seed, bh, s, p, BM=bm, BN=bn)
    return out, out_t


def test_the_mask_is_philox_words_against_p_2_32_and_the_transposed_draw_is_the_same():
    n, s, seed, bh, p = 16, 40, 4321, 3, 0.3  # S not a multiple of the block: counters per row ceil(S / 4) = 10
    out, out_t = _mask(seed, bh, n, s, p)
    assert torch.equal(out_t, out.T)
    s4 = (s + 3) // 4
    words = torch.empty(4, n * s4, dtype=torch.int32)
    _words_kernel[(1,)](words, seed + ((2**31 + bh) << 32), n * s4, BC=triton.next_power_of_2(n * s4))
    w = words.long() % 2**32                                                 # (word, i s4 + j // 4)
    w = w.view(4, n, s4)[[0, 2, 1, 3]].permute(1, 2, 0).reshape(n, 4 * s4)[:, :s]  # word (0, 2, 1, 3)[j % 4]
    thr = int(torch.tensor(p, dtype=torch.float32).item() * 2**32)
    assert torch.equal(out, (w >= thr).to(torch.int8))


def test_the_rate_is_p_and_the_draws_are_independent():
    n, s = 128, 128
    for p in (0.1, 0.5):
        heads = [_mask(99, bh, n, s, p)[0].double() for bh in range(4)]
        x = torch.stack(heads)  # 65,536 draws: the rate's sd is 0.0012 at p = 0.1, 0.002 at 0.5
        assert abs(1 - x.mean().item() - p) < 0.006, (p, x.mean())
        drop = 1 - x
        # the four words of a call (keys 4c .. 4c + 3) and neighbouring rows: dropped together with probability p^2
        for a, b in [(drop[..., 0::4], drop[..., 1::4]), (drop[..., 2::4], drop[..., 3::4]),
                     (drop[..., 0::4], drop[..., 3::4]), (drop[:, :-1], drop[:, 1:])]:
            assert abs((a * b).mean().item() - p * p) < 0.01, p
        for a, b in [(x[0], x[1]), (x[0], _mask(100, 0, n, s, p)[0].double())]:  # heads, seeds
            assert abs(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].item()) < 0.03
    assert torch.equal(_mask(5, 1, 16, 64, 0.3)[0], _mask(5, 1, 16, 64, 0.3)[0])  # a seed repeats
    assert _mask(5, 1, 16, 64, 0.0)[0].all()                                         # p = 0 keeps all
    assert _mask(5, 1, 16, 64, 0.9999999)[0].float().mean() < 0.01                   # p 2^32 clamped, converts
