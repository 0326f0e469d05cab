#!/usr/bin/env python
"""Speed, memory, size and FLOPs of each attention family beside its softmax baseline, in one run, as ratios.

The command; its code, options and examples are in the package `hf_mgk.benchmark` (src/hf_mgk/benchmark/), which
also runs each measurement's child process (`python -m hf_mgk.benchmark`). `python scripts/benchmark.py --help`
lists the options."""

from hf_mgk.benchmark import main

if __name__ == "__main__":
    main()
