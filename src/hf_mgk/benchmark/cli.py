"""Speed, memory, size and FLOPs of each attention family beside its softmax baseline, in one run, as ratios.

    python scripts/benchmark.py --family mgk                  # MGK-BERT (H/2 heads, M=2) vs BERT (H heads, SDPA)
    python scripts/benchmark.py --family mgk --lengths 128 512 --repeats 5 --mode both
    python scripts/benchmark.py --family fish                 # FiSH-GPT2 (8 local heads, M=2) vs GPT-2 (8 heads, SDPA)
    python scripts/benchmark.py --family nprf                 # NPRF paths vs SDPA; NPRF-RoBERTa vs RoBERTa, Longformer
    python scripts/benchmark.py --family headsize             # fixed head sizes 128 / 32 vs BERT's 64, equal parameters
    python scripts/benchmark.py --family mgk-gpt2             # MGK-GPT2 (H/2 heads) vs GPT-2 (H heads, SDPA)
    python scripts/benchmark.py --family llama                # MGK-Llama, FiSH-Llama vs Llama: step, KV cache, decode
    python scripts/benchmark.py --family mgk --head-dims 32 64 128 --lengths 512 --figures figs   # ratio vs head size
    python scripts/benchmark.py --family all --models-only --mode both --interleave --lengths 256 512 1024 2048 \
        --csv results.csv --markdown results.md --figures figures      # the README's results table and figures
    python scripts/benchmark.py --family mgk --device cuda    # on a GPU (synchronised timings, CUDA peak memory)
    python scripts/benchmark.py --family fish --device cuda --dtype bf16 --interleave --lengths 1024 4096 --batch 8

Each (model, length, mode) is measured in a fresh child process: a warm-up step, then the median of `--repeats`
steps. `--mode train` (the default) times a training step (forward + backward of the encoder + an SGD step; no
LM head, so the vocabulary projection does not hide the attention), `--mode forward` a forward under
torch.no_grad() in eval mode, `--mode both` each. Memory is the peak the step adds above the loaded model (CPU: peak
RSS minus the RSS before the first step; CUDA: torch.cuda.max_memory_allocated minus the memory allocated before).
Shared machines are noisy: read the ratios, which are taken in the same run. With `--interleave` the whole models
of a family are also timed together at each length, one child building them all and alternating their steps
(`measure_interleaved`), so that the baseline and each model see the same machine state; memory, parameters and
FLOPs still come from each case's own child; the attention-alone tables then time every path with SDPA the same way.
tokens/s = batch * N / step time. `--dtype bf16` / `fp16` runs the models under torch.autocast and gives the
attention-alone tables inputs in that dtype; on `--device cuda` those tables show the eager paths ("..., eager")
beside "auto", which there takes the Triton kernels where Triton is installed.

FLOPs, for every model: torch.utils.flop_counter.FlopCounterMode counts the (untimed) warm-up step (see
count_flops and flop_counter_mode), the whole step and the attention layers' forward share, and each family's paper
formula (hf_mgk.flops: MGK App. B and NPRF's products for the attention layer, FiSH App. D for the attention-matrix
part) is printed beside it. The fish family adds its App. D tables (attention-matrix part counted vs App. D).

--csv FILE writes one row per measurement (CSV_COLUMNS), --markdown FILE the summary table (each model against its
baseline: time ratio beside the FLOP ratios, and the command that made it), --figures DIR one PNG per family and
mode of the time ratio against N (solid) with the paper formula's FLOP ratio (dashed), and with several
--head-dims one against the head size at the largest N; none of them overwrites an existing file without
--overwrite. --models-only skips the attention-alone tables (mgk, fish, nprf).

With several threads on cores that other work keeps busy, every parallelised op waits for its slowest thread
(measured here: an in-place add on 2^20 floats, 0.24 ms on 1 thread, 4.5 ms on 2), which penalises models made
of many small ops far more than their FLOPs: compare --threads 1 with the default.
"""

import argparse
import json
import pathlib

import torch

from . import measure, models
from .attention import measure_alone_interleaved, measure_fish_attention, measure_mgk_attention
from .cases import FAMILIES
from .decode import measure_decode
from .figures import figure_paths, write_figures
from .models import FISH_DEFAULT, FISH_TYPES
from .nprf import measure_attention
from .tables import make_rows, print_table, write_csv, write_markdown

# What a child can be asked to run (measure.call_child names one; the child prints its result as JSON).
CHILD_FUNCTIONS = {"measure": measure.measure, "measure_interleaved": measure.measure_interleaved,
                   "measure_decode": measure_decode,
                   "measure_attention": measure_attention,
                   "measure_mgk_attention": measure_mgk_attention, "measure_fish_attention": measure_fish_attention,
                   "measure_alone_interleaved": measure_alone_interleaved}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=sorted(FAMILIES) + ["all"], default="all")
    p.add_argument("--lengths", type=int, nargs="*", help="sequence lengths (default: per family)")
    p.add_argument("--heads", type=int, default=8, help="the baseline's heads H")
    p.add_argument("--global-heads", type=int, default=2, help="FiSH's global heads M (fish and llama families)")
    p.add_argument("--fish-types", nargs="*", choices=FISH_TYPES,
                   help=f"FiSH attention types (fish family; default: {' '.join(FISH_DEFAULT)})")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=sorted(models.DTYPES), default="fp32",
                   help="bf16 / fp16: the models run under torch.autocast to it, the attention-alone tables take "
                        "their inputs in it (default fp32)")
    p.add_argument("--mode", choices=["train", "forward", "both"],
                   help="train: forward + backward + SGD step; forward: no-grad forward (default: train; the nprf "
                        "family's whole models: forward)")
    p.add_argument("--head-dims", type=int, nargs="*",
                   help="sweep the head size: the baseline gets --heads heads of each size (hidden = heads x size)")
    only = p.add_mutually_exclusive_group()
    only.add_argument("--models-only", action="store_true", help="skip the attention-alone tables (mgk, fish, nprf)")
    only.add_argument("--attention-only", action="store_true",
                      help="only the attention-alone tables (mgk, fish, nprf): no whole models")
    p.add_argument("--interleave", action="store_true",
                   help="time the whole models of a family at each length in one child, their steps alternating "
                        "(the same machine state for the baseline and each model; memory and FLOPs still from "
                        "each case's own child); the attention-alone tables the same way, every path with SDPA")
    p.add_argument("--csv", help="write one row per measurement to this CSV file")
    p.add_argument("--markdown", help="write the summary table (models vs baselines) to this Markdown file")
    p.add_argument("--figures", help="write PNG figures of the ratios to this folder")
    p.add_argument("--overwrite", action="store_true", help="replace existing --csv / --markdown / figure files")
    p.add_argument("--static", metavar="JSON",
                   help="the static cost model's figures (python -m hf_mgk.benchmark.static --json JSON, for this "
                        "GPU's target): printed beside the measured ratio of each row on the Triton kernels")
    p.add_argument("--_child", help=argparse.SUPPRESS)
    p.add_argument("--_device", default="cpu", help=argparse.SUPPRESS)
    p.add_argument("--_dtype", default="fp32", help=argparse.SUPPRESS)
    return p


def run_in_child(call, device, dtype="fp32"):
    """The child's side of measure.call_child: CHILD_FUNCTIONS[name](*call_args) (`call`: their JSON) on `device`
    in `dtype` (--dtype), its result printed as JSON."""
    models.DTYPE = dtype
    if device != "cpu":
        torch.set_default_device(device)
    name, call_args = json.loads(call)
    print(json.dumps(CHILD_FUNCTIONS[name](*call_args)))


def _modes(args, spec):
    return ["train", "forward"] if args.mode == "both" else [args.mode or spec.get("mode", "train")]


def main(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args._child:
        return run_in_child(args._child, args._device, args._dtype)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error(f"--device cuda: CUDA is not available here (torch {torch.__version__}, built for CUDA "
                f"{torch.version.cuda}); run with --device cpu or on a machine with a GPU")
    if args.attention_only and (args.csv or args.markdown or args.figures):
        p.error("--attention-only prints the attention-alone tables; --csv, --markdown and --figures are of the "
                "whole models")
    measure.DEVICE = args.device
    models.DTYPE = args.dtype
    names = sorted(FAMILIES) if args.family == "all" else [args.family]
    planned = {name: FAMILIES[name](args) for name in names}
    figures = {name: figure_paths(args.figures, name, _modes(args, spec), args.head_dims, spec)
               for name, spec in planned.items()} if args.figures else {}
    outputs = [pathlib.Path(f) for f in (args.csv, args.markdown) if f]
    outputs += [path for by_mode in figures.values() for paths in by_mode.values() for path in paths]
    existing = [str(path) for path in outputs if path.exists()]
    if existing and not args.overwrite:
        p.error(f"{', '.join(existing)} already exist(s); pass --overwrite to replace, or choose other paths")
    if args.figures:
        pathlib.Path(args.figures).mkdir(parents=True, exist_ok=True)

    print(f"torch {torch.__version__}, {args.device}, {args.dtype}, {args.threads} threads, batch {args.batch}, "
          f"median of {args.repeats} steps" + (", the models' steps interleaved" if args.interleave else ""))
    rows = []
    for name in names:
        for i, head_dim in enumerate(args.head_dims or [None]):
            spec = FAMILIES[name](args, head_dim)
            if i and not spec.get("sweeps_head_dim", True):
                break
            first = i == 0
            if "runner" in spec and first and not args.models_only:
                spec["runner"](args)
            for mode in [] if args.attention_only else _modes(args, spec):
                results = {}
                for length in spec["lengths"]:
                    results.update(measure.run_cases(spec, length, args, mode))
                title = f"{name}: {FAMILIES[name].__doc__.strip().splitlines()[0]} Mode: {mode}" + (
                    f", head size {head_dim}" if head_dim else "")
                family_rows = make_rows(name, spec, results, mode, args, head_dim)
                rows += family_rows
                print_table(title, spec, family_rows)
                for table in spec.get("tables", []) + (spec.get("train_tables", []) if mode == "train" else []):
                    table(title, spec, results)
            if first and "decode" in spec and not args.attention_only:
                spec["decode"](args, spec)
            for extra in spec.get("after", []) if first and not args.models_only else []:
                extra(args, spec)
        for mode, paths in figures.get(name, {}).items():
            write_figures(paths, [r for r in rows if r["family"] == name and r["mode"] == mode],
                          f"{name} ({mode}, {args.device}, {args.threads} threads, batch {args.batch})")
    if args.csv:
        write_csv(args.csv, rows)
    if args.markdown:
        write_markdown(args.markdown, rows, args)
