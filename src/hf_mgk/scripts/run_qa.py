"""Fine-tune and evaluate hf-mgk models on extractive question answering: SQuAD v1.1, and v2.0 with
`--version_2_with_negative` (questions without an answer).

Modelled on transformers' examples/pytorch/question-answering/run_qa.py: the same options and defaults
(--max_seq_length 384, --doc_stride 128, --n_best_size 20, --max_answer_length 30, --null_score_diff_threshold 0.0)
and the same outputs in --output_dir: eval_predictions.json, eval_nbest_predictions.json (and eval_null_odds.json
for v2), eval_results.json with exact match / F1 on the 0-100 scale, and the predict_* files for --do_predict on
--test_file. The post-processing lives in `hf_mgk.qa`. Models: MGK-BERT and NPRF-RoBERTa (a fast tokenizer is
required). Data: --dataset_name squad / squad_v2, or local files in SQuAD's own JSON layout or flat
.json / .jsonl / .csv rows with id, title, context, question, answers.

    python scripts/run_qa.py --model_name_or_path bert-base-uncased --attention_overrides attention_type=mgk \\
        --dataset_name squad --do_train --do_eval --per_device_train_batch_size 12 --learning_rate 3e-5 \\
        --num_train_epochs 2 --output_dir outputs/mgk-bert-squad
"""

import logging
from dataclasses import dataclass, field
from typing import Optional

import transformers
from transformers import DataCollatorWithPadding, default_data_collator

from hf_mgk import hub, qa, training
from hf_mgk.metrics import load_metric

logger = logging.getLogger("run_qa")

_FILE_HELP = ("SQuAD's own JSON layout ({\"version\", \"data\": [{\"title\", \"paragraphs\": [{\"context\", \"qas\": "
              "[{\"id\", \"question\", \"answers\": [{\"text\", \"answer_start\"}], \"is_impossible\"}]}]}]}), or flat "
              "rows with columns id, title, context, question, answers ({\"text\": [...], \"answer_start\": [...]}) "
              "in .json, .jsonl or .csv.")


@dataclass
class DataTrainingArguments(training.DataArguments):
    train_file: Optional[str] = field(default=None, metadata={"help": "A local training file: " + _FILE_HELP})
    validation_file: Optional[str] = field(default=None, metadata={
        "help": "A local evaluation file (--do_eval), in the format of --train_file."})
    test_file: Optional[str] = field(default=None, metadata={"help": (
        "A local file to predict (--do_predict), in the format of --train_file; without answers only the "
        "predictions are written, with them predict_results.json too.")})
    max_seq_length: int = field(default=384, metadata={"help": (
        "Tokens per feature (question + context window); longer contexts are split into overlapping windows. "
        "Lowered to the tokenizer's model_max_length, with a warning.")})
    pad_to_max_length: bool = field(default=True, metadata={"help": (
        "Pad every feature to --max_seq_length; with False, batches are padded to their longest feature.")})
    doc_stride: int = field(default=128, metadata={
        "help": "Tokens shared by consecutive windows of a long context."})
    version_2_with_negative: bool = field(default=False, metadata={
        "help": "SQuAD v2.0: some questions have no answer (empty answers); the model may answer nothing."})
    null_score_diff_threshold: float = field(default=0.0, metadata={"help": (
        "With --version_2_with_negative: answer nothing when the null score (CLS start + end logits) exceeds "
        "the best span's score by more than this.")})
    n_best_size: int = field(default=20, metadata={
        "help": "Best start and end logits searched per window, and answers listed in the n-best file."})
    max_answer_length: int = field(default=30, metadata={"help": "Longest answer, in tokens."})

    def __post_init__(self):
        super().__post_init__()
        for name in ("train_file", "validation_file", "test_file"):
            path = getattr(self, name)
            if path is not None and path.rsplit(".", 1)[-1].lower() not in ("json", "jsonl", "csv"):
                raise ValueError(f"--{name} {path}: use a .json (SQuAD's layout or flat rows), .jsonl or .csv file")
        for name in ("max_seq_length", "n_best_size", "max_answer_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1; got {getattr(self, name)}")
        if not 0 <= self.doc_stride < self.max_seq_length:
            raise ValueError(f"--doc_stride must be in 0..max_seq_length-1; got {self.doc_stride} with "
                             f"--max_seq_length {self.max_seq_length}")


def load_examples(data_args, model_args, training_args):
    """{"train", "validation", "test"} examples the run needs, in the flat layout, checked."""
    wanted = {"train": training_args.do_train, "validation": training_args.do_eval, "test": training_args.do_predict}
    if data_args.dataset_name is not None:
        raw = training.load_raw_datasets(data_args, model_args)
    else:
        files = {s: getattr(data_args, f"{s}_file") for s in wanted if getattr(data_args, f"{s}_file") is not None}
        # Hold out validation examples only when evaluating without a validation file.
        pct = data_args.validation_split_percentage if training_args.do_eval else None
        raw = qa.load_local_datasets(files, pct)
    option = {"train": "--train_file", "validation": "--validation_file", "test": "--test_file"}
    flag = {"train": "--do_train", "validation": "--do_eval", "test": "--do_predict"}
    examples = {}
    for split, needed in wanted.items():
        if not needed:
            continue
        if split not in raw:
            raise ValueError(f"{flag[split]} needs {option[split]} or a dataset with a {split} split")
        ds = raw[split]
        where = f"the {split} data"
        training.require_columns(ds, [c for c in qa.REQUIRED_COLUMNS if split != "test" or c != "answers"], where)
        limit = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
                 "test": data_args.max_predict_samples}[split]
        ds = training.take(ds, limit)
        qa.check_examples(ds, data_args.version_2_with_negative, where)
        examples[split] = ds
    return examples


def main(argv=None):
    model_args, data_args, training_args = training.parse_args(DataTrainingArguments, argv)
    training.setup_logging(training_args)
    transformers.set_seed(training_args.seed)
    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise ValueError("nothing to do: pass --do_train, --do_eval and/or --do_predict")
    if not model_args.use_fast_tokenizer:
        raise ValueError("run_qa needs a fast tokenizer (offset mappings from the `tokenizers` library); drop "
                         "--use_fast_tokenizer False")

    identity = training.run_identity("run_qa", model_args, data_args, task_name="squad_v2" if
                                     data_args.version_2_with_negative else "squad",
                                     max_seq_length=data_args.max_seq_length, doc_stride=data_args.doc_stride)
    checkpoint = training.prepare_output_dir(training_args, identity)
    examples = load_examples(data_args, model_args, training_args)

    tokenizer = training.load_tokenizer(model_args)
    qa.require_fast_tokenizer(tokenizer)
    if tokenizer.padding_side != "right" and not data_args.pad_to_max_length:
        # Batches padded on the left would shift every feature's logits against its offset mapping.
        raise ValueError("a tokenizer that pads on the left needs --pad_to_max_length (the default)")
    plan = training.plan_model(model_args)
    family = plan.family
    model = training.load_model(plan, "qa", **training.new_model_kwargs(model_args, tokenizer))
    training.fit_vocabulary(model, tokenizer)
    max_seq_length = data_args.max_seq_length
    if max_seq_length > tokenizer.model_max_length:  # as upstream
        logger.warning("--max_seq_length %d is more than the tokenizer's model_max_length %d; using %d",
                       max_seq_length, tokenizer.model_max_length, tokenizer.model_max_length)
        max_seq_length = tokenizer.model_max_length
    # A length beyond the model's position table is an error now rather than at the first batch.
    max_seq_length = training.sequence_length(max_seq_length, "--max_seq_length", tokenizer, model.config)

    maker = qa.FeatureMaker(tokenizer, max_seq_length, data_args.doc_stride, data_args.pad_to_max_length)

    def features(split, fn, desc):
        with training_args.main_process_first(desc=desc):
            return examples[split].map(fn, batched=True, remove_columns=examples[split].column_names, desc=desc,
                                       num_proc=data_args.preprocessing_num_workers,
                                       load_from_cache_file=not data_args.overwrite_cache,
                                       new_fingerprint=training.map_fingerprint(
                                           examples[split], tokenizer, "run_qa", fn.__name__, max_seq_length,
                                           data_args.doc_stride, data_args.pad_to_max_length))

    train_dataset = eval_dataset = predict_dataset = None
    if training_args.do_train:
        # One example gives several features; --max_train_samples also bounds the features, as upstream.
        train_dataset = training.take(features("train", maker.train_features, "train features"),
                                      data_args.max_train_samples)
    if training_args.do_eval:
        eval_dataset = features("validation", maker.eval_features, "validation features")
    if training_args.do_predict:
        predict_dataset = features("test", maker.eval_features, "test features")

    def post_process(examples_, features_, logits, stage):
        answers, _, _ = qa.postprocess_qa_predictions(
            examples_, features_, logits, version_2_with_negative=data_args.version_2_with_negative,
            n_best_size=data_args.n_best_size, max_answer_length=data_args.max_answer_length,
            null_score_diff_threshold=data_args.null_score_diff_threshold,
            output_dir=training_args.output_dir if training_args.should_save else None, prefix=stage)
        return qa.metric_inputs(answers, examples_, data_args.version_2_with_negative)

    metric = load_metric("squad_v2" if data_args.version_2_with_negative else "squad")

    def compute_metrics(p):
        return metric.compute(predictions=p.predictions, references=p.label_ids)

    accepted = ("exact", "f1", "HasAns_exact", "HasAns_f1", "best_exact", "best_f1") if (
        data_args.version_2_with_negative) else ("exact_match", "f1")
    best = (training_args.metric_for_best_model or "").removeprefix("eval_")
    if training_args.load_best_model_at_end and best not in accepted:
        # Evaluation features carry no answer positions, so there is no eval loss (Trainer's default) to compare.
        raise ValueError(f"--load_best_model_at_end needs --metric_for_best_model, one of {', '.join(accepted)}; "
                         f"got {training_args.metric_for_best_model}")

    collator = default_data_collator if data_args.pad_to_max_length else DataCollatorWithPadding(
        tokenizer, pad_to_multiple_of=8 if training_args.fp16 or training_args.bf16 else None)
    trainer = qa.QuestionAnsweringTrainer(
        model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
        eval_examples=examples.get("validation"), processing_class=tokenizer, data_collator=collator,
        post_process_function=post_process, compute_metrics=compute_metrics)

    results = {}
    if training_args.do_train:
        # Only a training run owns --output_dir (evaluating into a model's folder must not rewrite its identity).
        training.write_run_info(training_args, identity, task="question-answering",
                                dataset=training.dataset_label(data_args), base_model=training.base_model(plan),
                                family=family)
        results.update(training.train_and_save(trainer, checkpoint, len(train_dataset)))
    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        results.update(training.evaluate_and_save(trainer, eval_dataset, len(eval_dataset)))
    if training_args.do_predict:
        logger.info("*** Predict ***")
        output = trainer.predict(predict_dataset, examples["test"])
        metrics = {**output.metrics, "predict_samples": len(predict_dataset)}
        trainer.log_metrics("predict", metrics)
        training.save_metrics(trainer, "predict", metrics)
        results.update(metrics)
    hub.push_to_hub_at_end(trainer)
    training.close_distributed()
    return results


if __name__ == "__main__":
    training.run_script(main)
