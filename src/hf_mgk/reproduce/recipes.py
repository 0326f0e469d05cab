"""The recipes: what every arm of a claim shares at one scale (model sizes, steps, batch, optimizer and schedule;
the data split's size and vocabulary; the warm-start, stability-script and head-analysis budgets), and each arm's
config built from its claim's recipe. One recipe per claim kind and scale: no arm is tuned on its own."""

from dataclasses import dataclass

__all__ = ["SCALES", "Recipe", "DataRecipe", "DATA", "WARMSTART", "NPRF_SCRIPT_ARGS", "HEADS_SEQUENCES", "recipe",
           "arm_config"]

# default: each claim in about 30 minutes on 2 CPU cores for 3 seeds (`--jobs 2 --threads 1`); full: the larger
# budget of the first reports (600 steps of batch 16, the whole held-out plays; hours per claim on 2 cores, minutes
# on a GPU); tiny: seconds, for smoke tests.
SCALES = ("tiny", "default", "full")


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
