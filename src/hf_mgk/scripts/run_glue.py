"""Fine-tune MGK-BERT, FiSH-GPT2, MGK-GPT2 or NPRF-RoBERTa for sequence classification: the nine GLUE tasks or your own.

Modelled on transformers' examples/pytorch/text-classification/run_glue.py, with the same options
(`--task_name`, `--max_seq_length`, `--pad_to_max_length`, `--train_file` / `--validation_file` / `--test_file`,
`--max_*_samples`, `--dataset_name` / `--dataset_config_name`) and the same results files. Beyond upstream:

- a GLUE task also runs on local files in the column layout of the Hub's `nyu-mll/glue` (labels as names or ids);
  MNLI takes `--validation_mismatched_file`, `--test_mismatched_file` and `--ax_file`;
- `--do_predict` also writes the GLUE server's submission files to `<output_dir>/glue_submission/`;
- a checkpoint that already classifies another label set is an error (upstream ignores its labels silently);
  labels outside the task's label set and missing columns are errors naming the file;
- FiSH-GPT2 and MGK-GPT2 (GPT-2 has no padding token) pad with the end-of-text token, set on the tokenizer and the
  config.

    python scripts/run_glue.py --model_name_or_path bert-base-uncased --attention_overrides attention_type=mgk \\
        --task_name mnli --do_train --do_eval --do_predict --output_dir out/mgk-bert-mnli
"""

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import transformers
from transformers import DataCollatorWithPadding, Trainer, default_data_collator

from hf_mgk import hub, training
from hf_mgk.families import FAMILIES
from hf_mgk.metrics import load_metric

logger = logging.getLogger("run_glue")

# The input columns of each task, as in the Hub's GLUE dataset (nyu-mll/glue).
TASK_KEYS = {
    "cola": ("sentence", None),
    "mnli": ("premise", "hypothesis"),
    "mrpc": ("sentence1", "sentence2"),
    "qnli": ("question", "sentence"),
    "qqp": ("question1", "question2"),
    "rte": ("sentence1", "sentence2"),
    "sst2": ("sentence", None),
    "stsb": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"),
}
# The label names of the Hub's GLUE dataset in its id order; STS-B is a regression on a 0-5 score.
TASK_LABELS = {
    "cola": ["unacceptable", "acceptable"],
    "mnli": ["entailment", "neutral", "contradiction"],
    "mrpc": ["not_equivalent", "equivalent"],
    "qnli": ["entailment", "not_entailment"],
    "qqp": ["not_duplicate", "duplicate"],
    "rte": ["entailment", "not_entailment"],
    "sst2": ["negative", "positive"],
    "stsb": None,
    "wnli": ["not_entailment", "entailment"],
}
STSB_RANGE = (0.0, 5.0)
GLUE_HUB = ("nyu-mll/glue", "glue")
# The GLUE server's file name for each test set. It reads the label names for the inference tasks and the 0/1 ids
# for the others (as its sample submission and jiant's exporter write them); STS-B scores as numbers.
SUBMISSION_FILES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B",
                    "mnli": "MNLI-m", "mnli-mm": "MNLI-mm", "ax": "AX", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
SUBMIT_NAMES = {"mnli", "mnli-mm", "ax", "qnli", "rte"}
MNLI_SPLITS = ("validation_mismatched", "test_mismatched", "ax")  # local files: --<split>_file


@dataclass
class DataTrainingArguments(training.DataArguments):
    task_name: Optional[str] = field(default=None, metadata={"help": (
        f"The GLUE task: one of {', '.join(TASK_KEYS)}. Its data comes from the Hub's nyu-mll/glue unless local "
        "files are given (the Hub's column layout, labels as names or ids). Leave unset for your own task: "
        "labels from the training file's 'label' column (a regression if they are floats), inputs 'sentence1' / "
        "'sentence2' or else the first one or two other columns.")})
    max_seq_length: int = field(default=128, metadata={
        "help": "Longest tokenized input; longer ones are truncated (shorter ones padded, see --pad_to_max_length)."})
    pad_to_max_length: bool = field(default=True, metadata={"help": (
        "Pad every input to --max_seq_length. --no_pad_to_max_length pads each batch to its longest input "
        "instead (faster on GPUs and CPUs, not on TPUs).")})
    test_file: Optional[str] = field(default=None, metadata={
        "help": "A local file to predict with --do_predict (its labels, if any, are ignored); MNLI: the matched one."})
    validation_mismatched_file: Optional[str] = field(default=None, metadata={
        "help": "MNLI with local files: the mismatched validation file (--validation_file is the matched one)."})
    test_mismatched_file: Optional[str] = field(default=None, metadata={
        "help": "MNLI with local files: the mismatched test file (--test_file is the matched one)."})
    ax_file: Optional[str] = field(default=None, metadata={"help": (
        "MNLI with local files: GLUE's diagnostic set AX (premise, hypothesis), predicted with the MNLI model "
        "into AX.tsv by --do_predict. From the Hub it is nyu-mll/glue's 'ax'.")})

    def __post_init__(self):
        if self.task_name is not None:
            self.task_name = self.task_name.lower()
            if self.task_name not in TASK_KEYS:
                raise ValueError(f"--task_name {self.task_name}: not a GLUE task; use one of {', '.join(TASK_KEYS)} "
                                 "(or leave it unset for your own task with --train_file / --validation_file)")
        local = any(getattr(self, f"{s}_file") is not None for s in ("train", "validation", "test", *MNLI_SPLITS))
        if self.dataset_name in GLUE_HUB:
            if self.dataset_config_name not in TASK_KEYS:
                raise ValueError(f"--dataset_name {self.dataset_name} needs --dataset_config_name, one of "
                                 f"{', '.join(TASK_KEYS)} (AX is predicted by an MNLI run); got "
                                 f"{self.dataset_config_name!r}")
            if self.task_name not in (None, self.dataset_config_name):
                raise ValueError(f"--task_name {self.task_name} and --dataset_config_name "
                                 f"{self.dataset_config_name} name different GLUE tasks")
            self.task_name = self.dataset_config_name
        elif self.task_name is not None and self.dataset_name is None and not local:
            self.dataset_name, self.dataset_config_name = GLUE_HUB[0], self.task_name
        if self.dataset_name is not None and local:
            raise ValueError(f"give --dataset_name {self.dataset_name} or local files, not both")
        super().__post_init__()
        for name in (f"{split}_file" for split in MNLI_SPLITS):
            path = getattr(self, name)
            if path is None:
                continue
            if self.task_name != "mnli" or self.dataset_name is not None:
                raise ValueError(f"--{name} goes only with --task_name mnli and local files")
            training.check_data_file(f"--{name}", path)
        if self.max_seq_length < 1:
            raise ValueError(f"--max_seq_length must be >= 1; got {self.max_seq_length}")

    @property
    def from_glue_hub(self):
        """A GLUE task read from a Hub dataset in nyu-mll/glue's layout (rather than from local files)."""
        return self.task_name is not None and self.dataset_name is not None


def load_data(data_args, model_args, training_args):
    """The raw splits: train, validation, test and, for MNLI, validation_mismatched, test_mismatched, ax."""
    if not data_args.from_glue_hub:
        return training.load_raw_datasets(data_args, model_args, splits=("train", "validation", "test", *MNLI_SPLITS),
                                          extension_map={"csv": "csv", "tsv": "csv", "json": "json", "jsonl": "json"})
    hub = {k: v for k, v in model_args.hub_kwargs().items() if k != "revision"}
    raw = training.hub_dataset(data_args.dataset_name, data_args.dataset_config_name, **hub)
    for name in list(raw):  # MNLI: validation_matched -> validation, test_matched -> test
        if name.endswith("_matched"):
            raw[name[: -len("_matched")]] = raw.pop(name)
    if data_args.task_name == "mnli" and training_args.do_predict:
        raw["ax"] = training.hub_dataset(data_args.dataset_name, "ax", split="test", **hub)
    return raw


def class_names(dataset):
    feature = dataset.features.get("label")
    return getattr(feature, "names", None)  # a ClassLabel's names (its values are ids)


def task_label(value, label_list, names, task):
    """A label value as the task's label: its name (a float for a regression), or None when it is not one."""
    if value is None:
        return None
    if label_list is None:
        try:
            score = float(value)
        except (TypeError, ValueError):
            return None
        if math.isnan(score) or (task == "stsb" and not STSB_RANGE[0] <= score <= STSB_RANGE[1]):
            return None
        return score
    if names is not None:  # a ClassLabel column holds ids
        value = names[value] if 0 <= value < len(names) else None
    elif task is not None and str(value).isdigit():  # GLUE labels may be given as the Hub dataset's ids
        value = label_list[int(value)] if int(value) < len(label_list) else None
    return str(value) if str(value) in label_list else None


def label_lookup(dataset, label_list, task, where):
    """{value in the 'label' column: task label}; a clear error for values outside the task's label set."""
    names = class_names(dataset)
    lookup, bad = {}, []
    for value in dataset.unique("label"):
        label = task_label(value, label_list, names, task)
        if label is None:
            bad.append(value)
        else:
            lookup[value] = label
    if bad:
        if label_list is None:
            expected = "numbers" + (" from {} to {}".format(*STSB_RANGE) if task == "stsb" else "")
        else:
            expected = ", ".join(label_list) + (f" (or their ids 0..{len(label_list) - 1})" if task else "")
        shown = ", ".join(repr(v) for v in bad[:10]) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise ValueError(f"{where} has labels outside the task's label set: {shown}. Expected: {expected}")
    return lookup


def task_labels(raw, data_args):
    """(label names in the task's order, or None for a regression) of a GLUE task or of your own data."""
    if data_args.task_name is not None:
        return TASK_LABELS[data_args.task_name]
    split = next((s for s in ("train", "validation") if s in raw), None)
    if split is None:
        raise ValueError("your own task (no --task_name) takes its labels from --train_file or --validation_file: "
                         "give one")
    dataset = raw[split]
    training.require_columns(dataset, ["label"], training.describe_split(data_args, split))
    if class_names(dataset) is not None:
        return list(class_names(dataset))
    if dataset.features["label"].dtype in ("float32", "float64"):
        return None
    values = [v for v in dataset.unique("label") if v is not None]
    return [str(v) for v in sorted(values)]  # sorted for determinism, as upstream


def input_columns(dataset, task):
    """The one or two text columns: the task's, or upstream's choice for your own data."""
    if task is not None:
        return TASK_KEYS[task]
    others = [c for c in dataset.column_names if c != "label"]
    if "sentence1" in others and "sentence2" in others:
        return "sentence1", "sentence2"
    return (others[0], others[1]) if len(others) >= 2 else (others[0], None)


def checkpoint_labels(config_dict):
    """The labels a checkpoint already classifies (its id2label names in id order), or None when it is not a
    sequence classifier (a pretrained body: its head is new either way)."""
    if config_dict is None:
        return None
    id2label = config_dict.get("id2label") or {"0": "LABEL_0", "1": "LABEL_1"}
    names = [id2label[k] for k in sorted(id2label, key=int)]
    named = any(name != f"LABEL_{i}" for i, name in enumerate(names))
    classifier = any(a.endswith("ForSequenceClassification") for a in config_dict.get("architectures") or [])
    return names if named or classifier else None


def _label_set(names):
    return "a regression (one output)" if names is None else f"{len(names)} labels ({', '.join(names)})"


def model_labels(label_list, saved, source, task):
    """id2label for the model: the task's order for a new classifier, the checkpoint's order when it already
    classifies the same labels (its head keeps its meaning); a clear error when it classifies others."""
    if saved is not None:
        unnamed = all(name == f"LABEL_{i}" for i, name in enumerate(saved))
        wanted = 1 if label_list is None else len(label_list)
        same = len(saved) == wanted and (unnamed or label_list is None
                                         or sorted(n.lower() for n in saved) == sorted(n.lower() for n in label_list))
        if not same:
            raise ValueError(
                f"--model_name_or_path {source} is already a sequence classifier for "
                f"{_label_set(None if len(saved) == 1 and unnamed else saved)}, but {task or 'this task'} has "
                f"{_label_set(label_list)}. Its classifier cannot be reused for another label set: start from the "
                "checkpoint it was fine-tuned from (without a classification head)")
        if label_list is not None and not unnamed:
            spelled = {name.lower(): name for name in label_list}
            return {i: spelled[name.lower()] for i, name in enumerate(saved)}
    if label_list is None:
        return None
    return dict(enumerate(label_list))


def prepare_tokenizer(tokenizer, family):
    """GPT-2 has no padding token: pad with its end-of-text token, as GPT-2 classifiers usually do. True when set."""
    if tokenizer.pad_token is not None:
        return False
    if tokenizer.eos_token is None:
        raise ValueError(f"the tokenizer of this {family} model has neither a padding nor an end-of-text token; "
                         "give one with a padding token (--tokenizer_name)")
    tokenizer.pad_token = tokenizer.eos_token
    logger.info("the tokenizer has no padding token (as GPT-2's): padding with its end-of-text token %r (id %d), "
                "set as tokenizer.pad_token and config.pad_token_id", tokenizer.eos_token, tokenizer.pad_token_id)
    return True


def make_compute_metrics(task, label_list, id2label):
    """Trainer's compute_metrics: the GLUE metric of the task (accuracy, or the MSE of a regression, for your own
    task) on labels in the task's order, plus combined_score, the mean, when there are several (as upstream)."""
    if label_list is None and task is None:
        metric = None
    else:
        metric = load_metric("glue", task) if task is not None else load_metric("accuracy")
    # Model ids -> the task's label ids (they differ when a checkpoint's head orders the labels its own way).
    to_task = None if label_list is None else np.array([label_list.index(id2label[i]) for i in range(len(id2label))])

    def compute_metrics(p):
        logits = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        if to_task is None:
            predictions, references = np.squeeze(logits, axis=-1), p.label_ids
        else:
            predictions, references = to_task[np.argmax(logits, axis=-1)], to_task[p.label_ids]
        if metric is None:
            result = {"mse": float(np.mean((predictions - references) ** 2))}
        else:
            result = metric.compute(predictions=predictions, references=references)
        if len(result) > 1:
            result["combined_score"] = float(np.mean(list(result.values())))
        return result

    return compute_metrics


def write_predictions(trainer, dataset, raw, name, task, id2label, label_list, output_dir):
    """predict_results_<name>.txt as upstream, and the GLUE server's <Task>.tsv in output_dir/glue_submission."""
    logits = trainer.predict(dataset, metric_key_prefix="predict").predictions
    logits = logits[0] if isinstance(logits, tuple) else logits
    if label_list is None:
        scores = np.squeeze(logits, axis=-1)
        shown = submitted = [f"{s:.3f}" for s in scores]
    else:
        shown = [id2label[int(i)] for i in np.argmax(logits, axis=-1)]
        submitted = shown if name in SUBMIT_NAMES else [str(label_list.index(label)) for label in shown]
    if not trainer.is_world_process_zero():
        return
    path = os.path.join(output_dir, f"predict_results_{name}.txt" if name else "predict_results.txt")
    write_tsv(path, range(len(shown)), shown)
    logger.info("predictions written to %s", path)
    if task is None:
        return
    indices = raw["idx"] if "idx" in raw.column_names else range(len(raw))
    path = os.path.join(output_dir, "glue_submission", SUBMISSION_FILES[name] + ".tsv")
    write_tsv(path, indices, submitted)
    logger.info("GLUE submission file written to %s", path)


def write_tsv(path, indices, predictions):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("index\tprediction\n")
        f.writelines(f"{i}\t{p}\n" for i, p in zip(indices, predictions))


def select_splits(raw, data_args, training_args):
    """(splits the run uses, each cut to its --max_*_samples; [(results suffix, split)] to evaluate;
    [(predictions name, split)] to predict). A split the options need and the data lacks is an error."""
    task = data_args.task_name
    mnli = task == "mnli"
    eval_sets = [("", "validation")] + ([("_mm", "validation_mismatched")] if mnli else [])
    predict_sets = ([("mnli", "test"), ("mnli-mm", "test_mismatched")] + ([("ax", "ax")] if "ax" in raw else [])
                    if mnli else [(task, "test")])
    needed = {}  # split -> (the option that needs it, at most this many examples)
    if training_args.do_train:
        needed["train"] = ("--do_train", data_args.max_train_samples)
    if training_args.do_eval:
        needed.update({split: ("--do_eval", data_args.max_eval_samples) for _, split in eval_sets})
    if training_args.do_predict:
        needed.update({split: ("--do_predict", data_args.max_predict_samples) for _, split in predict_sets})
    if not needed:
        raise ValueError("nothing to do: give --do_train, --do_eval and/or --do_predict")
    for split, (option, _) in needed.items():
        if split not in raw:
            source = (f"--dataset_name {data_args.dataset_name} has none" if data_args.dataset_name
                      else f"give --{split}_file")
            raise ValueError(f"{option} needs the {split!r} split: {source}"
                             + (" (MNLI is evaluated and predicted on matched and mismatched data)" if mnli else ""))
    splits = {split: training.take(raw[split], limit) for split, (_, limit) in needed.items()}
    return splits, eval_sets if training_args.do_eval else [], predict_sets if training_args.do_predict else []


def check_data(raw, splits, data_args):
    """(label names or None for a regression, the input columns, {split: label lookup}): every split is checked
    for its columns and labels before the model is loaded or anything is written."""
    task = data_args.task_name
    label_list = task_labels(raw, data_args)
    keys = [k for k in input_columns(next(iter(splits.values())), task) if k]
    lookups = {}
    for split, dataset in splits.items():
        labelled = not split.startswith("test") and split != "ax"  # test labels are -1 or absent
        where = training.describe_split(data_args, split)
        training.require_columns(dataset, keys + (["label"] if labelled else []), where)
        if labelled:
            lookups[split] = label_lookup(dataset, label_list, task, where)
    return label_list, keys, lookups


def load_model_and_tokenizer(model_args, label_list, task):
    """(model, tokenizer, plan)."""
    plan = training.plan_model(model_args)
    family = plan.family
    id2label = model_labels(label_list, checkpoint_labels(plan.checkpoint),
                            model_args.model_name_or_path, task)
    tokenizer = training.load_tokenizer(model_args)
    padding_set = prepare_tokenizer(tokenizer, family)
    config_kwargs = {"num_labels": 1} if id2label is None else {
        "id2label": id2label, "label2id": {name: i for i, name in id2label.items()}}
    config_kwargs.update(training.new_model_kwargs(model_args, tokenizer))
    if padding_set or FAMILIES[family].decoder:  # GPT-2 classifies from the last token not padding
        config_kwargs["pad_token_id"] = tokenizer.pad_token_id
    model = training.load_model(plan, "seq-cls", **config_kwargs)
    model.config.finetuning_task = task  # set here: from_pretrained takes only the checkpoint config's fields
    if model_args.model_name_or_path is None:
        training.fit_vocabulary(model, tokenizer)
    if model.config.pad_token_id != tokenizer.pad_token_id:
        logger.warning("the model's pad_token_id (%s) is not the tokenizer's (%s)", model.config.pad_token_id,
                       tokenizer.pad_token_id)
    return model, tokenizer, plan


def tokenize(splits, lookups, keys, label_list, tokenizer, model, data_args, training_args):
    max_seq_length = training.sequence_length(data_args.max_seq_length, "--max_seq_length", tokenizer, model.config)
    padding = "max_length" if data_args.pad_to_max_length else False
    label2id = model.config.label2id

    def preprocess(examples, lookup):
        # Empty cells read as None (QQP has empty questions); the Hub's GLUE gives them as "".
        texts = [["" if t is None else t for t in examples[k]] for k in keys]
        out = tokenizer(*texts, padding=padding, max_length=max_seq_length, truncation=True)
        if lookup is not None:
            labels = [lookup[v] for v in examples["label"]]
            out["labels"] = labels if label_list is None else [label2id[name] for name in labels]
        return out

    processed = {}
    for split, dataset in splits.items():
        with training_args.main_process_first(desc=f"tokenizing {split}"):
            processed[split] = dataset.map(
                preprocess, batched=True, fn_kwargs={"lookup": lookups.get(split)},
                remove_columns=dataset.column_names, num_proc=data_args.preprocessing_num_workers,
                load_from_cache_file=not data_args.overwrite_cache, desc=f"Tokenizing {split}",
                new_fingerprint=training.map_fingerprint(
                    dataset, tokenizer, "run_glue", keys, padding, max_seq_length, sorted(label2id.items()),
                    label_list, sorted((lookups.get(split) or {}).items())))
    return processed


def main(argv=None):
    model_args, data_args, training_args = training.parse_args(DataTrainingArguments, argv)
    training.setup_logging(training_args)
    logger.setLevel(training_args.get_process_log_level())
    transformers.set_seed(training_args.seed)
    task = data_args.task_name
    identity = training.run_identity("run_glue", model_args, data_args, task_name=task)
    checkpoint = training.prepare_output_dir(training_args, identity)

    raw = load_data(data_args, model_args, training_args)
    splits, eval_sets, predict_sets = select_splits(raw, data_args, training_args)
    label_list, keys, lookups = check_data(raw, splits, data_args)
    model, tokenizer, plan = load_model_and_tokenizer(model_args, label_list, task)
    family = plan.family
    processed = tokenize(splits, lookups, keys, label_list, tokenizer, model, data_args, training_args)
    if data_args.pad_to_max_length:
        collator = default_data_collator
    else:
        collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if training_args.fp16 else None)
    trainer = Trainer(
        model=model, args=training_args, train_dataset=processed.get("train"),
        eval_dataset=processed.get("validation"), processing_class=tokenizer, data_collator=collator,
        compute_metrics=make_compute_metrics(task, label_list, model.config.id2label))

    results = {}
    if training_args.do_train:
        dataset = f"glue/{task}" if data_args.from_glue_hub else training.dataset_label(data_args)
        training.write_run_info(training_args, identity, task="text-classification", dataset=dataset,
                                glue_task=task, base_model=training.base_model(plan), family=family)
        results.update(training.train_and_save(trainer, checkpoint, len(processed["train"])))
    if eval_sets:  # MNLI: matched, then mismatched with "_mm" keys, in one eval_results.json (upstream's names)
        metrics = {}
        for suffix, split in eval_sets:
            part = trainer.evaluate(eval_dataset=processed[split], metric_key_prefix="eval")
            part["eval_samples"] = len(processed[split])
            metrics.update({key + suffix: value for key, value in part.items()})
        trainer.log_metrics("eval", metrics)
        training.save_metrics(trainer, "eval", metrics)
        results.update(metrics)
    for name, split in predict_sets:
        if task is not None and len(splits[split]) < len(raw[split]):
            logger.warning("--max_predict_samples: %s predicts %d of %d examples; the GLUE server needs them all",
                           split, len(splits[split]), len(raw[split]))
        write_predictions(trainer, processed[split], splits[split], name, task, model.config.id2label, label_list,
                          training_args.output_dir)

    hub.push_to_hub_at_end(trainer)
    training.close_distributed()
    return results


if __name__ == "__main__":
    training.run_script(main)
