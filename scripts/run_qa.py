#!/usr/bin/env python
"""Extractive question answering (SQuAD v1.1 / v2.0 and files in their format) with hf-mgk models.

The command; its code, options and examples are in `hf_mgk.scripts.run_qa` (src/hf_mgk/scripts/run_qa.py), which
other code imports. `python scripts/run_qa.py --help` lists the options."""

from hf_mgk.scripts.run_qa import main
from hf_mgk.training import run_script

if __name__ == "__main__":
    run_script(main)
