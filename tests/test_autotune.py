"""backend="auto" on a GPU times the Triton kernels against the eager path once per kind of call and keeps the faster
(hf_mgk.attention_autotune). Here on CPU tensors in Triton's interpreter, with the CPU counted as a measured device
and a fake clock that moves only when an arm's backend runs (by the seconds the test gives it), so the choice is
known in advance: the faster arm wins, the choice is kept per process, cached in a file keyed by the GPU and the
versions, shared between ranks through the process group's store, switched off by HF_MGK_AUTOTUNE=0, never timed in
a trace, and a kernel that fails for resources loses with one warning."""

import json
import logging
import warnings

import pytest
import torch

pytest.importorskip("triton")

from hf_mgk import attention_autotune as autotune  # noqa: E402
from hf_mgk import attention_fish as af  # noqa: E402
from hf_mgk import attention_mgk as am  # noqa: E402
from hf_mgk.attention_fish import fish_attention, make_gfish_mixing  # noqa: E402
from hf_mgk.attention_mgk import mgk_attention, smgk_attention  # noqa: E402
from hf_mgk.attention_triton import interpreting  # noqa: E402

# The arms run on CPU tensors: the kernels need the interpreter (unset under HF_MGK_TEST_CUDA=1)
pytestmark = pytest.mark.skipif(not interpreting(), reason="CPU tensors need the interpreter (HF_MGK_TEST_CUDA=1)")


class FakeClock:
    """Seconds that pass only while an arm runs: `cost[name]` per call of backend `name`'s function."""

    def __init__(self, cost):
        self.now, self.cost, self.calls = 0.0, cost, []

    def __call__(self):
        return self.now

    def wrap(self, module, attribute, name):
        real = getattr(module, attribute)

        def timed(*args, **kwargs):
            self.calls.append(name)
            self.now += self.cost[name]
            return real(*args, **kwargs)
        return timed


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """The CPU as a measured device, one timed run per arm, a fresh cache folder and no choice held."""
    monkeypatch.setattr(autotune, "MEASURED_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(autotune, "REPEATS", 1)
    monkeypatch.setenv("HF_MGK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_MGK_AUTOTUNE", raising=False)
    monkeypatch.setattr(autotune, "_CHOSEN", {})
    monkeypatch.setattr(autotune, "_FILES", {})
    monkeypatch.setattr(autotune, "_WARNED", set())
    return tmp_path / "cache"


def mgk_clock(monkeypatch, triton_s, blocked_s):
    """A fake clock for MGK's arms: the kernels and the blocked path (the CPU's eager choice in float32)."""
    clock = FakeClock({"triton": triton_s, "blocked": blocked_s})
    monkeypatch.setattr(am, "mgk_triton", clock.wrap(am, "mgk_triton", "triton"))
    monkeypatch.setattr(am, "mgk_blocked", clock.wrap(am, "mgk_blocked", "blocked"))
    monkeypatch.setattr(autotune, "clock", clock)
    return clock


def mgk_inputs(n=24, grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(2, 2, n, 16, generator=g), torch.randn(2, 2, 2, n, 16, generator=g), \
        torch.randn(2, 2, n, 16, generator=g)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def run_mgk(*inputs, **kwargs):
    return mgk_attention(*inputs, variances=[1.0, 2.0], **kwargs)


@pytest.mark.parametrize("fast", ["triton", "blocked"])
def test_the_faster_arm_wins_and_runs(measured, monkeypatch, fast):
    slow = "blocked" if fast == "triton" else "triton"
    clock = mgk_clock(monkeypatch, triton_s=1.0 if fast == "triton" else 3.0, blocked_s=1.0 if fast == "blocked"
                      else 3.0)
    q, k, v = mgk_inputs()
    out = run_mgk(q, k, v)
    # timed: a warm-up and one timed run of each arm (forward + backward: the backward is in the same functions),
    # then the call itself on the faster arm
    assert clock.calls == ["triton", "triton", "blocked", "blocked", fast]
    assert torch.equal(out, run_mgk(q, k, v, backend=fast))
    assert not torch.equal(out, run_mgk(q, k, v, backend=slow))  # the arms differ in rounding: the test can tell
    clock.calls.clear()
    run_mgk(*mgk_inputs(n=30, seed=1))                           # the same kind (N, S <= 32): no timing again
    assert clock.calls == [fast]
    run_mgk(*mgk_inputs(n=40, seed=1))                           # a longer kind: timed
    assert clock.calls[1:] == ["triton", "triton", "blocked", "blocked", fast]


def test_the_timing_leaves_the_users_tensors_and_random_numbers_alone(measured, monkeypatch):
    mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    q, k, v = mgk_inputs()
    torch.manual_seed(5)
    out = run_mgk(q, k, v, dropout_p=0.3)                         # timed, then run
    assert all(t.grad is None for t in (q, k, v))                  # the arms' gradients went nowhere
    torch.manual_seed(5)
    assert torch.equal(out, run_mgk(q, k, v, dropout_p=0.3))      # the choice held: the same draws as after timing
    out.sum().backward()                                           # the user's graph is whole
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_the_choice_is_logged_once_per_kind(measured, monkeypatch, caplog):
    mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    with caplog.at_level(logging.INFO, logger="hf_mgk.attention_autotune"):
        for _ in range(3):
            run_mgk(*mgk_inputs())
    said = [r.getMessage() for r in caplog.records if r.name == "hf_mgk.attention_autotune"]
    assert len(said) == 1 and "'triton'" in said[0] and "mgk soft float32" in said[0] and "timing triton" in said[0]


def test_a_later_process_takes_the_cached_choice_and_a_new_version_times_again(measured, monkeypatch):
    clock = mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    run_mgk(*mgk_inputs())
    files = list((measured / "autotune").glob("*.json"))
    assert len(files) == 1
    held = json.loads(files[0].read_text())
    assert held["key"] == autotune.cache_key(torch.device("cpu"))
    assert {"device", "torch", "triton", "code"} <= set(held["key"])
    [(kind, entry)] = held["choices"].items()
    assert kind.startswith("mgk soft float32 B<=2 N<=32 S<=32 fwd+bwd") and entry["backend"] == "triton"
    assert entry["seconds"] == {"triton": 1.0, "blocked": 2.0}

    # a new process (nothing held in memory), the clock now favouring the other arm: the file's choice, untimed
    autotune._CHOSEN.clear()
    autotune._FILES.clear()
    clock.cost, clock.calls = {"triton": 5.0, "blocked": 1.0}, []
    run_mgk(*mgk_inputs())
    assert clock.calls == ["triton"]

    # another torch: another file, timed again
    autotune._CHOSEN.clear()
    autotune._FILES.clear()
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    clock.calls = []
    run_mgk(*mgk_inputs())
    assert clock.calls == ["triton", "triton", "blocked", "blocked", "blocked"]
    assert len(list((measured / "autotune").glob("*.json"))) == 2


def test_a_broken_cache_file_is_timed_again_and_rewritten(measured, monkeypatch):
    clock = mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    path, _ = autotune.cache_file(torch.device("cpu"))
    (measured / "autotune").mkdir(parents=True)
    with open(path, "w") as f:
        f.write("{not json")
    with pytest.warns(RuntimeWarning, match="cannot read the timing cache"):
        run_mgk(*mgk_inputs())
    assert clock.calls[:4] == ["triton", "triton", "blocked", "blocked"]
    assert json.load(open(path))["choices"]


def test_an_unwritable_cache_folder_keeps_the_choice_for_the_process(measured, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a user's file")
    monkeypatch.setenv("HF_MGK_CACHE", str(blocker))               # a file where the folder would go
    clock = mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    run_mgk(*mgk_inputs())
    run_mgk(*mgk_inputs())
    assert clock.calls == ["triton", "triton", "blocked", "blocked", "triton", "triton"]
    assert blocker.read_text() == "a user's file"


def test_the_off_switch_keeps_the_eager_path(measured, monkeypatch):
    clock = mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    monkeypatch.setenv("HF_MGK_AUTOTUNE", "0")
    run_mgk(*mgk_inputs())
    assert clock.calls == ["blocked"]
    monkeypatch.setenv("HF_MGK_AUTOTUNE", "maybe")
    with pytest.raises(ValueError, match="HF_MGK_AUTOTUNE='maybe' is not a switch"):
        run_mgk(*mgk_inputs())
    monkeypatch.setenv("HF_MGK_AUTOTUNE", "1")
    clock.calls.clear()
    run_mgk(*mgk_inputs(), backend="blocked")                      # a named backend is never timed
    assert clock.calls == ["blocked"]


def test_nothing_is_timed_in_a_trace(measured, monkeypatch):
    clock = mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    q, k, v = mgk_inputs(grad=False)
    traced = torch.jit.trace(lambda q, k, v: mgk_attention(q, k, v, variances=[1.0, 2.0], backend="auto"),
                             (q, k, v), check_trace=False)
    assert "triton" not in clock.calls and "blocked" not in clock.calls
    assert not autotune._CHOSEN
    assert torch.allclose(traced(q, k, v), run_mgk(q, k, v, backend="dense"), atol=1e-5)


def test_ranks_take_the_choice_one_of_them_published(measured, monkeypatch):
    store = torch.distributed.HashStore()
    monkeypatch.setattr(autotune, "_store", lambda: store)
    clock = mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    run_mgk(*mgk_inputs())                                          # the first rank: times, publishes "triton"
    [kind] = autotune._CHOSEN
    key, published = autotune._published(store, kind)
    assert published == "triton"

    # another rank, whose clock favours the other arm: it takes the published choice without timing
    autotune._CHOSEN.clear()
    autotune._FILES.clear()
    clock.cost, clock.calls = {"triton": 5.0, "blocked": 1.0}, []
    monkeypatch.setenv("HF_MGK_CACHE", str(measured / "other-machine"))
    run_mgk(*mgk_inputs())
    assert clock.calls == ["triton"]

    # two ranks that time at once: the first to publish wins, the second takes it
    store2 = torch.distributed.HashStore()
    monkeypatch.setattr(autotune, "_store", lambda: store2)
    autotune._CHOSEN.clear()
    store2.set(key, "blocked")                                      # published while this rank was timing
    monkeypatch.setattr(autotune, "_published", lambda store, kind: (key, None))
    clock.calls = []
    run_mgk(*mgk_inputs())
    assert clock.calls[-1] == "blocked"


def test_kernels_that_fail_for_resources_lose_with_one_warning(measured, monkeypatch):
    from triton.runtime.errors import OutOfResources

    clock = mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)

    def too_big(*args, **kwargs):
        clock.calls.append("triton")
        raise OutOfResources(300000, 232448, "shared memory")
    monkeypatch.setattr(am, "mgk_triton", too_big)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        out = run_mgk(*mgk_inputs())
        run_mgk(*mgk_inputs(n=40))                                  # another kind fails too: no second warning
    assert [str(w.message) for w in said if "cannot run on this GPU" in str(w.message)] == [
        f"hf_mgk: the Triton kernels cannot run on this GPU ({OutOfResources(300000, 232448, 'shared memory')}); "
        "the eager path runs instead"]
    assert torch.equal(out, run_mgk(*mgk_inputs(), backend="blocked"))
    with pytest.raises(OutOfResources):                             # asked for by name: the failure is the user's
        run_mgk(*mgk_inputs(), backend="triton")


def test_smgk_and_fish_are_timed_with_their_own_kinds(measured, monkeypatch):
    clock = mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    q, k, v = mgk_inputs()
    shift = torch.randn(2, 2, 16, requires_grad=True)
    out = smgk_attention(q, k[:, :, 0], shift, v, variances=[1.0, 2.0], e_step="hard", is_causal=True)
    assert clock.calls[-1] == "triton" and shift.grad is None
    assert torch.equal(out, smgk_attention(q, k[:, :, 0], shift, v, variances=[1.0, 2.0], e_step="hard",
                                           is_causal=True, backend="triton"))
    assert any(kind.startswith("smgk hard float32") and "causal=True" in kind for kind in autotune._CHOSEN)

    fish = FakeClock({"triton": 1.0, "recomputed": 2.0})
    monkeypatch.setattr(af, "fish_triton", fish.wrap(af, "fish_triton", "triton"))
    monkeypatch.setattr(af, "fish_recomputed", fish.wrap(af, "fish_recomputed", "recomputed"))
    monkeypatch.setattr(autotune, "clock", fish)
    mixing = make_gfish_mixing(2, 4)
    g = torch.Generator().manual_seed(3)
    fq, fk = torch.randn(2, 2, 24, 16, generator=g), torch.randn(2, 2, 24, 16, generator=g)
    fv = torch.randn(2, 4, 24, 16, generator=g, requires_grad=True)
    out = fish_attention(fq, fk, fv, mixing, is_causal=True)
    assert fish.calls == ["triton", "triton", "recomputed", "recomputed", "triton"]
    assert all(p.grad is None for p in mixing.parameters()) and fv.grad is None
    assert torch.equal(out, fish_attention(fq, fk, fv, mixing, is_causal=True, backend="triton"))
    assert any(kind.startswith("fish gfish float32 B<=2 N<=32 S<=32 fwd+bwd") for kind in autotune._CHOSEN)


def _rank(rank, world, store_file, cache, results):
    """One rank of a 2-rank gloo job whose fake clock favours a different arm on each rank."""
    import os

    os.environ["HF_MGK_CACHE"] = os.path.join(cache, str(rank))  # two machines: no shared cache
    torch.distributed.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=world)
    autotune.MEASURED_DEVICES = ("cuda", "cpu")
    autotune.REPEATS = 1
    fast = ("triton", "blocked")[rank]
    clock = FakeClock({"triton": 1.0 if fast == "triton" else 3.0, "blocked": 1.0 if fast == "blocked" else 3.0})
    am.mgk_triton = clock.wrap(am, "mgk_triton", "triton")
    am.mgk_blocked = clock.wrap(am, "mgk_blocked", "blocked")
    autotune.clock = clock
    run_mgk(*mgk_inputs())
    torch.distributed.barrier()
    with open(os.path.join(results, str(rank)), "w") as f:
        f.write(clock.calls[-1])


@pytest.mark.slow
def test_the_ranks_of_a_real_job_run_one_choice(tmp_path):
    """Two processes in a gloo group (the default store the job's ranks share), each timing its own arm faster: both
    run the one choice the first to finish published."""
    import torch.multiprocessing as mp

    (tmp_path / "results").mkdir()
    mp.spawn(_rank, args=(2, str(tmp_path / "store"), str(tmp_path / "cache"), str(tmp_path / "results")), nprocs=2,
             join=True)
    ran = {(tmp_path / "results" / str(r)).read_text() for r in range(2)}
    assert len(ran) == 1 and ran <= {"triton", "blocked"}
