#!/usr/bin/env python
"""Masked language modelling with MGK-BERT and NPRF-RoBERTa: pre-training, warm starts, continued training.

The command; its code, options and examples are in `hf_mgk.scripts.run_mlm` (src/hf_mgk/scripts/run_mlm.py), which
other code imports. `python scripts/run_mlm.py --help` lists the options."""

from hf_mgk.scripts.run_mlm import main
from hf_mgk.training import run_script

if __name__ == "__main__":
    run_script(main)
