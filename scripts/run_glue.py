#!/usr/bin/env python
"""Sequence classification (the GLUE tasks, MNLI, or your own files) with every hf-mgk family.

The command; its code, options and examples are in `hf_mgk.scripts.run_glue` (src/hf_mgk/scripts/run_glue.py), which
other code imports. `python scripts/run_glue.py --help` lists the options."""

from hf_mgk.scripts.run_glue import main
from hf_mgk.training import run_script

if __name__ == "__main__":
    run_script(main)
