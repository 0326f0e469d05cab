"""The code paths of the FiSH kernels that test_attention_fish_triton.py does not reach: linear mixing folded into the
query with head and value sizes that are not a power of two (q' / k' columns and V / dO rows padded), blocks that need
no mask at all (whole blocks, no causal diagonal) and causal caches with N > S, against the float64 reference as
test_attention_fish_triton's `_check`; and the generator of the noise (attention_triton.normal_tile): Philox4x32-10
words as tl.randint4x's, every word used, the Box-Muller transform exact on them, its tails to 5 sigma and beyond, and
draws independent across pairs, heads, batches, seeds and calls."""

import math

import pytest
import torch

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.exactness  # run again under other CPU kernels by CI (.ci/run)

from conftest import triton_devices  # noqa: E402
from hf_mgk import attention_fish_triton as aft  # noqa: E402
from hf_mgk import attention_triton as at  # noqa: E402
from test_attention_fish_triton import _check  # noqa: E402

tl = triton.language
DEVICES = triton_devices()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["fish", "hard_fish", "mish_noise"])
@pytest.mark.parametrize("case", [(2, 20, 20, 20, 24, True, True),     # D, Dv padded to 32: q' / k' columns, V rows
                                  (2, 32, 32, 16, 16, False, False),   # whole blocks only: no mask anywhere
                                  (3, 40, 24, 16, 16, True, False)],   # N > S causal: rows that see no key, M = 3
                         ids=["padded-sizes", "whole-blocks", "causal-n>s"])
def test_linear_paths_match_reference(device, variant, case):
    _check(variant, *case, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["fish", "hard_fish", "gfish", "hard_gfish"])
def test_one_pass_backward_over_quarter_rows_and_several_key_blocks(monkeypatch, device, variant):
    """The backward's programs (one per batch x local head and block of keys: dk, dv, dq added by atomics, the
    mixing's gradient shares) iterate over part of the query rows (aft.kv_rows: 16 of 64, a network 32): 64 x 32
    blocks, 72 queries (the last part ragged), 80 keys (three key blocks, every dq row added to by each), causal and
    padded."""
    monkeypatch.setenv("HF_MGK_TRITON_BLOCKS", "fish=64x32")
    assert aft.block_sizes(device, 2, 16, 16) == (64, 32) and (aft.kv_rows(64), aft.kv_rows(64, True)) == (16, 32)
    _check(variant, 2, 72, 80, 16, 16, True, True, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["fish", "hard_fish", "gfish"])
def test_the_backward_takes_its_own_blocks_and_warps(monkeypatch, device, variant):
    """The forward and the backward launch at blocks of their own (aft.launch_configs): here a forward over 32 x 16
    blocks with 8 warps and a backward of 16-row iterations over 32-key programs with 4 (the GPU defaults are such
    pairs: LAUNCHES), against the reference; 40 queries and 56 keys end inside a block of each, causal and padded."""
    launches = ((32, 16, 8), (16, 32, 4))
    monkeypatch.setattr(aft, "launch_configs", lambda *args, **kwargs: launches)
    seen = []
    for name in ("_fwd_kernel", "_bwd_kv_kernel"):
        kernel = getattr(aft, name)
        monkeypatch.setattr(aft, name, _Recorder(kernel, seen))
    _check(variant, 2, 40, 56, 16, 16, True, True, device)
    assert seen == [("_fwd_kernel", 32, 16, 8), ("_bwd_kv_kernel", 16, 32, 4)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["gfish", "hard_gfish"])
@pytest.mark.parametrize("heads, group", [(4, 1), (4, 2), (4, 4), (3, 2), (6, 4)])
def test_network_programs_cover_groups_of_local_heads(monkeypatch, device, variant, heads, group):
    """A network's programs cover a group of local heads (aft.heads_a_program: the largest divisor of H up to
    NETWORK_GROUP; the hidden layer formed once a tile for them): one head a program, two groups of two, all four in
    one, H = 3 falling back to one and H = 6 to three (in the interpreter; float32 on a GPU takes one); against the
    reference, outputs and every gradient (each head's row of W2 and b2 from its own program's share), causal,
    padded, several key blocks."""
    import test_attention_fish_triton as base
    monkeypatch.setattr(base, "H", heads)
    monkeypatch.setattr(aft, "NETWORK_GROUP", group)
    want = {(4, 1): 1, (4, 2): 2, (4, 4): 4, (3, 2): 1, (6, 4): 3}[heads, group]
    assert aft.heads_a_program(heads, True, "cpu", torch.float32) == aft.heads_a_program(heads, True) == want
    assert aft.heads_a_program(heads, False) == 1
    assert aft.heads_a_program(heads, True, "cuda", torch.float32) == 1  # float32 on a GPU: one (shared memory)
    _check(variant, 2, 20, 36, 16, 16, True, True, device)


class _Recorder:
    """A kernel's launches as (name, BLOCK_M, BLOCK_N, num_warps), passed on to the kernel."""

    def __init__(self, kernel, seen):
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.seen.append((self.kernel.__name__, kwargs["BLOCK_M"], kwargs["BLOCK_N"], kwargs["num_warps"]))
            return self.kernel[grid](*args, **kwargs)
        return run


def test_launch_configs_by_mixing_and_where_they_hold(monkeypatch):
    """Half precision on a GPU with M x D <= 128 and D <= 64: the studied launches by kind of mixing, the backward over
    fewer rows than the forward's; float32, wider heads, the interpreter and a tuning: block_sizes for both passes, 4
    warps, the backward over kv_rows of its rows."""
    monkeypatch.delenv("HF_MGK_TRITON_BLOCKS", raising=False)
    bf16, kb = torch.bfloat16, 1024
    for network, noise, kind in ((False, False, "linear"), (False, True, "noise"), (True, True, "network noise"),
                                 (True, False, "network")):
        for m, d in ((1, 64), (2, 64), (2, 32), (4, 32)):
            for dropout in (False, True):
                assert aft.launch_configs("cuda", m, d, d, bf16, 227 * kb, network, noise, dropout) == aft.LAUNCHES[
                    kind, dropout]
    assert aft.LAUNCHES["linear", False] == ((128, 64, 4), (32, 64, 4))
    assert aft.LAUNCHES["linear", True] == ((64, 64, 4), (16, 64, 4))  # 128 rows spilled with dropout
    for args in (("cuda", 2, 64, 64, torch.float32, 99 * kb), ("cuda", 3, 64, 64, bf16, 227 * kb),
                 ("cuda", 1, 128, 128, bf16, 227 * kb), ("cuda", 2, 64, 128, bf16, 227 * kb),
                 ("cpu", 2, 64, 64, torch.float32, None)):
        bm, bn = aft.block_sizes(*args)
        for network in (False, True):
            assert aft.launch_configs(*args, network, True) == ((bm, bn, 4), (aft.kv_rows(bm, network), bn, 4))
    monkeypatch.setenv("HF_MGK_TRITON_BLOCKS", "fish:w128=64x32")
    assert aft.launch_configs("cuda", 2, 64, 64, bf16, 227 * kb, False, False) == ((64, 32, 4), (16, 32, 4))
    assert aft.launch_configs("cuda", 1, 64, 64, bf16, 227 * kb, False, False) == aft.LAUNCHES["linear", False]  # w64


if at.triton is not None:

    @triton.jit
    def _words_kernel(OUT, REF, seed, stream, N: tl.constexpr):
        c = tl.arange(0, N).to(tl.uint32)
        w = at.philox4(c, seed + c * 0, stream + c * 0)
        r = tl.randint4x(seed, tl.arange(0, N))  # key (seed, 0): stream 0 only
        for i in tl.static_range(4):
            tl.store(OUT + i * N + tl.arange(0, N), w[i].to(tl.int32, bitcast=True))
            tl.store(REF + i * N + tl.arange(0, N), r[i].to(tl.int32, bitcast=True))

    @triton.jit
    def _transform_kernel(I, T, Z, N: tl.constexpr):
        offs = tl.arange(0, N)
        z0, z1 = at._box_muller(tl.load(I + offs).to(tl.uint32, bitcast=True),
                                tl.load(T + offs).to(tl.uint32, bitcast=True))
        tl.store(Z + offs, z0)
        tl.store(Z + N + offs, z1)

    @triton.jit
    def _tile_kernel(Z, WORDS, seed, stream, S4, BM: tl.constexpr, BN: tl.constexpr):
        offs_m = tl.arange(0, BM)
        z = at.normal_tile(seed, stream, offs_m * S4, 0, BN)
        tl.store(Z + offs_m[:, None] * BN + tl.arange(0, BN)[None, :], z)
        c = (offs_m[:, None] * S4 + tl.arange(0, BN // 4)[None, :]).to(tl.uint32)
        w = at.philox4(c, seed + offs_m[:, None] * 0, stream + offs_m[:, None] * 0)
        for i in tl.static_range(4):
            tl.store(WORDS + (i * BM + offs_m[:, None]) * (BN // 4) + tl.arange(0, BN // 4)[None, :],
                     w[i].to(tl.int32, bitcast=True))


def _box_muller64(i, t):
    """The transform in float64 on the words (as int64 holding uint32): radius from (i + 1/2) 2^-32, angle from t as
    a signed word times 2 pi 2^-32."""
    u = (i.double() + 0.5) / 2**32
    theta = torch.where(t >= 2**31, t - 2**32, t).double() * (2 * math.pi / 2**32)
    r = torch.sqrt(-2 * torch.log(u))
    return r * torch.cos(theta), r * torch.sin(theta)


@pytest.mark.skipif(not at.interpreting(), reason="the generator's checks run in the interpreter")
def test_philox_words_are_tl_randint4x_and_the_stream_changes_them():
    n = 64
    out, ref = torch.empty(4, n, dtype=torch.int32), torch.empty(4, n, dtype=torch.int32)
    _words_kernel[(1,)](out, ref, 12345, 0, N=n)
    assert torch.equal(out, ref)  # Triton's Philox4x32-10 for counter (c, 0, 0, 0), key (seed, 0)
    other = torch.empty(4, n, dtype=torch.int32)
    _words_kernel[(1,)](other, ref, 12345, 1, N=n)
    assert (other != out).float().mean() > 0.99  # the key's second word: another stream


@pytest.mark.skipif(not at.interpreting(), reason="the generator's checks run in the interpreter")
def test_box_muller_is_exact_on_the_words_and_reaches_past_5_sigma():
    """Both outputs of the transform, against float64 on the same words (to float32's rounding: u near 1 is rounded
    to float32's spacing 2^-24 there, which moves a radius near 0 by up to sqrt(2^-23)); the extreme words give
    |z| = 6.66, so the tails to 5 sigma (and to 6.6) are the normal's own: the words are uniform, the transform
    exact."""
    g = torch.Generator().manual_seed(0)
    words = torch.randint(0, 2**32, (2, 4096), generator=g, dtype=torch.int64)
    words[0, :4] = torch.tensor([0, 1, 2**32 - 1, 2**31])            # the radius's ends
    words[1, :4] = torch.tensor([0, 2**31, 2**30, 3 * 2**30])          # angles 0, -pi, pi/2, -pi/2
    z = torch.empty(2, 4096)
    as32 = [torch.where(w >= 2**31, w - 2**32, w).to(torch.int32) for w in words]
    _transform_kernel[(1,)](as32[0], as32[1], z, N=4096)
    want = torch.stack(_box_muller64(words[0], words[1])).float()
    assert torch.allclose(z, want, rtol=1e-5, atol=4e-4)
    assert z.abs().max() > 6.6 and abs(z[0, 0].item() - math.sqrt(2 * 33 * math.log(2))) < 1e-4


@pytest.mark.skipif(not at.interpreting(), reason="the generator's checks run in the interpreter")
def test_a_tile_uses_every_word_of_each_call():
    """Element (m, n) of a tile is normal (0, 2, 1, 3)[n % 4] of the call at counter m S4 + n // 4 (normals 0, 1 from
    words 0, 1, normals 2, 3 from words 2, 3): the four words of a call make four normals, none thrown away."""
    bm, bn, s4 = 16, 32, 9
    z, words = torch.empty(bm, bn), torch.empty(4, bm, bn // 4, dtype=torch.int32)
    _tile_kernel[(1,)](z, words, 777, 5, s4, BM=bm, BN=bn)
    w = words.long() % 2**32
    z01, z23 = _box_muller64(w[0], w[1]), _box_muller64(w[2], w[3])
    want = torch.stack([z01[0], z23[0], z01[1], z23[1]], dim=-1).reshape(bm, bn).float()
    assert torch.allclose(z, want, rtol=1e-5, atol=4e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_noise_is_independent_across_seeds_calls_heads_and_batches(device):
    """Correlations near 0 between two seeds, two calls of fish_attention's seed draw, two heads and two batch entries
    (the key's second word); a seed repeats its draw exactly; moments and both tails of a larger sample."""
    def draw(seed, b=2, h=2, n=64, s=64):
        return aft.kernel_noise(seed, b, 2, h, n, s, False, device).double()

    gen = torch.Generator().manual_seed(0)
    first, second = aft.noise_seed(gen, device), aft.noise_seed(gen, device)  # two calls
    a, b = draw(first), draw(second)
    assert torch.equal(a, draw(first))
    for x, y in [(a, b), (a, draw(first + 1)), (a[:, 0], a[:, 1]), (a[0], a[1])]:
        assert abs(torch.corrcoef(torch.stack([x.flatten(), y.flatten()]))[0, 1].item()) < 0.03
    x = torch.cat([a.flatten(), b.flatten()])  # 32,768 draws
    assert abs(x.mean().item()) < 0.03 and abs(x.var().item() - 1) < 0.04
    assert abs((x.abs() > 2.576).double().mean().item() - 0.01) < 0.003  # sd 0.00055
    assert abs((x.pow(4).mean() - 3).item()) < 0.2                      # the kurtosis: normal tails
