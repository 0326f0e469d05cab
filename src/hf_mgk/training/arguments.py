"""The training scripts' arguments: `ModelArguments`, `DataArguments` (each script subclasses it) and the
TrainingArguments subclass through `HfArgumentParser`, with every path, file and override checked at parsing (a
clear error naming the option, before any model or data is loaded), and the scripts' logging."""

import csv
import dataclasses
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

import transformers
from transformers import HfArgumentParser, TrainingArguments

from ..families import FAMILIES

logger = logging.getLogger("hf_mgk.training")


@dataclass
class ModelArguments:
    """Which model to start from: a checkpoint (`--model_name_or_path`) or a new one (`--model_type`)."""

    model_name_or_path: Optional[str] = field(default=None, metadata={"help": (
        "A checkpoint folder or Hub name. A stock BERT / GPT-2 / RoBERTa checkpoint warm-starts MGK-BERT / "
        "FiSH-GPT2 or MGK-GPT2 (see --family) / NPRF-RoBERTa (choose the attention with --attention_overrides); a "
        "saved hf-mgk folder (or a checkpoint-* folder) continues from its weights. Leave unset to train from "
        "scratch with --model_type.")})
    family: Optional[str] = field(default=None, metadata={"help": (
        "Only with --model_name_or_path: the hf-mgk family a stock checkpoint warm-starts, for a GPT-2 one "
        "fish-gpt2 or mgk-gpt2. Default: the family of --attention_overrides' attention_type when only one family "
        "has it (mgk/smgk/mlk/smlk: mgk-gpt2; fish/hard_fish/gfish/hard_gfish/mish: fish-gpt2), else the "
        "checkpoint's first family (gpt2: fish-gpt2; bert: mgk-bert; roberta: nprf-roberta). An hf-mgk folder "
        "is of its own family: a different --family is an error."),
        "choices": sorted(FAMILIES)})
    model_type: Optional[str] = field(default=None, metadata={
        "help": "Train from scratch: the family to build (with --config_overrides and --tokenizer_name).",
        "choices": sorted(FAMILIES)})
    config_overrides: Optional[str] = field(default=None, metadata={"help": (
        "Only with --model_type (as upstream): config fields of the new model, comma-separated key=value, values "
        "parsed as JSON, e.g. 'attention_type=mgk,num_keys=2,num_hidden_layers=4,mgk_variances=[1,3]'.")})
    attention_overrides: Optional[str] = field(default=None, metadata={"help": (
        "Only with --model_name_or_path: config fields for the attention of the warm start, same syntax as "
        "--config_overrides, e.g. 'attention_type=mgk,num_keys=2,num_attention_heads=6' (the checkpoint's first "
        "6 of its 12 heads kept, 0-5; --keep_heads picks others). Default: the family's default attention for a stock checkpoint, the "
        "saved one for an hf-mgk folder.")})
    keep_heads: Optional[str] = field(default=None, metadata={"help": (
        "With fewer heads than the checkpoint: which of its heads to keep, comma-separated indices (the same in "
        "every layer), e.g. '0,2,4,6,8,10'. Default: the first ones.")})
    config_name: Optional[str] = field(default=None, metadata={
        "help": "A config folder / Hub name to build a new model from, if not the one of --model_name_or_path."})
    tokenizer_name: Optional[str] = field(default=None, metadata={
        "help": "A tokenizer folder / Hub name, if not the one of --model_name_or_path (needed with --model_type)."})
    cache_dir: Optional[str] = field(default=None, metadata={
        "help": "Where to store models, tokenizers and datasets downloaded from the Hub."})
    use_fast_tokenizer: bool = field(default=True, metadata={
        "help": "Use a fast (Rust) tokenizer; run_qa.py needs one (offset mappings)."})
    model_revision: str = field(default="main", metadata={
        "help": "The model version to use on the Hub: a branch name, tag or commit id."})
    token: Optional[str] = field(default=None, metadata={
        "help": "The Hub token for private models / datasets (default: the one `hf auth login` stored)."})
    trust_remote_code: bool = field(default=False, metadata={"help": (
        "Allow custom code from the Hub for the model, tokenizer and dataset. hf-mgk's own families never need it "
        "here (this package is installed); set it only for checkpoints or datasets whose code you have read.")})

    def __post_init__(self):
        if self.config_overrides is not None and (self.model_type is None or self.model_name_or_path is not None
                                                  or self.config_name is not None):
            raise ValueError("--config_overrides goes only with --model_type (a new model from scratch), not with "
                             "--model_name_or_path or --config_name; to change the attention of a warm start use "
                             "--attention_overrides")
        if self.attention_overrides is not None and self.model_name_or_path is None:
            raise ValueError("--attention_overrides goes only with --model_name_or_path; for a new model use "
                             "--model_type with --config_overrides")
        if self.model_name_or_path is None and self.model_type is None and self.config_name is None:
            raise ValueError("give --model_name_or_path (a checkpoint to start from) or --model_type (a new model, "
                             f"one of {', '.join(sorted(FAMILIES))})")
        if self.model_name_or_path is not None:
            check_model_folder(self.model_name_or_path)
        if self.family is not None and self.model_name_or_path is None:
            raise ValueError("--family goes only with --model_name_or_path (the family a stock checkpoint "
                             "warm-starts); for a new model use --model_type")
        self.keep_heads_list = _parse_heads(self.keep_heads)
        if self.keep_heads_list is not None and self.model_name_or_path is None:
            raise ValueError("--keep_heads goes only with --model_name_or_path (heads of a checkpoint to keep)")

    def hub_kwargs(self):
        """The download options every `from_pretrained` call takes."""
        return {"cache_dir": self.cache_dir, "revision": self.model_revision, "token": self.token,
                "trust_remote_code": self.trust_remote_code}


@dataclass
class DataArguments:
    """The data options every script shares; each script subclasses this with its own."""

    dataset_name: Optional[str] = field(default=None, metadata={
        "help": "A dataset on the Hub (datasets' load_dataset name), for example 'wikitext' or 'squad'."})
    dataset_config_name: Optional[str] = field(default=None, metadata={
        "help": "The dataset's configuration, for example 'wikitext-2-raw-v1'."})
    train_file: Optional[str] = field(default=None, metadata={"help": "A local training file (txt, csv, tsv, json "
                                                                      "or jsonl; the script says which)."})
    validation_file: Optional[str] = field(default=None, metadata={
        "help": "A local evaluation file, in the format of --train_file."})
    validation_split_percentage: int = field(default=5, metadata={
        "help": "Without a validation split: this percentage of the training data becomes the validation set."})
    max_train_samples: Optional[int] = field(default=None, metadata={
        "help": "Truncate the training set to this many examples (debugging, quick runs)."})
    max_eval_samples: Optional[int] = field(default=None, metadata={
        "help": "Truncate the evaluation set to this many examples."})
    max_predict_samples: Optional[int] = field(default=None, metadata={
        "help": "Truncate the prediction (test) set to this many examples."})
    preprocessing_num_workers: Optional[int] = field(default=None, metadata={
        "help": "Processes for tokenization (datasets.map num_proc)."})
    overwrite_cache: bool = field(default=False, metadata={
        "help": "Recompute the tokenized datasets instead of reusing datasets' cache."})

    def __post_init__(self):
        if (self.dataset_name is None and self.train_file is None and self.validation_file is None
                and getattr(self, "test_file", None) is None):  # run_qa.py predicts from --test_file alone
            raise ValueError("give --dataset_name (a Hub dataset) or --train_file / --validation_file (local files)")
        for name in ("train_file", "validation_file", "test_file"):
            check_data_file(f"--{name}", getattr(self, name, None))
        if not 0 < self.validation_split_percentage < 100:
            raise ValueError(f"--validation_split_percentage must be in 1..99; got {self.validation_split_percentage}")
        for name in ("max_train_samples", "max_eval_samples", "max_predict_samples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name} must be >= 1; got {value}")


@dataclass
class HfMgkTrainingArguments(TrainingArguments):
    """transformers' TrainingArguments plus the example scripts' `--overwrite_output_dir` (gone from v5)."""

    overwrite_output_dir: bool = field(default=False, metadata={"help": (
        "Start a new run in --output_dir even if it holds checkpoints or another run (Trainer's checkpoints, the "
        "checkpoint-<step> folders holding a trainer_state.json, are deleted; other files stay). Without it a run "
        "resumes from the folder's last checkpoint, and a folder holding a different run is refused.")})


def parse_args(data_class, argv=None):
    """(ModelArguments, data_class, HfMgkTrainingArguments) from the command line, or from one .json file given as
    the only argument, as transformers' examples do. Bad values exit with the message (argparse's way)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = HfArgumentParser((ModelArguments, data_class, HfMgkTrainingArguments))
    try:
        if len(argv) == 1 and argv[0].endswith(".json"):
            parsed = parser.parse_json_file(json_file=os.path.abspath(argv[0]))
        else:
            parsed = parser.parse_args_into_dataclasses(args=argv)
    except ValueError as err:  # raised by the dataclasses' own checks
        parser.error(str(err))
    _check_launch(parser, parsed[-1])
    return parsed


def launched():
    """Whether a launcher (torchrun, accelerate launch) started this process as one rank of several."""
    return "TORCHELASTIC_RUN_ID" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1


def _check_launch(parser, training_args):
    """What transformers and accelerate do quietly with ranks on a CPU, said here: ranks started by a launcher
    without an accelerator each and without --use_cpu are not distributed (each would train alone on all the data,
    Trainer's rule), so that is refused; FSDP is enabled on accelerators only (on a CPU the ranks run as DDP, the
    weights whole on each), so that is a warning."""
    from transformers.training_args import ParallelMode

    if launched() and not training_args.use_cpu and training_args.parallel_mode != ParallelMode.DISTRIBUTED:
        parser.error(f"started as one of {os.environ.get('WORLD_SIZE', 'several')} ranks, but with no accelerator for "
                     "each and without --use_cpu: each rank would train alone on all the data. Add --use_cpu to train "
                     "the ranks on the CPU together")
    if training_args.fsdp and training_args.device.type == "cpu":
        logger.warning("--fsdp on the CPU: accelerate enables FSDP on accelerators only, so these ranks run as DDP "
                       "(the weights whole on each rank); the losses and the saved model are DDP's")


def setup_logging(training_args):
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", datefmt="%m/%d/%Y %H:%M:%S",
                        handlers=[logging.StreamHandler(sys.stdout)])
    if training_args.should_log:
        # As transformers' example scripts: info on the main process (Trainer's "***** Running training *****" with
        # the total batch size), since TrainingArguments' default log_level "passive" keeps the current verbosity.
        transformers.utils.logging.set_verbosity_info()
    level = training_args.get_process_log_level()
    logger.setLevel(level)
    transformers.utils.logging.set_verbosity(level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()
    try:
        import datasets

        datasets.utils.logging.set_verbosity(level)
    except ImportError:
        pass


def parse_overrides(text, config_class, option):
    """'a=1,b=[1,3],c=mgk' -> {'a': 1, 'b': [1, 3], 'c': 'mgk'}: values as JSON (bare words are strings, None /
    True / False as Python spells them too), keys checked against the config's fields (config_class None: not
    checked). Not transformers' `config.update_from_string`: it splits at every comma (no lists such as
    mgk_variances=[1,3]), converts by the current value's type and knows only fields the config already has."""
    if not text:
        return {}
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "[{" and 1 or ch in "]}" and -1 or 0
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    known = None if config_class is None else (
        {f.name for f in dataclasses.fields(config_class)} | set(vars(config_class()).keys()))
    out = {}
    for part in parts:
        key, sep, raw = part.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key:
            raise ValueError(f"{option}: expected key=value pairs separated by commas; got {part!r} in {text!r}")
        if known is not None and key not in known:
            raise ValueError(f"{option}: {config_class.__name__} has no field {key!r}")
        literal = {"None": None, "True": True, "False": False}
        try:
            value = literal[raw] if raw in literal else json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key] = value
    return out


def _parse_heads(text):
    if text is None:
        return None
    try:
        return [int(h) for h in text.split(",")]
    except ValueError:
        raise ValueError(f"--keep_heads must be comma-separated head indices like '0,2,4'; got {text!r}") from None


# The user's files, checked before anything runs: transformers and datasets report a bad one deep in their code,
# often without its path ("install sentencepiece", "Repo id must be ...", "incomplete metadata").


def check_data_file(option, path):
    """A data file (`option`, e.g. "--train_file") that is missing or 0 bytes is an error naming it."""
    if path is None:
        return
    if not os.path.isfile(path):
        raise ValueError(f"{option} {path} does not exist")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{option} {path} is empty (0 bytes)")


def check_model_folder(path, option="--model_name_or_path"):
    """A local checkpoint folder that is missing, has no config.json (empty, or saving never finished) or holds an
    unreadable weights file is an error naming it. A name that does not exist and could be a Hub id is left to the
    Hub."""
    if not os.path.exists(path):
        # A Hub id is `name` or `owner/name`: anything else can only be a local path.
        if os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1:
            raise ValueError(f"{option} {path} does not exist")
        return
    if not os.path.isdir(path):
        raise ValueError(f"{option} {path} is a file; give the folder of a saved model (the one with config.json)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"{option} {path} has no config.json, so it holds no saved model (an empty folder, or one "
                         "whose saving did not finish)")
    problem = damaged_weights(path)
    if problem is not None:
        raise ValueError(f"{option} {path}: {problem}")


def damaged_weights(folder):
    """What is wrong with the folder's first unreadable .safetensors file, or None. Opening one reads only its
    header, which also finds a file cut short (the header's sizes no longer cover it)."""
    from safetensors import SafetensorError, safe_open

    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            try:
                with safe_open(os.path.join(folder, name), "pt"):
                    pass
            except SafetensorError as err:
                return f"{name} cannot be read ({err}): it is truncated or damaged; save or download it again"
    return None


def first_bad_line(path, delimiter=None):
    """"line N ..." saying what is wrong with the first line of a text file that is not UTF-8 or, with a CSV
    `delimiter`, starts a row Python's strict CSV reader refuses (a quote that never closes); None when neither.
    For error messages: datasets reports these without a line, or not at all."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):  # a UTF-8 character never spans a newline
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                return (f"line {number} is not UTF-8 (byte {line[err.start]:#04x} at position {err.start + 1}); "
                        "save the file as UTF-8")
    if delimiter is None:
        return None
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter, strict=True)
        start = 1
        try:
            for _ in reader:
                start = reader.line_num + 1
        except csv.Error as err:
            return f"line {start} starts a row that is not valid CSV ({err}): a field that opens a quote must close it"
    return None


__all__ = ["ModelArguments", "DataArguments", "HfMgkTrainingArguments", "parse_args", "setup_logging", "parse_overrides",
           "check_data_file", "check_model_folder", "damaged_weights", "first_bad_line", "launched"]
