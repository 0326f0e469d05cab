"""The benchmark's families (--family): for each, the whole models it compares with its baseline at which lengths
(`cases`: name -> (model kind of models.BUILDERS, config overrides)), and what it prints besides the models'
table: its attention-alone tables (`runner` before the models, `after` them), its own tables (`tables`, and
`train_tables` for the train mode) and its whole models' decoding table (`decode`, after the models' tables, with
--models-only too). A family's first docstring line titles its tables."""

from .attention import run_fish_attention, run_mgk_attention
from .decode import print_decode_table
from .models import BERT_SIZE, FISH_DEFAULT, GPT2_SIZE, LLAMA_SIZE, NPRF_WIDTH
from .nprf import run_nprf
from .tables import print_equal_params, print_flop_table, print_param_table

FAMILIES = {}


def family(name):
    def register(fn):
        FAMILIES[name] = fn
        return fn
    return register


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


@family("nprf")
def nprf_cases(args, head_dim=None):
    """NPRF attention (each exact path) vs SDPA, and whole NPRF-RoBERTa vs RoBERTa (SDPA) and Longformer."""
    size = _width(NPRF_WIDTH["num_attention_heads"], head_dim, "hidden_size", "intermediate_size")
    base = "RoBERTa (SDPA)"
    return {"runner": run_nprf, "lengths": args.lengths or [512, 1024, 2048, 4096, 8192, 16384], "baseline": base,
            "cases": {base: ("roberta", size), "NPRF-RoBERTa": ("nprf_roberta", size),
                      "Longformer, window 256": ("longformer", size)},
            "mode": "forward", "repeat_up_to": 4096}


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


@family("llama")
def llama_cases(args, head_dim=None):
    """MGK-Llama (M=2 keys) and FiSH-Llama (hard FiSH) vs Llama (SDPA) of the same width and key/value heads."""
    heads, m = args.heads, args.global_heads
    size = _width(heads, head_dim, "hidden_size", "intermediate_size")
    head_dim = head_dim or LLAMA_SIZE["hidden_size"] // heads
    kv = LLAMA_SIZE["num_key_value_heads"]
    shape = {**size, "num_attention_heads": heads, "head_dim": head_dim}
    base = f"Llama, {heads} heads, {kv} KV heads (SDPA)"
    return {
        "lengths": args.lengths or [256, 512, 1024, 2048],
        "baseline": base,
        "cases": {
            base: ("llama", shape),
            f"MGK-Llama soft, {heads} heads, M=2": ("mgk_llama", {**shape, "num_keys": 2}),
            f"MGK-Llama soft, {heads // 2} heads, M=2": ("mgk_llama", {**shape, "num_attention_heads": heads // 2,
                                                                       "num_keys": 2}),
            f"FiSH-Llama hard_fish, {heads}+{m} heads": ("fish_llama", {**shape, "num_global_heads": m,
                                                                        "attention_type": "hard_fish"}),
        },
        "decode": print_decode_table,
    }
