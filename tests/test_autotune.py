"""backend="auto" on a GPU times the Triton kernels against the eager path once per kind of call and keeps the faster
(hf_mgk.attention_autotune). Here on CPU tensors in Triton's interpreter, with the CPU counted as a measured device
and a fake clock that moves only when an arm's backend runs (by the seconds the test gives it), so the choice is
known in advance: the faster arm wins, the choice is kept per process, cached in a file keyed by the GPU and the
versions, shared between ranks through the process group's store, switched off by HF_MGK_AUTOTUNE=0, never timed in
a trace; and the trial verifies the kernels: an arm that raises, or kernels that disagree with the eager path, lose
with one warning, both failing runs the eager path's own error, and a chosen kind whose kernels fail later falls
back to the eager path."""

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


# The arms' runs of a trial: each arm once to verify the kernels, then a warm-up and one timed run of each
TRIAL = ["triton", "blocked", "triton", "triton", "blocked", "blocked"]


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
    # verified (one run of each arm, compared), timed (a warm-up and one timed run of each arm: forward + backward,
    # the backward is in the same functions), then the call itself on the faster arm
    assert clock.calls == TRIAL + [fast]
    assert torch.equal(out, run_mgk(q, k, v, backend=fast))
    assert not torch.equal(out, run_mgk(q, k, v, backend=slow))  # the arms differ in rounding: the test can tell
    clock.calls.clear()
    run_mgk(*mgk_inputs(n=30, seed=1))                           # the same kind (N, S <= 32): no timing again
    assert clock.calls == [fast]
    run_mgk(*mgk_inputs(n=40, seed=1))                           # a longer kind: timed
    assert clock.calls[1:] == TRIAL + [fast]


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
    assert clock.calls == TRIAL + ["blocked"]
    assert len(list((measured / "autotune").glob("*.json"))) == 2


def test_a_broken_cache_file_is_timed_again_and_rewritten(measured, monkeypatch):
    clock = mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    path, _ = autotune.cache_file(torch.device("cpu"))
    (measured / "autotune").mkdir(parents=True)
    with open(path, "w") as f:
        f.write("{not json")
    with pytest.warns(RuntimeWarning, match="cannot read the timing cache"):
        run_mgk(*mgk_inputs())
    assert clock.calls[:6] == TRIAL
    assert json.load(open(path))["choices"]


def test_an_unwritable_cache_folder_keeps_the_choice_for_the_process(measured, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a user's file")
    monkeypatch.setenv("HF_MGK_CACHE", str(blocker))               # a file where the folder would go
    clock = mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    run_mgk(*mgk_inputs())
    run_mgk(*mgk_inputs())
    assert clock.calls == TRIAL + ["triton", "triton"]
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
    [warned] = [str(w.message) for w in said if "cannot run on this GPU" in str(w.message)]
    assert warned.startswith(f"hf_mgk: the Triton kernels cannot run on this GPU (OutOfResources: "
                             f"{OutOfResources(300000, 232448, 'shared memory')}) on mgk soft float32 B<=2 N<=32")
    assert warned.endswith("; the eager path runs instead")
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
    # verified against the blocked path (the one eager path every call without noise takes), then timed
    assert fish.calls == ["triton", "triton", "triton", "recomputed", "recomputed", "triton"]
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


def _warnings_of(run):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        result = run()
    return result, [str(w.message) for w in said if "hf_mgk:" in str(w.message)]


def test_a_kernel_arm_that_raises_loses_with_one_warning(measured, monkeypatch):
    """Any error of the kernels' arm (a compile or launch error, not only resources) makes it lose: the call runs
    the eager path, one warning for the process names it."""
    clock = mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)

    def broken(*args, **kwargs):
        clock.calls.append("triton")
        raise RuntimeError("PTX .version 8.7 does not support .target sm_120")
    monkeypatch.setattr(am, "mgk_triton", broken)
    out, said = _warnings_of(lambda: (run_mgk(*mgk_inputs()), run_mgk(*mgk_inputs(n=40)))[0])
    assert torch.equal(out, run_mgk(*mgk_inputs(), backend="blocked"))
    assert len(said) == 1 and said[0].startswith("hf_mgk: the Triton kernels failed (RuntimeError: PTX .version 8.7")
    assert "mgk soft float32 B<=2 N<=32" in said[0] and said[0].endswith("the eager path runs instead")
    assert set(autotune._CHOSEN.values()) == {"blocked"}


@pytest.mark.parametrize("wrong", ["output", "gradient"])
def test_kernels_that_disagree_with_the_eager_path_lose_though_faster(measured, monkeypatch, wrong):
    """The trial compares the arms' outputs and every gradient: kernels off by 1% (float32's tolerance is 0.1%)
    lose while timed faster, with one warning naming the kind and the error; the choice is cached with the reason."""
    clock = mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    right = am.mgk_triton

    class Off(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.01 if wrong == "output" else x.clone()

        @staticmethod
        def backward(ctx, g):
            return g * 1.01 if wrong == "output" else g * 1.02

    monkeypatch.setattr(am, "mgk_triton", lambda *args, **kwargs: Off.apply(right(*args, **kwargs)))
    q, k, v = mgk_inputs()
    out, said = _warnings_of(lambda: run_mgk(q, k, v))
    assert torch.equal(out, run_mgk(q, k, v, backend="blocked"))
    assert len(said) == 1 and said[0].startswith("hf_mgk: the Triton kernels disagree with the eager path on mgk "
                                                 "soft float32 B<=2 N<=32")
    assert "the eager path runs instead" in said[0]
    times = float(said[0].split("largest error is ")[1].split(" times")[0])
    assert 5 < times < 30  # 1% or 2% off against 0.1%: the error is measured, not just flagged
    [entry] = json.loads(next((measured / "autotune").glob("*.json")).read_text())["choices"].values()
    assert entry["backend"] == "blocked" and entry["reason"].startswith("the kernels disagree")
    assert clock.calls[:2] == ["triton", "blocked"] and "triton" not in clock.calls[2:]  # not timed


def test_noise_and_dropout_are_off_where_the_arms_are_compared(measured, monkeypatch):
    """The arms draw different dropout masks; the comparison runs both without dropout, so right kernels pass."""
    mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    _, said = _warnings_of(lambda: run_mgk(*mgk_inputs(), dropout_p=0.5))
    assert not said and list(autotune._CHOSEN.values()) == ["triton"]


def test_when_both_arms_fail_the_eager_path_raises_its_own_error(measured, monkeypatch):
    clock = mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)

    def broken(name, error):
        def run(*args, **kwargs):
            clock.calls.append(name)
            raise error
        return run
    monkeypatch.setattr(am, "mgk_triton", broken("triton", RuntimeError("launch failed")))
    monkeypatch.setattr(am, "mgk_blocked", broken("blocked", ValueError("the eager path's own error")))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="the eager path's own error"):
            run_mgk(*mgk_inputs())
    assert [str(w.message) for w in said if "hf_mgk:" in str(w.message)][0].startswith(
        "hf_mgk: the Triton kernels failed (RuntimeError: launch failed)")
    assert not autotune._CHOSEN and not (measured / "autotune").exists()  # nothing kept: the next call tries again


def test_a_chosen_kind_whose_kernels_fail_later_runs_the_eager_path(measured, monkeypatch):
    """A later call of a kind that chose the kernels whose launch fails (a new specialisation that does not compile)
    runs the eager path with one warning, and the kind keeps it; asked for by name, the error is the caller's."""
    clock = mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    run_mgk(*mgk_inputs())
    assert list(autotune._CHOSEN.values()) == ["triton"]

    def broken(*args, **kwargs):
        clock.calls.append("triton")
        raise RuntimeError("a new specialisation failed to compile")
    monkeypatch.setattr(am, "mgk_triton", broken)
    clock.calls.clear()
    q, k, v = mgk_inputs(n=30, seed=1)                              # the same kind
    out, said = _warnings_of(lambda: [run_mgk(q, k, v) for _ in range(3)][0])
    assert torch.equal(out, run_mgk(q, k, v, backend="blocked"))
    assert clock.calls == ["triton", "blocked", "blocked", "blocked", "blocked"]  # tried once, then eager only
    assert len(said) == 1 and "a new specialisation failed to compile" in said[0] and "from now on" in said[0]
    with pytest.raises(RuntimeError, match="a new specialisation failed to compile"):
        run_mgk(q, k, v, backend="triton")


def test_the_kind_holds_the_autocast_state_and_the_matmul_precision(measured, monkeypatch):
    mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    precision = torch.get_float32_matmul_precision()
    try:
        run_mgk(*mgk_inputs())
        torch.set_float32_matmul_precision("high")
        run_mgk(*mgk_inputs())
    finally:
        torch.set_float32_matmul_precision(precision)
    kinds = sorted(autotune._CHOSEN)
    assert len(kinds) == 2 and "autocast=off" in kinds[0]
    assert {k.split("matmul=")[1].split()[0] for k in kinds} == {precision, "high"}
    with torch.autocast("cpu", dtype=torch.bfloat16):            # compared at bfloat16's tolerance: agreed
        _, said = _warnings_of(lambda: run_mgk(*mgk_inputs(grad=False)))
    assert any("autocast=bfloat16" in k for k in autotune._CHOSEN) and not said


def test_a_held_choice_this_call_cannot_run_is_not_taken(measured, monkeypatch):
    """A choice from the cache or another rank names a backend of its own eager rule: where the current call's
    eager path is another ("recomputed" chosen outside autocast, run under it), it is not taken."""
    clock = mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    run_mgk(*mgk_inputs())
    [(kind, _)] = autotune._CHOSEN.items()
    path, key = autotune.cache_file(torch.device("cpu"))
    autotune._write(path, key, kind, {"backend": "dense"})        # not this call's eager path
    autotune._CHOSEN.clear()
    autotune._FILES.clear()
    clock.calls = []
    run_mgk(*mgk_inputs())
    assert clock.calls == TRIAL + ["triton"]                        # timed again

    store = torch.distributed.HashStore()
    monkeypatch.setattr(autotune, "_store", lambda: store)
    store.set(autotune._published(store, kind)[0], "sdpa")          # another rank's eager path
    autotune._CHOSEN.clear()
    clock.calls = []
    run_mgk(*mgk_inputs())
    assert clock.calls == ["blocked"] and list(autotune._CHOSEN.values()) == ["blocked"]


@pytest.mark.parametrize("columns", [4, 1], ids=["fish", "mish"])
def test_fish_noise_is_off_where_the_arms_are_compared(measured, monkeypatch, columns):
    """FiSH's arms draw their noise differently (the kernels' Philox, torch's generator): compared without it, right
    kernels pass and are chosen, once for the kind, which still says the call has noise. MiSH's eager path with
    noise ("recomputed") refuses it without: the comparison takes the blocked path."""
    fish = FakeClock({"triton": 1.0, "recomputed": 2.0})
    monkeypatch.setattr(af, "fish_triton", fish.wrap(af, "fish_triton", "triton"))
    monkeypatch.setattr(af, "fish_recomputed", fish.wrap(af, "fish_recomputed", "recomputed"))
    monkeypatch.setattr(autotune, "clock", fish)
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 2, 24, 16, generator=g), torch.randn(2, 2, 24, 16, generator=g)
    v = torch.randn(2, 4, 24, 16, generator=g, requires_grad=True)
    mixing = torch.randn(2, columns, generator=g, requires_grad=True)
    sigma = torch.full((2,), 0.5, requires_grad=True)
    _, said = _warnings_of(lambda: fish_attention(q, k, v, mixing, noise_std=sigma, is_causal=True))
    assert not said and list(autotune._CHOSEN.values()) == ["triton"]
    assert "noise=True" in next(iter(autotune._CHOSEN))
    fish.calls.clear()
    fish_attention(q, k, v, mixing, noise_std=sigma, is_causal=True)
    assert fish.calls == ["triton"]  # chosen: no trial again


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_the_first_call_inside_activation_checkpointing_trains(measured, monkeypatch, reentrant):
    """The first auto call of a kind inside torch.utils.checkpoint (transformers' gradient_checkpointing: non-reentrant
    by default) runs its trial there, forward and backward: the checkpoint's saved-tensor hooks must not see the
    trial's tensors, and the gradients equal those of the run without checkpointing."""
    from torch.utils.checkpoint import checkpoint

    mgk_clock(monkeypatch, triton_s=1.0, blocked_s=2.0)
    proj = torch.nn.Linear(16, 16)

    def layer(q, k, v):
        return run_mgk(proj(q), k, v, is_causal=True)

    def grads(run):  # .backward(): a reentrant checkpoint refuses torch.autograd.grad
        leaves = [*mgk_inputs(), proj.weight]
        proj.weight.grad = None
        run(*leaves[:3]).square().sum().backward()
        return [t.grad for t in leaves]

    got = grads(lambda q, k, v: checkpoint(layer, q, k, v, use_reentrant=reentrant))
    assert "triton" in autotune._CHOSEN.values()
    for name, g, want in zip(["q", "k", "v", "weight"], got, grads(layer)):
        assert g is not None and torch.allclose(g, want, rtol=1e-5, atol=1e-6), name
