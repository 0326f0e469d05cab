"""Launch the suite's torchrun runs over and over and count the ranks that hang (docs/testing.md, "torchrun").

    .venv/bin/python tests/torchrun_soak.py --launches 20 [--load 2] [--timeout 120] [--case run_mlm run_clm trainer]

The cases are the tests' own launches: run_mlm (tiny MGK-BERT) and run_clm (tiny hard-FiSH GPT-2), 3 steps on 2
processes with gloo, as test_run_lm.py's test_torchrun_two_processes_match_one starts them, and trainer_check.py's
four tasks in one launch, as test_trainer.py's. `--load N` keeps N busy processes spinning meanwhile (a loaded
machine). A launch that has not ended after --timeout seconds counts as a hang: every process is stopped with
SIGABRT (faulthandler prints their stacks; the last lines of each hang are kept in --stacks). Prints one line per
launch and a table per case: launches, hangs, failures, and the seconds a launch takes (median, max)."""

import argparse
import multiprocessing
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "src"))

import tiny  # noqa: E402


def spin():
    while True:
        pass


def case_argv(case, work, texts, out):
    from hf_mgk import bundled

    if case == "trainer":
        return [HERE / "trainer_check.py", "--task", "mlm", "cls", "clm", "clm-mgk", "--batch", "1",
                "--accumulation", "2", "--out", out / "result.pt"]
    family, tokenizer, length, extra = {
        "run_mlm": ("mgk-bert", bundled.bert_checkpoint_dir(), "--max_seq_length",
                    [tiny.overrides(tiny.bert_size(max_position_embeddings=tiny.POSITIONS)),
                     "hidden_dropout_prob=0,attention_probs_dropout_prob=0"]),
        "run_clm": ("fish-gpt2", bundled.gpt2_tokenizer_dir(), "--block_size",
                    [tiny.overrides(tiny.gpt2_size(n_inner=37, n_positions=tiny.POSITIONS, num_global_heads=2)),
                     "attention_type=hard_fish,resid_pdrop=0,embd_pdrop=0,attn_pdrop=0"]),
    }[case]
    return [ROOT / "scripts" / f"{case}.py", "--model_type", family, "--tokenizer_name", tokenizer,
            "--config_overrides", ",".join(extra), "--train_file", texts["train"], "--validation_file",
            texts["validation"], "--output_dir", out, "--cache_dir", work / "cache", "--use_cpu", "--report_to",
            "none", "--max_steps", "3", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "128",
            "--logging_steps", "1", "--save_strategy", "no", "--do_train", length, "32", "--optim", "sgd",
            "--learning_rate", "0.5", "--lr_scheduler_type", "constant", "--seed", "3", "--data_seed", "5"]


def launch(argv, timeout):
    """(seconds, "ok" | "failed" | "hang", stderr tail): one bounded launch, as the tests run it (conftest's
    run_bounded), the native stacks of a hung one first."""
    import pytest
    from conftest import free_port, run_bounded

    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), *map(str, argv)]
    start = time.perf_counter()
    try:
        done = run_bounded(command, env, timeout, stacks=native_stacks)
    except pytest.fail.Exception as hung:
        return time.perf_counter() - start, "hang", str(hung)  # native stacks first, then faulthandler's
    return time.perf_counter() - start, "ok" if done.returncode == 0 else "failed", done.stderr[-3000:]


def native_stacks(pids):
    """Every thread's native and Python stack of each process, by py-spy (PY_SPY, or on PATH) or else gdb, where
    either is installed: faulthandler shows no frame below a C call, where a teardown deadlock sits."""
    import shutil

    spy = os.environ.get("PY_SPY") or shutil.which("py-spy")
    texts = []
    for pid in pids:
        if spy:
            command = [spy, "dump", "--native", "--pid", str(pid)]
        elif shutil.which("gdb"):
            command = ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"]
        else:
            return ""
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        texts.append(f"--- process {pid}: {' '.join(command[:2])}\n{done.stdout}{done.stderr[-2000:]}")
    return "\n".join(texts) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=20, help="launches of each case")
    parser.add_argument("--case", nargs="+", default=["run_mlm", "run_clm", "trainer"],
                        choices=["run_mlm", "run_clm", "trainer"])
    parser.add_argument("--load", type=int, default=0, help="busy processes spinning meanwhile")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds after which a launch is a hang")
    parser.add_argument("--stacks", default=None, help="file for the stacks of the hung launches")
    a = parser.parse_args()

    from conftest import write_play_split

    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(a.load)]
    for p in spinners:
        p.start()
    results = {case: [] for case in a.case}
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        texts = write_play_split(work, (200, 600), (600, 700))
        for i in range(a.launches):
            for case in a.case:  # the cases alternate, so a change of load meets them all
                out = work / f"{case}-{i}"
                out.mkdir()
                seconds, outcome, err = launch(case_argv(case, work, texts, out), a.timeout)
                results[case].append((seconds, outcome))
                print(f"{case} launch {i + 1}: {outcome} in {seconds:.1f} s", flush=True)
                if outcome != "ok" and a.stacks:
                    with open(a.stacks, "a", encoding="utf-8") as f:
                        f.write(f"===== {case} launch {i + 1}: {outcome}\n{err}\n")
    for p in spinners:
        p.terminate()
    print(f"\nload {a.load}, timeout {a.timeout:.0f} s")
    print("| case | launches | hangs | failures | seconds (median) | seconds (max, ok) |")
    print("|---|---:|---:|---:|---:|---:|")
    for case, runs in results.items():
        ok = [s for s, o in runs if o == "ok"]
        print(f"| {case} | {len(runs)} | {sum(o == 'hang' for _, o in runs)} | {sum(o == 'failed' for _, o in runs)} "
              f"| {statistics.median(ok) if ok else float('nan'):.1f} | {max(ok) if ok else float('nan'):.1f} |")


if __name__ == "__main__":
    main()
