"""The benchmark's nprf family (hf_mgk.benchmark.nprf): the pure helpers (crossover, growth per doubling, number
formatting), that --batch reaches every measurement, and one run of the whole family at tiny lengths whose printed
tables are checked for completeness and self-consistency. No timed assertion: the machine is shared and noisy.

The family starts 22 child processes even at tiny lengths (about 4 s each, mostly imports), so the end-to-end
run replaces `call_child` by the same call in this process (through JSON, as the child's result comes back);
the child mechanism itself is exercised once on its own.
"""

import contextlib
import io
import re

import pytest
import torch

from hf_mgk.benchmark import cli, measure, models, nprf, tables

from conftest import children_in_process

# The attention alone and the whole models at a tiny size: what these tests check (the batch, the tables) does not
# depend on it.
TINY_ATTN = dict(heads=2, head_dim=16, features=8)
TINY_WIDTH = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128)
WHOLE_MODELS = ("roberta", "nprf_roberta", "longformer")


# ------------------------------------------------------------------ pure helpers
def test_crossover_is_where_the_path_stays_ahead_not_its_first_win():
    sdpa = {512: 10.0, 1024: 20.0, 2048: 40.0, 4096: 80.0}
    noisy = {512: 9.0, 1024: 21.0, 2048: 30.0, 4096: 50.0}  # wins at 512, loses at 1024, then ahead for good
    assert nprf.stays_ahead_from(noisy, sdpa) == 2048
    assert nprf.stays_ahead_from({n: t / 2 for n, t in sdpa.items()}, sdpa) == 512
    assert nprf.stays_ahead_from({**noisy, 4096: 80.0}, sdpa) is None  # a tie at the largest N is not ahead
    assert nprf.stays_ahead_from({n: 2 * t for n, t in sdpa.items()}, sdpa) is None


def test_crossover_uses_only_lengths_measured_for_both():
    sdpa = {512: 10.0, 1024: 20.0, 4096: 80.0}  # SDPA failed at 2048
    path = {512: 11.0, 1024: 19.0, 2048: 1e9, 4096: 50.0}  # explicit skipped at 8192
    assert nprf.stays_ahead_from(path, {**sdpa, 8192: 300.0}) == 1024
    assert nprf.stays_ahead_from({}, sdpa) is None


def test_growth_per_doubling():
    quadratic = {n: 1e-6 * n * n for n in (512, 1024, 4096)}  # 1024 -> 4096 is two doublings
    growth = nprf.growth_per_doubling(quadratic)
    assert [(a, b) for a, b, _ in growth] == [(512, 1024), (1024, 4096)]
    assert [g for _, _, g in growth] == pytest.approx([4.0, 4.0])
    assert nprf.growth_per_doubling({512: 1.0}) == []
    assert nprf.growth_per_doubling({1024: 3.0, 512: 2.0}) == [(512, 1024, pytest.approx(1.5))]


def test_ms_keeps_three_significant_digits():
    assert tables.format_ms(0.0123456) == "12.3"
    assert tables.format_ms(45.2314) == "45231"
    assert tables.format_ms(1.234e-5) == "0.0123"
    assert tables.format_ms(0.0015) == "1.50"


def test_explicit_memory_limit_counts_the_batch():
    n = 2048  # 6 * 8 heads * n^2 * 4 bytes = 0.75 GiB per batch row
    assert nprf.nprf_explicit_fits(n, 1) and nprf.nprf_explicit_fits(n, 10)
    assert not nprf.nprf_explicit_fits(n, 11)
    assert models.NPRF_ATTN == dict(heads=8, head_dim=64, features=32)  # the size the tables are run at


# ------------------------------------------------------------------ --batch reaches the measurements
@pytest.mark.parametrize("path", ["sdpa", *nprf.NPRF_PATHS])
def test_attention_step_uses_the_batch(path, monkeypatch):
    from hf_mgk import attention_nprf

    seen = []

    def recording(target):
        def call(query, *args, **kwargs):
            seen.append(query.shape)
            return target(query, *args, **kwargs)
        return call

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        recording(torch.nn.functional.scaled_dot_product_attention))
    monkeypatch.setattr(attention_nprf, "nprf_attention", recording(attention_nprf.nprf_attention))
    for key, value in TINY_ATTN.items():
        monkeypatch.setitem(models.NPRF_ATTN, key, value)
    nprf.nprf_attention_step(path, 24, True, 3)()
    assert seen == [(3, TINY_ATTN["heads"], 24, TINY_ATTN["head_dim"])]


@pytest.mark.parametrize("kind", WHOLE_MODELS)
def test_whole_model_measurement_uses_the_batch(kind, monkeypatch):
    seen = []
    model = models.build(kind, TINY_WIDTH, 20)
    monkeypatch.setattr(models, "build", lambda *a: model)
    model.register_forward_hook(lambda m, args, kwargs, out: seen.append(out.last_hidden_state.shape),
                                with_kwargs=True)
    r = measure.measure(kind, {}, 20, 3, 1, torch.get_num_threads(), False, "forward")
    assert seen and set(seen) == {(3, 20, TINY_WIDTH["hidden_size"])}
    assert r["flops_fwd"] == r["flops_fwd_bwd"] > r["flops_attn"] > 0  # forward mode: the step is the forward


@pytest.mark.slow
def test_child_process_measures_an_attention_path():
    r = measure.call_child("measure_attention", ["band", 32, False, 2, 1, 1])
    assert "error" not in r, r
    assert r["seconds"] > 0 and r["peak_mib"] >= 0


# ------------------------------------------------------------------ the whole family at tiny lengths
LENGTHS, BATCH = (32, 64), 2


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _rows(block):
    """The data rows of the first markdown table in `block`, keyed by N."""
    return {int(c[0]): c for c in map(_cells, block.splitlines()) if c[0].isdigit()}


def _consistent(ratio, ms, base_ms):
    """A printed 2-decimal ratio against printed 3-significant-digit times."""
    expected = float(ms) / float(base_ms)
    return abs(float(ratio) - expected) <= 0.005 + 0.011 * expected


@pytest.fixture(scope="module")
def family_run():
    """main() for --family nprf (the attention alone at TINY_ATTN, the whole models at TINY_WIDTH), with every child
    call made here; (printed text, [(name, args, result)])."""
    calls = []
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in TINY_ATTN.items():
            mp.setitem(models.NPRF_ATTN, key, value)
        for kind in WHOLE_MODELS:
            entry = list(models.BUILDERS[kind])
            entry[3] = {**entry[3], **TINY_WIDTH}
            mp.setitem(models.BUILDERS, kind, tuple(entry))
        mp.setattr(measure, "call_child", children_in_process(calls))
        mp.setattr("sys.argv", ["benchmark.py", "--family", "nprf", "--lengths", *map(str, LENGTHS),
                                "--repeats", "1", "--batch", str(BATCH), "--threads", str(threads)])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            cli.main()
    torch.set_num_threads(threads)
    return out.getvalue(), calls


@pytest.mark.slow
def test_every_measurement_gets_the_batch(family_run):
    _, calls = family_run
    attention = [a for name, a, _ in calls if name == "measure_attention"]
    models = [a for name, a, _ in calls if name == "measure"]
    assert len(attention) == 2 * len(LENGTHS) * (1 + len(nprf.NPRF_PATHS))
    assert sorted((a[0], a[2]) for a in models) == sorted(
        (kind, n) for kind in WHOLE_MODELS for n in LENGTHS)
    assert all(a[3] == BATCH for a in attention) and all(a[3] == BATCH and a[7] == "forward" for a in models)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_attention_table_is_complete_and_consistent(family_run, causal):
    text, calls = family_run
    kind = "causal" if causal else "bidirectional"
    block = text.split(f"## nprf: {kind} attention")[1].split("\n## ")[0]
    assert f"(B={BATCH}, H={TINY_ATTN['heads']}, D={TINY_ATTN['head_dim']}, m={TINY_ATTN['features']}," in (
        block.splitlines()[0])
    header = _cells(block.splitlines()[1])
    assert header[:2] == ["N", "SDPA ms"] and header[-1] == "SDPA MiB"
    rows = _rows(block)
    assert sorted(rows) == list(LENGTHS)
    for n, c in rows.items():
        assert len(c) == 3 + 3 * len(nprf.NPRF_PATHS)
        for i, p in enumerate(nprf.NPRF_PATHS):
            ms, ratio, mib = c[2 + 3 * i: 5 + 3 * i]
            assert header[2 + 3 * i] == f"{p} ms"
            assert _consistent(ratio, ms, c[1]), (n, p, c)
            assert float(mib) >= 0
    # growth and crossover lines name every path; the crossover is the helper's on the measured times
    seconds = {p: {a[1]: r["seconds"] for name, a, r in calls
                   if name == "measure_attention" and a[0] == p and a[2] == causal}
               for p in ("sdpa",) + nprf.NPRF_PATHS}
    for p in ("sdpa",) + nprf.NPRF_PATHS:
        assert re.search(rf"^  {p}: {LENGTHS[0]}->{LENGTHS[1]} \d+\.\d\d$", block, re.M), p
    fastest = {n: min(seconds[p][n] for p in nprf.NPRF_PATHS) for n in LENGTHS}
    for name, t in [("fastest exact NPRF path", fastest)] + [(p, seconds[p]) for p in nprf.NPRF_PATHS]:
        n = nprf.stays_ahead_from(t, seconds["sdpa"])
        expected = f"from N = {n}" if n is not None else "never stays ahead"
        assert re.search(rf"^  {name}: {expected}", block, re.M), (name, expected, block)


@pytest.mark.slow
def test_whole_model_table_is_complete_and_consistent(family_run):
    """The whole models come through main's one table: every (model, N), times and ratios to RoBERTa's."""
    text, _ = family_run
    block = text.split("## nprf: NPRF attention")[1].split("Mode: forward")[1].split("\n## ")[0]
    header = _cells(block.splitlines()[1])
    assert header[:5] == ["model", "N", "ms", "tokens/s", "x baseline"]
    rows = [_cells(line) for line in block.splitlines()[3:] if line.startswith("|")]
    assert [(r[0], int(r[1])) for r in rows] == [(m, n) for n in LENGTHS for m in
                                                  ("RoBERTa (SDPA)", "NPRF-RoBERTa", "Longformer, window 256")]
    for r in rows:
        base = next(b for b in rows if b[1] == r[1] and b[0] == "RoBERTa (SDPA)")
        assert _consistent(r[4], r[2], base[2]), r
        assert float(r[3].replace(",", "")) == pytest.approx(BATCH * int(r[1]) / (float(r[2]) / 1000), rel=0.01)


def test_printed_crossover_and_growth_on_given_times(monkeypatch, capsys):
    """The issue's noisy case through the printing code: NPRF wins at 512, loses at 1024, wins from 2048 on."""
    sdpa = {512: 10.0, 1024: 20.0, 2048: 40.0, 4096: 80.0}
    ms = {"sdpa": sdpa, "explicit": {512: 9.0, 1024: 21.0, 2048: 30.0, 4096: 100.0},
          "fft": {n: 2 * t for n, t in sdpa.items()}, "band": {512: 12.0, 1024: 22.0, 2048: 45.0, 4096: 70.0}}

    def given(name, call_args):
        if name == "measure_attention":
            return {"seconds": ms[call_args[0]][call_args[1]] / 1000, "peak_mib": 1.0}
        return {"seconds": 1.0, "peak_mib": 1.0, "params": 1, "flops_fwd": 1, "flops_fwd_bwd": 1, "flops_attn": 1}

    monkeypatch.setattr(measure, "call_child", given)
    monkeypatch.setattr("sys.argv", ["benchmark.py", "--family", "nprf", "--lengths", *map(str, sdpa),
                                     "--threads", str(torch.get_num_threads())])
    cli.main()
    block = capsys.readouterr().out.split("## nprf: bidirectional attention")[1].split("\n## ")[0]
    assert "  fastest exact NPRF path: from N = 2048\n" in block
    assert "  band: from N = 4096\n" in block
    assert "  explicit: never stays ahead" in block and "  fft: never stays ahead" in block
    assert "  sdpa: 512->1024 2.00, 1024->2048 2.00, 2048->4096 2.00\n" in block
    assert "  explicit: 512->1024 2.33, 1024->2048 1.43, 2048->4096 3.33\n" in block
    assert "| 1024 | 20.0 | 21.0 | 1.05 | 1 | 40.0 | 2.00 | 1 | 22.0 | 1.10 | 1 | 1 |" in block
