"""What the training scripts (`scripts/run_mlm.py`, `run_clm.py`, `run_glue.py`, `run_qa.py`) share, written once.

They follow transformers' example scripts: `ModelArguments` / a `DataArguments` subclass / `TrainingArguments`
through `HfArgumentParser` (or one `.json` file as the only argument), a model from a checkpoint
(`--model_name_or_path`: a stock BERT / GPT-2 / RoBERTa checkpoint warm-starts the family's attention, a saved
hf-mgk folder continues) or from scratch (`--model_type` + `--config_overrides`), datasets from the Hub or local
files, automatic resume from the last checkpoint in `--output_dir`, and `*_results.json` at the end.

Beyond upstream: an output folder that holds a *different* run is refused (the run's identity is written to
`hf_mgk_run.json`), `--config_overrides` values are parsed as JSON and checked against the config's fields (a
typo is an error, not a silently ignored attribute), and `--attention_overrides` / `--keep_heads` choose the
attention of a warm start."""

import csv
import dataclasses
import functools
import itertools
import json
import logging
import math
import os
import shutil
import sys
from dataclasses import dataclass, field
from typing import Optional

import transformers
from transformers import AutoConfig, AutoTokenizer, HfArgumentParser, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from .families import FAMILIES, STOCK_FAMILIES, TASK_AUTO, TASK_NAMES, family_of_attention
from .folders import checkpoint_folders, refuse_holding_inputs, sha256_file, trainer_checkpoints

logger = logging.getLogger("hf_mgk.training")

RUN_FILE = "hf_mgk_run.json"
# What Trainer.save_metrics writes: <split>_results.json, and all_results.json, which it reads and updates (so an
# earlier run's would carry that run's metrics into the new one's).
RESULTS_FILES = ("all_results.json", "train_results.json", "eval_results.json", "predict_results.json")

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
        "--config_overrides, e.g. 'attention_type=mgk,num_keys=2,num_attention_heads=6' (6 heads kept of the "
        "checkpoint's 12; see --keep_heads). Default: the family's default attention for a stock checkpoint, the "
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
            return parser.parse_json_file(json_file=os.path.abspath(argv[0]))
        return parser.parse_args_into_dataclasses(args=argv)
    except ValueError as err:  # raised by the dataclasses' own checks
        parser.error(str(err))


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


def incomplete_checkpoint(folder):
    """Why a Trainer checkpoint cannot be resumed from, or None. Trainer writes trainer_state.json last, so a run
    killed while saving leaves it missing or cut short."""
    try:
        with open(os.path.join(folder, "trainer_state.json"), encoding="utf-8") as f:
            json.load(f)
    except FileNotFoundError:
        return "it has no trainer_state.json"
    except (ValueError, UnicodeDecodeError):  # json.JSONDecodeError is a ValueError
        return "its trainer_state.json is cut short"
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


def _package():
    import hf_mgk  # registers the families with the Auto classes

    return hf_mgk


def checkpoint_config(model_args):
    """The config dict of --model_name_or_path (or --config_name), without building a model; None when new."""
    from transformers import PreTrainedConfig

    source = model_args.model_name_or_path or model_args.config_name
    if source is None:
        return None
    kwargs = {k: v for k, v in model_args.hub_kwargs().items() if k != "trust_remote_code"}
    config_dict, _ = PreTrainedConfig.get_config_dict(source, **kwargs)
    return config_dict


def family_of(model_args):
    """The hf-mgk family a run builds: an hf-mgk checkpoint's own, the one a stock checkpoint warm-starts (see
    `stock_family`), else --model_type."""
    config_dict = checkpoint_config(model_args)
    if config_dict is None:
        return model_args.model_type
    model_type = config_dict.get("model_type")
    source = model_args.model_name_or_path or model_args.config_name
    if model_type in STOCK_FAMILIES:
        family = stock_family(model_type, model_args)
    elif model_type in FAMILIES:
        family = model_type
        if model_args.family is not None and model_args.family != family:
            raise ValueError(f"--family {model_args.family} contradicts {source}, a saved {family} model; an hf-mgk "
                             "checkpoint continues as its own family (leave --family out)")
    else:
        raise ValueError(
            f"{source} is a {model_type!r} checkpoint; hf-mgk warm-starts from {', '.join(sorted(STOCK_FAMILIES))} "
            f"checkpoints and continues {', '.join(sorted(FAMILIES))} ones")
    if model_args.model_type is not None and model_args.model_type != family:
        hint = (f" (--family {model_args.model_type} chooses it for a stock {model_type!r} checkpoint)"
                if model_args.model_type in STOCK_FAMILIES.get(model_type, ()) else "")
        raise ValueError(f"--model_type {model_args.model_type} does not match the checkpoint, which gives "
                         f"{family}{hint}")
    return family


def stock_family(model_type, model_args):
    """The family a stock `model_type` checkpoint warm-starts: --family, else the only family of the
    --attention_overrides' attention_type among the checkpoint's, else the checkpoint's default."""
    families = STOCK_FAMILIES[model_type]
    if model_args.family is not None:
        if model_args.family not in families:
            raise ValueError(f"--family {model_args.family} cannot warm-start from a stock {model_type!r} checkpoint "
                             f"({model_args.model_name_or_path}); a {model_type!r} checkpoint warm-starts "
                             f"{' or '.join(families)}")
        return model_args.family
    attention = parse_overrides(model_args.attention_overrides, None, "--attention_overrides").get("attention_type")
    inferred = family_of_attention(model_type).get(attention)
    if inferred in families:
        return inferred
    if len(families) > 1:
        logger.info("a stock %s checkpoint warm-starts %s (the default; --family chooses among %s)", model_type,
                    families[0], ", ".join(families))
    return families[0]


def model_class(family, task):
    classes = FAMILIES[family].classes
    if task not in classes:
        tasks = ", ".join(TASK_NAMES[t] for t in classes if t in TASK_NAMES)
        raise ValueError(f"{family} has no model for {TASK_NAMES[task]}; it has: {tasks}")
    _package()  # registered with the Auto classes before any model is made
    return FAMILIES[family].auto_map[TASK_AUTO[task]]


def load_tokenizer(model_args):
    source = model_args.tokenizer_name or model_args.model_name_or_path
    if source is None:
        raise ValueError("a new model (--model_type) needs --tokenizer_name: training a tokenizer is not part of "
                         "these scripts")
    return AutoTokenizer.from_pretrained(source, use_fast=model_args.use_fast_tokenizer, **model_args.hub_kwargs())


def load_model(model_args, task, **config_kwargs):
    """The model for `task` ("mlm", "clm", "seq-cls", "qa"): warm-started or continued from
    --model_name_or_path, or new from --model_type / --config_name with --config_overrides.

    `config_kwargs`: what the task sets in the config (num_labels, is_decoder, ...). Returns (model, family)."""
    family = family_of(model_args)
    cls = model_class(family, task)
    config_class = FAMILIES[family].config_class
    if model_args.model_name_or_path is not None:
        kwargs = {**parse_overrides(model_args.attention_overrides, config_class, "--attention_overrides"),
                  **config_kwargs}
        # Keywords of from_pretrained are set on the loaded config without its checks: run them here first.
        fields = {f.name for f in dataclasses.fields(config_class)} - {"model_type", "architectures", "auto_map"}
        saved = {k: v for k, v in checkpoint_config(model_args).items() if k in fields}
        config_class(**{**saved, **kwargs})
        if model_args.keep_heads_list is not None:
            kwargs["keep_heads"] = model_args.keep_heads_list
        model = cls.from_pretrained(model_args.model_name_or_path, **kwargs, **model_args.hub_kwargs())
        return model, family
    if model_args.config_name is not None:
        config = AutoConfig.from_pretrained(model_args.config_name, **config_kwargs, **model_args.hub_kwargs())
        if not isinstance(config, config_class):
            raise ValueError(f"--config_name {model_args.config_name} is not a {family} config")
    else:
        overrides = parse_overrides(model_args.config_overrides, config_class, "--config_overrides")
        config = config_class(**{**overrides, **config_kwargs})
    logger.info("training a new %s model from scratch: %s", family, config.to_json_string(use_diff=True))
    return cls(config), family


def fit_vocabulary(model, tokenizer):
    """A new model's embeddings must cover the tokenizer (upstream resizes them the same way)."""
    size = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > size:
        model.resize_token_embeddings(len(tokenizer))


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


def run_identity(script, model_args, data_args, **extra):
    """What makes two runs the same run: resuming one with another's checkpoint would silently mix them."""
    fields = ("model_name_or_path", "model_type", "config_overrides", "attention_overrides", "keep_heads",
              "config_name")
    data_fields = ("dataset_name", "dataset_config_name", "train_file", "validation_file")
    identity = {"script": script, **{k: getattr(model_args, k) for k in fields},
                **{k: getattr(data_args, k, None) for k in data_fields}, **extra}
    if model_args.family is not None:  # only when given: runs recorded before --family existed stay the same run
        identity["family"] = model_args.family
    for key in ("train_file", "validation_file"):
        if identity[key] is not None:
            identity[key] = os.path.abspath(identity[key])
    return identity


def prepare_output_dir(training_args, identity):
    """Decide where training starts, before anything is written: returns the checkpoint to resume from or None.

    - `--resume_from_checkpoint PATH` resumes from PATH;
    - a folder with checkpoints of the same run (same `hf_mgk_run.json`) resumes from the last one;
    - a folder holding another run, or files but no checkpoint, is refused unless `--overwrite_output_dir`,
      which deletes Trainer's checkpoints in it (`folders.trainer_checkpoints`: not a user's `checkpoint-notes/`,
      nor one that is an input of this run) and starts anew."""
    out = training_args.output_dir
    if training_args.resume_from_checkpoint is not None:
        if not os.path.isdir(training_args.resume_from_checkpoint):
            raise ValueError(f"--resume_from_checkpoint {training_args.resume_from_checkpoint} is not a folder")
        problem = incomplete_checkpoint(training_args.resume_from_checkpoint)
        if problem is not None:
            raise ValueError(f"--resume_from_checkpoint {training_args.resume_from_checkpoint} is incomplete "
                             f"({problem}): its saving did not finish; resume from an earlier checkpoint")
        return training_args.resume_from_checkpoint
    if not training_args.do_train or not os.path.isdir(out) or not os.listdir(out):
        return None
    if training_args.overwrite_output_dir:
        if training_args.process_index == 0:
            checkpoints = trainer_checkpoints(out)
            inputs = {f"--{key}": identity.get(key) for key in ("model_name_or_path", "config_name", "train_file",
                                                                "validation_file")}
            for checkpoint in checkpoints:  # all checked before any is deleted
                refuse_holding_inputs(checkpoint, inputs, option="--overwrite_output_dir would delete the checkpoint")
            for checkpoint in checkpoints:
                shutil.rmtree(checkpoint)
        return None
    saved = read_run_identity(out)
    if saved is not None and saved != identity:
        changed = sorted(k for k in set(saved) | set(identity) if saved.get(k) != identity.get(k))
        details = "; ".join(f"{k}: {saved.get(k)!r} there, {identity.get(k)!r} now" for k in changed)
        raise ValueError(f"--output_dir {out} holds a different run ({details}). Use another --output_dir, or "
                         "--overwrite_output_dir to replace that run")
    last = get_last_checkpoint(out)
    if last is None:
        if saved is None:
            raise ValueError(f"--output_dir {out} exists and is not empty, and holds no checkpoint of this run. Use "
                             "another --output_dir, or --overwrite_output_dir to train into it anyway")
        return None  # the same run finished (or stopped before its first checkpoint): train again from the start
    problem = incomplete_checkpoint(last)
    if problem is not None:  # the run was killed while saving it: Trainer would fail on a missing file
        earlier = [c for c in checkpoint_folders(out) if c != last and incomplete_checkpoint(c) is None]
        advice = (f"resume from the one before with --resume_from_checkpoint {earlier[-1]} (or delete {last})"
                  if earlier else "no earlier checkpoint is complete: start anew with --overwrite_output_dir")
        raise ValueError(f"--output_dir {out}: its last checkpoint {last} is incomplete ({problem}; the run stopped "
                         f"while saving it): {advice}")
    logger.info("resuming from %s (pass --overwrite_output_dir to start anew)", last)
    return last


def read_run_identity(folder):
    record = _read_run_file(folder)
    return None if record is None else record["identity"]


def write_run_info(training_args, identity, **info):
    """`hf_mgk_run.json`: the run's identity (checked on resume) and facts the model card uses. Called as training
    starts, which also starts the run's results anew: results files of an earlier run (or of this run's model
    before this training) are removed, and none is recorded as this run's yet (`save_metrics` records them)."""
    if training_args.process_index != 0:
        return
    out = training_args.output_dir
    os.makedirs(out, exist_ok=True)
    import torch

    stale = [name for name in RESULTS_FILES if os.path.isfile(os.path.join(out, name))]
    for name in stale:
        os.remove(os.path.join(out, name))
    if stale:
        logger.info("removed %s of the earlier training in %s: a run's results are its own", ", ".join(stale), out)
    path = os.path.join(out, RUN_FILE)
    previous = _read_run_file(out) or {}
    record = {**previous, "identity": identity, **info, "results": {}, "hf_mgk_version": _package().__version__,
              "transformers_version": transformers.__version__, "torch_version": torch.__version__}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2, sort_keys=True)


def _read_run_file(folder):
    path = os.path.join(folder, RUN_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save_metrics(trainer, split, metrics):
    """`trainer.save_metrics`, then the hashes of the files it wrote go into hf_mgk_run.json when they measure
    this run's model: one trained by this process, or the run's saved model evaluated in its own folder. Publish
    shows only recorded results (`recorded_results`), never an earlier run's or another model's."""
    trainer.save_metrics(split, metrics)
    out = trainer.args.output_dir
    source = getattr(trainer.model, "name_or_path", None)
    this_run = trainer.state.global_step > 0 or (bool(source) and os.path.realpath(source) == os.path.realpath(out))
    record = _read_run_file(out)
    if not trainer.is_world_process_zero() or not this_run or record is None:
        return
    written = (f"{split}_results.json", "all_results.json")
    record.setdefault("results", {}).update({name: sha256_file(os.path.join(out, name)) for name in written})
    with open(os.path.join(out, RUN_FILE), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2, sort_keys=True)


def recorded_results(folder):
    """({file name: its metrics} of the results files in `folder` that its hf_mgk_run.json records as this run's,
    [names of the other results files there]). A file is the run's only if its content hash is the one recorded
    when the scripts wrote it: an earlier run's file, another model's evaluation or an edited file is not."""
    recorded = (_read_run_file(folder) or {}).get("results") or {}
    own, other = {}, []
    for name in RESULTS_FILES:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        if recorded.get(name) == sha256_file(path):
            with open(path, encoding="utf-8") as f:
                own[name] = json.load(f)
        else:
            other.append(name)
    return own, other


def train_and_save(trainer, checkpoint, n_train):
    """Train (resuming from `checkpoint`), save the model and tokenizer, write train_results.json."""
    result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model()
    metrics = {**result.metrics, "train_samples": n_train}
    trainer.log_metrics("train", metrics)
    save_metrics(trainer, "train", metrics)
    trainer.save_state()
    return metrics


def evaluate_and_save(trainer, dataset, n_samples, prefix="eval", with_perplexity=False, **extra):
    """Evaluate, add `<prefix>_samples` (and any `extra` metrics, prefixed), write <prefix>_results.json.

    with_perplexity: add "perplexity" = exp(<prefix>_loss) (inf on overflow), upstream's key for language models."""
    metrics = trainer.evaluate(eval_dataset=dataset, metric_key_prefix=prefix)
    metrics[f"{prefix}_samples"] = n_samples
    if with_perplexity:
        metrics["perplexity"] = perplexity(metrics[f"{prefix}_loss"])
    metrics.update({f"{prefix}_{k}": v for k, v in extra.items()})
    trainer.log_metrics(prefix, metrics)
    save_metrics(trainer, prefix, metrics)
    return metrics


def close_distributed():
    """End of a script under torchrun: tear the process group down before the interpreter exits (left to its
    shutdown, gloo's threads sometimes abort a rank after the work is done)."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def dataset_label(data_args):
    """What the model card names as the data: the Hub dataset (and configuration), or the local file names."""
    if data_args.dataset_name is not None:
        return "/".join(n for n in (data_args.dataset_name, data_args.dataset_config_name) if n)
    files = (getattr(data_args, f"{split}_file", None) for split in ("train", "validation", "test"))
    return ", ".join(os.path.basename(path) for path in files if path)


def base_model(model_args):
    """The checkpoint a run started from, for the model card: a Hub name, or a local folder holding a stock
    checkpoint (a warm start: the card says so in words, never as Hub metadata); None for a new model or the
    continuation of a local hf-mgk folder."""
    path = model_args.model_name_or_path
    if path is None:
        return None
    if not os.path.isdir(path):
        return path
    return path if (checkpoint_config(model_args) or {}).get("model_type") in STOCK_FAMILIES else None


# Language modelling: what run_mlm.py and run_clm.py share.


def new_model_kwargs(model_args, tokenizer):
    """A model from scratch takes the tokenizer's padding id unless --config_overrides sets one: a config's default
    belongs to its own family's tokenizer (NPRF-RoBERTa counts positions from its pad id, BERT's [PAD] is 0)."""
    if model_args.model_type is None or model_args.model_name_or_path or model_args.config_name:
        return {}
    config_class = FAMILIES[model_args.model_type].config_class
    if tokenizer.pad_token_id is None or "pad_token_id" in parse_overrides(
            model_args.config_overrides, config_class, "--config_overrides"):
        return {}
    return {"pad_token_id": tokenizer.pad_token_id}


def position_limit(config):
    """(the longest input the model's absolute position table takes, why); (None, why) without such a table."""
    if getattr(config, "use_absolute_positions", True) is False:
        return None, "use_absolute_positions=False"
    family = FAMILIES.get(config.model_type)
    if family is not None and family.positions_after_padding:  # fairseq positions start after the padding index
        offset = config.pad_token_id + 1
        return (config.max_position_embeddings - offset,
                f"max_position_embeddings={config.max_position_embeddings} minus RoBERTa's padding offset {offset}")
    name = "n_positions" if hasattr(config, "n_positions") else "max_position_embeddings"
    return getattr(config, name), f"{name}={getattr(config, name)}"


def sequence_length(requested, option, tokenizer, config):
    """`option` (--max_seq_length / --block_size) checked against the model's positions before any training.

    Not given: as upstream, the tokenizer's model_max_length capped at 1024, and here also at the model's limit.
    Given beyond the tokenizer's model_max_length: kept (with a warning) when the model takes it; upstream
    clamps to the tokenizer, which would cut NPRF-RoBERTa without absolute positions to 512."""
    limit, why = position_limit(config)
    if requested is None:
        length = min(1024, tokenizer.model_max_length, limit if limit is not None else 1024)
        if length < tokenizer.model_max_length:
            logger.warning("%s not given: using %d, the smallest of 1024, the tokenizer's model_max_length (%d) and "
                           "the model's limit (%s); pass %s to choose", option, length, tokenizer.model_max_length,
                           why if limit is None else f"{limit}: {why}", option)
        return length
    if limit is not None and requested > limit:
        raise ValueError(f"{option} {requested} is longer than the model's positions allow: at most {limit} "
                         f"({why}). Give {option} <= {limit}")
    if requested > tokenizer.model_max_length:
        logger.warning("%s %d is beyond the tokenizer's model_max_length (%d); using it, the model takes it (%s)",
                       option, requested, tokenizer.model_max_length, why)
    return requested


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


def map_splits(raw, function, data_args, training_args, desc, remove_columns=True):
    """`function` (batched) over every split, the main process first (its cache then serves the others)."""
    import datasets

    with training_args.main_process_first(desc=desc):
        return datasets.DatasetDict({
            split: ds.map(function, batched=True, num_proc=data_args.preprocessing_num_workers,
                          remove_columns=ds.column_names if remove_columns else None,
                          load_from_cache_file=not data_args.overwrite_cache, desc=f"{desc} ({split})")
            for split, ds in raw.items()})


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

    return map_splits(raw, tokenize, data_args, training_args, "tokenizing")


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
    from .metrics import load_metric

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
