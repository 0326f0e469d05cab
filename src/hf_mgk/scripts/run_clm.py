"""Causal language modelling with FiSH-GPT2, MGK-GPT2, or NPRF-RoBERTa as a decoder: pre-train from scratch
(`--model_type`), warm-start from a stock GPT-2 / RoBERTa checkpoint, or continue an hf-mgk one. Modelled on transformers'
examples/pytorch/language-modeling/run_clm.py: the texts are tokenized, concatenated and cut into blocks of
--block_size tokens (the remainder dropped), each block its own labels (the model shifts them), and evaluation
reports the loss, "perplexity" = exp(eval_loss) and "eval_accuracy" of the next-token predictions. `--eval_stride S`
adds the papers' sliding-window evaluation (eval_strided_loss, eval_strided_perplexity; `hf_mgk.lm_eval`).

NPRF-RoBERTa is built with `is_decoder=True` (causal attention), also when the checkpoint it starts from was
trained bidirectionally. Text that gives no block (fewer tokens than --block_size) is an error, where upstream
would train on nothing. A stock GPT-2 warm-starts FiSH-GPT2 or MGK-GPT2: `--family` chooses, else the
attention_type of --attention_overrides does (fish types: FiSH-GPT2, MGK types: MGK-GPT2), else FiSH-GPT2.

    python scripts/run_clm.py --model_name_or_path gpt2 --attention_overrides attention_type=fish,num_global_heads=4 \\
        --dataset_name wikitext --dataset_config_name wikitext-103-raw-v1 --do_train --do_eval \\
        --output_dir outputs/fish-gpt2-clm
    # MGK-GPT2 keeping 6 of GPT-2's 12 heads (every other one), M = 2 keys: the MGK paper's WikiText-103 setting
    python scripts/run_clm.py --model_name_or_path gpt2 --attention_overrides attention_type=mgk,num_keys=2,n_head=6 \
        --keep_heads 0,2,4,6,8,10 --dataset_name wikitext --dataset_config_name wikitext-103-raw-v1 \
        --do_train --do_eval --output_dir outputs/mgk-gpt2-clm
    python scripts/run_clm.py --model_type mgk-gpt2 --tokenizer_name gpt2 \
        --config_overrides n_layer=6,n_head=4,num_keys=2 --train_file train.txt --do_train --output_dir out/new
"""

import logging
from dataclasses import dataclass, field
from typing import Optional

from transformers import Trainer, default_data_collator, set_seed

from hf_mgk import hub, lm_eval, training
from hf_mgk.families import FAMILIES

logger = logging.getLogger("run_clm")


@dataclass
class DataTrainingArguments(training.DataArguments):
    """The data options of run_clm.py (files: .txt, one text per line, or .csv / .json with a "text" column, else
    the first column is taken)."""

    block_size: Optional[int] = field(default=None, metadata={"help": (
        "Tokens per training block: the texts are concatenated and cut into blocks of this length. Default: the "
        "tokenizer's model_max_length, at most 1024 and at most what the model's position table takes. Longer "
        "than the model's positions is an error, and so is text shorter than one block.")})

    eval_stride: Optional[int] = field(default=None, metadata={"help": (
        "Also evaluate as the MGK / FiSH papers do (transformers' 'perplexity of fixed-length models'): the "
        "validation text as one token stream, read in windows of --block_size tokens that start this many tokens "
        "apart, each scoring only its last eval_stride tokens (the first window all of its own): below the block "
        "size every token is predicted once, from at least block_size - eval_stride tokens before it. Adds eval_strided_loss and "
        "eval_strided_perplexity beside the block loss and perplexity. 1 .. block size; 1 is the papers' protocol "
        "(one forward pass per token). With --max_eval_samples N, the stream's first N x block_size tokens. Runs "
        "on the main process only, in the model's dtype (no --bf16 / --fp16 autocast).")})

    def __post_init__(self):
        super().__post_init__()
        if self.block_size is not None and self.block_size < 2:
            raise ValueError(f"--block_size must be >= 2 (a token and the next one); got {self.block_size}")
        if self.eval_stride is not None and self.eval_stride < 1:
            raise ValueError(f"--eval_stride must be in 1..block size (the tokens each window scores); got "
                             f"{self.eval_stride}")
        if self.eval_stride is not None and self.block_size is not None and self.eval_stride > self.block_size:
            raise ValueError(f"--eval_stride {self.eval_stride} is longer than a block (--block_size "
                             f"{self.block_size}): give 1..{self.block_size}")


def decoder_kwargs(plan):
    """NPRF-RoBERTa predicts the next token only with causal attention: is_decoder=True."""
    model_args = plan.model_args
    if not FAMILIES[plan.family].causal_lm_is_decoder:
        return {}
    saved = plan.checkpoint
    if saved is not None and not saved.get("is_decoder", False):
        logger.warning("%s was trained bidirectionally (is_decoder=False); it is trained here as a causal decoder "
                       "(is_decoder=True)", model_args.model_name_or_path or model_args.config_name)
    logger.info("NPRF-RoBERTa as a causal language model: is_decoder=True")
    return {"is_decoder": True}


def strided_metrics(trainer, tokenized, block_size, data_args):
    """{"strided_loss", "strided_perplexity"} of --eval_stride over the validation text as one token stream
    (`hf_mgk.lm_eval.strided_eval`), on the main process only (the others wait for it, at most --ddp_timeout
    seconds, in the evaluation that follows); {} on the other processes."""
    if not trainer.is_world_process_zero():
        return {}
    limit = None if data_args.max_eval_samples is None else data_args.max_eval_samples * block_size
    stream = training.token_stream(tokenized, limit)
    result = lm_eval.strided_eval(trainer.model, stream, block_size, data_args.eval_stride,
                                  trainer.args.per_device_eval_batch_size, trainer.args.device)
    logger.info("strided evaluation (--eval_stride %d, windows of %d): %d windows, %d scored tokens, loss %.4f",
                data_args.eval_stride, block_size, result["windows"], result["scored_tokens"], result["loss"])
    return {"strided_loss": result["loss"], "strided_perplexity": result["perplexity"]}


def main(argv=None):
    model_args, data_args, training_args = training.parse_args(DataTrainingArguments, argv)
    training.setup_logging(training_args)
    if not (training_args.do_train or training_args.do_eval):
        raise ValueError("nothing to do: give --do_train and/or --do_eval")
    if data_args.eval_stride is not None and not training_args.do_eval:
        raise ValueError("--eval_stride is an evaluation: give --do_eval with it")
    set_seed(training_args.seed)
    identity = training.run_identity("run_clm", model_args, data_args, block_size=data_args.block_size)
    checkpoint = training.prepare_output_dir(training_args, identity)

    tokenizer = training.load_tokenizer(model_args)
    plan = training.plan_model(model_args)
    model = training.load_model(plan, "clm", **decoder_kwargs(plan),
                                **training.new_model_kwargs(model_args, tokenizer))
    family = plan.family
    training.fit_vocabulary(model, tokenizer)
    block_size = training.sequence_length(data_args.block_size, "--block_size", tokenizer, model.config)

    if data_args.eval_stride is not None and data_args.eval_stride > block_size:  # block_size was not given
        raise ValueError(f"--eval_stride {data_args.eval_stride} is longer than a block ({block_size} tokens, "
                         f"--block_size not given): give 1..{block_size}")

    raw = training.needed_splits(training.load_raw_datasets(data_args, model_args), training_args)
    training.require_text(raw, data_args)
    tokenized = training.tokenize_texts(raw, tokenizer, data_args, training_args)
    blocks = training.group_into_blocks(tokenized, block_size, "--block_size", data_args, training_args, labels=True)
    train_dataset = training.take(blocks["train"], data_args.max_train_samples) if training_args.do_train else None
    eval_dataset = training.take(blocks["validation"], data_args.max_eval_samples) if training_args.do_eval else None

    trainer = Trainer(
        model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
        processing_class=tokenizer, data_collator=default_data_collator,  # blocks are all block_size long
        compute_metrics=training.token_accuracy(shift=1) if training_args.do_eval else None,
        preprocess_logits_for_metrics=training.predicted_ids if training_args.do_eval else None)

    results = {}
    if training_args.do_train:
        training.write_run_info(training_args, identity, task="text-generation",
                                dataset=training.dataset_label(data_args), base_model=training.base_model(plan),
                                family=family)
        results.update(training.train_and_save(trainer, checkpoint, len(train_dataset)))
    if training_args.do_eval:
        strided = {}
        if data_args.eval_stride is not None:
            strided = strided_metrics(trainer, tokenized["validation"], block_size, data_args)
        results.update(training.evaluate_and_save(trainer, eval_dataset, len(eval_dataset), with_perplexity=True,
                                                  **strided))
    hub.push_to_hub_at_end(trainer)
    training.close_distributed()
    return results


if __name__ == "__main__":
    training.run_script(main)
