#!/usr/bin/env python
"""Speed, memory and size of each attention family beside its softmax baseline, in one run, as ratios.

    python scripts/benchmark.py --family mgk                  # MGK-BERT (H/2 heads, M=2) vs BERT (H heads, SDPA)
    python scripts/benchmark.py --family mgk --lengths 128 512 --repeats 5

Each (model, length) is measured in a fresh child process: a warm-up step, then the median of `--repeats`
training steps (forward + backward of the encoder + an SGD step; no LM head, so the vocabulary projection does
not hide the attention), and the peak resident memory the step adds above the loaded model (ru_maxrss minus the
RSS before the first step). Shared machines are noisy: read the ratios, which are taken in the same run.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

FAMILIES = {}


def family(name):
    def register(fn):
        FAMILIES[name] = fn
        return fn
    return register


# ------------------------------------------------------------------ MGK-BERT
BERT_SIZE = dict(hidden_size=512, num_hidden_layers=2, intermediate_size=2048, vocab_size=1000,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@family("mgk")
def mgk_cases(args):
    """MGK-BERT with H/2 heads of the baseline's head size (App. B: the attention width halves), M=2 keys."""
    heads = args.heads
    head_dim = BERT_SIZE["hidden_size"] // heads
    return {
        "lengths": args.lengths or [128, 256, 512, 1024, 2048],
        "baseline": f"BERT, {heads} heads (SDPA)",
        "cases": {
            f"BERT, {heads} heads (SDPA)": ("bert", {"num_attention_heads": heads}),
            f"MGK-BERT soft, {heads // 2} heads": ("mgk", {"num_attention_heads": heads // 2, "head_dim": head_dim}),
            f"sMGK-BERT soft, {heads // 2} heads": ("mgk", {"num_attention_heads": heads // 2, "head_dim": head_dim,
                                                            "attention_type": "smgk"}),
            f"MGK-BERT hard, {heads // 2} heads": ("mgk", {"num_attention_heads": heads // 2, "head_dim": head_dim,
                                                           "e_step": "hard"}),
        },
    }


def build(kind, overrides, length):
    """The model for one case; `kind` names a builder so child processes can rebuild it from JSON."""
    if kind == "bert":
        from transformers import BertConfig, BertModel

        config = BertConfig(**BERT_SIZE, max_position_embeddings=max(length, 512), **overrides)
        config._attn_implementation = "sdpa"
        return BertModel(config, add_pooling_layer=False)
    if kind == "mgk":
        from hf_mgk import MGKBertConfig, MGKBertModel

        return MGKBertModel(MGKBertConfig(**BERT_SIZE, max_position_embeddings=max(length, 512), **overrides),
                            add_pooling_layer=False)
    raise ValueError(f"unknown model kind {kind!r}")


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(kind, overrides, length, batch, repeats, threads):
    """Runs in the child: (median step seconds, peak added MiB, parameter count)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build(kind, overrides, length).train()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ids = torch.randint(0, BERT_SIZE["vocab_size"], (batch, length))

    def step():
        opt.zero_grad(set_to_none=True)
        model(ids).last_hidden_state.float().pow(2).mean().backward()
        opt.step()

    rss_before = _rss_bytes()
    step()  # warm-up: allocations, kernel selection
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "peak_mib": max(peak, 0) / 2**20, "params": params}


def run_child(kind, overrides, length, args):
    cmd = [sys.executable, __file__, "--_child", json.dumps([kind, overrides, length, args.batch, args.repeats,
                                                             args.threads])]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_table(title, spec, results):
    base = spec["baseline"]
    print(f"\n## {title}")
    print("| model | N | step (ms) | x baseline | peak step memory (MiB) | x baseline | parameters | x baseline |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for length in spec["lengths"]:
        b = results[(base, length)]
        for name in spec["cases"]:
            r = results[(name, length)]
            if "error" in r or "error" in b:
                print(f"| {name} | {length} | {r.get('error', 'baseline failed')} | | | | | |")
                continue
            print(f"| {name} | {length} | {1000 * r['seconds']:.1f} | {r['seconds'] / b['seconds']:.2f} | "
                  f"{r['peak_mib']:.0f} | {r['peak_mib'] / max(b['peak_mib'], 1e-9):.2f} | "
                  f"{r['params'] / 1e6:.2f}M | {r['params'] / b['params']:.2f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=sorted(FAMILIES) + ["all"], default="all")
    p.add_argument("--lengths", type=int, nargs="*", help="sequence lengths (default: per family)")
    p.add_argument("--heads", type=int, default=8, help="the baseline's heads H")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--_child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._child:
        print(json.dumps(measure(*json.loads(args._child))))
        return
    print(f"torch {torch.__version__}, {args.threads} threads, batch {args.batch}, median of {args.repeats} steps")
    for name in sorted(FAMILIES) if args.family == "all" else [args.family]:
        spec = FAMILIES[name](args)
        results = {}
        for length in spec["lengths"]:
            for case, (kind, overrides) in spec["cases"].items():
                results[(case, length)] = run_child(kind, overrides, length, args)
        print_table(f"{name}: {FAMILIES[name].__doc__.strip()}", spec, results)


if __name__ == "__main__":
    main()
