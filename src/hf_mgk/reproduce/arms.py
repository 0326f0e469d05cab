"""Running the arms: what runs in the harness's own process. The data every arm trains and is evaluated on (the
bundled Shakespeare plays split by whole plays, and a byte-level BPE trained on the training plays only), and the
heads claim's measurements of trained models on held-out blocks. The training runs themselves are child processes
of `scripts/reproduce.py` (the package's `run_clm.py` / `run_mlm.py` / `run_glue.py`, `scripts/nprf_stability.py`).

Whole plays are held out, so no held-out line shares a document with training. With a small vocabulary (a few
thousand tokens) the attention and feed-forward layers, not the LM head, take most of a from-scratch model's FLOPs
(each report gives the share)."""

import json
import os

from .recipes import DATA, SCALES

__all__ = ["HELD_OUT_PLAYS", "play_name", "split_plays", "write_split", "SPECIAL_TOKENS", "train_tokenizer",
           "save_tokenizers", "prepare_data", "head_statistics", "heldout_blocks"]

# Held-out plays: whole documents, chosen once (alphabetical positions spread over the collection), never
# seen by the tokenizer or the training split.
HELD_OUT_PLAYS = ("hamlet", "twelfth_night")


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
    from .. import bundled

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


def head_statistics(model_dir, kind, blocks, batch_size=8):
    """Layer-wise head statistics of a saved model on `blocks` ((S, N) token ids of held-out text): rank histogram
    (counts per rank value), mean rank, the FiSH paper's head distance d^l (mean, variance) and the components for
    95% of Eq. 13's variance. Returns {"layers": [...], plus layer averages "mean_rank", "head_distance",
    "head_distance_variance", "components_95"}."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    from .. import analysis

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
