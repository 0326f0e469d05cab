#!/usr/bin/env python
"""The papers' head analyses of one or more checkpoints on a text, as figures and tables.

For each model (an hf-mgk checkpoint of any family, or a stock BERT / GPT-2 / RoBERTa one as the softmax
baseline) the text is tokenized with the model's tokenizer and cut into --max_sequences blocks of --max_length
tokens (special tokens included, as the model sees them), and every layer's attention matrices are collected
(`hf_mgk.analysis.collect_attentions`). Written to --output_dir:

    ranks.png                    rank histograms, one row per layer, one column per model (MGK paper Figs. 2, 7)
    head_distances.png           mean squared L2 distance between heads per layer (error bar: its std) and the
                                 layer averages of mean and variance (FiSH paper Table 7)
    principal_components.png     components explaining --variance of the Eq. 13 covariance per layer, and their
                                 layer average (FiSH paper Table 8)
    attention_maps_layer<l>.png  the attention matrices of one sequence, one row per model, one column per head
                                 (colours span each matrix's 1st to 99th percentile)
    head_analysis.json           every number above, with the settings
    head_analysis.csv            one row per model and layer, plus each model's layer average ("mean")
    rank_histograms.csv          model, layer, rank, count

    python scripts/analyze_heads.py --model outputs/mgk-bert-mlm outputs/softmax-bert-mlm \\
        --labels MGK softmax --text_file valid.txt --output_dir outputs/heads
"""

import argparse
import csv
import json
import os
import sys

import numpy as np
import torch

from hf_mgk import analysis, training

OUTPUT_FILES = ("ranks.png", "head_distances.png", "principal_components.png", "head_analysis.json",
                "head_analysis.csv", "rank_histograms.csv")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", nargs="+", required=True,
                   help="checkpoint folders or Hub names, e.g. a family and its softmax baseline")
    p.add_argument("--labels", nargs="+", help="a name per model for the figures (default: the folder names)")
    p.add_argument("--tokenizer", nargs="+",
                   help="a tokenizer for every model, or one per model (default: each model's own folder)")
    p.add_argument("--text_file", required=True, help="a UTF-8 text file; its tokens are cut into blocks")
    p.add_argument("--output_dir", required=True)
    p.add_argument("--max_sequences", type=int, default=64,
                   help="blocks of the text to analyse (default: %(default)s)")
    p.add_argument("--max_length", type=int, default=128,
                   help="tokens per block, special tokens included (default: %(default)s)")
    p.add_argument("--batch_size", type=int, default=8, help="sequences per forward (default: %(default)s)")
    p.add_argument("--tol", type=float, default=1e-6,
                   help="singular values above it (absolute) count towards the rank (default: %(default)s)")
    p.add_argument("--variance", type=float, default=0.95,
                   help="share explained by the principal components (default: %(default)s)")
    p.add_argument("--map_layers", type=int, nargs="+",
                   help="layers whose attention maps are drawn (default: the first and the last)")
    p.add_argument("--map_sequence", type=int, default=0,
                   help="which block the attention maps show (default: %(default)s)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where the models run (default: cuda when available, else cpu)")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --output_dir (earlier outputs of this script there are replaced)")
    args = p.parse_args(argv)
    for name in ("max_sequences", "max_length", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1; got {getattr(args, name)}")
    if not 0 < args.variance <= 1:
        p.error(f"--variance must be in (0, 1]; got {args.variance}")
    if args.tol < 0:
        p.error(f"--tol must be >= 0; got {args.tol}")
    args.labels = args.labels or [os.path.basename(os.path.normpath(m)) for m in args.model]
    if len(args.labels) != len(args.model):
        p.error(f"--labels gives {len(args.labels)} names for {len(args.model)} models")
    if len(set(args.labels)) != len(args.labels):
        p.error(f"two models have the same label ({', '.join(args.labels)}): name them with --labels")
    args.tokenizer = args.tokenizer or args.model
    if len(args.tokenizer) == 1:
        args.tokenizer = args.tokenizer * len(args.model)
    if len(args.tokenizer) != len(args.model):
        p.error(f"--tokenizer gives {len(args.tokenizer)} tokenizers for {len(args.model)} models (give 1 or "
                f"{len(args.model)})")
    if not os.path.isfile(args.text_file):
        p.error(f"--text_file {args.text_file} is not a file")
    for path in args.model:  # a Hub name is not a folder; a folder must be a saved model
        if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
            p.error(f"--model {path} is a folder without config.json, not a saved model")
    if args.map_layers is not None and min(args.map_layers) < 0:
        p.error(f"--map_layers are layer indices from 0; got {args.map_layers}")
    if args.map_sequence < 0 or args.map_sequence >= args.max_sequences:
        p.error(f"--map_sequence must be in [0, --max_sequences); got {args.map_sequence}")
    return args


def prepare_output_dir(folder, overwrite):
    """Refuse a folder that holds anything unless --overwrite; then remove only this script's earlier outputs."""
    if os.path.isdir(folder) and os.listdir(folder):
        if not overwrite:
            sys.exit(f"--output_dir {folder} is not empty; pass --overwrite to write into it")
        for name in os.listdir(folder):
            if name in OUTPUT_FILES or (name.startswith("attention_maps_layer") and name.endswith(".png")):
                os.remove(os.path.join(folder, name))
    os.makedirs(folder, exist_ok=True)


def load_model(path, device):
    """A checkpoint (any hf-mgk family or a stock one) as the class it was saved from (its head's weights load
    without warnings; the attentions are the same), else as the base model, with the eager attention a stock
    model needs to return its attention matrices."""
    import transformers
    from transformers import AutoConfig, AutoModel

    import hf_mgk  # registers the families with the Auto classes

    architectures = AutoConfig.from_pretrained(path).architectures or []
    known = [getattr(hf_mgk, a, None) or getattr(transformers, a, None) for a in architectures[:1]]
    cls = known[0] if known and known[0] is not None else AutoModel
    return cls.from_pretrained(path, attn_implementation="eager").to(device).eval()


def check_length(config, length, path):
    limit, why = training.position_limit(config)
    if config.model_type == "roberta":  # stock RoBERTa's positions start after the padding index too
        limit, why = limit - config.pad_token_id - 1, f"{why} minus RoBERTa's padding offset"
    if limit is not None and length > limit:
        sys.exit(f"--max_length {length} is longer than {path} takes: at most {limit} tokens ({why})")


def special_tokens(tokenizer):
    """The ids the tokenizer puts before and after one text ([CLS] / [SEP], <s> / </s>, none for GPT-2)."""
    inner = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    for i in range(len(full) - len(inner) + 1):
        if full[i:i + len(inner)] == inner:
            return full[:i], full[i + len(inner):]
    raise ValueError(f"cannot find where {type(tokenizer).__name__} puts its special tokens")


def text_blocks(tokenizer, text_file, max_sequences, max_length):
    """(S, max_length) ids: consecutive blocks of the text's tokens, each wrapped in the tokenizer's special
    tokens; S = max_sequences or fewer when the text runs out. Reads only as much of the file as it needs."""
    prefix, suffix = special_tokens(tokenizer)
    body = max_length - len(prefix) - len(suffix)
    if body < 1:
        sys.exit(f"--max_length {max_length} leaves no room for text besides the {len(prefix) + len(suffix)} "
                 "special tokens")
    ids, needed = [], max_sequences * body
    with open(text_file, encoding="utf-8", errors="replace") as f:
        while len(ids) < needed:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            # Cut at a line end so no word is split between two reads.
            chunk += f.readline()
            ids.extend(tokenizer(chunk, add_special_tokens=False, verbose=False)["input_ids"])
    count = min(max_sequences, len(ids) // body)
    if count == 0:
        sys.exit(f"{text_file} has {len(ids)} tokens, not enough for one block of {body} (--max_length "
                 f"{max_length} minus the special tokens)")
    blocks = [prefix + ids[i * body:(i + 1) * body] + suffix for i in range(count)]
    return torch.tensor(blocks)


def analyse_layers(layers, tol, variance):
    """The numbers of every layer (from `collect_attentions`) and their layer averages."""
    rows = []
    for index, layer in enumerate(layers):
        ranks = analysis.attention_ranks(layer, tol).flatten()
        # One head has no pair to measure: null in the JSON, a gap in the figure.
        mean, var = analysis.head_distances(layer) if layer[0].shape[0] > 1 else (None, None)
        values, counts = ranks.unique(return_counts=True)
        rows.append({"layer": index, "rank_histogram": {str(v): int(c) for v, c in zip(values.tolist(), counts)},
                     "rank_mean": ranks.double().mean().item(), "distance_mean": mean, "distance_variance": var,
                     "principal_components": analysis.principal_components(layer, variance)})
    keys = ("rank_mean", "distance_mean", "distance_variance", "principal_components")
    return rows, {k: None if rows[0][k] is None else float(np.mean([r[k] for r in rows])) for k in keys}


def analyse_model(path, tokenizer_path, label, args):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    model = load_model(path, args.device)
    check_length(model.config, args.max_length, path)
    ids = text_blocks(tokenizer, args.text_file, args.max_sequences, args.max_length)
    if args.map_sequence >= ids.shape[0]:
        sys.exit(f"--map_sequence {args.map_sequence}: the text gives {path} only {ids.shape[0]} blocks")
    layers = analysis.collect_attentions(model, ids, torch.ones_like(ids), batch_size=args.batch_size,
                                         progress=False if args.no_progress else label)
    rows, average = analyse_layers(layers, args.tol, args.variance)
    result = {"label": label, "path": path, "model_type": model.config.model_type,
              "attention_type": getattr(model.config, "attention_type", "softmax"), "num_layers": len(layers),
              "num_heads": layers[0][0].shape[0], "sequences": ids.shape[0], "sequence_length": ids.shape[1],
              "layers": rows, "layer_average": average}
    maps = [layer[args.map_sequence] for layer in layers]
    return result, maps


# ------------------------------------------------------------------------------------------------ figures

def _bars(ax, results, key, error=None):
    """Grouped bars: one group per layer, one bar per model."""
    width = 0.8 / len(results)
    for i, r in enumerate(results):
        x = np.arange(r["num_layers"]) + (i - (len(results) - 1) / 2) * width
        y = np.array([row[key] for row in r["layers"]], dtype=float)  # None (one head) -> nan: no bar
        yerr = np.sqrt(np.array([row[error] for row in r["layers"]], dtype=float)) if error else None
        ax.bar(x, y, width, yerr=yerr, capsize=2, label=r["label"])
    ax.set_xlabel("layer")
    ax.set_xticks(range(max(r["num_layers"] for r in results)))
    ax.legend(fontsize=8)


def _table(ax, results, columns):
    """The paper's layout: one row per model, the layer averages as columns."""
    ax.axis("off")
    cells = [["-" if r["layer_average"][key] is None else f"{r['layer_average'][key]:.{digits}f}"
              for _, key, digits in columns] for r in results]
    table = ax.table(cellText=cells, rowLabels=[r["label"] for r in results],
                     colLabels=[name for name, _, _ in columns], loc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    table.scale(1, 1.6)


def plot_ranks(results, path, plt):
    n_layers = max(r["num_layers"] for r in results)
    fig, axes = plt.subplots(n_layers, len(results), figsize=(3.2 * len(results), 1.9 * n_layers), squeeze=False,
                             sharex=True)
    ranks = [int(k) for r in results for row in r["layers"] for k in row["rank_histogram"]]
    edges = np.arange(min(ranks), max(ranks) + 2) - 0.5
    for col, r in enumerate(results):
        for layer in range(n_layers):
            ax = axes[layer, col]
            if layer >= r["num_layers"]:
                ax.axis("off")
                continue
            hist = r["layers"][layer]["rank_histogram"]
            ax.hist([int(k) for k in hist], bins=edges, weights=list(hist.values()))
            ax.set_title(f"{r['label']}, layer {layer}", fontsize=9)
            if col == 0:
                ax.set_ylabel("count")
        axes[-1, col].set_xlabel("rank")
    fig.suptitle(f"Rank of the attention matrices (N = {results[0]['sequence_length']})")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_distances(results, path, plt):
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 1.6]})
    _bars(left, results, "distance_mean", error="distance_variance")
    left.set_ylabel("mean squared L2 distance")
    left.set_title("distance between heads (bar: mean, line: std)", fontsize=9)
    _table(right, results, [("mean over layers", "distance_mean", 3),
                            ("variance over layers", "distance_variance", 3)])
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_components(results, path, variance, plt):
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 1.6]})
    _bars(left, results, "principal_components")
    left.set_ylabel("principal components")
    left.set_title(f"components explaining {variance:.0%} of the attention covariance", fontsize=9)
    _table(right, results, [("mean over layers", "principal_components", 1)])
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_maps(results, maps, layer, sequence, path, plt):
    """One row per model, one column per head: the attention of one block in one layer."""
    n_heads = max(r["num_heads"] for r in results)
    fig, axes = plt.subplots(len(results), n_heads, figsize=(1.4 * n_heads, 1.6 * len(results)), squeeze=False)
    for row, (r, layer_maps) in enumerate(zip(results, maps)):
        for head in range(n_heads):
            ax = axes[row, head]
            ax.set_xticks([])
            ax.set_yticks([])
            if layer >= r["num_layers"] or head >= r["num_heads"]:
                ax.axis("off")
                continue
            matrix = layer_maps[layer][head].numpy()
            # Colours span the matrix's 1st to 99th percentile: a few large weights ([CLS], [SEP]) would hide the
            # rest, and a nearly uniform matrix would be one colour.
            low, high = np.quantile(matrix, [0.01, 0.99])
            ax.imshow(matrix, cmap="viridis", interpolation="nearest", vmin=low, vmax=max(high, low + 1e-12))
            if head == 0:
                ax.set_ylabel(r["label"], fontsize=8)
            if row == 0:
                ax.set_title(f"head {head}", fontsize=8)
    fig.suptitle(f"Attention maps of block {sequence}, layer {layer}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ tables

def write_tables(results, args):
    settings = {k: getattr(args, k) for k in ("text_file", "max_sequences", "max_length", "tol", "variance")}
    with open(os.path.join(args.output_dir, "head_analysis.json"), "w", encoding="utf-8") as f:
        json.dump({**settings, "models": results}, f, indent=2)
    keys = ("rank_mean", "distance_mean", "distance_variance", "principal_components")
    with open(os.path.join(args.output_dir, "head_analysis.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["model", "layer", *keys])
        for r in results:
            for row in r["layers"]:
                writer.writerow([r["label"], row["layer"], *(row[k] for k in keys)])
            writer.writerow([r["label"], "mean", *(r["layer_average"][k] for k in keys)])
    with open(os.path.join(args.output_dir, "rank_histograms.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["model", "layer", "rank", "count"])
        for r in results:
            for row in r["layers"]:
                writer.writerows([r["label"], row["layer"], k, c] for k, c in row["rank_histogram"].items())


def main(argv=None):
    args = parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    results, maps = [], []
    prepare_output_dir(args.output_dir, args.overwrite)
    for path, tokenizer, label in zip(args.model, args.tokenizer, args.labels):
        result, layer_maps = analyse_model(path, tokenizer, label, args)
        results.append(result)
        maps.append(layer_maps)
        print(f"{label}: {result['sequences']} blocks of {result['sequence_length']} tokens, layer average "
              + ", ".join(f"{k} {v:.4g}" for k, v in result["layer_average"].items()))
    n_layers = max(r["num_layers"] for r in results)
    map_layers = args.map_layers if args.map_layers is not None else sorted({0, n_layers - 1})
    bad = [layer for layer in map_layers if not 0 <= layer < n_layers]
    if bad:
        sys.exit(f"--map_layers {bad}: the models have layers 0..{n_layers - 1}")
    write_tables(results, args)
    plot_ranks(results, os.path.join(args.output_dir, "ranks.png"), plt)
    plot_distances(results, os.path.join(args.output_dir, "head_distances.png"), plt)
    plot_components(results, os.path.join(args.output_dir, "principal_components.png"), args.variance, plt)
    for layer in map_layers:
        path = os.path.join(args.output_dir, f"attention_maps_layer{layer}.png")
        plot_maps(results, maps, layer, args.map_sequence, path, plt)
    print(f"written to {args.output_dir}")
    return results


if __name__ == "__main__":
    main()
