"""Where the Triton kernels were never built to run, they are refused, so backend="auto" keeps the torch paths and
backend="triton" is a ValueError that says why: a Triton older than the kernels compile with, a ROCm build of
torch, a GPU below compute capability 8.0, a CUDA graph's capture. And their random draws' seeds come from the
generator of the tensors' device, with no host sync."""

import logging
import types

import pytest
import torch

pytest.importorskip("triton")

from hf_mgk import attention_mgk as am  # noqa: E402
from hf_mgk import attention_triton as at  # noqa: E402
from hf_mgk.attention_fish import choose_backend as fish_choice  # noqa: E402
from hf_mgk.attention_mgk import choose_backend as mgk_choice  # noqa: E402

MGK_CALL = dict(e_step="soft", return_weights=False, device_type="cuda", dtype=torch.bfloat16, autocast=False,
                tracing=False, mask=None)
FISH_CALL = dict(mixing="heads", noise=False, dropout=False, return_weights=False, device_type="cuda",
                 dtype=torch.bfloat16, autocast=False, requires_grad=False, tracing=False)


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(at, "_SAID", set())
    monkeypatch.delenv("HF_MGK_TRITON", raising=False)


@pytest.mark.parametrize("version, refused", [("3.2.0", True), ("3.3.1+git5a3f", True), ("3.4.0", False),
                                              ("3.9.0", False), ("4.0.0", False)])
def test_a_triton_older_than_the_kernels_compile_with_is_refused_once_at_info(monkeypatch, caplog, fresh, version,
                                                                             refused):
    monkeypatch.setattr(at, "triton", types.SimpleNamespace(__version__=version))
    with caplog.at_level(logging.INFO, logger=at.__name__):
        assert at.available() is not refused and at.available() is not refused
    said = [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]
    assert said == ([f"hf_mgk: the Triton kernels are not used: triton {version} (the kernels need 3.4 or later); "
                     "the torch paths run"] if refused else [])
    assert (at.refusal("cuda", 64, installed=at.available()) or "").startswith(f"triton {version}") is refused
    assert (mgk_choice(**MGK_CALL, triton=at.available()) == "triton") is not refused
    assert (fish_choice(**FISH_CALL, triton=at.available()) == "triton") is not refused


def test_rocm_is_refused(monkeypatch, fresh):
    """A ROCm build's tensors say "cuda": the kernels are refused there, whatever the call (outside the
    interpreter, which runs CPU tensors)."""
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    monkeypatch.setattr(at, "interpreting", lambda: False)
    assert not at.available()
    assert at.refusal("cuda", 64, installed=at.available()).startswith("a ROCm build of torch")
    assert mgk_choice(**MGK_CALL, triton=at.available()) != "triton"
    q, v = torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8)
    with pytest.raises(ValueError, match="backend 'triton' cannot run this call: a ROCm build of torch"):
        am.mgk_attention(q, torch.randn(1, 1, 2, 3, 8), v, variances=[1.0, 2.0], backend="triton")


@pytest.mark.parametrize("cap, refused", [((7, 0), True), ((7, 5), True), ((8, 0), False), ((8, 6), False),
                                          ((9, 0), False)])
def test_a_gpu_below_compute_capability_8_is_refused(monkeypatch, cap, refused):
    monkeypatch.setattr(at, "capability", lambda index=None: cap)
    why = at.refusal("cuda", 64)
    assert (why is not None) is refused
    if refused:
        assert why.startswith(f"a GPU of compute capability {cap[0]}.{cap[1]} (the kernels need 8.0 or later")
    assert (mgk_choice(**MGK_CALL, triton=True) == "triton") is not refused
    assert (fish_choice(**FISH_CALL, triton=True) == "triton") is not refused


def test_without_a_cuda_device_the_rule_reads_no_capability():
    """The rules' unit tests name "cuda" on machines without one: no capability is read there."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert at.capability() is None and at.refusal("cuda", 64) is None


def test_inside_a_cuda_graph_capture_the_kernels_are_refused(monkeypatch):
    """Their draws' seed is a host integer a capture would freeze into every replay: refused while capturing, so
    auto takes the torch path even where the kind chose the kernels, and backend="triton" says why."""
    monkeypatch.setattr(at, "capturing", lambda device_type: device_type == "cuda")
    why = at.refusal("cuda", 64)
    assert why.startswith("a CUDA graph's capture")
    assert mgk_choice(**MGK_CALL, triton=True) != "triton" and fish_choice(**FISH_CALL, triton=True) != "triton"
    refusals = am._refusals(**MGK_CALL, triton=True)
    from hf_mgk.attention_blocks import resolve_backend
    assert resolve_backend("auto", mgk_choice(**MGK_CALL, triton=True), refusals, device_type="cuda",
                           timed=lambda: "triton") != "triton"  # a cached "triton" is not asked for
    with pytest.raises(ValueError, match="cannot run this call: a CUDA graph's capture"):
        resolve_backend("triton", "sdpa", refusals, device_type="cuda")


class _CudaGenerator:
    """A CUDA generator's host-side state as torch keeps it: a seed and a Philox offset."""

    device = torch.device("cuda", 0)

    def __init__(self, seed, offset=0):
        self.seed, self.offset = seed, offset

    def initial_seed(self):
        return self.seed

    def get_offset(self):
        return self.offset

    def set_offset(self, offset):
        self.offset = offset


def test_seeds_come_from_the_devices_generator_without_gpu_work(monkeypatch):
    """A CUDA generator's seed and offset make the seed on the host (no tensor, so no sync), and the offset
    advances: a seeded run repeats, the next call draws anew, another seed differs."""
    monkeypatch.setattr(torch, "randint", lambda *a, **k: pytest.fail("a tensor was drawn"))
    gen = _CudaGenerator(1234)
    first, second = at.draw_seed(gen.device, gen), at.draw_seed(gen.device, gen)
    assert gen.offset == 8 and first != second
    assert at.draw_seed(gen.device, _CudaGenerator(1234)) == first       # the same seed repeats the run
    assert at.draw_seed(gen.device, _CudaGenerator(1235)) != first
    seeds = {at.draw_seed(gen.device, gen) for _ in range(1000)}
    assert len(seeds) == 1000 and all(0 <= s < at.SEED_BOUND for s in seeds)


def test_seeds_of_cpu_tensors_come_from_torchs_generator():
    torch.manual_seed(3)
    first = at.draw_seed(torch.device("cpu"))
    torch.manual_seed(3)
    assert at.draw_seed(torch.device("cpu")) == first and 0 <= first < at.SEED_BOUND
    assert at.draw_seed(torch.device("cpu"), torch.Generator().manual_seed(3)) == first


def test_sequences_past_the_grids_limit_are_refused():
    """The kernels put the blocks of rows (forward) or keys (backward) on the grid's second axis, at most 65,535
    programs of at least 16: longer sequences take the torch paths, and asking for the kernels says why."""
    assert at.length_refusal(at.MAX_LENGTH) is None and at.MAX_LENGTH == 65535 * 16
    assert at.length_refusal(at.MAX_LENGTH + 1).startswith(f"sequences this long ({at.MAX_LENGTH + 1} positions")
    for length, refused in [(4096, False), (at.MAX_LENGTH + 1, True)]:
        assert (mgk_choice(**MGK_CALL, triton=True, length=length) == "triton") is not refused
        assert (fish_choice(**FISH_CALL, triton=True, length=length) == "triton") is not refused
    why = am._refusals(**MGK_CALL, triton=True, length=at.MAX_LENGTH + 1)["triton"]
    assert why.startswith("sequences this long") and "N and S up to 1048560" in why
