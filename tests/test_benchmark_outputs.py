"""The benchmark's outputs (scripts/benchmark.py, the package hf_mgk.benchmark): the command and the children's
entry point, the rows behind every table, --csv, --markdown, --figures, --mode, --head-dims, the refusal to
overwrite, the CUDA check, the headsize family's equal parameters and the paper formula per model.

main() runs in this process with tiny models (every child call made here, through JSON as from a child). No timed
assertion: the machine is shared and noisy; what is asserted is what can be computed from the printed numbers.
"""

import argparse
import csv
import json

import pytest
import torch

from hf_mgk import flops
from hf_mgk.benchmark import cli, counting, measure, models, tables
from hf_mgk.benchmark.cases import FAMILIES, headsize_cases

from conftest import children_in_process, load_benchmark_script

TINY_BERT = dict(hidden_size=32, num_hidden_layers=1, intermediate_size=64, vocab_size=50,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
LENGTHS, HEAD_DIMS, HEADS = (16, 32), (8, 16), 4


def _use_tiny(mp):
    """Tiny BERT-sized builders and every child call made in this process (`mp`: a MonkeyPatch); the calls made."""
    for kind in ("bert", "mgk"):
        entry = list(models.BUILDERS[kind])
        entry[3] = TINY_BERT
        mp.setitem(models.BUILDERS, kind, tuple(entry))
    calls = []
    mp.setattr(measure, "call_child", children_in_process(calls))
    return calls


@pytest.fixture
def tiny(monkeypatch):
    """`_use_tiny` for one test; returns the calls made."""
    threads = torch.get_num_threads()
    yield _use_tiny(monkeypatch)
    torch.set_num_threads(threads)


def _main(monkeypatch, *argv):
    monkeypatch.setattr("sys.argv", ["benchmark.py", *argv, "--threads", str(torch.get_num_threads())])
    cli.main()


@pytest.fixture(scope="module")
def mgk_run(tmp_path_factory):
    """One run of the mgk family, read by every test that takes it: both modes, two head sizes, two lengths, every
    output file."""
    out = tmp_path_factory.mktemp("out")
    argv = ["--family", "mgk", "--models-only", "--mode", "both", "--heads", str(HEADS), "--repeats", "1",
            "--lengths", *map(str, LENGTHS), "--head-dims", *map(str, HEAD_DIMS),
            "--csv", str(out / "r.csv"), "--markdown", str(out / "r.md"), "--figures", str(out / "figs")]
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        calls = _use_tiny(mp)
        _main(mp, *argv)
    torch.set_num_threads(threads)
    with open(out / "r.csv") as f:
        rows = list(csv.DictReader(f))
    return out, rows, calls


def test_the_command_is_the_package_main():
    """scripts/benchmark.py is a command only: its main is the package's, and each child is started as the package's
    entry point (`python -m hf_mgk.benchmark --_child ...`), whose main is the same."""
    from hf_mgk.benchmark import __main__ as entry

    assert load_benchmark_script().main is cli.main and entry.main is cli.main
    command = measure.child_command("measure_attention", ["band", 32, False, 2, 1, 1])
    assert command[1:4] == ["-m", "hf_mgk.benchmark", "--_child"] and command[-2:] == ["--_device", "cpu"]
    assert json.loads(command[4]) == ["measure_attention", ["band", 32, False, 2, 1, 1]]


def test_child_prints_its_result_as_json(capsys):
    """The child's side of call_child, in this process: --_child runs the named function and prints its result as
    JSON on the last line, which call_child reads (a real child: test_benchmark_nprf.py, slow tier)."""
    threads = torch.get_num_threads()
    cli.main(["--_child", json.dumps(["measure_attention", ["band", 32, False, 2, 1, 1]]), "--_device", "cpu"])
    torch.set_num_threads(threads)
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["seconds"] > 0 and r["peak_mib"] >= 0


@pytest.mark.slow
def test_csv_has_one_row_per_measurement(mgk_run):
    out, rows, calls = mgk_run
    with open(out / "r.csv") as f:
        assert next(csv.reader(f)) == tables.CSV_COLUMNS
    cases = 4  # BERT, MGK soft, sMGK soft, MGK hard
    assert len(rows) == 2 * len(HEAD_DIMS) * len(LENGTHS) * cases == len(calls)
    assert {r["mode"] for r in rows} == {"train", "forward"} and {r["device"] for r in rows} == {"cpu"}
    assert {(int(r["hidden"]), int(r["head_dim"])) for r in rows} == {(HEADS * d, d) for d in HEAD_DIMS}
    assert all(r["error"] == "" for r in rows)


@pytest.mark.slow
def test_ratios_and_tokens_per_second_follow_from_the_times(mgk_run):
    _, rows, _ = mgk_run
    for r in rows:
        group = [b for b in rows if (b["mode"], b["length"], b["hidden"]) == (r["mode"], r["length"], r["hidden"])]
        base = next(b for b in group if b["baseline"] == "True")
        assert base["case"] == f"BERT, {HEADS} heads (SDPA)"
        ms = float(r["ms"])
        assert float(r["ratio_vs_baseline"]) == pytest.approx(ms / float(base["ms"]))
        assert float(r["tokens_per_s"]) == pytest.approx(int(r["batch"]) * int(r["length"]) / (ms / 1000))
        for counted, ratio in [("flops_counted", "flop_ratio_counted"),
                               ("flops_attention_counted", "flop_ratio_attention_counted")]:
            assert float(r[ratio]) == pytest.approx(int(r[counted]) / int(base[counted]))
        assert float(r["params_ratio"]) == pytest.approx(int(r["params"]) / int(base["params"]))


@pytest.mark.slow
def test_formula_columns_are_app_b(mgk_run):
    """flops_formula: App. B for the layer x layers x batch (MGK with M = 2 keys, H/2 heads; sMGK: none), and its
    ratio the formula's; the BERT rows' counted attention is the formula plus one addition per product entry
    (tests/test_flops.py's relation), in both modes (SDPA counted by PyTorch's formula)."""
    _, rows, _ = mgk_run
    for r in rows:
        n, dx, h, d = (int(r[k]) for k in ("length", "hidden", "heads", "head_dim"))
        if "sMGK" in r["case"]:
            assert r["flops_formula"] == r["flop_ratio_formula"] == "" and r["formula"].startswith("no formula")
            continue
        keys = 1 if r["case"].startswith("BERT") else 2
        assert int(r["flops_formula"]) == TINY_BERT["num_hidden_layers"] * flops.mgk_attention_flops(n, dx, h, d, keys)
        assert float(r["flop_ratio_formula"]) == pytest.approx(
            flops.mgk_attention_flops(n, dx, h, d, keys) / flops.mgk_attention_flops(n, dx, HEADS, d))
        if keys == 1:
            entries = 3 * n * h * d + n * n * h + n * h * d + n * dx
            assert int(r["flops_attention_counted"]) == int(r["flops_formula"]) + entries
    forward = [r for r in rows if r["mode"] == "forward"]
    train = {(r["case"], r["length"], r["hidden"]): r for r in rows if r["mode"] == "train"}
    for r in forward:  # a forward step counts the forward only; training about 3x that
        t = train[(r["case"], r["length"], r["hidden"])]
        assert t["flops_attention_counted"] == r["flops_attention_counted"]
        assert 2.5 < int(t["flops_counted"]) / int(r["flops_counted"]) < 3.5


@pytest.mark.slow
def test_markdown_summary_has_every_model_against_its_baseline(mgk_run):
    out, rows, _ = mgk_run
    text = (out / "r.md").read_text()
    assert text.startswith("Command: `python scripts/benchmark.py --family mgk --models-only --mode both")
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    for column in ("model", "baseline", "time x baseline", "FLOPs x, counted (step)", "FLOPs x, paper formula"):
        assert column in header
    body = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]
    models = [r for r in rows if r["baseline"] == "False"]
    assert len(body) == len(models)
    for cells, r in zip(body, models):
        assert (cells["model"], cells["mode"], int(cells["N"])) == (r["case"], r["mode"], int(r["length"]))
        assert float(cells["time x baseline"]) == pytest.approx(float(r["ratio_vs_baseline"]), abs=0.005)
        ratio = r["flop_ratio_formula"]
        assert cells["FLOPs x, paper formula"] == ("-" if ratio == "" else f"{float(ratio):.2f}")


@pytest.mark.slow
def test_figures_are_written(mgk_run):
    out, _, _ = mgk_run
    names = sorted(p.name for p in (out / "figs").iterdir())
    assert names == sorted(f"mgk-{mode}-ratio-vs-{x}.png" for mode in ("train", "forward")
                           for x in ("length", "head-size"))
    for name in names:
        assert (out / "figs" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("which", ["csv", "markdown", "figure"])
def test_refuses_to_overwrite(which, tiny, monkeypatch, tmp_path, capsys):
    figs = tmp_path / "figs"
    figs.mkdir()
    target = {"csv": tmp_path / "r.csv", "markdown": tmp_path / "r.md",
              "figure": figs / "headsize-forward-ratio-vs-length.png"}[which]
    target.write_text("saved by the user")
    argv = ["--family", "headsize", "--mode", "forward", "--lengths", "16", "--repeats", "1",
            "--csv", str(tmp_path / "r.csv"), "--markdown", str(tmp_path / "r.md"), "--figures", str(figs)]
    with pytest.raises(SystemExit):
        _main(monkeypatch, *argv)
    assert f"{target} already exist(s); pass --overwrite" in capsys.readouterr().err
    assert target.read_text() == "saved by the user" and tiny == []  # refused before measuring anything
    _main(monkeypatch, *argv, "--overwrite")
    assert target.read_bytes() != b"saved by the user" and len(tiny) == 4


def test_interleave_times_every_model_in_one_child_alternating(tiny, monkeypatch, tmp_path):
    """--interleave: per length, each case's own child only counts (no timed step), and one child builds every case
    and alternates their timed steps; the rows' times are that child's, the memory and FLOPs each case's own."""
    order = []
    real_model_step = models.model_step

    def model_step(kind, overrides, length, batch, mode):
        model, ids, step = real_model_step(kind, overrides, length, batch, mode)
        return model, ids, lambda *a: (order.append((kind, tuple(sorted(overrides.items())))), step(*a))[1]

    def interleaved(*args):
        order.append("start")
        result = real_interleaved(*args)
        order.append("end")
        return result

    real_interleaved = cli.CHILD_FUNCTIONS["measure_interleaved"]
    monkeypatch.setattr(models, "model_step", model_step)
    monkeypatch.setitem(cli.CHILD_FUNCTIONS, "measure_interleaved", interleaved)
    argv = ["--family", "mgk", "--models-only", "--mode", "train", "--heads", str(HEADS), "--repeats", "3",
            "--lengths", *map(str, LENGTHS), "--interleave", "--csv", str(tmp_path / "r.csv")]
    _main(monkeypatch, *argv)
    cases = list(FAMILIES["mgk"](argparse.Namespace(lengths=None, heads=HEADS))["cases"].values())
    per_case = [c for c in tiny if c[0] == "measure"]
    together = [c for c in tiny if c[0] == "measure_interleaved"]
    assert len(per_case) == len(LENGTHS) * len(cases) and len(together) == len(LENGTHS)
    assert all(args[4] == 0 and result["seconds"] is None for _, args, result in per_case)  # repeats 0: untimed
    for (_, args, result), length in zip(together, LENGTHS):
        assert [tuple(c) for c in args[0]] == cases and args[1] == length and args[3] == 3
        assert len(result["seconds"]) == len(cases) and all(t > 0 for t in result["seconds"])
    # the interleaved child's steps: each case's warm-up, then 3 rounds of one step of every case in turn
    keys = [(kind, tuple(sorted(overrides.items()))) for kind, overrides in cases]
    starts = [i for i, o in enumerate(order) if o == "start"]
    assert len(starts) == len(LENGTHS)
    for start in starts:
        assert order[start + 1:order.index("end", start)] == keys + keys * 3
    with open(tmp_path / "r.csv") as f:
        rows = list(csv.DictReader(f))
    for (_, args, result), length in zip(together, LENGTHS):
        at = [r for r in rows if int(r["length"]) == length]
        assert [float(r["ms"]) for r in at] == pytest.approx([1000 * t for t in result["seconds"]])
        assert float(at[1]["ratio_vs_baseline"]) == pytest.approx(result["seconds"][1] / result["seconds"][0])
        assert all(r["error"] == "" and float(r["peak_mem_mib"]) >= 0 and int(r["flops_counted"]) > 0 for r in at)


def test_cuda_asked_but_unavailable(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        _main(monkeypatch, "--family", "mgk", "--device", "cuda")
    assert "--device cuda: CUDA is not available here" in capsys.readouterr().err


def test_headsize_family_has_equal_parameters(tiny, monkeypatch, capsys):
    """Fixed head sizes 128 and 32 against BERT's d/H = 64 at the benchmark's own width: H D = d each, so the
    models have the same parameters, printed and equal; the head sizes and counts differ as named."""
    for kind in ("bert", "mgk"):  # back to the benchmark's own width
        entry = list(models.BUILDERS[kind])
        monkeypatch.setitem(models.BUILDERS, kind, models.Builder(*entry[:3], models.BERT_SIZE, *entry[4:]))
    spec = headsize_cases(argparse.Namespace(lengths=None))
    shapes = {}
    for case, (kind, overrides) in spec["cases"].items():
        config = models.make_config(kind, overrides, 128)
        d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shapes[case] = (config.num_attention_heads, d, sum(p.numel() for p in models.build(kind, overrides, 128)
                                                          .parameters()))
    assert sorted((h, d) for h, d, _ in shapes.values()) == [(4, 128), (8, 64), (8, 64), (16, 32)]
    assert len({n for _, _, n in shapes.values()}) == 1
    tables.print_equal_params("t", spec, {(case, 128): {"params": n} for case, (_, _, n) in shapes.items()})
    assert capsys.readouterr().out.rstrip().endswith("-- all equal")


@pytest.mark.parametrize("kind, overrides, formula, expected", [
    ("gpt2", {"n_head": 4}, "app_d", lambda n: flops.fish_cost(32, 4, 1, 8, n)["mha_flops"]),
    ("fish_gpt2", {"n_head": 4, "num_global_heads": 2, "attention_type": "hard_fish"}, "app_d",
     lambda n: flops.fish_cost(32, 4, 2, 8, n, variant="hard_fish")["fish_flops"]),
    ("gpt2", {"n_head": 4}, "app_b", lambda n: flops.mgk_attention_flops(n, 32, 4, 8)),  # beside MGK-GPT2
    ("roberta", {"num_attention_heads": 4}, "app_b", lambda n: flops.mgk_attention_flops(n, 32, 4, 8)),
    ("nprf_roberta", {"num_attention_heads": 4, "num_random_features": 8}, "app_b",
     lambda n: flops.nprf_attention_flops(n, 32, 4, 8, 8)),
    ("mgk", {"num_attention_heads": 2, "head_dim": 8, "num_keys": 3, "mgk_variances": [1, 3, 5]}, "app_b",
     lambda n: flops.mgk_attention_flops(n, 32, 2, 8, 3)),
    ("mgk_gpt2", {"n_head": 2, "head_dim": 8}, "app_b", lambda n: flops.mgk_attention_flops(n, 32, 2, 8, 2)),
    ("longformer", {"num_attention_heads": 4}, "app_b", None),
])
def test_paper_formula_for_every_model_kind(kind, overrides, formula, expected):
    size = {"n_embd": 32, "n_layer": 2} if "gpt2" in kind else {"hidden_size": 32, "num_hidden_layers": 2}
    config = models.make_config(kind, {**size, **overrides}, 24)
    value, scope = counting.paper_flops(kind, config, 24, 3, formula)
    if expected is None:
        assert value is None and scope.startswith("no formula")
    else:
        assert value == 2 * 3 * expected(24)


def test_mgk_gpt2_family():
    """MGK-GPT2 (H/2 heads of GPT-2's head size) against GPT-2 (H heads), both by App. B: the formula ratio is
    App. B's (ii) over (i)."""
    spec = FAMILIES["mgk-gpt2"](argparse.Namespace(heads=8, lengths=[256]))
    rows = {}
    for case, (kind, overrides) in spec["cases"].items():
        config = models.make_config(kind, overrides, 256)
        rows[case] = counting.paper_flops(kind, config, 256, 1, spec.get("formula", "app_b"))[0]
    base = rows.pop(spec["baseline"])
    assert base == 2 * flops.mgk_attention_flops(256, 512, 8, 64)
    assert set(rows.values()) == {2 * flops.mgk_attention_flops(256, 512, 4, 64, 2)}
