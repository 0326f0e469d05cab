"""--figures: one PNG per family and mode of the time ratio against N (solid), the paper formula's FLOP ratio
dashed beside it, and with several --head-dims the same against the head size at the largest N."""

import math
import pathlib


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
