"""Masked language modelling with MGK-BERT or NPRF-RoBERTa: pre-train from scratch, warm-start from a stock
BERT / RoBERTa checkpoint, or continue an hf-mgk one. Modelled on transformers'
examples/pytorch/language-modeling/run_mlm.py: the texts are tokenized and grouped into blocks of
--max_seq_length tokens (or one example per line with --line_by_line), masked by DataCollatorForLanguageModeling
(--mlm_probability; 80% [MASK], 10% a random token, 10% kept), and evaluation reports the loss, "perplexity" =
exp(eval_loss) and "eval_accuracy" over the masked tokens.

One difference from upstream: each example's masks are drawn from its own generator, seeded by (--seed, the
epoch, the example's tokens), not from one random stream shared by the batch. The masks then do not depend on
the batch size or the number of processes (one process with batch 4 and `torchrun --nproc_per_node 2` with
batch 2 train on the same masked batches, so on the same losses), they still change every epoch as upstream's
dynamic masking does, and every evaluation masks the same tokens (its numbers compare across checkpoints).

    python scripts/run_mlm.py --model_name_or_path bert-base-uncased \\
        --attention_overrides attention_type=mgk,num_keys=2 --dataset_name wikitext \\
        --dataset_config_name wikitext-103-raw-v1 --do_train --do_eval --output_dir outputs/mgk-bert-mlm
"""

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, set_seed

from hf_mgk import hub, training

logger = logging.getLogger("run_mlm")


@dataclass
class DataTrainingArguments(training.DataArguments):
    """The data options of run_mlm.py (files: .txt, one text per line, or .csv / .json with a "text" column, else
    the first column is taken)."""

    max_seq_length: Optional[int] = field(default=None, metadata={"help": (
        "Tokens per block (or the longest line with --line_by_line). Default: the tokenizer's model_max_length, at "
        "most 1024 and at most what the model's position table takes. Longer than the model's positions is an "
        "error.")})
    line_by_line: bool = field(default=False, metadata={"help": (
        "One example per non-empty line (truncated to --max_seq_length) instead of the texts concatenated and cut "
        "into blocks.")})
    pad_to_max_length: bool = field(default=False, metadata={"help": (
        "With --line_by_line: pad every line to --max_seq_length. Otherwise each batch is padded to its longest "
        "line.")})
    mlm_probability: float = field(default=0.15, metadata={"help": (
        "Share of the tokens (special tokens and padding excluded) that are masked and predicted. Each example's "
        "masks depend on --seed, the epoch and its tokens only, not on the batch or the number of processes.")})

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.mlm_probability <= 1:
            raise ValueError(f"--mlm_probability must be in (0, 1]; got {self.mlm_probability}")
        if self.max_seq_length is not None and self.max_seq_length < 1:
            raise ValueError(f"--max_seq_length must be >= 1; got {self.max_seq_length}")
        if self.pad_to_max_length and not self.line_by_line:
            raise ValueError("--pad_to_max_length goes with --line_by_line (grouped blocks are already "
                             "--max_seq_length long)")


@dataclass
class ExampleSeededMasking(DataCollatorForLanguageModeling):
    """Upstream's masking, with each example masked by its own generator seeded from (mask_seed, epoch, its
    tokens). `epoch` is set by `MaskEpochCallback` in training; None (evaluation) gives the same masks every
    time. Padding is added after the masks are drawn on the example's own tokens, so it changes nothing."""

    mask_seed: int = 0
    epoch: Optional[int] = None

    def torch_call(self, examples):
        self._rows = [self._ids(e) for e in examples]
        return super().torch_call(examples)

    @staticmethod
    def _ids(example):
        return example["input_ids"] if isinstance(example, Mapping) else example

    def example_seed(self, ids):
        key = f"{self.mask_seed}/{self.epoch}".encode()
        digest = hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=8, key=key).digest()
        return int.from_bytes(digest, "little") >> 1  # manual_seed takes < 2**63 on every platform

    def torch_mask_tokens(self, inputs, special_tokens_mask=None, offset_mapping=None):
        labels = torch.full_like(inputs, -100)
        width = inputs.shape[1]
        for row, ids in enumerate(self._rows):
            n = len(ids)
            cols = slice(0, n) if self.tokenizer.padding_side == "right" else slice(width - n, width)
            special = None if special_tokens_mask is None else special_tokens_mask[row:row + 1, cols]
            self.generator = torch.Generator().manual_seed(self.example_seed(ids))
            inputs[row:row + 1, cols], labels[row:row + 1, cols] = super().torch_mask_tokens(
                inputs[row:row + 1, cols].clone(), special_tokens_mask=special)
        return inputs, labels


class MaskEpochCallback(TrainerCallback):
    """Gives the collator the epoch that starts (before its data loader is iterated, workers included)."""

    def __init__(self, collator):
        self.collator = collator

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.collator.epoch = int(state.epoch or 0)  # a resumed epoch starts at a fraction


class MaskedLMTrainer(Trainer):
    """Evaluation masks without the epoch: every evaluation of a model scores the same masked tokens."""

    def evaluate(self, *args, **kwargs):
        epoch, self.data_collator.epoch = self.data_collator.epoch, None
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            self.data_collator.epoch = epoch


def prepare_datasets(raw, tokenizer, max_seq_length, data_args, training_args):
    """Tokenized examples per split: one per non-empty line (--line_by_line), else blocks of max_seq_length tokens
    (a text shorter than one block stays one shorter block, as upstream)."""
    if not data_args.line_by_line:
        # The special tokens mask saves the collator from recomputing it.
        return training.tokenize_into_blocks(raw, tokenizer, max_seq_length, "--max_seq_length", data_args,
                                             training_args, keep_short=True, return_special_tokens_mask=True)
    column = training.text_column(next(iter(raw.values())))
    padding = "max_length" if data_args.pad_to_max_length else False
    # Blank lines are dropped before tokenizing: a batch of them only would give the tokenizer an empty list.
    with training_args.main_process_first(desc="dropping blank lines"):
        raw = raw.filter(lambda batch: [bool(line and line.strip()) for line in batch[column]], batched=True,
                         load_from_cache_file=not data_args.overwrite_cache, desc="dropping blank lines")

    def tokenize(batch):
        return tokenizer(batch[column], padding=padding, truncation=True, max_length=max_seq_length,
                         return_special_tokens_mask=True)

    return training.map_splits(raw, tokenize, data_args, training_args, "tokenizing line by line", tokenizer=tokenizer,
                               options=("line_by_line", column, padding, max_seq_length))


def require_masked_tokens(collator, dataset, where, batch_size=64):
    """Evaluation scores the masked tokens, the same ones every time: a set too small to have one would train and
    then fail in the metric ("Found empty input array"). Checked before training; stops at the first batch with one."""
    for start in range(0, len(dataset), batch_size):
        batch = collator([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))])
        if (batch["labels"] != -100).any():
            return
    n_tokens = sum(len(mask) - sum(mask) for mask in dataset["special_tokens_mask"])
    raise ValueError(f"{where} is too little to evaluate on: masking --mlm_probability {collator.mlm_probability} of "
                     f"its {n_tokens} tokens (special tokens not counted) masks none. Give more evaluation text")


def main(argv=None):
    model_args, data_args, training_args = training.parse_args(DataTrainingArguments, argv)
    training.setup_logging(training_args)
    if not (training_args.do_train or training_args.do_eval):
        raise ValueError("nothing to do: give --do_train and/or --do_eval")
    set_seed(training_args.seed)
    identity = training.run_identity("run_mlm", model_args, data_args, max_seq_length=data_args.max_seq_length,
                                     line_by_line=data_args.line_by_line)
    checkpoint = training.prepare_output_dir(training_args, identity)

    tokenizer = training.load_tokenizer(model_args)
    if tokenizer.mask_token is None:
        raise ValueError("the tokenizer has no mask token, which masked language modelling needs")
    # A masked LM attends both ways, whatever a loaded checkpoint was trained as.
    plan = training.plan_model(model_args)
    family = plan.family
    model = training.load_model(plan, "mlm", is_decoder=False,
                                        **training.new_model_kwargs(model_args, tokenizer))
    training.fit_vocabulary(model, tokenizer)
    max_seq_length = training.sequence_length(data_args.max_seq_length, "--max_seq_length", tokenizer,
                                              model.config)

    raw = training.needed_splits(training.load_raw_datasets(data_args, model_args), training_args)
    training.require_text(raw, data_args)
    processed = prepare_datasets(raw, tokenizer, max_seq_length, data_args, training_args)
    train_dataset = training.take(processed["train"], data_args.max_train_samples) if training_args.do_train else None
    eval_dataset = training.take(processed["validation"], data_args.max_eval_samples) if training_args.do_eval else None

    # As upstream: fp16 runs fastest on lengths that are multiples of 8, which dynamic padding may not give.
    pad_to_multiple_of_8 = data_args.line_by_line and training_args.fp16 and not data_args.pad_to_max_length
    collator = ExampleSeededMasking(tokenizer=tokenizer, mlm_probability=data_args.mlm_probability,
                                    pad_to_multiple_of=8 if pad_to_multiple_of_8 else None,
                                    mask_seed=training_args.seed)
    if training_args.do_eval:
        require_masked_tokens(collator, eval_dataset, training.describe_split(data_args, "validation"))
    trainer = MaskedLMTrainer(
        model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
        processing_class=tokenizer, data_collator=collator, callbacks=[MaskEpochCallback(collator)],
        compute_metrics=training.token_accuracy() if training_args.do_eval else None,
        preprocess_logits_for_metrics=training.predicted_ids if training_args.do_eval else None)

    results = {}
    if training_args.do_train:
        training.write_run_info(training_args, identity, task="fill-mask", dataset=training.dataset_label(data_args),
                                base_model=training.base_model(plan), family=family)
        results.update(training.train_and_save(trainer, checkpoint, len(train_dataset)))
    if training_args.do_eval:
        results.update(training.evaluate_and_save(trainer, eval_dataset, len(eval_dataset), with_perplexity=True))
    hub.push_to_hub_at_end(trainer)
    training.close_distributed()
    return results


if __name__ == "__main__":
    training.run_script(main)
