"""What the benchmark prints and writes from its measurements: one row per (case, length) with its ratios to the
baseline (`make_rows`, CSV_COLUMNS), the console table, the --csv file and the --markdown summary, and the fish
and headsize families' FLOP, parameter and equal-parameter tables."""

import csv
import math
import pathlib
import sys

import torch

from . import counting, models

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
            config = models.make_config(kind, overrides, length)
            formula, scope = counting.paper_flops(kind, config, length, args.batch, spec.get("formula", "app_b"))
            row = {"family": family_name, "case": case, "baseline": case == spec["baseline"], "device": args.device,
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


# ------------------------------------------------------------------ cells
def format_ms(seconds):
    """Milliseconds to at least 3 significant digits, no exponent (ratios can be checked against them)."""
    ms = 1000 * seconds
    return f"{ms:.{max(0, 2 - math.floor(math.log10(ms))) if ms > 0 else 0}f}"


def _x(value):
    return "-" if value is None else f"{value:.2f}"


def _num(value, fmt):
    return "-" if value is None else format(value, fmt)


# (header, cell) pairs: the console table, and the summary that --markdown writes
TABLE = [("model", lambda r: r["case"]), ("N", lambda r: str(r["length"])),
         ("ms", lambda r: r["error"] or format_ms(r["ms"] / 1000)),
         ("tokens/s", lambda r: _num(r.get("tokens_per_s"), ",.0f")),
         ("x baseline", lambda r: _x(r["ratio_vs_baseline"])),
         ("peak MiB", lambda r: _num(r.get("peak_mem_mib"), ".0f")), ("x", lambda r: _x(r["peak_mem_ratio"])),
         ("parameters", lambda r: _num(r["params"], ",")), ("x", lambda r: _x(r["params_ratio"])),
         ("GFLOP counted", lambda r: _num(r.get("flops_counted") and r["flops_counted"] / 1e9, ".3f")),
         ("x", lambda r: _x(r["flop_ratio_counted"])),
         ("attention fwd, counted x", lambda r: _x(r["flop_ratio_attention_counted"])),
         ("paper formula x", lambda r: _x(r["flop_ratio_formula"]))]
SUMMARY = [("family", lambda r: r["family"]), ("model", lambda r: r["case"]),
           ("baseline", lambda r: r["baseline_case"]), ("mode", lambda r: r["mode"]), ("N", lambda r: str(r["length"])),
           ("head size", lambda r: str(r["head_dim"])),
           ("ms", lambda r: r["error"] or format_ms(r["ms"] / 1000)),
           ("baseline ms", lambda r: "-" if r["baseline_ms"] is None else format_ms(r["baseline_ms"] / 1000)),
           ("tokens/s", lambda r: _num(r.get("tokens_per_s"), ",.0f")),
           ("time x baseline", lambda r: _x(r["ratio_vs_baseline"])),
           ("FLOPs x, counted (step)", lambda r: _x(r["flop_ratio_counted"])),
           ("FLOPs x, counted (attention fwd)", lambda r: _x(r["flop_ratio_attention_counted"])),
           ("FLOPs x, paper formula", lambda r: _x(r["flop_ratio_formula"])),
           ("formula covers", lambda r: r["formula"])]


# ------------------------------------------------------------------ the console table, --csv and --markdown
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
            f"torch {torch.__version__}, device {args.device}, {args.threads} threads, batch {args.batch}, median of "
            f"{args.repeats} steps{', the models alternating in one process (--interleave)' if args.interleave else ''}"
            ". time x baseline = ms / the baseline's ms at the same N in the same run; FLOPs x: "
            "FlopCounterMode on the timed step (forward + backward in training) and on the attention layers' "
            "forward, and the paper's formula (forward) over what it covers.", "",
            markdown_table([r for r in rows if not r["baseline"]], SUMMARY), ""]
    pathlib.Path(path).write_text("\n".join(text))


# ------------------------------------------------------------------ the families' own tables
def _ratio(r, b, key):
    return f"{r[key] / b[key]:.2f}" if b[key] else "-"


def _g(x):
    return f"{x / 1e9:.3f}"


def _row_against_base(label, r, b, keys, value):
    """A row of the FLOP and parameter tables: `label` (its first cells), then for each key the case's value
    (formatted by `value`) and its ratio to the baseline's; where either failed, the error and empty cells."""
    if "error" in r or "error" in b:
        return f"| {label} | {r.get('error', 'baseline failed')} |" + " |" * (2 * len(keys) - 1)
    return f"| {label} | " + " | ".join(f"{value(r[k])} | {_ratio(r, b, k)}" for k in keys) + " |"


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
            print(_row_against_base(f"{name} | {length}", results[(name, length)], b,
                                    ("flops_fwd", "flops_fwd_bwd", "flops_attn", "flops_score", "appd_flops"), _g))


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
        print(_row_against_base(name, results[(name, length)], b,
                                ("params", "params_attn", "params_score", "appd_params"), lambda n: f"{n:,}"))


def print_equal_params(title, spec, results):
    """The parameter counts of the cases, to show they are equal."""
    counts = {case: r["params"] for (case, _), r in results.items() if "params" in r}
    same = len(set(counts.values())) == 1
    print(f"parameters: {', '.join(f'{c}: {n:,}' for c, n in counts.items())}"
          f" -- {'all equal' if same else 'NOT equal'}")
