"""The benchmark's options for GPU runs, checked on the CPU: --dtype (the children compute in it, the
models under autocast, the attention-alone inputs in it), the eager rows beside "auto" on --device cuda, --interleave
for the attention-alone tables (one child per N, its times used), --attention-only, and the block-size tuning pass
(in Triton's interpreter on tiny shapes). No timed assertion: the machine is shared and noisy."""

import argparse
import contextlib
import io
import os

import pytest
import torch

from hf_mgk import attention_fish_triton as aft
from hf_mgk import attention_mgk_triton as amt
from hf_mgk import attention_triton as at
from hf_mgk.benchmark import attention, cli, measure, models, tune

from conftest import children_in_process


@pytest.fixture
def dtype(monkeypatch):
    def set_dtype(name):
        monkeypatch.setattr(models, "DTYPE", name)
    return set_dtype


def _args(**kw):
    threads = torch.get_num_threads()
    return argparse.Namespace(**{**dict(heads=4, global_heads=2, batch=1, repeats=2, threads=threads, lengths=[16],
                                        fish_types=["hard_fish", "fish"], device="cpu", dtype="fp32",
                                        interleave=False, static=None), **kw})


def _table(run, args, spec=None):
    out = io.StringIO()
    threads = torch.get_num_threads()
    with contextlib.redirect_stdout(out):
        run(args, spec or {"lengths": args.lengths})
    torch.set_num_threads(threads)
    lines = out.getvalue().splitlines()
    return lines, [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| 16 |")]


def test_the_child_computes_in_the_parents_dtype(dtype):
    """--dtype reaches the child (its command line), whose attention inputs are in it and whose models' forward runs
    under autocast to it; fp32 is left as it is."""
    dtype("bf16")
    command = measure.child_command("measure", ["mgk", {}, 8, 1, 1, 1])
    assert command[-4:] == ["--_dtype", "bf16", "--_device", "cpu"]
    for step in (attention.mgk_attention_step("MGK soft", 4, 16, 1, 8),
                 attention.fish_attention_step("fish", 4, 2, 16, 1, 8)):
        leaves = [c.cell_contents for c in step.__closure__ if isinstance(c.cell_contents, torch.Tensor)
                  and c.cell_contents.dim() >= 4]
        assert leaves and all(t.dtype == torch.bfloat16 for t in leaves)
        step()
    seen = []
    model, _, step = models.model_step("mgk", {"num_attention_heads": 4, "hidden_size": 64, "intermediate_size": 64,
                                               "num_hidden_layers": 1}, 16, 1, "train")
    model.encoder.layer[0].intermediate.dense.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    step()
    dtype("fp32")
    step()
    assert seen == [torch.bfloat16, torch.float32]


def test_run_in_child_takes_the_dtype(capsys, monkeypatch):
    monkeypatch.setattr(models, "DTYPE", "fp32")
    cli.main(["--_child", '["measure_mgk_attention", ["MGK soft", 4, 16, 1, 8, 1, 1]]', "--_dtype", "fp16",
              "--_device", "cpu"])
    assert models.DTYPE == "fp16" and "seconds" in capsys.readouterr().out


@pytest.mark.skipif(not at.interpreting(), reason="the kernels' rows on CPU tensors need the interpreter")
def test_on_a_gpu_the_tables_show_the_kernels_and_the_eager_path_beside_auto(monkeypatch, tmp_path):
    """--device cuda (its children run here on the CPU, the kernels in Triton's interpreter): each MGK and FiSH path
    ("auto") also as "..., triton" and "..., eager" (the rule's choice without the kernels); with --static the
    model's figure beside each Triton row; what auto chose by timing listed under the table. On the CPU the table is
    as before."""
    from hf_mgk import attention_autotune

    calls = []
    monkeypatch.setattr(measure, "call_child", children_in_process(calls))
    monkeypatch.setattr(attention_autotune, "MEASURED_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(attention_autotune, "REPEATS", 1)
    monkeypatch.setattr(attention_autotune, "_CHOSEN", {})
    monkeypatch.setenv("HF_MGK_CACHE", str(tmp_path / "cache"))
    figures = tmp_path / "static.json"
    figures.write_text('{"summary": {"mgk soft": {"both": 2.5}, "smgk hard": {"both": 3.25}, "fish": {"both": 9}}}')
    lines, rows = _table(attention.run_mgk_attention, _args(device="cuda", static=str(figures)))
    names = [r[2] for r in rows]
    assert names == [*attention.MGK_PATHS, *(f"{p}, {b}" for p in ("MGK soft", "sMGK soft", "MGK hard", "sMGK hard")
                                             for b in ("triton", "eager"))]
    assert all(len(r) == 10 and float(r[3]) > 0 for r in rows)
    model = {r[2]: r[5] for r in rows}
    assert model["MGK soft, triton"] == "2.50" and model["sMGK hard, triton"] == "3.25"
    assert model["MGK soft"] == model["MGK soft, eager"] == model["MGK hard, triton"] == ""  # no figure given
    assert "model (static)" in lines[[i for i, line in enumerate(lines) if line.startswith("| N |")][0]]
    chosen = lines[[i for i, line in enumerate(lines) if line.startswith("backend='auto' timed")][0] + 1:]
    assert {line.split(" ")[1] + " " + line.split(" ")[2] for line in chosen} == {
        "mgk soft", "smgk soft", "mgk hard", "smgk hard"}
    assert all(line.rstrip().endswith(("triton", "blocked", "dense", "sdpa")) for line in chosen)

    _, rows = _table(attention.run_fish_attention, _args(device="cuda", static=str(figures)))
    assert [r[2] for r in rows] == ["hard_fish", "fish", "hard_fish, triton", "hard_fish, eager", "fish, triton",
                                    "fish, eager"]
    assert {r[2]: r[5] for r in rows}["fish, triton"] == "9.00"
    _, rows = _table(attention.run_fish_attention, _args())
    assert [r[2] for r in rows] == ["hard_fish", "fish"] and all(len(r) == 7 for r in rows)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_interleave_times_the_paths_together(device, monkeypatch):
    """--interleave: one measure_alone_interleaved child per N times SDPA and every path alternating, and the table
    shows its times; on the CPU the separate children still run (memory: the process's peak), on a GPU not (each
    path's peak from the same child)."""
    calls = []
    monkeypatch.setattr(measure, "call_child", children_in_process(calls))
    lines, rows = _table(attention.run_fish_attention, _args(device=device, interleave=True))
    together = [c for c in calls if c[0] == "measure_alone_interleaved"]
    assert len(together) == 1
    kind, paths, shape, repeats, _ = together[0][1]
    assert (kind, repeats) == ("fish", 2) and paths[0] == "sdpa" and paths[1:] == [r[2] for r in rows]
    times = {p: got["seconds"] for p, got in zip(paths, together[0][2]["rows"])}
    for r in rows:
        assert float(r[3]) == pytest.approx(times[r[2]] * 1e3, rel=0.01, abs=0.01)
        assert float(r[1]) == pytest.approx(times["sdpa"] * 1e3, rel=0.01, abs=0.01)
    separate = [c for c in calls if c[0] == "measure_fish_attention"]
    assert len(separate) == (0 if device == "cuda" else len(paths))
    assert any("alternate in one process" in line for line in lines)


def test_a_path_that_cannot_run_says_why_in_the_interleaved_table(monkeypatch):
    calls = []
    monkeypatch.setattr(measure, "call_child", children_in_process(calls))
    monkeypatch.setitem(attention.FISH_GPU_PATHS, "fish, eager", ("fish", "no-such-backend"))
    _, rows = _table(attention.run_fish_attention, _args(device="cuda", interleave=True, fish_types=["fish"]))
    by_path = {r[2]: r for r in rows}
    assert "unknown backend 'no-such-backend'" in by_path["fish, eager"][3] and float(by_path["fish"][3]) > 0


def test_attention_only_runs_no_model(monkeypatch):
    calls = []
    monkeypatch.setattr(measure, "call_child", children_in_process(calls))
    out = io.StringIO()
    threads = torch.get_num_threads()
    with contextlib.redirect_stdout(out):
        cli.main(["--family", "fish", "--attention-only", "--lengths", "16", "--heads", "4", "--repeats", "1",
                  "--fish-types", "hard_fish", "--threads", str(threads)])
    torch.set_num_threads(threads)
    assert {c[0] for c in calls} == {"measure_fish_attention"} and "## fish: attention alone" in out.getvalue()
    with pytest.raises(SystemExit):
        cli.main(["--family", "fish", "--attention-only", "--csv", "x.csv"])


def test_tuned_block_sizes_reach_the_kernels(monkeypatch, caplog):
    monkeypatch.setenv("HF_MGK_TRITON_BLOCKS", "mgk:w64=128x32, fish:w128=32x64")
    assert at.tuned_blocks("mgk", (1, 1), "w64") == (128, 32) and at.tuned_blocks("fish", (1, 1), "w128") == (32, 64)
    assert amt.block_sizes("cuda", 64, 64) == (128, 32) and aft.block_sizes("cuda", 2, 64, 64) == (32, 64)
    monkeypatch.setenv("HF_MGK_TRITON_BLOCKS", "fish:w128=32x64")
    assert amt.block_sizes("cuda", 64, 64) == (128, 64) and amt.block_sizes("cpu", 64, 64) == (32, 32)


def test_tuned_block_sizes_hold_for_the_shape_class_they_were_timed_at(monkeypatch, caplog):
    """A tuning names its shape class: other shapes keep their defaults (FiSH's shrink with M x D). An entry
    without a class applies to every shape and says so once; a malformed one names the variable."""
    assert at.shape_class(64) == "w64" and at.shape_class(48) == "w64" and at.shape_class(8) == "w16"
    assert at.shape_class(64, 2) == "w128" and at.shape_class(64, 3) == "w256" and at.shape_class(128, 8) == "w1024"
    monkeypatch.setenv("HF_MGK_TRITON_BLOCKS", "fish:w128=16x16,mgk:w128=16x32")
    assert aft.block_sizes("cuda", 2, 64, 64) == (16, 16)      # the class it was tuned at
    assert aft.block_sizes("cuda", 4, 64, 64) == (32, 64)      # M = 4: w256 keeps its default
    assert aft.block_sizes("cuda", 2, 128, 64) == (32, 64)     # D = 128: w256 too
    assert amt.block_sizes("cuda", 64, 64) == (128, 64) and amt.block_sizes("cuda", 128, 128) == (16, 32)
    monkeypatch.setattr(at, "_UNCLASSED_SAID", set())
    monkeypatch.setenv("HF_MGK_TRITON_BLOCKS", "fish=16x16")
    with caplog.at_level("WARNING", logger="hf_mgk.attention_triton"):
        assert aft.block_sizes("cuda", 2, 64, 64) == (16, 16) and aft.block_sizes("cuda", 4, 64, 64) == (16, 16)
    said = [r.getMessage() for r in caplog.records if "HF_MGK_TRITON_BLOCKS" in r.getMessage()]
    assert len(said) == 1 and "every shape" in said[0]
    for bad in ("fish=16", "fish:w128=axb", "fsh=16x16"):
        monkeypatch.setenv("HF_MGK_TRITON_BLOCKS", bad)
        with pytest.raises(ValueError, match="HF_MGK_TRITON_BLOCKS: cannot read"):
            aft.block_sizes("cuda", 2, 64, 64)


@pytest.mark.slow  # the kernels of both families in the interpreter, three candidates each
@pytest.mark.skipif(not at.interpreting(), reason="the tuning pass runs the kernels: here in Triton's interpreter")
def test_tuning_pass_times_each_candidate_and_names_the_fastest(monkeypatch, capsys):
    """tune.main on tiny shapes in the interpreter: every candidate and the defaults timed for each family (a
    candidate that cannot run is reported, not fatal), the last line the variable to export (naming a family only
    where a candidate beat its defaults), the environment as it was after."""
    monkeypatch.delenv("HF_MGK_TRITON_BLOCKS", raising=False)
    monkeypatch.setattr(models, "DTYPE", "fp32")
    real = tune.FAMILY_STEPS["mgk"]

    def broken_at_16(a):  # a candidate the "GPU" cannot run
        step = real(a)
        return lambda: (_ for _ in ()).throw(RuntimeError("out of resources")) if at.tuned_blocks(
            "mgk", None, at.shape_class(16)) == (16, 16) else step()

    monkeypatch.setitem(tune.FAMILY_STEPS, "mgk", broken_at_16)
    chosen = tune.main(["--device", "cpu", "--dtype", "fp32", "--length", "24", "--batch", "1", "--heads", "2",
                        "--head-dim", "16", "--repeats", "1", "--candidates", "16x16", "32x32", "16x32"])
    out = capsys.readouterr().out
    assert "| 16x16 | out of resources |" in out
    for family in ("mgk", "fish"):
        assert f"## {family}: Triton block sizes" in out
    assert out.strip().splitlines()[-1] == "HF_MGK_TRITON_BLOCKS=" + ",".join(chosen)
    picked = dict(item.split("=") for item in chosen)
    for family, key in (("mgk", "mgk:w16"), ("fish", "fish:w32")):
        table = out.split(f"## {family}: ")[1].split("\n\n")[0]
        timed = {row.split("|")[1].strip(): float(row.split("|")[2]) for row in table.splitlines()
                 if row.startswith("| ") and row.split("|")[2].strip().replace(".", "").isdigit()}
        assert "default" in timed and len(timed) == (3 if family == "mgk" else 4)
        fastest = min(timed, key=timed.get)
        assert picked.get(key, "default") == fastest
    assert picked.keys() <= {"mgk:w16", "fish:w32"}
    assert "HF_MGK_TRITON_BLOCKS" not in os.environ
