"""The benchmark's memory table (hf_mgk.benchmark.memory) and its measure (measure.allocated_peaks): the peak is the
bytes a step holds at once, its backward included, each step apart; the paths documented as holding N x S numbers
grow about 4x when N doubles and the O(N) ones at most about 2x. Memory only: no timed assertion."""

import contextlib
import io
import os
from types import SimpleNamespace

import pytest
import torch

from hf_mgk.benchmark import measure, memory

MiB = 2**20
# Small enough for seconds, N past the blocked paths' 128 query rows per block (below, one block is the whole N x S).
SIZE = SimpleNamespace(heads=2, keys=2, head_dim=16, features=16, batch=1)
LENGTHS = [256, 512]
N_BY_S = ["MGK hard, dense", "MGK soft, dense, weights", "MGK EM prior, M-step", "MLK, dense, weights",
          "NPRF, explicit"]
LINEAR = ["MGK soft, blocked, keep_bytes=0", "MGK soft, blocked, eval", "MGK soft, SDPA-aug", "MLK, linear, causal",
          "hard_fish, fused, eval", "hard_fish, recomputed, keep_bytes=0", "NPRF, band"]


def test_allocated_peaks_counts_the_bytes_held_at_once_per_step():
    def two_then_one():
        def step():
            a, b = torch.ones(MiB // 4), torch.ones(MiB // 8)  # 1 MiB and 0.5 MiB, alive together
            del a, b
            torch.ones(MiB // 16)
        return step

    held = torch.ones(MiB // 4)

    def reads_only():
        return lambda: held.sum()

    def exp(backward):  # exp's result (1 MiB) is saved for backward, which adds the gradient (1 MiB) beside it
        x = torch.ones(MiB // 4, requires_grad=True)
        return lambda: x.exp().sum().backward() if backward else x.exp().sum()

    peaks = measure.allocated_peaks([two_then_one, reads_only, two_then_one, lambda: exp(True), lambda: exp(False)])
    assert peaks[0] == peaks[2] == MiB + MiB // 2
    assert peaks[1] < 1024  # a 0-d result
    assert 2 * MiB <= peaks[3] < 2 * MiB + 1024
    assert MiB <= peaks[4] < MiB + 1024


@pytest.fixture(scope="module")
def peaks():
    threads = torch.get_num_threads()
    try:
        return memory.measure_paths(N_BY_S + LINEAR, LENGTHS, SIZE)
    finally:
        torch.set_num_threads(threads)


def _growth(peaks, path):
    return peaks[(path, LENGTHS[1])] / peaks[(path, LENGTHS[0])]


@pytest.mark.parametrize("path", N_BY_S)
def test_n_by_s_paths_grow_four_fold(peaks, path):
    assert 3.5 <= _growth(peaks, path) <= 4.2


@pytest.mark.parametrize("path", LINEAR)
def test_o_n_paths_grow_at_most_about_two_fold(peaks, path):
    assert _growth(peaks, path) <= 2.3


def test_sdpa_baselines_are_measured_in_each_mode(peaks):
    for path in N_BY_S + LINEAR:
        base = peaks[(memory.sdpa_name(path), LENGTHS[1])]
        assert 0 < base < peaks[(path, LENGTHS[1])] or path == "MLK, linear, causal"


def test_noisy_fish_keeps_its_noise_at_any_budget():
    """FiSH's training noise is drawn for the whole call and kept for backward: even with keep_bytes=0 (every block
    recomputed) what it adds to hard FiSH grows about 4x per doubling (causal: about half the N x S pairs)."""
    extra = {}
    for n in LENGTHS:
        got = measure.allocated_peaks([lambda n=n, p=p: memory.PATHS[p][2](SIZE, n, True) for p in
                                       ("fish, recomputed, keep_bytes=0", "hard_fish, recomputed, keep_bytes=0")])
        extra[n] = got[0] - got[1]
    noise = {n: SIZE.heads * sum(min(n, r + 128) * min(128, n - r) for r in range(0, n, 128)) * 4 for n in LENGTHS}
    assert all(extra[n] >= noise[n] for n in LENGTHS)
    assert extra[LENGTHS[1]] / extra[LENGTHS[0]] >= 3


def test_command_prints_one_row_per_path(capsys):
    threads = torch.get_num_threads()
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            got = memory.main(["--lengths", "64", "128", "--heads", "2", "--head-dim", "8", "--features", "8",
                               "--threads", str(threads)])
    finally:
        torch.set_num_threads(threads)
    lines = out.getvalue().splitlines()
    head = "| path | mode | N=64 MiB | N=128 MiB | x per doubling | SDPA N=64 MiB | SDPA N=128 MiB | x SDPA at N=128 |"
    assert head in lines
    rows = {r[0]: r for r in ([c.strip() for c in line.strip("|").split("|")] for line in lines)
            if r[0] in memory.PATHS}
    assert list(rows) == list(memory.PATHS)
    for path, r in rows.items():
        assert len(r) == 8 and r[1].startswith(memory.PATHS[path][0])
        assert float(r[4]) == pytest.approx(got[(path, 128)] / got[(path, 64)], abs=0.006)
        assert float(r[2]) > 0 and float(r[7]) > 0


def test_command_shows_progress_on_stderr_and_no_profiler_trace_lines(capfd):
    """The default run takes minutes: a bar on stderr counts the cases as they are measured, stdout keeps the
    table. torch's profiler (libkineto) writes `USDT:... profiler_start` / `profiler_stop` from C++ to fd 2 (hence
    capfd) at every session: dropped."""
    threads = torch.get_num_threads()
    try:
        memory.main(["--lengths", "64", "128", "--heads", "2", "--head-dim", "8", "--paths", "MGK hard, dense",
                     "--threads", str(threads)])
    finally:
        torch.set_num_threads(threads)
    out, err = capfd.readouterr()
    assert "USDT" not in out + err
    assert "peak memory: 100%" in err and "4/4" in err  # the path and its SDPA baseline at 2 lengths
    assert "%|" not in out and "| MGK hard, dense | fwd+bwd |" in out


def test_only_kinetos_trace_lines_are_dropped_from_fd_2(capfd):
    """Around the profiler's start and stop, fd 2 is filtered, not silenced: any other line (a kineto error, a
    warning) comes through, also when the call raises."""
    with pytest.raises(RuntimeError), measure._without_kineto_usdt_lines():
        os.write(2, b"USDT:2026-12-03 10:00:00 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
                    b"ERROR:2026-12-03 10:00:00 1:1 Something.cpp:1] a real error\n")
        raise RuntimeError
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "ERROR:2026-12-03 10:00:00 1:1 Something.cpp:1] a real error\nafter\n"


@pytest.mark.parametrize("lengths", [["256"], ["256", "256"]])
def test_one_length_is_refused(lengths):
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        memory.main(["--lengths", *lengths])
