"""The benchmark behind `scripts/benchmark.py` (its options: `python scripts/benchmark.py --help`): each attention
family's models beside their softmax baseline, and the attention alone, as time, memory, parameter and FLOP ratios.
`import hf_mgk` does not load it. One job a module:

- `cases`: the families (--family): which models against which baseline, at which lengths, and their tables;
- `models`: the models' sizes, how a child rebuilds one, and its timed step;
- `attention`, `nprf`: the attention alone (MGK and FiSH paths; NPRF's exact paths) and their tables;
- `measure`: child processes (`call_child`), timing, memory (a child's peak RSS; a step's allocator peak), a model's
  measurement, --interleave;
- `memory`: the peak memory of the attention paths that can hold N x S numbers against SDPA's
  (`python -m hf_mgk.benchmark.memory`);
- `static`: the kernels' static cost from their compiled SASS, no GPU (`python -m hf_mgk.benchmark.static`);
- `counting`: FLOPs counted (FlopCounterMode) and by the papers' formulas;
- `tables`, `figures`: the rows, the console and Markdown tables, --csv, --figures;
- `cli`: the options and `main`; `python -m hf_mgk.benchmark` runs it, and is how each child is started."""

from .cli import main

__all__ = ["main"]
