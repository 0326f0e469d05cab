#!/usr/bin/env python
"""Causal language modelling (pre-training, warm starts, continued training) with the hf-mgk families.

The command; its code, options and examples are in `hf_mgk.scripts.run_clm` (src/hf_mgk/scripts/run_clm.py), which
other code imports. `python scripts/run_clm.py --help` lists the options."""

from hf_mgk.scripts.run_clm import main
from hf_mgk.training import run_script

if __name__ == "__main__":
    run_script(main)
