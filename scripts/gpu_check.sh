#!/usr/bin/env bash
# The GPU check of the Triton kernels, one command on a machine with a CUDA GPU and this repository's
# environment (bash scripts/setup.sh, or torch + triton + this package installed):
#   1. the kernels' correctness tests compiled on the GPU (pytest -m cuda: every output and gradient against the
#      references, as the CPU suite runs them in Triton's interpreter), then, per path and dtype (float32, bf16,
#      fp16), each kernel's largest error against the eager path on this GPU, output and every gradient, beside
#      both arms' times (python -m hf_mgk.benchmark.agreement: N = 1000, ending inside a block; OUT/agreement.txt);
#   2. one tuning pass of the block sizes (python -m hf_mgk.benchmark.tune: the defaults and 4 candidates a family,
#      compilation most of its time), whose choice the tables then use;
#   3. the attention-alone tables in bf16, B = 8, D = 64, N = 1024 and 4096, forward + backward, every path and SDPA
#      alternating in one process (--interleave): the Triton kernels ("..., triton") beside the eager path
#      ("..., eager") and beside what backend="auto" chose by timing them on its first call of each kind ("auto",
#      timed afresh: its cache goes to OUT/autotune-cache), with the choices listed under each table; beside each
#      Triton row's measured ratio, the static cost model's figure for this GPU's target (python -m
#      hf_mgk.benchmark.static, run on the CPU meanwhile: OUT/static.txt), the lower bound the run calibrates.
# Everything is written under the folder given (default gpu_check/); each step is bounded so the whole ends in under
# 10 minutes. `bash scripts/gpu_check.sh OUT models` then times the whole 2-layer models (width 512, B 8, N 1024,
# bf16 autocast, their steps alternating) against their baselines, with the block sizes OUT/tune.txt chose (~3
# minutes more). PYTHON picks the interpreter (default .venv/bin/python, else python3: a machine with torch, triton,
# transformers and pytest, e.g. a fresh GPU machine, runs this package from src/ without installing it).
# What is known of the kernels on GPUs so far, and the switch that turns them off: docs/gpu.md.
# Every step runs even when one before it failed (one call on a GPU machine gathers all it can), and the command
# exits 1 at the end, naming the steps that failed, if any did (a failing test, a time-out, a crash).
set -uo pipefail
cd "$(dirname "$0")/.."
FAILED=()
step() {  # step NAME COMMAND...: run it; its status (the pipeline's, with pipefail) decides
    local name=$1
    shift
    "$@" || FAILED+=("$name")
}
finish() {
    if [ ${#FAILED[@]} -gt 0 ]; then
        echo "gpu_check: FAILED: ${FAILED[*]}" >&2
        exit 1
    fi
}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=${1:-gpu_check}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
$PY -c "import hf_mgk" 2>/dev/null || export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
$PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || { echo "gpu_check: no CUDA GPU here" >&2; exit 1; }
if [ "${2:-}" = models ]; then
    BLOCKS=$(grep -s '^HF_MGK_TRITON_BLOCKS=' "$OUT/tune.txt" | tail -1 | cut -d= -f2-)
    [ -n "$BLOCKS" ] && export HF_MGK_TRITON_BLOCKS="$BLOCKS"
    models() {
        timeout 90 $PY scripts/benchmark.py --family "$1" --models-only --device cuda --dtype bf16 --interleave \
            --lengths 1024 --batch 8 --heads 8 --repeats 10 2>&1 | tee "$OUT/models_$1.txt"
    }
    for family in mgk fish mgk-gpt2; do
        step "models_$family" models "$family"
    done
    finish
    exit 0
fi
device() {
    $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" \
        | tee "$OUT/device.txt"
}
step device device
# the static cost model for this GPU's target (sm_89 counted as sm_86, sm_87 as sm_80), on the CPU while the tests run
TARGET=$($PY -c "import torch; M, m = torch.cuda.get_device_capability(); print({80: 80, 87: 80, 86: 86, 89: 86, 90: 90}.get(10 * M + m, ''))")
if [ -n "$TARGET" ]; then
    timeout 270 $PY -m hf_mgk.benchmark.static --target "$TARGET" --json "$OUT/static.json" > "$OUT/static.txt" 2>&1 &
    STATIC_PID=$!
fi
export HF_MGK_CACHE="$OUT/autotune-cache"
# the kernels compile per constant set: spread the tests over processes where pytest-xdist is there
XDIST=$($PY -c "import xdist" 2>/dev/null && echo "-n 16")
kernel_tests() {
    HF_MGK_TEST_CUDA=1 timeout 180 $PY -m pytest -q -m cuda -p no:cacheprovider $XDIST \
        tests/test_attention_mgk_triton.py tests/test_attention_fish_triton.py 2>&1 | tail -40 | tee "$OUT/pytest.txt"
}
agreement() {
    timeout 100 $PY -m hf_mgk.benchmark.agreement --device cuda --lengths 1000 --repeats 3 2>&1 | tee "$OUT/agreement.txt"
}
tune() {
    timeout 90 $PY -m hf_mgk.benchmark.tune --device cuda --dtype bf16 --repeats 10 2>&1 | tee "$OUT/tune.txt"
}
step pytest kernel_tests
step agreement agreement
step tune tune
BLOCKS=$(grep -s '^HF_MGK_TRITON_BLOCKS=' "$OUT/tune.txt" | tail -1 | cut -d= -f2-)
[ -n "$BLOCKS" ] && export HF_MGK_TRITON_BLOCKS="$BLOCKS"
static_report() {  # the model's figures (the tables print them beside the measured ratios)
    wait "$STATIC_PID" && grep -v -i warn "$OUT/static.txt" | head -16
}
STATIC=()
if [ -n "${STATIC_PID:-}" ]; then
    step static static_report
    [ -s "$OUT/static.json" ] && STATIC=(--static "$OUT/static.json")
fi
attention() {
    timeout 95 $PY scripts/benchmark.py --family "$1" --attention-only --device cuda --dtype bf16 --interleave \
        --lengths 1024 4096 --batch 8 --heads 8 --repeats 10 ${STATIC[@]+"${STATIC[@]}"} 2>&1 | tee "$OUT/attention_$1.txt"
}
for family in mgk fish; do
    step "attention_$family" attention "$family"
done
echo "written: $OUT (HF_MGK_TRITON_BLOCKS=${BLOCKS:-default})"
finish
