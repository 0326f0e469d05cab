"""Data: datasets from the Hub or local files (checked: columns, blank text, bad rows), and the language-modeling
preprocessing (tokenize, cut into blocks) and metrics (token accuracy, perplexity)."""

import csv
import functools
import itertools
import math
import os

from .arguments import first_bad_line


def load_raw_datasets(data_args, model_args, extension_map=None, splits=("train", "validation", "test")):
    """A DatasetDict with "train" / "validation" (and "test" when the data has it) from the Hub or local files;
    without a validation split, --validation_split_percentage of the training data is held out.

    extension_map: file extension -> datasets builder (default: txt -> text, csv, tsv -> csv, json/jsonl -> json).
    splits: the local splits, each read from `data_args.<split>_file` when that is set."""
    import datasets

    hub = {k: v for k, v in model_args.hub_kwargs().items() if k != "revision"}
    if data_args.dataset_name is not None:
        raw = hub_dataset(data_args.dataset_name, data_args.dataset_config_name, **hub)
        if "validation" not in raw:
            raw["validation"] = hub_dataset(data_args.dataset_name, data_args.dataset_config_name,
                                            split=f"train[:{data_args.validation_split_percentage}%]", **hub)
            raw["train"] = hub_dataset(data_args.dataset_name, data_args.dataset_config_name,
                                       split=f"train[{data_args.validation_split_percentage}%:]", **hub)
        return raw
    extension_map = extension_map or {"txt": "text", "csv": "csv", "tsv": "csv", "json": "json", "jsonl": "json"}
    files = {split: getattr(data_args, f"{split}_file", None) for split in splits}
    files = {split: path for split, path in files.items() if path is not None}
    builders = set()
    for split, path in files.items():
        ext = path.rsplit(".", 1)[-1].lower()
        if ext not in extension_map:
            raise ValueError(f"--{split}_file {path}: unsupported file type .{ext}; use one of "
                             f"{', '.join('.' + e for e in extension_map)}")
        builders.add((extension_map[ext], ext == "tsv"))
    if len(builders) > 1:
        raise ValueError(f"the data files must be of one type; got {', '.join(files.values())}")
    builder, tsv = builders.pop()
    # GLUE's TSVs are unquoted and GLUE's own readers read them with quoting off; with it on, a field that opens a
    # quote silently swallows the rows up to the next quote.
    options = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if tsv else {}
    if builder == "text":
        options["keep_linebreaks"] = True
    pct = data_args.validation_split_percentage

    # One file at a time: loaded together, datasets casts every file to the first one's columns (a column missing
    # from a later file is filled with None, one missing from the first fails with an obscure error).
    def load(split, part="data"):
        path = files[split]
        try:
            return datasets.load_dataset(builder, data_files={"data": path}, split=part,
                                         cache_dir=model_args.cache_dir, **options)
        except datasets.exceptions.DatasetGenerationError as err:  # its message names neither file nor line
            reason = (first_bad_line(path, "," if builder == "csv" and not tsv else None)
                      or f"{type(err.__cause__).__name__}: {err.__cause__}")
            raise ValueError(f"--{split}_file {path} cannot be read: {reason}") from None
        except ValueError as err:
            if "corresponds to no data" not in str(err):  # datasets' words for a split with no rows
                raise
            if part == "data":
                raise ValueError(f"--{split}_file {path} has no rows (a header only?)") from None
            raise ValueError(f"--validation_split_percentage {pct} of the rows of --train_file {path} leaves no row "
                             f"for {'validation' if part.startswith('data[:') else 'training'}: give a "
                             "--validation_file, more rows, or another percentage") from None

    raw = datasets.DatasetDict({split: load(split) for split in files})
    if "validation" not in raw and "train" in raw:
        raw["validation"] = load("train", f"data[:{pct}%]")
        raw["train"] = load("train", f"data[{pct}%:]")
    return raw


def hub_dataset(name, config_name=None, **kwargs):
    """datasets.load_dataset for --dataset_name, with a clear error when the Hub cannot be reached."""
    import datasets

    try:
        return datasets.load_dataset(name, config_name, **kwargs)
    except ConnectionError as err:
        raise ValueError(f"--dataset_name {name}: the Hugging Face Hub cannot be reached ({err}); with no network, "
                         "give local files with --train_file / --validation_file instead") from None


def require_columns(dataset, columns, where):
    """Clear error for a dataset that lacks a column the task needs."""
    missing = [c for c in columns if c not in dataset.column_names]
    if missing:
        raise ValueError(f"{where} has no column {', '.join(repr(c) for c in missing)}; its columns are "
                         f"{', '.join(repr(c) for c in dataset.column_names)}")


def describe_split(data_args, split):
    """Where a split comes from, for error messages: its file and option, or the Hub dataset."""
    if data_args.dataset_name is not None:
        name = "/".join(n for n in (data_args.dataset_name, data_args.dataset_config_name) if n)
        return f"the {split!r} split of {name}"
    path = getattr(data_args, f"{split}_file", None)
    if path is None and split in ("train", "validation"):  # validation held out of the training file
        return f"the {split} part of --train_file {data_args.train_file}"
    return f"--{split}_file {path}"


def take(dataset, limit):
    return dataset if limit is None else dataset.select(range(min(limit, len(dataset))))


def dataset_label(data_args):
    """What the model card names as the data: the Hub dataset (and configuration), or the local file names."""
    if data_args.dataset_name is not None:
        return "/".join(n for n in (data_args.dataset_name, data_args.dataset_config_name) if n)
    files = (getattr(data_args, f"{split}_file", None) for split in ("train", "validation", "test"))
    return ", ".join(os.path.basename(path) for path in files if path)


def group_texts(examples, block_size, keep_short=False, labels=False):
    """Concatenate a batch of tokenized texts and cut it into blocks of `block_size` tokens, dropping the remainder
    (upstream). keep_short: a batch shorter than one block stays one short block (upstream run_mlm.py). labels: a
    copy of the ids (a causal LM shifts them inside the model)."""
    joined = {k: list(itertools.chain.from_iterable(v)) for k, v in examples.items()}
    total = len(joined["input_ids"])
    if total >= block_size or not keep_short:
        total -= total % block_size
    blocks = {k: [v[i:i + block_size] for i in range(0, total, block_size)] for k, v in joined.items()}
    if labels:
        blocks["labels"] = [list(ids) for ids in blocks["input_ids"]]
    return blocks


def needed_splits(raw, training_args):
    """The splits a run uses, "train" with --do_train and "validation" with --do_eval; a missing one is an error."""
    import datasets

    needed = {"train": training_args.do_train, "validation": training_args.do_eval}
    for split in (s for s, wanted in needed.items() if wanted and s not in raw):
        option = "--do_train" if split == "train" else "--do_eval"
        raise ValueError(f"{option} needs {split} data (--dataset_name, or --{split}_file)")
    return datasets.DatasetDict({s: raw[s] for s, wanted in needed.items() if wanted})


def require_text(raw, data_args):
    """A split of blank lines only is an error naming its file: a masked LM would train on blocks of special tokens
    alone (a loss of 0, exit code 0), --line_by_line would have no example, a causal LM would learn newlines."""
    for split, ds in raw.items():
        column = text_column(ds)
        if not any(isinstance(text, str) and text.strip()
                   for batch in ds.iter(batch_size=1000) for text in batch[column]):
            raise ValueError(f"{describe_split(data_args, split)} holds no text: its {len(ds)} lines are all blank")


def text_column(dataset):
    """The column of the texts, as upstream: "text", else the first one."""
    return "text" if "text" in dataset.column_names else dataset.column_names[0]


def map_splits(raw, function, data_args, training_args, desc, remove_columns=True, tokenizer=None, options=()):
    """`function` (batched) over every split, the main process first (its cache then serves the others).
    tokenizer, options: for a function that calls `tokenizer` with `options` (see `map_fingerprint`)."""
    import datasets

    with training_args.main_process_first(desc=desc):
        return datasets.DatasetDict({
            split: ds.map(function, batched=True, num_proc=data_args.preprocessing_num_workers,
                          remove_columns=ds.column_names if remove_columns else None,
                          load_from_cache_file=not data_args.overwrite_cache, desc=f"{desc} ({split})",
                          new_fingerprint=map_fingerprint(ds, tokenizer, desc, remove_columns, *options))
            for split, ds in raw.items()})


def map_fingerprint(dataset, tokenizer, *options):
    """The cache fingerprint of `dataset.map(f)` for a function f that tokenizes with `tokenizer`, shaped by
    `options` (its own arguments and what else decides its output: names, lengths, label maps), or None without a
    tokenizer (datasets then makes one itself).

    datasets makes a fingerprint by pickling f, and with it the tokenizer and its whole vocabulary: ~1.5 s per map
    call with GPT-2's (measured: 6 of a tiny run_clm's 9.5 s). The same facts hashed directly: the input's
    fingerprint, the fast tokenizer's complete serialized state (vocabulary, merges, normalisation, pre- and post-
    processing, added tokens) and the attributes its __call__ reads besides, the options, and hf_mgk's version (the
    functions' code). A slow (Python) tokenizer has no such state: None, datasets' own hash."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    from datasets.fingerprint import Hasher

    from .. import __version__

    state = (type(tokenizer).__name__, backend.to_str(), tokenizer.padding_side, tokenizer.truncation_side,
             tokenizer.model_max_length, sorted(tokenizer.special_tokens_map.items()))
    return Hasher.hash(["hf_mgk", __version__, dataset._fingerprint, state, repr(options)])


def tokenize_into_blocks(raw, tokenizer, block_size, option, data_args, training_args, keep_short=False,
                         labels=False, **tokenizer_kwargs):
    """Tokenize every text of each split, then group the tokens into blocks (see `group_texts`). A split that gives
    no block is an error naming its number of tokens (upstream silently trains or evaluates on nothing)."""
    tokenized = tokenize_texts(raw, tokenizer, data_args, training_args, **tokenizer_kwargs)
    return group_into_blocks(tokenized, block_size, option, data_args, training_args, keep_short=keep_short,
                             labels=labels)


def tokenize_texts(raw, tokenizer, data_args, training_args, **tokenizer_kwargs):
    """Every text of each split tokenized on its own (the text column: see `text_column`)."""
    column = text_column(next(iter(raw.values())))

    def tokenize(batch):
        return tokenizer(batch[column], **tokenizer_kwargs)

    return map_splits(raw, tokenize, data_args, training_args, "tokenizing", tokenizer=tokenizer,
                      options=("tokenize_texts", column, sorted(tokenizer_kwargs.items())))


def group_into_blocks(tokenized, block_size, option, data_args, training_args, keep_short=False, labels=False):
    """The second half of `tokenize_into_blocks`: tokenized splits grouped into blocks, a split without one an
    error."""
    blocks = map_splits(tokenized, functools.partial(group_texts, block_size=block_size, keep_short=keep_short,
                                                     labels=labels),
                        data_args, training_args, f"grouping into blocks of {block_size}", remove_columns=False)
    for split, ds in blocks.items():
        if len(ds) == 0:
            n_tokens = sum(map(len, tokenized[split]["input_ids"]))
            raise ValueError(f"{describe_split(data_args, split)} has {n_tokens} tokens, not enough for one block of "
                             f"{block_size} tokens ({option} {block_size}): give more text or a smaller {option}")
    return blocks


def token_stream(tokenized, limit=None):
    """The input_ids of a tokenized split concatenated in order, as one list: every token of the split, where the
    blocks drop each map batch's remainder. limit: at most its first `limit` tokens."""
    stream = list(itertools.chain.from_iterable(tokenized["input_ids"]))
    return stream if limit is None else stream[:limit]


def predicted_ids(logits, labels):
    """preprocess_logits_for_metrics: keep the argmax per position, not (batch, length, vocabulary) logits for the
    whole evaluation set."""
    if isinstance(logits, tuple):  # extra outputs (the cache, hidden states) come after the logits
        logits = logits[0]
    return logits.argmax(dim=-1)


def token_accuracy(shift=0):
    """compute_metrics of a language model: accuracy over the scored tokens (labels != -100). shift=1 for a causal
    LM, whose prediction at position t is of the token at t + 1."""
    from ..metrics import load_metric

    metric = load_metric("accuracy")

    def compute(eval_pred):
        preds, labels = eval_pred
        if shift:
            preds, labels = preds[:, :-shift], labels[:, shift:]
        scored = labels != -100
        return metric.compute(predictions=preds[scored], references=labels[scored])

    return compute


def perplexity(loss):
    try:
        return math.exp(loss)
    except OverflowError:
        return float("inf")


__all__ = ["load_raw_datasets", "hub_dataset", "require_columns", "describe_split", "take", "dataset_label",
           "group_texts", "needed_splits", "require_text", "text_column", "map_splits", "map_fingerprint",
           "tokenize_into_blocks", "tokenize_texts", "group_into_blocks", "token_stream", "predicted_ids",
           "token_accuracy", "perplexity"]
