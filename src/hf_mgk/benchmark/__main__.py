"""`python -m hf_mgk.benchmark`: the benchmark's command (as `scripts/benchmark.py`), and each child's entry point
(measure.child_command)."""

from .cli import main

if __name__ == "__main__":
    main()
