#!/usr/bin/env python
"""Speed, memory, size and FLOPs of each attention family beside its softmax baseline, in one run, as ratios.

    python scripts/benchmark.py --family mgk                  # MGK-BERT (H/2 heads, M=2) vs BERT (H heads, SDPA)
    python scripts/benchmark.py --family mgk --lengths 128 512 --repeats 5 --mode both
    python scripts/benchmark.py --family fish                 # FiSH-GPT2 (8 local heads, M=2) vs GPT-2 (8 heads, SDPA)
    python scripts/benchmark.py --family nprf                 # NPRF paths vs SDPA; NPRF-RoBERTa vs RoBERTa, Longformer
    python scripts/benchmark.py --family headsize             # fixed head sizes 128 / 32 vs BERT's 64, equal parameters
    python scripts/benchmark.py --family mgk-gpt2             # MGK-GPT2 (H/2 heads) vs GPT-2 (H heads, SDPA)
    python scripts/benchmark.py --family mgk --head-dims 32 64 128 --lengths 512 --figures figs   # ratio vs head size
    python scripts/benchmark.py --family all --models-only --mode both --interleave --lengths 256 512 1024 2048 \
        --csv results.csv --markdown results.md --figures figures      # the README's results table and figures
    python scripts/benchmark.py --family mgk --device cuda    # on a GPU (synchronised timings, CUDA peak memory)

Each (model, length, mode) is measured in a fresh child process: a warm-up step, then the median of `--repeats`
steps. `--mode train` (the default) times a training step (forward + backward of the encoder + an SGD step; no
LM head, so the vocabulary projection does not hide the attention), `--mode forward` a forward under
torch.no_grad() in eval mode, `--mode both` each. Memory is the peak the step adds above the loaded model (CPU: peak
RSS minus the RSS before the first step; CUDA: torch.cuda.max_memory_allocated minus the memory allocated before).
Shared machines are noisy: read the ratios, which are taken in the same run. With `--interleave` the whole models
of a family are also timed together at each length, one child building them all and alternating their steps
(`measure_interleaved`), so that the baseline and each model see the same machine state; memory, parameters and
FLOPs still come from each case's own child. tokens/s = batch * N / step time.

FLOPs, for every model: torch.utils.flop_counter.FlopCounterMode counts the (untimed) warm-up step (see
count_flops and flop_counter_mode), the whole step and the attention layers' forward share, and each family's paper
formula (hf_mgk.flops: MGK App. B and NPRF's products for the attention layer, FiSH App. D for the attention-matrix
part) is printed beside it. The fish family adds its App. D tables (attention-matrix part counted vs App. D).

--csv FILE writes one row per measurement (CSV_COLUMNS), --markdown FILE the summary table (each model against its
baseline: time ratio beside the FLOP ratios, and the command that made it), --figures DIR one PNG per family and
mode of the time ratio against N (solid) with the paper formula's FLOP ratio (dashed), and with several
--head-dims one against the head size at the largest N; none of them overwrites an existing file without
--overwrite. --models-only skips the attention-alone tables (mgk, fish, nprf).

With several threads on cores that other work keeps busy, every parallelised op waits for its slowest thread
(measured here: an in-place add on 2^20 floats, 0.24 ms on 1 thread, 4.5 ms on 2), which penalises models made
of many small ops far more than their FLOPs: compare --threads 1 with the default.
"""

import argparse
import copy
import csv
import importlib
import json
import math
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import time

import torch
from torch.utils import flop_counter

from hf_mgk import flops as paper
from hf_mgk.families import FAMILIES as MODEL_FAMILIES

FAMILIES = {}


def family(name):
    def register(fn):
        FAMILIES[name] = fn
        return fn
    return register


# ------------------------------------------------------------------ sizes
NPRF_ATTN = dict(heads=8, head_dim=64, features=32)
NPRF_WIDTH = dict(hidden_size=512, num_hidden_layers=2, num_attention_heads=8, intermediate_size=2048,
                  vocab_size=1000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

# ------------------------------------------------------------------ MGK-BERT
BERT_SIZE = dict(hidden_size=512, num_hidden_layers=2, intermediate_size=2048, vocab_size=1000,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _width(heads, head_dim, hidden, inner):
    """Overrides that give the baseline's `heads` heads of size `head_dim` (hidden = heads x head_dim, the feed-forward
    4x that, as in BERT and GPT-2): the papers' efficiency figures vary the model width this way. None: as is."""
    return {} if head_dim is None else {hidden: heads * head_dim, inner: 4 * heads * head_dim}


@family("mgk")
def mgk_cases(args, head_dim=None):
    """MGK-BERT with H/2 heads of the baseline's head size (App. B: the attention width halves), M=2 keys."""
    heads = args.heads
    size = _width(heads, head_dim, "hidden_size", "intermediate_size")
    head_dim = head_dim or BERT_SIZE["hidden_size"] // heads
    half = {**size, "num_attention_heads": heads // 2, "head_dim": head_dim}
    return {
        "lengths": args.lengths or [128, 256, 512, 1024, 2048],
        "baseline": f"BERT, {heads} heads (SDPA)",
        "cases": {
            f"BERT, {heads} heads (SDPA)": ("bert", {**size, "num_attention_heads": heads}),
            f"MGK-BERT soft, {heads // 2} heads": ("mgk", half),
            f"sMGK-BERT soft, {heads // 2} heads": ("mgk", {**half, "attention_type": "smgk"}),
            f"MGK-BERT hard, {heads // 2} heads": ("mgk", {**half, "e_step": "hard"}),
        },
        "after": [run_mgk_attention],
    }


# ------------------------------------------------------------------ MGK attention alone
# The baseline's H heads of size D against MGK's H/2 heads with M keys, forward + backward of one attention call
# on random (B, heads, N, D) inputs (the MGK model's attention type and E-step choose the path, as in the model).
MGK_PATHS = {  # name -> (function, e_step, M, backend); "SDPA-aug" is the augmented-key SDPA path the CPU rule
    # replaced; "compiled" the torch.compile path (its compile time is reported apart from the step time)
    "MGK soft": ("mgk", "soft", 2, "auto"), "sMGK soft": ("smgk", "soft", 2, "auto"),
    "MGK hard": ("mgk", "hard", 2, "auto"), "sMGK hard": ("smgk", "hard", 2, "auto"),
    "MGK soft, SDPA-aug": ("mgk", "soft", 2, "sdpa"),
    "MGK soft, compiled": ("mgk", "soft", 2, "compiled"), "sMGK soft, compiled": ("smgk", "soft", 2, "compiled"),
    "MGK hard, compiled": ("mgk", "hard", 2, "compiled"), "sMGK hard, compiled": ("smgk", "hard", 2, "compiled"),
}


def mgk_paper_flops(path, heads, length, head_dim):
    """The papers' count (MGK App. B) of one layer's attention, multiply-adds of QK^T (or the M key products) and
    AV, for the baseline's `heads`: softmax 2 H N^2 D; MGK with H/2 heads (M + 1) H/2 N^2 D (M keys' scores, one
    value per position); sMGK (one key product for all M shifted keys) 2 H/2 N^2 D. path: "sdpa" or MGK_PATHS."""
    if path == "sdpa":
        return 2 * heads * length * length * head_dim
    kind, _, m, _ = MGK_PATHS[path]
    return (2 if kind == "smgk" else m + 1) * (heads // 2) * length * length * head_dim


def mgk_attention_step(path, heads, length, batch, head_dim):
    """fwd+bwd of one attention call: SDPA with `heads` heads, or an MGK path with heads // 2."""
    from hf_mgk import attention_mgk as am

    g = _generator()
    if path == "sdpa":
        q, k, v = (torch.randn(batch, heads, length, head_dim, generator=g, requires_grad=True) for _ in range(3))
        grad = torch.randn(batch, heads, length, head_dim, generator=g)
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v).backward(grad)
    kind, e_step, m, backend = MGK_PATHS[path]
    h = heads // 2
    q, v = (torch.randn(batch, h, length, head_dim, generator=g, requires_grad=True) for _ in range(2))
    grad = torch.randn(batch, h, length, head_dim, generator=g)  # dense, as from the layers above
    variances = [head_dim ** 0.5 * (1 + 2 * r) for r in range(m)]
    prior = torch.log_softmax(torch.zeros(h, m), -1).requires_grad_(e_step == "soft")  # the hard E-step ignores pi
    if kind == "smgk":
        key = torch.randn(batch, h, length, head_dim, generator=g, requires_grad=True)
        shift = (0.1 * torch.randn(h, m, head_dim, generator=g)).requires_grad_()
        return lambda: am.smgk_attention(q, key, shift, v, variances=variances, log_prior=prior,
                                         e_step=e_step, backend=backend).backward(grad)
    keys = torch.randn(batch, h, m, length, head_dim, generator=g, requires_grad=True)
    return lambda: am.mgk_attention(q, keys, v, variances=variances, log_prior=prior, e_step=e_step,
                                    backend=backend).backward(grad)


def _measure_alone(step, compiling, kernels, repeats):
    """In the child: median fwd+bwd seconds of `step`, FlopCounterMode's count of the (untimed) warm-up step, and
    for a compiled path the seconds its first calls spent compiling `kernels` (or why it did not compile)."""
    from hf_mgk import attention_compile

    def counted():
        with flop_counter_mode() as fc:
            step()
        return fc.get_total_flops()

    if compiling:  # compile (and count the FLOPs of) one untimed step first: the warm-up then times nothing new
        step()
    result, flops = _timed(step, repeats, counted)
    result["flops"] = flops
    result["compile_s"] = sum(attention_compile.compile_seconds(k) for k in kernels)
    failed = attention_compile.why_not_compiled(torch.get_default_device().type) if compiling else None
    if failed:
        result["error"] = f"not compiled: {failed}"
    return result


def print_alone_rows(lengths, paths, rows, extra=lambda path, n, r, base: []):
    """The attention-alone tables' rows: N, SDPA ms, path, ms, x SDPA, `extra`'s cells, x counted FLOPs, peak MiB,
    compile s; a row that could not be measured says why."""
    for n in lengths:
        base = rows[("sdpa", n)]
        for p in paths:
            r = rows[(p, n)]
            if "error" in r or "error" in base:
                print(f"| {n} | | {p} | {r.get('error', base.get('error'))} |" + " |" * (4 + len(extra(p, n, {}, {}))))
                continue
            cells = [_ms(base["seconds"]), p, _ms(r["seconds"]), f"{r['seconds'] / base['seconds']:.2f}",
                     *extra(p, n, r, base), f"{r['flops'] / base['flops']:.2f}", f"{r['peak_mib']:.0f}",
                     f"{r['compile_s']:.1f}" if r.get("compile_s") else ""]
            print(f"| {n} | " + " | ".join(cells) + " |")


def measure_mgk_attention(path, heads, length, batch, head_dim, repeats, threads):
    """In the child: `_measure_alone` of one MGK path (or SDPA)."""
    torch.set_num_threads(threads)
    compiling = path != "sdpa" and MGK_PATHS[path][3] == "compiled"
    return _measure_alone(mgk_attention_step(path, heads, length, batch, head_dim), compiling,
                          ("mgk_forward", "mgk_backward"), repeats)


def run_mgk_attention(args, spec):
    """The attention alone, fwd+bwd: each MGK path with H/2 heads against SDPA with H, time and FLOP ratios."""
    heads, head_dim, batch = args.heads, BERT_SIZE["hidden_size"] // args.heads, args.batch
    rows = {(p, n): call_child("measure_mgk_attention", [p, heads, n, batch, head_dim, args.repeats, args.threads])
            for n in spec["lengths"] for p in ("sdpa", *MGK_PATHS)}
    print(f"\n## mgk: attention alone, forward + backward (B={batch}, D={head_dim}, no mask): MGK paths with "
          f"{heads // 2} heads, M=2, against SDPA with {heads}; x = time / SDPA's")
    print("'x paper FLOPs': the papers' count (App. B) of the attention products, forward (softmax 2 H N^2 D, MGK "
          "(M + 1) H/2 N^2 D, sMGK 2 H/2 N^2 D); the target is 1.1 times it. 'x counted FLOPs': FlopCounterMode on "
          "the timed step, forward + backward (SDPA by PyTorch's formula: QK^T, AV and 4 backward products).")
    print("'compile s': the compiled path's first calls that compiled a graph (forward and backward kernels), "
          "not in its step time.")
    print("| N | SDPA ms | path | ms | x SDPA | x paper FLOPs | target (1.1x) | x counted FLOPs | peak MiB | compile s |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    def paper_cells(p, n, r, base):
        paper = mgk_paper_flops(p, heads, n, head_dim) / mgk_paper_flops("sdpa", heads, n, head_dim)
        return [f"{paper:.2f}", f"{1.1 * paper:.3f}"]

    print_alone_rows(spec["lengths"], MGK_PATHS, rows, paper_cells)


# ------------------------------------------------------------------ FiSH-GPT2
GPT2_SIZE = dict(n_embd=512, n_layer=2, n_inner=2048, vocab_size=1000, bos_token_id=0, eos_token_id=0,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
FISH_TYPES = ("hard_fish", "fish", "mish", "hard_gfish", "gfish")
FISH_DEFAULT = ("hard_fish", "fish", "mish", "hard_gfish")  # gfish = hard_gfish + noise: --fish-types to add


@family("fish")
def fish_cases(args, head_dim=None):
    """FiSH-GPT2 with H local heads and M global heads (App. D: M=2, H=8) of the baseline's head size."""
    heads, m = args.heads, args.global_heads
    size = _width(heads, head_dim, "n_embd", "n_inner")
    head_dim = head_dim or GPT2_SIZE["n_embd"] // heads
    base = f"GPT-2, {heads} heads (SDPA)"
    cases = {base: ("gpt2", {**size, "n_head": heads})}
    for kind in args.fish_types or FISH_DEFAULT:
        cases[f"FiSH-GPT2 {kind}, {heads}+{m} heads"] = (
            "fish_gpt2", {**size, "n_head": heads, "head_dim": head_dim, "num_global_heads": m, "attention_type": kind})
    return {"lengths": args.lengths or [256, 512, 1024, 2048, 4096], "baseline": base, "cases": cases,
            "flop_detail": True, "formula": "app_d", "train_tables": [print_flop_table, print_param_table],
            "after": [run_fish_attention]}


# ------------------------------------------------------------------ FiSH attention alone
# Causal (as in GPT-2), forward + backward of one attention call: SDPA with H heads against each FiSH type with H
# local heads mixed from M global ones, on the path the model's rule picks ("auto") and on the compiled path.
FISH_NOISY = ("fish", "mish", "gfish")  # the types with training noise (FiSHGPT2Config.is_noisy)
FISH_PATHS = {f"{kind}{', compiled' if backend == 'compiled' else ''}": (kind, backend)
              for kind in FISH_TYPES for backend in ("auto", "compiled")}


def fish_attention_step(path, heads, m, length, batch, head_dim):
    """fwd+bwd of one causal attention call: SDPA with `heads` heads, or a FiSH path (FISH_PATHS) with `heads` local
    and `m` global heads, its mixing as the model initialises it and sigma = 0.1 for the noisy types."""
    from hf_mgk import attention_fish as af

    g = _generator()
    grad = torch.randn(batch, heads, length, head_dim, generator=g)
    if path == "sdpa":
        q, k, v = (torch.randn(batch, heads, length, head_dim, generator=g, requires_grad=True) for _ in range(3))
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
    kind, backend = FISH_PATHS[path]
    q, k = (torch.randn(batch, m, length, head_dim, generator=g, requires_grad=True) for _ in range(2))
    v = torch.randn(batch, heads, length, head_dim, generator=g, requires_grad=True)
    if kind.endswith("gfish"):
        mixing = af.make_gfish_mixing(m, heads)
    else:
        mixing = torch.full((m, 1 if kind == "mish" else heads), 1.0 / m, requires_grad=True)
    noise = torch.full((m,), 0.1, requires_grad=True) if kind in FISH_NOISY else None
    return lambda: af.fish_attention(q, k, v, mixing, noise_std=noise, is_causal=True, backend=backend).backward(grad)


def measure_fish_attention(path, heads, m, length, batch, head_dim, repeats, threads):
    """In the child: `_measure_alone` of one FiSH path (or SDPA)."""
    torch.set_num_threads(threads)
    compiling = path != "sdpa" and FISH_PATHS[path][1] == "compiled"
    return _measure_alone(fish_attention_step(path, heads, m, length, batch, head_dim), compiling,
                          ("fish_forward", "fish_backward"), repeats)


def run_fish_attention(args, spec):
    """The attention alone, fwd+bwd, causal: each FiSH type on its auto and compiled paths against SDPA."""
    heads, m, batch = args.heads, args.global_heads, args.batch
    head_dim = GPT2_SIZE["n_embd"] // heads
    lengths = args.lengths or [512, 1024]
    paths = [p for p in FISH_PATHS if FISH_PATHS[p][0] in (args.fish_types or FISH_TYPES)]
    rows = {(p, n): call_child("measure_fish_attention", [p, heads, m, n, batch, head_dim, args.repeats,
                                                          args.threads])
            for n in lengths for p in ("sdpa", *paths)}
    print(f"\n## fish: attention alone, causal, forward + backward (B={batch}, D={head_dim}): each FiSH type with "
          f"{heads} local heads mixed from {m} global ones, on the path its rule picks and compiled, against SDPA with "
          f"{heads} heads; x = time / SDPA's. 'x counted FLOPs': FlopCounterMode on the step (SDPA by PyTorch's "
          "formula). 'compile s': the compiled path's first calls that compiled a graph, not in its step time.")
    print("| N | SDPA ms | path | ms | x SDPA | x counted FLOPs | peak MiB | compile s |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    print_alone_rows(lengths, paths, rows)


# ------------------------------------------------------------------ fixed head size (concise multi-head attention)
@family("headsize")
def headsize_cases(args, head_dim=None):
    """Fixed head sizes (Bhojanapalli et al., concise multi-head attention: the head size chosen apart from d/H)
    against BERT's standard head size d/H, at equal parameters. At one hidden size d an attention layer has
    4 d (H D) weights (+ biases), so equal parameters means equal H D = d: head size 128 (the paper's BERT choice)
    with d/128 heads and 32 (its LM1B choice) with d/32 heads, through the package's `head_dim` path; the package's
    path at BERT's own shape shows what that path costs by itself."""
    d = BERT_SIZE["hidden_size"]
    base = f"BERT, {d // 64} heads of 64 = d/H (SDPA)"
    cases = {base: ("bert", {"num_attention_heads": d // 64})}
    for size in (64, 128, 32):
        cases[f"fixed head size {size}, {d // size} heads"] = (
            "mgk", {"num_attention_heads": d // size, "head_dim": size, "attention_type": "softmax"})
    return {"lengths": args.lengths or [128, 256, 512, 1024, 2048], "baseline": base, "cases": cases,
            "sweeps_head_dim": False, "tables": [print_equal_params]}


def print_equal_params(title, spec, results):
    """The parameter counts of the cases, to show they are equal."""
    counts = {case: r["params"] for (case, _), r in results.items() if "params" in r}
    same = len(set(counts.values())) == 1
    print(f"parameters: {', '.join(f'{c}: {n:,}' for c, n in counts.items())}"
          f" -- {'all equal' if same else 'NOT equal'}")


# ------------------------------------------------------------------ MGK-GPT2
@family("mgk-gpt2")
def mgk_gpt2_cases(args, head_dim=None):
    """MGK-GPT2 with H/2 heads of the baseline's head size, M=2 keys, vs GPT-2 with H heads (SDPA)."""
    heads = args.heads
    size = _width(heads, head_dim, "n_embd", "n_inner")
    half = {**size, "n_head": heads // 2, "head_dim": head_dim or GPT2_SIZE["n_embd"] // heads}
    base = f"GPT-2, {heads} heads (SDPA)"
    return {"lengths": args.lengths or [256, 512, 1024, 2048], "baseline": base,
            "cases": {base: ("gpt2", {**size, "n_head": heads}),
                      f"MGK-GPT2 soft, {heads // 2} heads": ("mgk_gpt2", half),
                      f"MGK-GPT2 hard, {heads // 2} heads": ("mgk_gpt2", {**half, "e_step": "hard"})}}


class Builder(tuple):
    """How to build one kind of model (a tuple, so tests can swap the size): module, config class, model class,
    size, position field, fewest positions, model kwargs, attention implementation or None, extra positions
    (RoBERTa's padding offset), the name of the attention modules (their FLOP share is the formula's scope)."""

    def __new__(cls, module, config, model, size, positions, fewest, model_kwargs, attn, offset=0,
                attention="attention"):
        return super().__new__(cls, (module, config, model, size, positions, fewest, model_kwargs, attn, offset,
                                     attention))


NO_POOLER = {"add_pooling_layer": False}


def _names(family):
    """An hf-mgk family's config and base model class names, from the registry."""
    return MODEL_FAMILIES[family].config_name, MODEL_FAMILIES[family].classes["base"]


# Child processes rebuild a case from its kind and JSON overrides.
BUILDERS = {
    "bert": Builder("transformers", "BertConfig", "BertModel", BERT_SIZE, "max_position_embeddings", 512,
                    NO_POOLER, "sdpa"),
    "mgk": Builder("hf_mgk", *_names("mgk-bert"), BERT_SIZE, "max_position_embeddings", 512,
                   NO_POOLER, None),
    "gpt2": Builder("transformers", "GPT2Config", "GPT2Model", GPT2_SIZE, "n_positions", 1024, {}, "sdpa",
                    attention="attn"),
    "fish_gpt2": Builder("hf_mgk", *_names("fish-gpt2"), GPT2_SIZE, "n_positions", 1024, {}, None,
                         attention="attn"),
    "roberta": Builder("transformers", "RobertaConfig", "RobertaModel", NPRF_WIDTH, "max_position_embeddings", 0,
                       NO_POOLER, "sdpa", offset=2),
    "nprf_roberta": Builder("hf_mgk", *_names("nprf-roberta"),
                            {**NPRF_WIDTH, "use_absolute_positions": False,
                             "num_random_features": NPRF_ATTN["features"]},
                            "max_position_embeddings", 0, NO_POOLER, None, offset=2),
    "longformer": Builder("transformers", "LongformerConfig", "LongformerModel", {**NPRF_WIDTH, "attention_window": 256},
                          "max_position_embeddings", 0, NO_POOLER, None, offset=2),
    "mgk_gpt2": Builder("hf_mgk", *_names("mgk-gpt2"), GPT2_SIZE, "n_positions", 1024, {}, None,
                        attention="attn"),
}


def make_config(kind, overrides, length):
    """The configuration of one case, with room for `length` positions."""
    if kind not in BUILDERS:
        raise ValueError(f"unknown model kind {kind!r}")
    module, config_name, _, size, positions, fewest, _, attn, offset, _ = BUILDERS[kind]
    config = getattr(importlib.import_module(module), config_name)(
        **{**size, positions: max(length + offset, fewest), **overrides})
    if attn is not None:
        config._attn_implementation = attn
    return config


def build(kind, overrides, length):
    """The model for one case, with room for `length` positions."""
    config = make_config(kind, overrides, length)
    module, _, model_name, *_, model_kwargs, _, _, _ = BUILDERS[kind]
    return getattr(importlib.import_module(module), model_name)(config, **model_kwargs)


def paper_flops(kind, config, length, batch, formula="app_b"):
    """(forward FLOPs by the family's paper formula over all layers and the batch, what the formula covers), or
    (None, why not). formula "app_d" (the fish family, GPT-2 and FiSH-GPT2): FiSH App. D, the attention-matrix
    part; otherwise the attention layer: NPRF's products for NPRF, MGK App. B for softmax and MGK attention."""
    if formula == "app_d":
        return app_d(config, batch, length)["appd_flops"], "FiSH App. D, attention-matrix part"
    if kind == "longformer":
        return None, "no formula (Longformer)"
    hidden, heads, layers = config.hidden_size, config.num_attention_heads, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kind_of_attention = getattr(config, "attention_type", "softmax")
    if kind == "nprf_roberta" and kind_of_attention == "nprf":
        per_layer = paper.nprf_attention_flops(length, hidden, heads, head_dim, config.num_random_features)
        return per_layer * layers * batch, "NPRF products, FFT form, attention layer"
    if kind_of_attention not in ("softmax", "mgk"):
        return None, f"no formula ({kind_of_attention}: App. B covers separate keys, option (A))"
    keys = config.num_keys if kind_of_attention == "mgk" else 1
    per_layer = paper.mgk_attention_flops(length, hidden, heads, head_dim, keys)
    return per_layer * layers * batch, "MGK App. B, attention layer"


# ------------------------------------------------------------------ FLOP counting
def _cpu_sdpa_flops(query, key, value, dropout_p=0.0, is_causal=False, *args, out_shape=None, **kwargs):
    """FlopCounterMode has no formula for the CPU flash kernel (it would count 0): PyTorch's own SDPA count
    (QK^T and PV, 2mnk each), on the visible pairs only when causal (row i sees keys j <= i, top-left),
    as the kernel skips key blocks wholly above the diagonal and FiSH's blocked path cuts them off."""
    return _causal_share(flop_counter.sdpa_flop_count(query, key, value), query[-2], key[-2], is_causal)


def _cpu_sdpa_backward_flops(grad_out, query, key, value, out, logsumexp, dropout_p=0.0, is_causal=False,
                             *args, out_shape=None, **kwargs):
    full = flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)
    return _causal_share(full, query[-2], key[-2], is_causal)


def _causal_share(full, n, s, is_causal):
    """`full` (a count over all n x s pairs, a multiple of n*s) times the visible share of the pairs."""
    if not is_causal:
        return full
    visible = sum(min(i + 1, s) for i in range(n))
    return full // (n * s) * visible


def flop_counter_mode():
    """FlopCounterMode with the CPU flash kernel's counts, and in-place baddbmm_ counted as baddbmm (PyTorch has no
    formula for it and would count 0: the blocked MGK and FiSH backwards accumulate their gradients with it)."""
    aten = torch.ops.aten
    return flop_counter.FlopCounterMode(display=False, custom_mapping={
        aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flops,
        aten.baddbmm_: _baddbmm_flops,
    })


def _baddbmm_flops(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs):
    """2 b m n k for the product of (b, m, k) and (b, k, n), as PyTorch counts baddbmm (the add is not counted)."""
    b, m, k = a_shape
    return 2 * b * m * k * b_shape[-1]


def _total(counts):
    return int(sum(counts.values()))


def count_flops(model, ids, step=None, attention="attn"):
    """FlopCounterMode counts (2mnk per matmul) of one step on the model as it is (training: grad enabled, so the
    attention takes its training path; or a no-grad forward): the forward of the whole model, the share of the
    modules named `attention` in that forward (taken before the backward, whose module attribution is not
    reliable), and the whole step (flops_fwd_bwd; the forward alone for a forward step). `step(on_forward)` runs
    one step and calls on_forward() after the forward; by default a forward, the benchmark's loss and a backward
    (gradients cleared after)."""
    if step is None:
        def step(on_forward):
            hidden = model(ids).last_hidden_state
            on_forward()
            hidden.float().pow(2).mean().backward()
            model.zero_grad(set_to_none=True)
    forward = {}
    with flop_counter_mode() as fc:
        step(lambda: forward.update(fc.get_flop_counts()))
    attn = sum(_total(c) for name, c in forward.items() if name.split(".")[-1] == attention)
    return {"flops_fwd": _total(forward["Global"]), "flops_attn": attn, "flops_fwd_bwd": fc.get_total_flops()}


def attention_matrix_flops(attn, batch, length):
    """FlopCounterMode count of App. D's part of one attention layer (`attn`: GPT-2's or FiSH-GPT2's): the
    Q/K projections (bias-free count: addmm counts the product only) and the attention matrices before the
    softmax (QK^T; for FiSH the M global QK^T and the package's own mixing, noise included in training).
    Values, softmax and the output projection are left out, as in App. D; no mask, full N x N, as App. D.
    Run on meta tensors: shapes only, no work."""
    from hf_mgk.attention_fish import fish_attention

    attn = copy.deepcopy(attn).to("meta")
    qk_heads = getattr(attn, "num_qk_heads", attn.num_heads)
    width = qk_heads * attn.head_dim
    d = attn.c_attn.weight.shape[0]
    x = torch.empty(batch * length, d, device="meta")
    with torch.no_grad(), flop_counter_mode() as fc:
        qk = torch.addmm(attn.c_attn.bias[:2 * width], x, attn.c_attn.weight[:, :2 * width])
        q, k = qk.view(batch, length, 2, qk_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        if hasattr(attn, "mixing"):  # value heads of size 0: the product with V counts nothing
            value = torch.empty(batch, attn.num_heads, length, 0, device="meta")
            noise = getattr(attn, "noise_std", None) if attn.training else None
            fish_attention(q, k, value, attn.mixing, scale=attn.scaling, noise_std=noise, return_weights=True)
        else:
            torch.matmul(q, k.transpose(-1, -2))
    return fc.get_total_flops()


def attention_matrix_params(attn):
    """App. D's parameters of one layer, counted on the module: the Q/K projection weights (no bias, as App. D),
    the mixing weights p_kj (or GFiSH's network) and sigma_k."""
    width = getattr(attn, "num_qk_heads", attn.num_heads) * attn.head_dim
    n = attn.c_attn.weight[:, :2 * width].numel()
    if hasattr(attn, "mixing"):
        n += sum(p.numel() for p in ([attn.mixing] if isinstance(attn.mixing, torch.nn.Parameter)
                                     else attn.mixing.parameters()))
    if hasattr(attn, "noise_std"):
        n += attn.noise_std.numel()
    return n


def app_d(config, batch, length):
    """App. D (hf_mgk.flops.fish_cost) for the whole model: per layer x layers x batch."""
    fish_cost = paper.fish_cost

    kind = getattr(config, "attention_type", "softmax")
    head_dim = getattr(config, "head_dim", None) or config.n_embd // config.n_head
    m = getattr(config, "num_global_heads", 1)
    cost = fish_cost(config.n_embd, config.n_head, m, head_dim, length,
                     variant="fish" if kind == "softmax" else kind)
    flops, params = (("mha_flops", "mha_params") if kind == "softmax" else ("fish_flops", "fish_params"))
    return {"appd_flops": cost[flops] * config.n_layer * batch, "appd_params": cost[params] * config.n_layer}


def flop_report(model, ids, step=None):
    """count_flops (of `step`, see there), plus the attention-matrix part counted and by App. D (all layers)."""
    batch, length = ids.shape
    layers = model.h
    result = count_flops(model, ids, step)
    result["flops_score"] = sum(attention_matrix_flops(block.attn, batch, length) for block in layers)
    result["params_score"] = sum(attention_matrix_params(block.attn) for block in layers)
    result["params_attn"] = sum(p.numel() for block in layers for p in block.attn.parameters())
    result.update(app_d(model.config, batch, length))
    return result


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def model_step(kind, overrides, length, batch, mode):
    """(model, ids, step) of one case: step(on_forward) runs mode "train" (forward, backward and an SGD step) or
    "forward" (a forward in eval mode under no_grad), calling on_forward after the forward."""
    torch.manual_seed(0)
    model = build(kind, overrides, length).train(mode == "train")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ids = torch.randint(3, model.config.vocab_size, (batch, length))  # ids 0-2 are RoBERTa's special tokens

    def step(on_forward=lambda: None):
        if mode == "forward":
            with torch.no_grad():
                model(ids)
            return on_forward()
        opt.zero_grad(set_to_none=True)
        hidden = model(ids).last_hidden_state
        on_forward()
        hidden.float().pow(2).mean().backward()
        opt.step()

    return model, ids, step


def measure(kind, overrides, length, batch, repeats, threads, detail=False, mode="train"):
    """Runs in the child: median step seconds (None with repeats = 0), peak added MiB, parameter count and
    FlopCounterMode's counts (count_flops; with `detail`, FiSH's flop_report), taken on the (untimed) warm-up step
    of `model_step`."""
    torch.set_num_threads(threads)
    model, ids, step = model_step(kind, overrides, length, batch, mode)
    params = sum(p.numel() for p in model.parameters())
    # warm-up: allocations, kernel selection; and the step FlopCounterMode counts (untimed)
    attention = BUILDERS[kind][9]
    warm_up = (lambda: flop_report(model, ids, step)) if detail else (
        lambda: count_flops(model, ids, step, attention))
    result, counts = _timed(step, repeats, warm_up)
    result["params"] = params
    result.update(counts)
    return result


DEVICE = "cpu"  # main() sets it from --device; call_child hands it to the child


def call_child(name, call_args):
    """Run CHILD_FUNCTIONS[name](*call_args) in a fresh interpreter (clean memory peak); its result dict."""
    proc = subprocess.run([sys.executable, __file__, "--_child", json.dumps([name, call_args]), "--_device", DEVICE],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1][:120] if proc.stderr.strip() else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_child(kind, overrides, length, args, detail=False, mode="train", repeats=None):
    return call_child("measure", [kind, overrides, length, args.batch, args.repeats if repeats is None else repeats,
                                  args.threads, detail, mode])


def run_cases(spec, length, args, mode):
    """{(case, length): result} of every case of a family at one length: each case's own child (memory, FLOPs,
    parameters; and its time unless --interleave), then with --interleave one child that times all of them
    alternating (`measure_interleaved`), whose times replace the separate ones."""
    repeats = args.repeats if length <= spec.get("repeat_up_to", math.inf) else 1
    detail = spec.get("flop_detail", False) and mode == "train"
    results = {(case, length): run_child(kind, overrides, length, args, detail, mode, 0 if args.interleave else repeats)
               for case, (kind, overrides) in spec["cases"].items()}
    if args.interleave:
        timed = call_child("measure_interleaved", [list(spec["cases"].values()), length, args.batch, repeats,
                                                   args.threads, mode])
        for case, seconds in zip(spec["cases"], timed.get("seconds") or [None] * len(spec["cases"])):
            result = results[(case, length)] = {**results[(case, length)], "seconds": seconds}
            if "error" in timed and "error" not in result:
                result["error"] = f"interleaved timing: {timed['error']}"
    return results


# ------------------------------------------------------------------ rows: one per measurement, for every output
CSV_COLUMNS = ["family", "case", "baseline", "device", "mode", "threads", "batch", "length", "hidden", "heads",
               "head_dim", "params", "params_ratio", "ms", "tokens_per_s", "ratio_vs_baseline", "peak_mem_mib",
               "peak_mem_ratio", "flops_counted", "flop_ratio_counted", "flops_attention_counted",
               "flop_ratio_attention_counted", "flops_formula", "flop_ratio_formula", "formula", "error"]


def _div(a, b):
    return a / b if a is not None and b else None


def make_rows(family_name, spec, results, mode, args, swept=None):
    """One dict per (case, length) with CSV_COLUMNS (and `swept`, the --head-dims value): the measurement, its
    ratios to the baseline at the same length, and the FLOPs counted and by the family's paper formula. counted:
    the whole timed step (forward + backward in training); attention: the attention layers' forward share;
    formula: forward, over what the formula covers (`formula`)."""
    rows = []
    base = spec["baseline"]
    for length in spec["lengths"]:
        ref = {}
        for case in [base] + [c for c in spec["cases"] if c != base]:  # the baseline's row first: the reference
            kind, overrides = spec["cases"][case]
            r = results[(case, length)]
            config = make_config(kind, overrides, length)
            formula, scope = paper_flops(kind, config, length, args.batch, spec.get("formula", "app_b"))
            row = {"family": family_name, "case": case, "baseline": case == spec["baseline"], "device": DEVICE,
                   "mode": mode, "threads": args.threads, "batch": args.batch, "length": length,
                   "hidden": config.hidden_size, "heads": config.num_attention_heads,
                   "head_dim": getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
                   "params": r.get("params"), "flops_formula": formula, "formula": scope, "error": r.get("error"),
                   "swept": swept, "baseline_case": base}
            if "error" not in r:
                row.update(ms=1000 * r["seconds"], tokens_per_s=args.batch * length / r["seconds"],
                           peak_mem_mib=r["peak_mib"], flops_counted=r["flops_fwd_bwd"],
                           flops_attention_counted=r["flops_attn"])
            ref = ref or row
            row["baseline_ms"] = ref.get("ms")
            row.update(ratio_vs_baseline=_div(row.get("ms"), ref.get("ms")),
                       peak_mem_ratio=_div(row.get("peak_mem_mib"), ref.get("peak_mem_mib")),
                       params_ratio=_div(row["params"], ref["params"]),
                       flop_ratio_counted=_div(row.get("flops_counted"), ref.get("flops_counted")),
                       flop_ratio_attention_counted=_div(row.get("flops_attention_counted"),
                                                         ref.get("flops_attention_counted")),
                       flop_ratio_formula=_div(formula, ref["flops_formula"]))
            rows.append(row)
    return rows


def _x(value):
    return "-" if value is None else f"{value:.2f}"


def _num(value, fmt):
    return "-" if value is None else format(value, fmt)


# (header, cell) pairs: the console table, and the summary that --markdown writes
TABLE = [("model", lambda r: r["case"]), ("N", lambda r: str(r["length"])),
         ("ms", lambda r: r["error"] or _ms(r["ms"] / 1000)), ("tokens/s", lambda r: _num(r.get("tokens_per_s"), ",.0f")),
         ("x baseline", lambda r: _x(r["ratio_vs_baseline"])),
         ("peak MiB", lambda r: _num(r.get("peak_mem_mib"), ".0f")), ("x", lambda r: _x(r["peak_mem_ratio"])),
         ("parameters", lambda r: _num(r["params"], ",")), ("x", lambda r: _x(r["params_ratio"])),
         ("GFLOP counted", lambda r: _num(r.get("flops_counted") and r["flops_counted"] / 1e9, ".3f")),
         ("x", lambda r: _x(r["flop_ratio_counted"])),
         ("attention fwd, counted x", lambda r: _x(r["flop_ratio_attention_counted"])),
         ("paper formula x", lambda r: _x(r["flop_ratio_formula"]))]
SUMMARY = [("family", lambda r: r["family"]), ("model", lambda r: r["case"]), ("baseline", lambda r: r["baseline_case"]),
           ("mode", lambda r: r["mode"]), ("N", lambda r: str(r["length"])), ("head size", lambda r: str(r["head_dim"])),
           ("ms", lambda r: r["error"] or _ms(r["ms"] / 1000)),
           ("baseline ms", lambda r: "-" if r["baseline_ms"] is None else _ms(r["baseline_ms"] / 1000)),
           ("tokens/s", lambda r: _num(r.get("tokens_per_s"), ",.0f")),
           ("time x baseline", lambda r: _x(r["ratio_vs_baseline"])),
           ("FLOPs x, counted (step)", lambda r: _x(r["flop_ratio_counted"])),
           ("FLOPs x, counted (attention fwd)", lambda r: _x(r["flop_ratio_attention_counted"])),
           ("FLOPs x, paper formula", lambda r: _x(r["flop_ratio_formula"])),
           ("formula covers", lambda r: r["formula"])]


def markdown_table(rows, columns):
    """The rows as a Markdown table (text columns left-aligned, numbers right-aligned)."""
    left = {"model", "family", "baseline", "mode", "formula covers"}
    lines = ["| " + " | ".join(h for h, _ in columns) + " |",
             "|" + "|".join("---" if h in left else "---:" for h, _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(r) for _, cell in columns) + " |" for r in rows]
    return "\n".join(lines)


def print_table(title, spec, rows):
    print(f"\n## {title}")
    print(markdown_table(rows, TABLE))


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def write_markdown(path, rows, args):
    """The summary: every model against its family's baseline, the measured time ratio beside the FLOP ratios."""
    command = " ".join(["python", "scripts/benchmark.py", *sys.argv[1:]])
    text = [f"Command: `{command}`", "",
            f"torch {torch.__version__}, device {DEVICE}, {args.threads} threads, batch {args.batch}, median of "
            f"{args.repeats} steps{', the models alternating in one process (--interleave)' if args.interleave else ''}"
            ". time x baseline = ms / the baseline's ms at the same N in the same run; FLOPs x: "
            "FlopCounterMode on the timed step (forward + backward in training) and on the attention layers' "
            "forward, and the paper's formula (forward) over what it covers.", "",
            markdown_table([r for r in rows if not r["baseline"]], SUMMARY), ""]
    pathlib.Path(path).write_text("\n".join(text))


def figure_paths(directory, family_name, modes, head_dims, spec):
    sweep = len(head_dims or []) > 1 and spec.get("sweeps_head_dim", True)
    return {mode: [pathlib.Path(directory) / f"{family_name}-{mode}-ratio-vs-length.png"]
            + ([pathlib.Path(directory) / f"{family_name}-{mode}-ratio-vs-head-size.png"] if sweep else [])
            for mode in modes}


def write_figures(paths, rows, title):
    """The papers' efficiency figures from measured rows: time / baseline against N (solid), the paper formula's
    FLOP ratio dashed in the same colour; with a head-size sweep, the same against the head size at the largest N."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    cases = list(dict.fromkeys(r["case"] for r in rows if not r["baseline"]))
    first_sweep = rows[0]["swept"]
    for path, x_key in zip(paths, ("length", "swept")):
        if x_key == "length":
            chosen = [r for r in rows if r["swept"] == first_sweep]
        else:
            longest = max(r["length"] for r in rows)
            chosen = [r for r in rows if r["length"] == longest]
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for i, case in enumerate(cases):
            mine = sorted((r for r in chosen if r["case"] == case), key=lambda r: r[x_key])
            xs = [r[x_key] for r in mine]
            colour = f"C{i}"
            ax.plot(xs, [r["ratio_vs_baseline"] or math.nan for r in mine], "o-", color=colour, label=case)
            if any(r["flop_ratio_formula"] is not None for r in mine):
                ax.plot(xs, [r["flop_ratio_formula"] or math.nan for r in mine], "--", color=colour, alpha=0.6)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.plot([], [], "k--", alpha=0.6, label="paper formula's FLOP ratio")
        ax.set_xscale("log", base=2)
        ticks = sorted({r[x_key] for r in chosen})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("sequence length N" if x_key == "length" else f"head size (N = {longest})")
        ax.set_ylabel(f"time / {rows[0]['baseline_case']}'s")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def _ratio(r, b, key):
    return f"{r[key] / b[key]:.2f}" if b[key] else "-"


def _g(x):
    return f"{x / 1e9:.3f}"


def print_flop_table(title, spec, results):
    base = spec["baseline"]
    print(f"\n## {title.rstrip('.')}: FLOPs")
    print("Counted: torch.utils.flop_counter.FlopCounterMode on the model in training mode (grad enabled, so the "
          "training path), batch as above. It counts matrix products only, 2*m*n*k for (m x k)(k x n), and no "
          "elementwise op (softmax, noise, bias). CPU SDPA (no PyTorch formula) is counted with PyTorch's SDPA "
          "formula on the causal triangle's visible pairs. App. D counts (2k-1)*m*n per product, plus the noise "
          "add (M*N^2) for the noisy types; its part is the attention matrices only: Q/K projections + QK^T "
          "(+ mixing), full N x N, no softmax, values or output projection. 'score part, counted' is that same "
          "part counted by FlopCounterMode (full N x N, on meta tensors). Every column: all layers, whole batch; "
          "GFLOP = 1e9.")
    print("| model | N | fwd, whole model | x base | fwd+bwd, whole model | x base | fwd, attention layers | "
          "x base | score part, counted | x base | score part, App. D | x base |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for length in spec["lengths"]:
        b = results[(base, length)]
        for name in spec["cases"]:
            r = results[(name, length)]
            if "error" in r or "error" in b:
                print(f"| {name} | {length} | {r.get('error', 'baseline failed')} |" + " |" * 10)
                continue
            cells = [f"{_g(r[k])} | {_ratio(r, b, k)}"
                     for k in ("flops_fwd", "flops_fwd_bwd", "flops_attn", "flops_score", "appd_flops")]
            print(f"| {name} | {length} | " + " | ".join(cells) + " |")


def print_param_table(title, spec, results):
    base = spec["baseline"]
    print(f"\n## {title.rstrip('.')}: parameters")
    print("'attention-matrix part': Q/K projection weights (no bias) + mixing weights + sigma_k, all layers; "
          "counted on the modules vs App. D (iii)/(iv) (hf_mgk.flops.fish_cost; the GFiSH/MiSH/hard terms are the "
          "package's extension of App. D). 'attention layers': every parameter of the attention modules.")
    print("| model | whole model | x base | attention layers | x base | attention-matrix part, counted | x base | "
          "attention-matrix part, App. D | x base |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    length = next((n for n in spec["lengths"] if "error" not in results[(base, n)]), spec["lengths"][0])
    b = results[(base, length)]
    for name in spec["cases"]:
        r = results[(name, length)]
        if "error" in r or "error" in b:
            print(f"| {name} | {r.get('error', 'baseline failed')} |" + " |" * 7)
            continue
        cells = [f"{r[k]:,} | {_ratio(r, b, k)}" for k in ("params", "params_attn", "params_score", "appd_params")]
        print(f"| {name} | " + " | ".join(cells) + " |")


# ------------------------------------------------------------------ NPRF
NPRF_PATHS = ("explicit", "fft", "band")


def nprf_attention_step(path, length, causal, batch):
    """fwd+bwd of one attention call on random (B, H, N, D) inputs: SDPA or one exact NPRF path."""
    from hf_mgk import attention_nprf as an

    h, d, m = (NPRF_ATTN[k] for k in ("heads", "head_dim", "features"))
    q, k, v = (torch.randn(batch, h, length, d, requires_grad=True) for _ in range(3))
    # A dense upstream gradient, as from the layers above (`.sum().backward()` would pass a stride-0 one, which
    # makes bmm's backward copy it matrix by matrix).
    grad = torch.randn(batch, h, length, d)
    if path == "sdpa":
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(grad)
    table = torch.zeros(h, 32, requires_grad=True)  # T5 buckets, the model's defaults (32 buckets, distance 128)
    w = an.t5_constant_distance(not causal, 32, 128)
    features = an.draw_features(m, d, _generator())

    def step():
        bias = an.rpe_bias_from_buckets(table, length, bidirectional=not causal, max_distance=128)
        an.nprf_attention(q, k, v, bias, features, max_distance=w, is_causal=causal, backend=path).backward(grad)
    return step


def nprf_explicit_fits(length, batch):
    """The explicit path keeps several B*H*N*N float32 tensors for backward: skip it where that passes ~8 GiB."""
    return 6 * batch * NPRF_ATTN["heads"] * length * length * 4 < 8 * 2**30


def _generator():
    """A seeded generator on the device the child computes on."""
    return torch.Generator(device=torch.get_default_device()).manual_seed(0)


def _cuda():
    """Whether the child computes on the GPU (main() sets the default device there for --device cuda)."""
    return torch.get_default_device().type == "cuda"


def _timed(step, repeats, warm_up=None):
    """A warm-up call (`warm_up`, default `step`; the peak memory it adds is the memory figure), then the median
    of `repeats` calls of `step`, synchronised on a GPU. Returns ({seconds, peak_mib}, the warm-up's return)."""
    if _cuda():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _rss_bytes()
    warm = (warm_up or step)()
    if _cuda():
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    times = [_step_seconds(step) for _ in range(repeats)]
    return {"seconds": statistics.median(times) if times else None, "peak_mib": max(peak, 0) / 2**20}, warm


def _step_seconds(step):
    """Seconds of one call of `step`, synchronised on a GPU."""
    start = time.perf_counter()
    step()
    if _cuda():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure_interleaved(cases, length, batch, repeats, threads, mode):
    """Runs in the child (--interleave): every case's `model_step` built in this one process and warmed up, then
    `repeats` rounds that each time one step of every case in turn; the median seconds per case, in order. The
    cases' steps alternate, so the baseline and each model are timed under the same machine state (load, clock),
    where separate children are timed minutes apart."""
    torch.set_num_threads(threads)
    steps = [model_step(kind, overrides, length, batch, mode)[2] for kind, overrides in cases]
    for step in steps:
        step()
    times = [[] for _ in steps]
    for _ in range(repeats):
        for step, took in zip(steps, times):
            took.append(_step_seconds(step))
    return {"seconds": [statistics.median(took) for took in times]}


def measure_attention(path, length, causal, batch, repeats, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    return _timed(nprf_attention_step(path, length, causal, batch), repeats)[0]


def growth_per_doubling(seconds):
    """{N: seconds} -> [(N1, N2, factor)] for consecutive measured lengths: the time's factor per doubling of N,
    (t(N2) / t(N1)) ** (1 / log2(N2 / N1)), which is t(2N) / t(N) when N2 = 2 N1."""
    ns = sorted(seconds)
    return [(a, b, (seconds[b] / seconds[a]) ** (1 / math.log2(b / a))) for a, b in zip(ns, ns[1:])]


def stays_ahead_from(seconds, baseline):
    """The smallest N (of those measured in both {N: seconds}) from which `seconds` is below `baseline` at that N
    and at every larger one; None if it is not ahead at the largest."""
    start = None
    for n in sorted(set(seconds) & set(baseline), reverse=True):
        if seconds[n] >= baseline[n]:
            break
        start = n
    return start


def _ms(seconds):
    """Milliseconds to at least 3 significant digits, no exponent (ratios can be checked against them)."""
    ms = 1000 * seconds
    return f"{ms:.{max(0, 2 - math.floor(math.log10(ms))) if ms > 0 else 0}f}"


@family("nprf")
def nprf_cases(args, head_dim=None):
    """NPRF attention (each exact path) vs SDPA, and whole NPRF-RoBERTa vs RoBERTa (SDPA) and Longformer."""
    size = _width(NPRF_WIDTH["num_attention_heads"], head_dim, "hidden_size", "intermediate_size")
    base = "RoBERTa (SDPA)"
    return {"runner": run_nprf, "lengths": args.lengths or [512, 1024, 2048, 4096, 8192, 16384], "baseline": base,
            "cases": {base: ("roberta", size), "NPRF-RoBERTa": ("nprf_roberta", size),
                      "Longformer, window 256": ("longformer", size)},
            "mode": "forward", "repeat_up_to": 4096}


def run_nprf(args):
    """Attention fwd+bwd per path and length, growth per doubling and the crossover (the whole models follow in
    main's loop). Lengths above 4096 are timed once (a single 16k SDPA step takes tens of seconds here)."""
    lengths = args.lengths or [512, 1024, 2048, 4096, 8192, 16384]
    batch = args.batch
    for causal in (False, True):
        rows = {}
        for length in lengths:
            for path in ("sdpa",) + NPRF_PATHS:
                if path == "explicit" and not nprf_explicit_fits(length, batch):
                    rows[(path, length)] = {"error": "skipped (N^2 memory)"}
                    continue
                repeats = args.repeats if length <= 4096 else 1
                rows[(path, length)] = call_child("measure_attention", [path, length, causal, batch, repeats,
                                                                         args.threads])
        title = ("causal" if causal else "bidirectional") + " attention, fwd+bwd"
        print(f"\n## nprf: {title} (B={batch}, H={NPRF_ATTN['heads']}, D={NPRF_ATTN['head_dim']}, "
              f"m={NPRF_ATTN['features']}, T5 buckets 32/128); ratio = time / SDPA's")
        print("| N | SDPA ms | " + " | ".join(f"{p} ms | x SDPA | MiB" for p in NPRF_PATHS) + " | SDPA MiB |")
        print("|---:|---:|" + "---:|---:|---:|" * len(NPRF_PATHS) + "---:|")
        for length in lengths:
            s = rows[("sdpa", length)]
            cells = []
            for p in NPRF_PATHS:
                r = rows[(p, length)]
                if "error" in r or "error" in s:
                    cells.append(f"{r.get('error', '')} | | ")
                else:
                    cells.append(f"{_ms(r['seconds'])} | {r['seconds'] / s['seconds']:.2f} | {r['peak_mib']:.0f}")
            sdpa_ms = _ms(s["seconds"]) if "error" not in s else s["error"]
            print(f"| {length} | {sdpa_ms} | " + " | ".join(cells) + f" | {s.get('peak_mib', 0):.0f} |")
        seconds = {p: {n: rows[(p, n)]["seconds"] for n in lengths if "error" not in rows[(p, n)]}
                   for p in ("sdpa",) + NPRF_PATHS}
        print("\ngrowth per doubling of N (time(2N) / time(N); per doubling where measured lengths skip one):")
        for p, t in seconds.items():
            print(f"  {p}: " + ", ".join(f"{a}->{b} {g:.2f}" for a, b, g in growth_per_doubling(t)))
        fastest = {n: min(seconds[p][n] for p in NPRF_PATHS if n in seconds[p])
                   for n in lengths if any(n in seconds[p] for p in NPRF_PATHS)}
        print(f"crossover: the smallest N from which a path is faster than SDPA at every larger measured N as well "
              f"(lengths tried {lengths}):")
        for name, t in [("fastest exact NPRF path", fastest)] + [(p, seconds[p]) for p in NPRF_PATHS]:
            n = stays_ahead_from(t, seconds["sdpa"])
            print(f"  {name}: " + (f"from N = {n}" if n is not None else "never stays ahead (not faster at the "
                                   "largest N measured for both)"))


CHILD_FUNCTIONS = {"measure": measure, "measure_interleaved": measure_interleaved,
                   "measure_attention": measure_attention,
                   "measure_mgk_attention": measure_mgk_attention, "measure_fish_attention": measure_fish_attention}


def _modes(args, spec):
    return ["train", "forward"] if args.mode == "both" else [args.mode or spec.get("mode", "train")]


def main():
    global DEVICE
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=sorted(FAMILIES) + ["all"], default="all")
    p.add_argument("--lengths", type=int, nargs="*", help="sequence lengths (default: per family)")
    p.add_argument("--heads", type=int, default=8, help="the baseline's heads H")
    p.add_argument("--global-heads", type=int, default=2, help="FiSH's global heads M (fish family)")
    p.add_argument("--fish-types", nargs="*", choices=FISH_TYPES,
                   help=f"FiSH attention types (fish family; default: {' '.join(FISH_DEFAULT)})")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--mode", choices=["train", "forward", "both"],
                   help="train: forward + backward + SGD step; forward: no-grad forward (default: train; the nprf "
                        "family's whole models: forward)")
    p.add_argument("--head-dims", type=int, nargs="*",
                   help="sweep the head size: the baseline gets --heads heads of each size (hidden = heads x size)")
    p.add_argument("--models-only", action="store_true", help="skip the attention-alone tables (mgk, fish, nprf)")
    p.add_argument("--interleave", action="store_true",
                   help="time the whole models of a family at each length in one child, their steps alternating "
                        "(the same machine state for the baseline and each model; memory and FLOPs still from "
                        "each case's own child)")
    p.add_argument("--csv", help="write one row per measurement to this CSV file")
    p.add_argument("--markdown", help="write the summary table (models vs baselines) to this Markdown file")
    p.add_argument("--figures", help="write PNG figures of the ratios to this folder")
    p.add_argument("--overwrite", action="store_true", help="replace existing --csv / --markdown / figure files")
    p.add_argument("--_child", help=argparse.SUPPRESS)
    p.add_argument("--_device", default="cpu", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._child:
        if args._device != "cpu":
            torch.set_default_device(args._device)
        name, call_args = json.loads(args._child)
        print(json.dumps(CHILD_FUNCTIONS[name](*call_args)))
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error(f"--device cuda: CUDA is not available here (torch {torch.__version__}, built for CUDA "
                f"{torch.version.cuda}); run with --device cpu or on a machine with a GPU")
    DEVICE = args.device
    names = sorted(FAMILIES) if args.family == "all" else [args.family]
    planned = {name: FAMILIES[name](args) for name in names}
    figures = {name: figure_paths(args.figures, name, _modes(args, spec), args.head_dims, spec)
               for name, spec in planned.items()} if args.figures else {}
    outputs = [pathlib.Path(f) for f in (args.csv, args.markdown) if f]
    outputs += [path for by_mode in figures.values() for paths in by_mode.values() for path in paths]
    existing = [str(path) for path in outputs if path.exists()]
    if existing and not args.overwrite:
        p.error(f"{', '.join(existing)} already exist(s); pass --overwrite to replace, or choose other paths")
    if args.figures:
        pathlib.Path(args.figures).mkdir(parents=True, exist_ok=True)

    print(f"torch {torch.__version__}, {DEVICE}, {args.threads} threads, batch {args.batch}, median of "
          f"{args.repeats} steps" + (", the models' steps interleaved" if args.interleave else ""))
    rows = []
    for name in names:
        for i, head_dim in enumerate(args.head_dims or [None]):
            spec = FAMILIES[name](args, head_dim)
            if i and not spec.get("sweeps_head_dim", True):
                break
            first = i == 0
            if "runner" in spec and first and not args.models_only:
                spec["runner"](args)
            for mode in _modes(args, spec):
                results = {}
                for length in spec["lengths"]:
                    results.update(run_cases(spec, length, args, mode))
                title = f"{name}: {FAMILIES[name].__doc__.strip().splitlines()[0]} Mode: {mode}" + (
                    f", head size {head_dim}" if head_dim else "")
                family_rows = make_rows(name, spec, results, mode, args, head_dim)
                rows += family_rows
                print_table(title, spec, family_rows)
                for table in spec.get("tables", []) + (spec.get("train_tables", []) if mode == "train" else []):
                    table(title, spec, results)
            for extra in spec.get("after", []) if first and not args.models_only else []:
                extra(args, spec)
        for mode, paths in figures.get(name, {}).items():
            write_figures(paths, [r for r in rows if r["family"] == name and r["mode"] == mode],
                          f"{name} ({mode}, {DEVICE}, {args.threads} threads, batch {args.batch})")
    if args.csv:
        write_csv(args.csv, rows)
    if args.markdown:
        write_markdown(args.markdown, rows, args)


if __name__ == "__main__":
    main()
