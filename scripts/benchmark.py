#!/usr/bin/env python
"""Speed, memory and size of each attention family beside its softmax baseline, in one run, as ratios.

    python scripts/benchmark.py --family mgk                  # MGK-BERT (H/2 heads, M=2) vs BERT (H heads, SDPA)
    python scripts/benchmark.py --family mgk --lengths 128 512 --repeats 5
    python scripts/benchmark.py --family fish                 # FiSH-GPT2 (8 local heads, M=2) vs GPT-2 (8 heads, SDPA)
    python scripts/benchmark.py --family nprf                 # NPRF paths vs SDPA; NPRF-RoBERTa vs RoBERTa, Longformer

Each (model, length) is measured in a fresh child process: a warm-up step, then the median of `--repeats`
training steps (forward + backward of the encoder + an SGD step; no LM head, so the vocabulary projection does
not hide the attention), and the peak resident memory the step adds above the loaded model (ru_maxrss minus the
RSS before the first step). Shared machines are noisy: read the ratios, which are taken in the same run.

The fish family also counts FLOPs, on the (untimed) warm-up step, with torch.utils.flop_counter.FlopCounterMode
(see count_flops and attention_matrix_flops), and prints the App. D formulas (hf_mgk.fish_cost) beside them.

With several threads on cores that other work keeps busy, every parallelised op waits for its slowest thread
(measured here: an in-place add on 2^20 floats, 0.24 ms on 1 thread, 4.5 ms on 2), which penalises models made
of many small ops far more than their FLOPs: compare --threads 1 with the default.
"""

import argparse
import copy
import importlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
from torch.utils import flop_counter

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
        "after": [run_mgk_attention],
    }


# ------------------------------------------------------------------ MGK attention alone
# The baseline's H heads of size D against MGK's H/2 heads with M keys, forward + backward of one attention call
# on random (B, heads, N, D) inputs (the MGK model's attention type and E-step choose the path, as in the model).
MGK_PATHS = {  # name -> (function, e_step, M); "SDPA-aug" is the augmented-key SDPA path the CPU rule replaced
    "MGK soft": ("mgk", "soft", 2), "sMGK soft": ("smgk", "soft", 2), "MGK hard": ("mgk", "hard", 2),
    "sMGK hard": ("smgk", "hard", 2), "MGK soft, SDPA-aug": ("sdpa_aug", "soft", 2),
}


def mgk_paper_flops(path, heads, length, head_dim):
    """The papers' count (MGK App. B) of one layer's attention, multiply-adds of QK^T (or the M key products) and
    AV, for the baseline's `heads`: softmax 2 H N^2 D; MGK with H/2 heads (M + 1) H/2 N^2 D (M keys' scores, one
    value per position); sMGK (one key product for all M shifted keys) 2 H/2 N^2 D. path: "sdpa" or MGK_PATHS."""
    if path == "sdpa":
        return 2 * heads * length * length * head_dim
    kind, _, m = MGK_PATHS[path]
    return (2 if kind == "smgk" else m + 1) * (heads // 2) * length * length * head_dim


def mgk_attention_step(path, heads, length, batch, head_dim):
    """fwd+bwd of one attention call: SDPA with `heads` heads, or an MGK path with heads // 2."""
    from hf_mgk import attention_mgk as am

    g = torch.Generator().manual_seed(0)
    if path == "sdpa":
        q, k, v = (torch.randn(batch, heads, length, head_dim, generator=g, requires_grad=True) for _ in range(3))
        grad = torch.randn(batch, heads, length, head_dim, generator=g)
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v).backward(grad)
    kind, e_step, m = MGK_PATHS[path]
    h = heads // 2
    q, v = (torch.randn(batch, h, length, head_dim, generator=g, requires_grad=True) for _ in range(2))
    grad = torch.randn(batch, h, length, head_dim, generator=g)  # dense, as from the layers above
    variances = [head_dim ** 0.5 * (1 + 2 * r) for r in range(m)]
    prior = torch.log_softmax(torch.zeros(h, m), -1).requires_grad_(e_step == "soft")  # the hard E-step ignores pi
    if kind == "smgk":
        key = torch.randn(batch, h, length, head_dim, generator=g, requires_grad=True)
        shift = (0.1 * torch.randn(h, m, head_dim, generator=g)).requires_grad_()
        return lambda: am.smgk_attention(q, key, shift, v, variances=variances, log_prior=prior,
                                         e_step=e_step).backward(grad)
    keys = torch.randn(batch, h, m, length, head_dim, generator=g, requires_grad=True)
    if kind == "sdpa_aug":
        var = torch.tensor(variances)
        return lambda: am._mgk_soft_sdpa(q, keys, v, var, prior, None, False, 0.0).backward(grad)
    return lambda: am.mgk_attention(q, keys, v, variances=variances, log_prior=prior, e_step=e_step).backward(grad)


def measure_mgk_attention(path, heads, length, batch, head_dim, repeats, threads):
    """In the child: median fwd+bwd seconds, and FlopCounterMode's count of the (untimed) warm-up step."""
    torch.set_num_threads(threads)
    step = mgk_attention_step(path, heads, length, batch, head_dim)

    def counted():
        with flop_counter_mode() as fc:
            step()
        return fc.get_total_flops()

    result, flops = _timed(step, repeats, counted)
    result["flops"] = flops
    return result


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
    print("| N | SDPA ms | path | ms | x SDPA | x paper FLOPs | target (1.1x) | x counted FLOPs | peak MiB |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for n in spec["lengths"]:
        base = rows[("sdpa", n)]
        for p in MGK_PATHS:
            r = rows[(p, n)]
            if "error" in r or "error" in base:
                print(f"| {n} | | {p} | {r.get('error', base.get('error'))} | | | | | |")
                continue
            paper = mgk_paper_flops(p, heads, n, head_dim) / mgk_paper_flops("sdpa", heads, n, head_dim)
            print(f"| {n} | {_ms(base['seconds'])} | {p} | {_ms(r['seconds'])} | {r['seconds'] / base['seconds']:.2f}"
                  f" | {paper:.2f} | {1.1 * paper:.3f} | {r['flops'] / base['flops']:.2f} | {r['peak_mib']:.0f} |")


# ------------------------------------------------------------------ FiSH-GPT2
GPT2_SIZE = dict(n_embd=512, n_layer=2, n_inner=2048, vocab_size=1000, bos_token_id=0, eos_token_id=0,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
FISH_TYPES = ("hard_fish", "fish", "mish", "hard_gfish", "gfish")
FISH_DEFAULT = ("hard_fish", "fish", "mish", "hard_gfish")  # gfish = hard_gfish + noise: --fish-types to add


@family("fish")
def fish_cases(args):
    """FiSH-GPT2 with H local heads and M global heads (App. D: M=2, H=8) of the baseline's head size."""
    heads, m = args.heads, args.global_heads
    head_dim = GPT2_SIZE["n_embd"] // heads
    base = f"GPT-2, {heads} heads (SDPA)"
    cases = {base: ("gpt2", {"n_head": heads})}
    for kind in args.fish_types or FISH_DEFAULT:
        cases[f"FiSH-GPT2 {kind}, {heads}+{m} heads"] = (
            "fish_gpt2", {"n_head": heads, "head_dim": head_dim, "num_global_heads": m, "attention_type": kind})
    return {"lengths": args.lengths or [256, 512, 1024, 2048, 4096], "baseline": base, "cases": cases,
            "count_flops": True, "tables": [print_table, print_flop_table, print_param_table]}


# kind -> (module, config class, model class, size, position field, fewest positions, model kwargs, attention
# implementation or None). Child processes rebuild a case from its kind and JSON overrides.
BUILDERS = {
    "bert": ("transformers", "BertConfig", "BertModel", BERT_SIZE, "max_position_embeddings", 512,
             {"add_pooling_layer": False}, "sdpa"),
    "mgk": ("hf_mgk", "MGKBertConfig", "MGKBertModel", BERT_SIZE, "max_position_embeddings", 512,
            {"add_pooling_layer": False}, None),
    "gpt2": ("transformers", "GPT2Config", "GPT2Model", GPT2_SIZE, "n_positions", 1024, {}, "sdpa"),
    "fish_gpt2": ("hf_mgk", "FiSHGPT2Config", "FiSHGPT2Model", GPT2_SIZE, "n_positions", 1024, {}, None),
}


def build(kind, overrides, length):
    """The model for one case, with room for `length` positions."""
    if kind not in BUILDERS:
        raise ValueError(f"unknown model kind {kind!r}")
    module, config_name, model_name, size, positions, fewest, model_kwargs, attn = BUILDERS[kind]
    module = importlib.import_module(module)
    config = getattr(module, config_name)(**size, **{positions: max(length, fewest)}, **overrides)
    if attn is not None:
        config._attn_implementation = attn
    return getattr(module, model_name)(config, **model_kwargs)


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


def count_flops(model, ids, step=None):
    """FlopCounterMode counts (2mnk per matmul) of one training step on the model as it trains (grad enabled,
    so the attention takes its training path): the forward of the whole model, the attention modules' share
    of that forward (taken before the backward, whose module attribution is not reliable), and forward +
    backward. `step(on_forward)` runs one step and calls on_forward() between forward and backward; by
    default a forward, the benchmark's loss and a backward (gradients cleared after)."""
    if step is None:
        def step(on_forward):
            hidden = model(ids).last_hidden_state
            on_forward()
            hidden.float().pow(2).mean().backward()
            model.zero_grad(set_to_none=True)
    forward = {}
    with flop_counter_mode() as fc:
        step(lambda: forward.update(fc.get_flop_counts()))
    attn = sum(_total(c) for name, c in forward.items() if name.split(".")[-1] == "attn")
    return {"flops_fwd": _total(forward["Global"]), "flops_attn": attn, "flops_fwd_bwd": fc.get_total_flops()}


def attention_matrix_flops(attn, batch, length):
    """FlopCounterMode count of App. D's part of one attention layer (`attn`: GPT-2's or FiSH-GPT2's): the
    Q/K projections (bias-free count: addmm counts the product only) and the attention matrices before the
    softmax (QK^T; for FiSH the M global QK^T and the package's own mixing, noise included in training).
    Values, softmax and the output projection are left out, as in App. D; no mask, full N x N, as App. D.
    Run on meta tensors: shapes only, no work."""
    from hf_mgk.attention_fish import fish_attention_reference

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
            fish_attention_reference(q, k, value, attn.mixing, scale=attn.scaling, noise_std=noise,
                                     return_weights=True)
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
    """App. D (hf_mgk.fish_cost) for the whole model: per layer x layers x batch."""
    from hf_mgk.attention_fish import fish_cost

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


def measure(kind, overrides, length, batch, repeats, threads, count=False):
    """Runs in the child: (median step seconds, peak added MiB, parameter count), and with `count` the FLOP and
    parameter counts of flop_report, taken on the (untimed) warm-up step."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build(kind, overrides, length).train()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (batch, length))

    def step(on_forward=None):
        opt.zero_grad(set_to_none=True)
        hidden = model(ids).last_hidden_state
        if on_forward is not None:
            on_forward()
        hidden.float().pow(2).mean().backward()
        opt.step()

    # warm-up: allocations, kernel selection; with `count` it is the step FlopCounterMode counts (untimed)
    warm_up = (lambda: flop_report(model, ids, step)) if count else step
    result, counts = _timed(step, repeats, warm_up)
    result["params"] = params
    if count:
        result.update(counts)
    return result


def call_child(name, call_args):
    """Run CHILD_FUNCTIONS[name](*call_args) in a fresh interpreter (clean memory peak); its result dict."""
    proc = subprocess.run([sys.executable, __file__, "--_child", json.dumps([name, call_args])],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1][:120] if proc.stderr.strip() else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_child(kind, overrides, length, args, count=False):
    return call_child("measure", [kind, overrides, length, args.batch, args.repeats, args.threads, count])


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
          "counted on the modules vs App. D (iii)/(iv) (hf_mgk.fish_cost; the GFiSH/MiSH/hard terms are the "
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
NPRF_ATTN = dict(heads=8, head_dim=64, features=32)
NPRF_WIDTH = dict(hidden_size=512, num_hidden_layers=2, num_attention_heads=8, intermediate_size=2048,
                  vocab_size=1000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
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
    features = an.draw_features(m, d, torch.Generator().manual_seed(0))

    def step():
        bias = an.rpe_bias_from_buckets(table, length, bidirectional=not causal, max_distance=128)
        an._nprf_attention(q, k, v, bias, features, True, w, None, causal, False, path=path).backward(grad)
    return step


def nprf_explicit_fits(length, batch):
    """The explicit path keeps several B*H*N*N float32 tensors for backward: skip it where that passes ~8 GiB."""
    return 6 * batch * NPRF_ATTN["heads"] * length * length * 4 < 8 * 2**30


def _timed(step, repeats, warm_up=None):
    """A warm-up call (`warm_up`, default `step`; its peak RSS above the RSS before it is the memory figure),
    then the median of `repeats` calls of `step`. Returns ({seconds, peak_mib}, the warm-up's return value)."""
    rss_before = _rss_bytes()
    warm = (warm_up or step)()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "peak_mib": max(peak, 0) / 2**20}, warm


def measure_attention(path, length, causal, batch, repeats, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    return _timed(nprf_attention_step(path, length, causal, batch), repeats)[0]


def whole_model_forward(kind, length, batch):
    """One forward (no grad) of an encoder of equal width at this length."""
    if kind == "nprf":
        from hf_mgk import NPRFRobertaConfig, NPRFRobertaModel

        model = NPRFRobertaModel(NPRFRobertaConfig(**NPRF_WIDTH, use_absolute_positions=False,
                                                   num_random_features=NPRF_ATTN["features"]), add_pooling_layer=False)
    elif kind == "roberta":
        from transformers import RobertaConfig, RobertaModel

        config = RobertaConfig(**NPRF_WIDTH, max_position_embeddings=length + 2)
        config._attn_implementation = "sdpa"
        model = RobertaModel(config, add_pooling_layer=False)
    elif kind == "longformer":
        from transformers import LongformerConfig, LongformerModel

        model = LongformerModel(LongformerConfig(**NPRF_WIDTH, attention_window=256,
                                                 max_position_embeddings=length + 2), add_pooling_layer=False)
    else:
        raise ValueError(kind)
    model.eval()
    ids = torch.randint(3, NPRF_WIDTH["vocab_size"], (batch, length))
    return lambda: model(ids)


def measure_forward(kind, length, batch, repeats, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    with torch.no_grad():
        return _timed(whole_model_forward(kind, length, batch), repeats)[0]


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
def nprf_cases(args):
    """NPRF attention (each exact path) vs SDPA, and whole NPRF-RoBERTa vs RoBERTa (SDPA) and Longformer."""
    return {"runner": run_nprf}


def run_nprf(args):
    """Attention fwd+bwd per path and length, growth per doubling and the crossover; then whole-model forwards.
    Lengths above 4096 are timed once (a single 16k SDPA step takes tens of seconds here)."""
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
    print(f"\n## nprf: whole-model forward, no grad, equal width (hidden {NPRF_WIDTH['hidden_size']}, "
          f"{NPRF_WIDTH['num_hidden_layers']} layers, {NPRF_WIDTH['num_attention_heads']} heads), batch {batch}; "
          "x = time / RoBERTa's")
    print("| N | RoBERTa (SDPA) ms | NPRF-RoBERTa ms | x | Longformer (window 256) ms | x |")
    print("|---:|---:|---:|---:|---:|---:|")
    for length in lengths:
        res = {kind: call_child("measure_forward", [kind, length, batch, args.repeats if length <= 4096 else 1,
                                                         args.threads])
               for kind in ("roberta", "nprf", "longformer")}
        base = res["roberta"]
        cells = []
        for kind in ("nprf", "longformer"):
            r = res[kind]
            if "error" in r or "error" in base:
                cells.append(f"{r.get('error', base.get('error'))} | ")
            else:
                cells.append(f"{_ms(r['seconds'])} | {r['seconds'] / base['seconds']:.2f}")
        base_ms = _ms(base["seconds"]) if "error" not in base else base["error"]
        print(f"| {length} | {base_ms} | " + " | ".join(cells) + " |")


CHILD_FUNCTIONS = {"measure": measure, "measure_attention": measure_attention,
                   "measure_forward": measure_forward, "measure_mgk_attention": measure_mgk_attention}


def main():
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
    p.add_argument("--_child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._child:
        name, call_args = json.loads(args._child)
        print(json.dumps(CHILD_FUNCTIONS[name](*call_args)))
        return
    print(f"torch {torch.__version__}, {args.threads} threads, batch {args.batch}, median of {args.repeats} steps")
    for name in sorted(FAMILIES) if args.family == "all" else [args.family]:
        spec = FAMILIES[name](args)
        if "runner" in spec:
            spec["runner"](args)
            continue
        results = {}
        for length in spec["lengths"]:
            for case, (kind, overrides) in spec["cases"].items():
                results[(case, length)] = run_child(kind, overrides, length, args, spec.get("count_flops", False))
        for table in spec.get("tables", [print_table]):
            table(f"{name}: {FAMILIES[name].__doc__.strip()}", spec, results)
        for extra in spec.get("after", []):
            extra(args, spec)


if __name__ == "__main__":
    main()
