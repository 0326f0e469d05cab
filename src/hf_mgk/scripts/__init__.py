"""The code of the training scripts (run_mlm, run_clm, run_glue, run_qa), importable: `scripts/run_*.py` are the
commands (python / torchrun take a file), and other code (the quickstart, the tests) imports these modules
through the package rather than putting scripts/ on sys.path. `import hf_mgk` does not load them."""
