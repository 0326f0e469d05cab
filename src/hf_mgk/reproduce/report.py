"""The statistics, verdicts and report of a claim: per-arm means and sample standard deviations over seeds, each
check's outcome by its stated rule, the claim's verdict, the figures, and report.md. Pure functions of the numbers
in results.json (the figures draw them), so a report can be regenerated from a committed results.json."""

import dataclasses
import json
import math
import os
import shlex

__all__ = ["mean_std", "summarize_arm", "HOLDS", "FAILS", "INCONCLUSIVE", "MISSING", "check_outcome", "verdict",
           "VERDICT_RULE", "judge", "draw_figures", "DATA_NOTES", "layer_table", "draw_rank_histograms",
           "report_markdown", "READER_OUTPUT_DIR", "reader_command"]


def mean_std(values):
    """Mean and sample standard deviation (n - 1; NaN for one value) of finite numbers."""
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def summarize_arm(seeds):
    """{seed: {metric: value}} -> ({metric: mean}, {metric: std}) over the seeds that have the metric."""
    metrics = sorted({m for values in seeds.values() for m in values})
    means, stds = {}, {}
    for m in metrics:
        values = [v[m] for v in seeds.values() if m in v and v[m] is not None]
        means[m], stds[m] = mean_std(values)
    return means, stds


def _standard_error(a, b):
    """Of the difference of the two means: sqrt(s_a^2/n_a + s_b^2/n_b); an arm of one seed adds nothing."""
    return math.sqrt(sum(mean_std(v)[1] ** 2 / len(v) for v in (a, b) if len(v) > 1))


# The outcomes of a check, and the verdicts of a claim (with "partly holds").
HOLDS = "holds"
FAILS = "does not hold"
INCONCLUSIVE = "inconclusive"
MISSING = "not run"


def check_outcome(check, a, b, lower_is_better):
    """The outcome of one check from the per-seed numbers `a` and `b` of its two arms; (outcome, numbers).

    better:   gain = how much a beats b (b - a when lower is better); holds if gain > 2 SE, does not hold if
              gain < -2 SE (b significantly better), else inconclusive. SE = sqrt(s_a^2/n_a + s_b^2/n_b).
    no_worse: excess = how much a is worse than b, relative to |mean b|; holds if excess <= tol, does not hold if
              excess - 2 SE / |mean b| > tol, else inconclusive.
    fewer:    holds if mean a < mean b, else does not hold (counts such as diverged runs)."""
    if not a or not b:
        return MISSING, {}
    ma, mb = mean_std(a)[0], mean_std(b)[0]
    if not (math.isfinite(ma) and math.isfinite(mb)):
        return FAILS if math.isfinite(mb) else INCONCLUSIVE, {"a": ma, "b": mb}
    se = _standard_error(a, b)
    sign = 1.0 if lower_is_better else -1.0
    gain = sign * (mb - ma)
    numbers = {"a": ma, "b": mb, "gain": gain, "se": se}
    if check.kind == "better":
        outcome = HOLDS if gain > 2 * se else FAILS if gain < -2 * se else INCONCLUSIVE
        if se == 0 and gain == 0:
            outcome = INCONCLUSIVE
        return outcome, numbers
    if check.kind == "no_worse":
        scale = abs(mb) or 1.0
        excess = -gain / scale
        numbers["excess"] = excess
        outcome = HOLDS if excess <= check.tol else FAILS if excess - 2 * se / scale > check.tol else INCONCLUSIVE
        return outcome, numbers
    if check.kind == "fewer":
        return (HOLDS if ma < mb else FAILS), numbers
    raise ValueError(f"unknown check kind {check.kind!r}")


def verdict(outcomes):
    """The claim's verdict from its checks' outcomes: every check holds -> "holds"; none holds and at least one
    does not -> "does not hold"; some hold -> "partly holds"; otherwise "inconclusive" (or "not run")."""
    ran = [o for o in outcomes if o != MISSING]
    if not ran:
        return MISSING
    if all(o == HOLDS for o in ran):
        return HOLDS
    if any(o == HOLDS for o in ran):
        return "partly holds"
    if any(o == FAILS for o in ran):
        return FAILS
    return INCONCLUSIVE


VERDICT_RULE = ("Each check compares two arms' per-seed numbers. 'better': the difference of the means exceeds "
                "twice its standard error (sqrt(s_a^2/n_a + s_b^2/n_b), sample std) in the claimed direction "
                "(holds), or in the other direction (does not hold); else inconclusive. 'no_worse': arm a is at "
                "most tol (relative to b's mean) worse than b (holds), or worse than that by more than twice the "
                "standard error (does not hold); else inconclusive. 'fewer' (counts such as diverged runs): "
                "a's mean count is below b's (holds), else does not hold. The claim holds when every check holds, "
                "partly holds when some do, and does not hold when none does and at least one fails.")


def judge(claim, arms_results):
    """Checks and verdict of a claim from {arm: {"seeds": {seed: {metric: value}}}}."""
    results = []
    for check in claim.checks:
        metric = check.metric or claim.metric
        lower = claim.lower_is_better if check.lower_is_better is None else check.lower_is_better
        values = [[s[metric] for s in arms_results.get(name, {}).get("seeds", {}).values()
                   if metric in s and s[metric] is not None] for name in (check.a, check.b)]
        outcome, numbers = check_outcome(check, *values, lower)
        results.append({**dataclasses.asdict(check), "outcome": outcome, **numbers})
    return {"checks": results, "verdict": verdict([r["outcome"] for r in results]), "rule": VERDICT_RULE}


def _fmt(x, digits=4):
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}g}"


def draw_figures(results, folder):
    """curves.png (held-out loss per arm against steps: the mean over seeds, the band their min-max) and
    final.png (the claim's metric per arm, mean with sample-std error bars, each seed a dot). Returns the names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    arms = results["arms"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, arm in arms.items():
        curves = [c for c in arm.get("curves", {}).values() if c]
        if not curves:
            continue
        steps = sorted({s for c in curves for s, _ in c})
        rows = [[dict(c).get(s) for c in curves] for s in steps]
        mean = [sum(v for v in r if v is not None) / max(1, sum(v is not None for v in r)) for r in rows]
        lo = [min(v for v in r if v is not None) for r in rows]
        hi = [max(v for v in r if v is not None) for r in rows]
        line, = ax.plot(steps, mean, marker="o", ms=3, label=arm.get("label", name))
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2)
    if ax.lines:
        ax.set_xlabel("training step")
        ax.set_ylabel("held-out loss")
        ax.set_title(f"{results['claim']}: held-out loss (mean over seeds, band = min-max)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(folder, "curves.png"), dpi=110)
        names.append("curves.png")
    plt.close(fig)

    if results.get("layers"):
        names.append(draw_rank_histograms(results, folder, plt))

    metric = results["metric"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    labels = list(arms)
    for i, name in enumerate(labels):
        arm = arms[name]
        values = [s[metric] for s in arm["seeds"].values() if s.get(metric) is not None]
        finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
        mean, std = mean_std(finite)
        ax.bar(i, mean if math.isfinite(mean) else 0, yerr=std if math.isfinite(std) else 0, capsize=4,
               color="tab:blue" if i else "tab:gray", alpha=0.6)
        ax.plot([i] * len(finite), finite, "k.", ms=5)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(metric)
    finite_all = [s[metric] for a in arms.values() for s in a["seeds"].values()
                  if isinstance(s.get(metric), (int, float)) and math.isfinite(s[metric])]
    if finite_all:
        low, high = min(finite_all), max(finite_all)
        pad = (high - low) * 0.5 or abs(high) * 0.05 or 1
        ax.set_ylim(max(0, low - pad) if low >= 0 else low - pad, high + pad)
    ax.set_title(f"{results['claim']}: {metric} per arm (mean, sample std, seeds as dots)")
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "final.png"), dpi=110)
    plt.close(fig)
    names.append("final.png")
    return names


DATA_NOTES = {
    "nprf-stability": "this claim uses its script's own data: the bundled BERT tokenizer's 4,096 most frequent "
                      "tokens, the plays in order, the last one held out",
    "mgk-warmstart": "adaptation on these plays with MiniLM's own bert-base-uncased tokenizer; fine-tuning on the "
                     "movie-review polarity sentences",
}


def layer_table(results):
    """The heads claim's per-layer numbers: each arm beside its baseline, means over seeds."""
    lines = ["## Per layer (mean over seeds)", "",
             "| arm | layer | mean rank | rank histogram (rank: count, seed 0) | head distance d^l | components (95%) |",
             "|---|---|---|---|---|---|"]
    for name, per_seed in results["layers"].items():
        seeds = list(per_seed.values())
        for layer in range(len(seeds[0])):
            rows = [s[layer] for s in seeds]
            hist = ", ".join(f"{k}: {v}" for k, v in sorted(rows[0]["rank_histogram"].items(), key=lambda kv: int(kv[0])))
            lines.append(f"| `{name}` | {layer} | {mean_std([r['mean_rank'] for r in rows])[0]:.2f} | {hist} | "
                         f"{mean_std([r['head_distance'] for r in rows])[0]:.4g} | "
                         f"{mean_std([r['components_95'] for r in rows])[0]:.1f} |")
    return lines + [""]


def draw_rank_histograms(results, folder, plt):
    """ranks.png: per source claim (a row) and layer (a column), the histogram of attention ranks of each arm (the
    share of its matrices at each rank, all seeds pooled): MGK Fig. 7's comparison, each arm beside its baseline."""
    per_source = {}
    for name, per_seed in results["layers"].items():
        per_source.setdefault(name.split("/", 1)[0], []).append((name.split("/", 1)[1], per_seed))
    layers = max(len(next(iter(per_seed.values()))) for _, per_seed in results["layers"].items())
    fig, axes = plt.subplots(len(per_source), layers, figsize=(3.2 * layers, 2.6 * len(per_source)), squeeze=False)
    for row, (source, arms) in enumerate(per_source.items()):
        for layer in range(layers):
            ax = axes[row][layer]
            for arm, per_seed in arms:
                counts = {}
                for seed_layers in per_seed.values():
                    for rank, count in seed_layers[layer]["rank_histogram"].items():
                        counts[int(rank)] = counts.get(int(rank), 0) + count
                ranks, total = sorted(counts), sum(counts.values())  # shares: arms differ in head count
                ax.step(ranks, [counts[r] / total for r in ranks], where="mid", label=arm)
            ax.set_title(f"{source}, layer {layer}", fontsize=8)
            ax.tick_params(labelsize=7)
            if layer == 0:
                ax.set_ylabel("share of matrices")
                ax.legend(fontsize=6)
            if row == len(per_source) - 1:
                ax.set_xlabel("rank")
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "ranks.png"), dpi=100)
    plt.close(fig)
    return "ranks.png"


# The command that results.json and report.md show is the one a reader types in their own checkout. A relative
# output folder means the same there, so it stays as given; an absolute one names a folder of the machine that ran
# the claim (/work/rd, /tmp/repro), so it is shown as the README's folder instead. Every absolute folder maps to the
# same one, so the heads claim's command still points at the folder its source claims' commands fill.
READER_OUTPUT_DIR = "runs/repro"


def reader_command(argv):
    """`argv` (python, the script, its flags) joined for a shell, an absolute `--output_dir` shown as
    READER_OUTPUT_DIR."""
    argv = list(argv)
    for i in range(len(argv) - 1):
        if argv[i] == "--output_dir" and os.path.isabs(argv[i + 1]):
            argv[i + 1] = READER_OUTPUT_DIR
    return shlex.join(argv)


def report_markdown(results, figures=()):
    """report.md: the claim with the paper's numbers, the budget, per-seed numbers, mean +- std, the checks with
    their rule, the verdict, the wall time and the command."""
    arms, metric, paper = results["arms"], results["metric"], results["paper"]
    b = results["budget"]
    seeds = b["seeds"]
    lines = [f"# {results['claim']}: {results['title']}", "",
             f"**Claim** ({results['source']}): {results['statement']}", "",
             f"**Verdict at this scale: {results['verdict']}.**", ""]
    lines += ["## The paper's numbers and ours", "",
              f"Paper: {paper.get('metric', '')}. Ours: held-out `{metric}` ({'lower' if results['lower_is_better'] else 'higher'} "
              f"is better), mean ± sample std over {len(seeds)} seeds.", ""]
    extra = [m for m in sorted({m for a in arms.values() for m in a["mean"]}) if m != metric]
    header = ["arm", "paper", f"ours: {metric}", *extra, "parameters"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, arm in arms.items():
        cells = [f"{arm.get('label', name)} (`{name}`)", _fmt(paper.get(name)),
                 f"{_fmt(arm['mean'].get(metric))} ± {_fmt(arm['std'].get(metric), 2)}"]
        cells += [f"{_fmt(arm['mean'].get(m))} ± {_fmt(arm['std'].get(m), 2)}" for m in extra]
        cells.append(f"{arm['parameters']:,}" if arm.get("parameters") else "-")
        lines.append("| " + " | ".join(cells) + " |")
    if paper.get("note"):
        lines += ["", f"Paper: {paper['note']}"]
    lines += ["", f"### Per seed (`{metric}`)", "", "| arm | " + " | ".join(f"seed {s}" for s in seeds) + " |",
              "|---|" + "---|" * len(seeds)]
    for name, arm in arms.items():
        lines.append(f"| `{name}` | " + " | ".join(_fmt(arm["seeds"].get(str(s), {}).get(metric)) for s in seeds)
                     + " |")
    lines += ["", "## Checks", "", "| check | a | b | gain of a | 2 SE | outcome |", "|---|---|---|---|---|---|"]
    for c in results["checks"]:
        lines.append(f"| {c['text']} | {_fmt(c.get('a'))} | {_fmt(c.get('b'))} | {_fmt(c.get('gain'), 3)} | "
                     f"{_fmt(2 * c['se'], 3) if c.get('se') is not None else '-'} | {c['outcome']} |")
    lines += ["", f"Rule: {results['rule']}", ""]
    lines += ["## Budget and recipe (every arm alike)", ""]
    if "max_steps" in b:
        lines += [f"- scale `{b['scale']}`: {b['max_steps']} steps of batch {b['batch_size']} x {b['block_size']} "
                  f"tokens, AdamW lr {b['learning_rate']:g}, {b['schedule']} schedule with {b['warmup_ratio']:g} "
                  f"warm-up, weight decay {b['weight_decay']:g}, seeds {' '.join(map(str, seeds))}",
                  f"- base model: {json.dumps(b['model'])}; the arms' configs are in results.json"]
    else:
        lines += [f"- {k}: {v}" for k, v in b.items() if k not in ("device", "threads", "jobs")]
    lines.append(f"- data: Shakespeare, {len(results['data']['training_plays'])} plays for training, held out whole: "
                 f"{', '.join(results['data']['held_out_plays'])}; a byte-level BPE of "
                 f"{results['data']['vocab_size']} tokens trained on the training plays only"
                 + (f"; evaluated on the first {results['data']['validation_chars']:,} characters of the held-out "
                    "plays" if results["data"].get("validation_chars") and results["claim"] not in DATA_NOTES else "")
                 + (f" ({DATA_NOTES[results['claim']]})" if results["claim"] in DATA_NOTES else ""))
    if "lm_head_flop_share" in results:
        lines.append(f"- the LM head's share of a forward's FLOPs (first arm, one block): "
                     f"{results['lm_head_flop_share']:.1%}")
    if b.get("eval_stride"):
        lines.append(f"- `eval_strided_perplexity`: the held-out plays as one token stream in windows of "
                     f"{b['block_size']} tokens advancing by {b['eval_stride']}, each token scored once (the "
                     "papers' protocol is stride 1)")
    elapsed = (f"; {results['harness_seconds'] / 60:.1f} min from start to end, {b['jobs']} at a time"
               if b.get("jobs") and results.get("harness_seconds") else "")
    lines += [f"- device `{b['device']}`, threads {b['threads'] or 'default'}; wall time of the runs "
              f"{results['wall_seconds'] / 60:.1f} min (sum over runs){elapsed}", "",
              "Command:", "", "```", results["command"], "```", ""]
    if results.get("notes"):
        lines += ["## Notes", "", results["notes"], ""]
    if results.get("layers"):
        lines += layer_table(results)
    if figures:
        lines += ["## Figures", ""] + [f"![{f}]({f})" for f in figures] + [""]
    return "\n".join(lines)
