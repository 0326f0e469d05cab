"""scripts/reproduce.py and hf_mgk.reproduce: the claims' registry, the held-out split and tokenizer, the statistics
and verdict rules on hand-made numbers, and the harness end to end on a tiny budget (resume, results.json's means
recomputed from its per-seed numbers, the report)."""

import dataclasses
import glob
import importlib.util
import json
import math
import os
import re
import shlex
import statistics

import pytest

from hf_mgk import reproduce as R
from hf_mgk.families import FAMILIES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"script_{name}", os.path.join(ROOT, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------------------------------- registry

def test_registry_names_the_issues_claims():
    for name in ("mgk-lm", "mgk-mlm", "fish-lm", "heads", "nprf-stability", "concise-heads"):
        assert name in R.CLAIMS


@pytest.mark.parametrize("name", sorted(R.CLAIMS))
def test_claim_checks_name_its_arms_and_metrics(name):
    claim = R.CLAIMS[name]
    arms = [a.name for a in claim.arms]
    assert len(set(arms)) == len(arms)
    for check in claim.checks:
        assert check.a in arms and check.b in arms, check
        assert check.kind in ("better", "no_worse", "fewer")
        metric = check.metric or claim.metric
        assert metric == claim.metric or metric in claim.extra_metrics
    assert all(k in arms for k in claim.paper if k not in ("metric", "note"))  # the paper's numbers, by arm


@pytest.mark.parametrize("scale", R.SCALES)
@pytest.mark.parametrize("name", [n for n, c in R.CLAIMS.items() if c.kind in ("clm", "mlm")])
def test_every_arm_builds_a_valid_config(name, scale):
    """Every arm's overrides are real config fields of its family with valid values, at every scale, and the arms
    differ only in the attention (the recipe's sizes are shared)."""
    claim = R.CLAIMS[name]
    config_class = FAMILIES[claim.family].config_class
    configs = []
    for arm in claim.arms:
        config = R.arm_config(claim, arm, scale, 300, {"eos": 5, "pad": 0})
        configs.append(config)
        built = config_class(**config)
        for key, value in config.items():
            assert getattr(built, key) == value, (arm.name, key)
    shared = set.intersection(*(set(c) for c in configs)) - {k for a in claim.arms for k in a.overrides}
    for key in shared:
        assert len({json.dumps(c[key]) for c in configs}) == 1, key


def test_nprf_arms_are_the_stability_scripts_variants():
    script = load_script("nprf_stability")
    assert {a.name: a.overrides for a in R.CLAIMS["nprf-stability"].arms} == script.VARIANTS


def test_heads_sources_are_trained_arms_of_other_claims():
    for source, arms in R.heads_sources(R.CLAIMS["heads"]).items():
        assert R.CLAIMS[source].kind in ("clm", "mlm")
        assert set(arms) <= {a.name for a in R.CLAIMS[source].arms}


# ------------------------------------------------------------------------------------------------ statistics

def test_mean_and_sample_std():
    mean, std = R.mean_std([1.0, 2.0, 4.0])
    assert mean == pytest.approx(7 / 3)
    assert std == pytest.approx(statistics.stdev([1.0, 2.0, 4.0]))  # n - 1
    assert math.isnan(R.mean_std([3.0])[1])
    means, stds = R.summarize_arm({"0": {"loss": 1.0, "acc": 0.5}, "1": {"loss": 3.0, "acc": 0.7}})
    assert means == {"acc": pytest.approx(0.6), "loss": 2.0}
    assert stds["loss"] == pytest.approx(math.sqrt(2))


BETTER = R.Check("a beats b", "better", "a", "b")


@pytest.mark.parametrize("a, b, lower, outcome", [
    ([1.0, 1.1, 0.9], [2.0, 2.1, 1.9], True, R.HOLDS),  # a clearly lower
    ([1.0, 1.1, 0.9], [2.0, 2.1, 1.9], False, R.FAILS),  # ... but higher is better
    ([2.0, 2.1, 1.9], [1.0, 1.1, 0.9], True, R.FAILS),
    ([1.0, 2.0, 3.0], [1.5, 2.5, 3.5], True, R.INCONCLUSIVE),  # a gain of 0.5 against 2 SE = 1.63
    ([1.0, 1.0], [1.0, 1.0], True, R.INCONCLUSIVE),
    ([], [1.0], True, R.MISSING),
])
def test_better_rule(a, b, lower, outcome):
    assert R.check_outcome(BETTER, a, b, lower)[0] == outcome


def test_better_rule_threshold_is_two_standard_errors():
    # a = b - gain, each arm [x - 1, x, x + 1]: s = 1, n = 3, SE = sqrt(2/3), 2 SE = 1.633
    b = [9.0, 10.0, 11.0]
    just_in = [x - 1.64 for x in b]
    just_out = [x - 1.62 for x in b]
    assert R.check_outcome(BETTER, just_in, b, True)[0] == R.HOLDS
    assert R.check_outcome(BETTER, just_out, b, True)[0] == R.INCONCLUSIVE


@pytest.mark.parametrize("a, outcome", [
    ([100.5, 100.5], R.HOLDS),  # 0.5% worse, within 1%
    ([98.0, 99.0], R.HOLDS),  # better
    ([105.0, 105.2], R.FAILS),  # 5% worse, well beyond 1% + 2 SE
    ([101.0, 104.0], R.INCONCLUSIVE),  # 2.5% worse on average, but the spread covers 1%
])
def test_no_worse_rule(a, outcome):
    check = R.Check("a no worse than b", "no_worse", "a", "b", tol=0.01)
    assert R.check_outcome(check, a, [100.0, 100.0], True)[0] == outcome


def test_fewer_rule_and_verdict():
    fewer = R.Check("a diverges less", "fewer", "a", "b")
    assert R.check_outcome(fewer, [0, 0, 0], [1, 0, 1], True)[0] == R.HOLDS
    assert R.check_outcome(fewer, [0, 0, 0], [0, 0, 0], True)[0] == R.FAILS
    assert R.verdict([R.HOLDS, R.HOLDS]) == R.HOLDS
    assert R.verdict([R.HOLDS, R.FAILS, R.INCONCLUSIVE]) == "partly holds"
    assert R.verdict([R.FAILS, R.INCONCLUSIVE]) == R.FAILS
    assert R.verdict([R.INCONCLUSIVE]) == R.INCONCLUSIVE
    assert R.verdict([R.MISSING]) == R.MISSING


def test_judge_reads_each_checks_metric_and_direction():
    claim = dataclasses.replace(R.CLAIMS["heads"], checks=(
        R.Check("higher rank", "better", "x", "y"),  # the claim's metric, mean_rank, higher is better
        R.Check("lower distance", "better", "x", "y", metric="head_distance", lower_is_better=True)))
    arms = {"x": {"seeds": {"0": {"mean_rank": 10.0, "head_distance": 5.0}, "1": {"mean_rank": 10.1, "head_distance": 5.1}}},
            "y": {"seeds": {"0": {"mean_rank": 5.0, "head_distance": 1.0}, "1": {"mean_rank": 5.1, "head_distance": 1.1}}}}
    judged = R.judge(claim, arms)
    assert [c["outcome"] for c in judged["checks"]] == [R.HOLDS, R.FAILS]
    assert judged["verdict"] == "partly holds"


# ------------------------------------------------------------------------------------- split and tokenizer

def _fake_plays(folder):
    words = {"alpha": "marigold", "beta": "thunderclap", "hamlet": "zyzzyvaquux", "twelfth_night": "qoppaxi"}
    paths = []
    for name, word in words.items():
        path = os.path.join(folder, f"{name}_gut.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(f"{name} line {i}: the {word} spoke {word} again" for i in range(200)) + "\n")
        paths.append(path)
    return sorted(paths)


def test_held_out_split_has_no_training_document(tmp_path):
    files = _fake_plays(tmp_path)
    train, held = R.split_plays(files)
    assert sorted(R.play_name(f) for f in held) == sorted(R.HELD_OUT_PLAYS)
    assert not set(train) & set(held)
    info = R.prepare_data(str(tmp_path / "data"), "tiny", texts=files)
    with open(info["validation_file"], encoding="utf-8") as f:
        validation = f.read()
    with open(info["train_file"], encoding="utf-8") as f:
        trained = f.read()
    assert "zyzzyvaquux" in validation and "zyzzyvaquux" not in trained
    assert "marigold" in trained and "marigold" not in validation
    assert info["held_out_plays"] == list(R.HELD_OUT_PLAYS)
    # a scale that cuts the held-out text says so, and the file holds that many characters (plus the newline)
    assert info["validation_chars"] == R.DATA["tiny"].validation_chars and len(validation) == 5001
    with pytest.raises(ValueError, match="held-out plays not among"):
        R.split_plays(files[:2])


def test_tokenizer_is_trained_without_the_held_out_text(tmp_path):
    """A word repeated hundreds of times becomes one token if the tokenizer saw it: the training plays' words do,
    the held-out plays' words do not."""
    from transformers import AutoTokenizer

    info = R.prepare_data(str(tmp_path / "data"), "tiny", texts=_fake_plays(tmp_path))
    for kind in ("clm", "mlm"):
        tok = AutoTokenizer.from_pretrained(info["tokenizers"][kind])
        assert len(tok) == info["vocab_size"]
        assert len(tok.tokenize(" thunderclap")) == 1
        assert len(tok.tokenize(" zyzzyvaquux")) > 2
        assert len(tok.tokenize(" qoppaxi")) > 1
    mlm = AutoTokenizer.from_pretrained(info["tokenizers"]["mlm"])
    ids = mlm("the marigold")["input_ids"]
    assert ids[0] == mlm.cls_token_id and ids[-1] == mlm.sep_token_id and mlm.mask_token_id is not None
    clm = AutoTokenizer.from_pretrained(info["tokenizers"]["clm"])
    assert clm("the marigold")["input_ids"] == clm.convert_tokens_to_ids(clm.tokenize("the marigold"))
    assert clm.eos_token_id == info["special_ids"]["eos"]


# ------------------------------------------------------------------------------------------- the harness

TWO_ARMS = R.Claim(
    name="test-mlm", title="two tiny arms", source="test", statement="softmax-4 beats softmax-1", kind="mlm",
    family="mgk-bert", metric="eval_loss", lower_is_better=True, paper={"metric": "none", "softmax-4": 1.0},
    arms=(R.Arm("softmax-4", "4 heads", {"attention_type": "softmax", "num_attention_heads": 4}),
          R.Arm("mgk-2", "MGK 2 heads", {"attention_type": "mgk", "num_attention_heads": 2, "num_keys": 2})),
    checks=(R.Check("4 heads beat MGK with 2", "better", "softmax-4", "mgk-2"),),
    extra_metrics=("perplexity", "eval_accuracy"))


@pytest.mark.slow
def test_harness_end_to_end_resume_and_statistics(tmp_path, monkeypatch, capsys):
    """Seed 0 of both arms; the same command again (read back, nothing retrained); then seeds 0 and 1 (seed 0 read
    back, seed 1 trained alone) and the statistics over the two seeds. Four training runs in all, each a child
    process (what the test's time goes to), the last two through the parallel path."""
    monkeypatch.setitem(R.CLAIMS, TWO_ARMS.name, TWO_ARMS)
    script = load_script("reproduce")
    out = str(tmp_path / "repro")  # absolute, like a machine's own folder: the report shows the reader's
    argv = ["--claim", "test-mlm", "--scale", "tiny", "--max_steps", "2", "--threads", "1", "--output_dir", out,
            "--jobs", "2"]
    first = script.main(argv + ["--seeds", "0"])["test-mlm"]

    # Resume: nothing is retrained, the results are the same.
    stamps = {p: os.path.getmtime(p) for p in (os.path.join(out, "test-mlm", "runs", a, "seed0", "model.safetensors")
                                                for a in ("softmax-4", "mgk-2"))}
    capsys.readouterr()
    again = script.main(argv + ["--seeds", "0"])["test-mlm"]
    assert capsys.readouterr().out.count("finished earlier, read back") == 2
    assert {p: os.path.getmtime(p) for p in stamps} == stamps
    assert again["arms"]["mgk-2"]["seeds"] == first["arms"]["mgk-2"]["seeds"]

    # Another seed is another run: it trains alone, the earlier ones are read back.
    capsys.readouterr()
    last = script.main(argv + ["--seeds", "0", "1"])["test-mlm"]
    printed = capsys.readouterr().out
    assert printed.count("finished earlier, read back") == 2 and printed.count("seed 1: eval_loss") == 2
    assert {p: os.path.getmtime(p) for p in stamps} == stamps

    saved = json.load(open(os.path.join(out, "test-mlm", "results.json")))
    assert saved["verdict"] == last["verdict"] and saved["claim"] == "test-mlm"
    for name, arm in saved["arms"].items():
        assert set(arm["seeds"]) == {"0", "1"}
        for metric in ("eval_loss", "perplexity", "eval_accuracy"):
            values = [arm["seeds"][s][metric] for s in ("0", "1")]
            assert arm["mean"][metric] == pytest.approx(statistics.mean(values))
            assert arm["std"][metric] == pytest.approx(statistics.stdev(values))
            run = json.load(open(os.path.join(out, "test-mlm", "runs", name, "seed0", "all_results.json")))
        assert arm["seeds"]["0"]["eval_loss"] == run["eval_loss"]  # what run_mlm.py wrote
        assert arm["seeds"]["0"] == first["arms"][name]["seeds"]["0"]  # read back, not retrained
        assert arm["parameters"] > 0 and arm["curves"]["0"]
    assert saved["arms"]["softmax-4"]["seeds"]["0"] != saved["arms"]["softmax-4"]["seeds"]["1"]  # seeds differ
    assert saved["checks"][0]["outcome"] in (R.HOLDS, R.FAILS, R.INCONCLUSIVE)
    assert saved["budget"]["max_steps"] == 2 and saved["budget"]["seeds"] == [0, 1]
    assert 0 < saved["lm_head_flop_share"] < 1
    report = open(os.path.join(out, "test-mlm", "report.md")).read()
    assert "seed 0" in report and "seed 1" in report and saved["verdict"] in report
    assert f"{saved['arms']['mgk-2']['mean']['eval_loss']:.4g}" in report
    assert "scripts/reproduce.py --claim test-mlm" in report
    assert "evaluated on the first 5,000 characters of the held-out plays" in report
    # the command as the reader runs it: no folder of this machine
    command = report.split("Command:")[1].split("```")[1].strip()
    assert command == saved["command"] and f"--output_dir {R.READER_OUTPUT_DIR}" in command
    assert not [token for token in shlex.split(command) if os.path.isabs(token)]
    for figure in ("curves.png", "final.png"):
        assert os.path.getsize(os.path.join(out, "test-mlm", figure)) > 1000


def test_harness_arguments_are_checked(capsys):
    script = load_script("reproduce")
    with pytest.raises(SystemExit):
        script.main(["--claim", "nope", "--output_dir", "x"])
    assert "unknown claim" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["--claim", "mgk-lm"])
    assert "--output_dir" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["--claim", "mgk-lm", "--output_dir", "x", "--seeds", "1", "1"])
    assert "repeats" in capsys.readouterr().err
    script.main(["--list"])
    listed = capsys.readouterr().out
    assert all(name in listed for name in R.CLAIMS)


def test_passthrough_flags_reach_the_training_script(tmp_path):
    script = load_script("reproduce")
    args, passthrough = script.parse_args(["--claim", "mgk-mlm", "--output_dir", str(tmp_path), "--scale", "tiny",
                                           "--gradient_accumulation_steps", "2"])
    claim = R.CLAIMS["mgk-mlm"]
    data = {"vocab_size": 300, "special_ids": {"eos": 5, "pad": 0}, "tokenizers": {"mlm": "tok"},
            "train_file": "t.txt", "validation_file": "v.txt"}
    argv = script.run_command(claim, claim.arms[1], 3, args, data, passthrough, "out")
    assert argv[-2:] == ["--gradient_accumulation_steps", "2"]
    assert argv[argv.index("--seed") + 1] == "3" and "--use_cpu" in argv
    overrides = dict(kv.split("=", 1) for kv in argv[argv.index("--config_overrides") + 1].split(","))
    assert overrides["attention_type"] == '"mgk"' and overrides["num_attention_heads"] == "4"


def test_report_of_the_committed_heads_run_has_layers_and_rank_figure(tmp_path):
    """The heads claim's report from its results.json: the per-layer table and the rank histograms."""
    results = json.load(open(os.path.join(ROOT, "docs", "reproductions", "full", "heads", "results.json")))
    figures = R.draw_figures(results, str(tmp_path))
    assert "ranks.png" in figures and os.path.getsize(tmp_path / "ranks.png") > 10000
    report = R.report_markdown(results, figures)
    assert "## Per layer" in report and "![ranks.png](ranks.png)" in report
    first = next(iter(results["layers"]))
    layers = results["layers"][first]["0"]
    assert report.split("## Per layer")[1].count(f"| `{first}` |") == len(layers)
    # the layer averages in the arms equal the mean of the per-layer numbers
    mean_rank = sum(layer["mean_rank"] for layer in layers) / len(layers)
    assert results["arms"][first]["seeds"]["0"]["mean_rank"] == pytest.approx(mean_rank)


def test_warmstart_arms_keep_the_same_heads_and_share_the_recipe(tmp_path):
    script = load_script("reproduce")
    args, passthrough = script.parse_args(["--claim", "mgk-warmstart", "--output_dir", str(tmp_path),
                                           "--scale", "tiny"])
    claim = R.CLAIMS["mgk-warmstart"]
    data = {"train_file": "t.txt", "validation_file": "v.txt"}
    commands = {arm.name: script.warmstart_commands(claim, arm, 0, args, data, passthrough, str(tmp_path / arm.name))
                for arm in claim.arms}
    kept = {name: c[0][c[0].index("--keep_heads") + 1] if "--keep_heads" in c[0] else None
            for name, c in commands.items()}
    assert kept == {"softmax-12": None, "mgk-6": R.WARMSTART_KEEP, "softmax-6": R.WARMSTART_KEEP}
    for name, (adapt, finetune) in commands.items():
        assert adapt[0].endswith("run_mlm.py") and finetune[0].endswith("run_glue.py")
        assert finetune[finetune.index("--model_name_or_path") + 1] == str(tmp_path / name / "adapt")

    def without_arm(argv):  # everything but the arm's own attention, heads and folders
        drop = {"--attention_overrides", "--keep_heads", "--output_dir", "--model_name_or_path"}
        return [a for i, a in enumerate(argv) if a not in drop and (i == 0 or argv[i - 1] not in drop)]

    recipes = {json.dumps([without_arm(c) for c in cmds]) for cmds in commands.values()}
    assert len(recipes) == 1


def test_nprf_result_counts_a_divergence(tmp_path):
    script = load_script("reproduce")
    saved = {"runs": [{"loss": [7.0, 6.5, "nan"], "first_nonfinite_loss": 3, "heldout_loss": "nan"}],
             "summary": [{"max_qk": 88.0}]}
    (tmp_path / "curves.json").write_text(json.dumps(saved))
    result = script.nprf_result(R.CLAIMS["nprf-stability"], str(tmp_path))
    assert result["metrics"]["diverged"] == 1.0 and result["metrics"]["first_nonfinite_step"] == 3
    assert math.isnan(result["metrics"]["heldout_loss"]) and result["eval_curve"][:2] == [(1, 7.0), (2, 6.5)]
    saved["runs"][0].update(first_nonfinite_loss=None, heldout_loss=6.2, loss=[7.0, 6.5])
    (tmp_path / "curves.json").write_text(json.dumps(saved))
    assert script.nprf_result(R.CLAIMS["nprf-stability"], str(tmp_path))["metrics"]["diverged"] == 0.0


def test_regenerating_a_report_keeps_the_elapsed_time(tmp_path):
    """A claim whose runs were all read back keeps the earlier results.json's start-to-end time (its report states
    it against the budget); a claim that trained anything now reports this call's."""
    script = load_script("reproduce")
    read_back = {("a", 0): {"seconds": 90.0, "read_back": True}, ("b", 0): {"seconds": 80.0, "read_back": True}}
    assert script.elapsed_seconds(str(tmp_path), read_back, 3.0) == 3.0  # nothing earlier to keep
    (tmp_path / "results.json").write_text(json.dumps({"harness_seconds": 1140.0}))
    assert script.elapsed_seconds(str(tmp_path), read_back, 3.0) == 1140.0
    trained = {**read_back, ("c", 0): {"seconds": 70.0}}
    assert script.elapsed_seconds(str(tmp_path), trained, 75.0) == 75.0
    results = json.load(open(os.path.join(ROOT, "docs", "reproductions", "mgk-lm", "results.json")))
    results["budget"]["jobs"] = 2
    assert f"{results['harness_seconds'] / 60:.1f} min from start to end, 2 at a time" in R.report_markdown(results)


@pytest.mark.parametrize("given, shown", [("/work/rd", R.READER_OUTPUT_DIR), ("outputs/repro", "outputs/repro")])
def test_the_command_shows_the_output_folder_as_a_reader_runs_it(given, shown):
    """results.json and report.md show the command that reruns the claim: an absolute output folder is the running
    machine's and is shown as the README's folder; a relative one stays as given."""
    script = load_script("reproduce")
    args, passthrough = script.parse_args(["--claim", "mgk-lm", "--output_dir", given, "--threads", "1",
                                           "--bf16"])
    command = script.claim_command(R.CLAIMS["mgk-lm"], args, passthrough)
    assert command.endswith(f"--threads 1 --output_dir {shown} --bf16")
    assert not [token for token in shlex.split(command) if os.path.isabs(token)]


REPRODUCTIONS = os.path.join(ROOT, "docs", "reproductions")


@pytest.mark.parametrize("folder", sorted(os.path.relpath(os.path.dirname(p), REPRODUCTIONS) for p in glob.glob(
    os.path.join(REPRODUCTIONS, "**", "results.json"), recursive=True)))
def test_committed_reports_are_their_results_as_the_package_writes_them(folder):
    """Each committed report.md is what report_markdown makes of the results.json beside it (figures in
    draw_figures' order), so a change to the report is regenerated into them, and its command names no folder of
    the machine that ran it."""
    folder = os.path.join(REPRODUCTIONS, folder)
    results = json.load(open(os.path.join(folder, "results.json"), encoding="utf-8"))
    figures = [f for f in ("curves.png", "ranks.png", "final.png") if os.path.isfile(os.path.join(folder, f))]
    assert open(os.path.join(folder, "report.md"), encoding="utf-8").read() == R.report_markdown(results, figures)
    assert not [token for token in shlex.split(results["command"]) if os.path.isabs(token)]


def test_committed_reproductions_hold_no_machine_path():
    """No committed text under docs/reproductions names a folder of the machine that made it (a reader's checkout
    has none of them)."""
    machine_path = re.compile(r"(?<![\w.])/(work|tmp|root|home)\b")
    found = []
    for folder, _, files in os.walk(REPRODUCTIONS):
        for name in files:
            if name.endswith((".md", ".json")):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    found += [f"{os.path.join(folder, name)}:{i}" for i, line in enumerate(f, 1)
                              if machine_path.search(line)]
    assert not found
