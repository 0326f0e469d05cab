"""The claims' registry: each claim the harness reproduces, as data. A claim names its arms (config overrides on
one shared base model), the model family, the metric and its direction, the paper's numbers, and the checks that
decide its verdict. What every arm of a claim shares at each scale (sizes, steps, optimizer) is in `recipes`."""

from dataclasses import dataclass, field

from ..modeling_warm_start import evenly_spaced_heads

__all__ = ["Arm", "Check", "Claim", "MGK_ARMS", "MGK_CHECKS", "MGK_PAPER", "MGK_NOTES", "FISH_ARMS", "FISH_CHECKS",
           "FISH_PAPER", "CONCISE_HEADS", "CONCISE_HEAD_DIM", "CONCISE_ARMS", "CONCISE_CHECKS", "CONCISE_PAPER",
           "NPRF_ARMS", "HEADS_ARMS", "WARMSTART_KEEP", "CLAIMS", "heads_sources"]


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


def heads_sources(claim):
    """{source claim: [arm names]} that the heads claim analyses."""
    out = {}
    for arm in claim.arms:
        source, name = arm.name.split("/", 1)
        out.setdefault(source, []).append(name)
    return out
