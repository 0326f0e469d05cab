"""The Triton kernels address their tensors in 64 bits where B x H x N x D (or B x M x N x S for the noise written
out) can pass 2^31 elements: each program's base offset is formed from the program id cast to int64, once, and only
the per-tile offsets within one (batch, head) stay in int32. Checked in the kernels' Triton IR compiled for sm_90
(no GPU needed; the interpreter, which these tests otherwise use, computes offsets in whatever numpy makes of them):
every use of a large tensor's pointer argument is a `tt.addptr` by an i64 offset that was computed in 64 bits (an
i64 product or sum, with no 32-bit product or sum widened anywhere in its chain), and the program id is widened.
Three control kernels written here, one in int32, one that widens after the product and one that multiplies a
64-bit base by a 32-bit product, show the check fails where it should."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

_SCRIPT = '''
import json, sys, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import hf_mgk.attention_fish_triton as aft
import hf_mgk.attention_mgk_triton as amt


@triton.jit
def narrow(X, Y, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    tl.store(Y + row * N + offs, tl.load(X + row * N + offs))


@triton.jit
def widened_late(X, Y, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    tl.store(Y + (row * N).to(tl.int64) + offs, tl.load(X + (row * N).to(tl.int64) + offs))


@triton.jit
def widened_inside(X, Y, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    tl.store(Y + row * (N * N) + offs, tl.load(X + row * (N * N) + offs))


@triton.jit
def wide(X, Y, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    tl.store(Y + row * N + offs, tl.load(X + row * N + offs))


RUNTIME = {"N": "i32", "S": "i32", "D": "i32", "DV": "i32", "M": "i32", "H": "i32", "stride_kr": "i32",
           "SEED": "i32", "NSEED": "i32", "scale": "fp32", "P_DROP": "fp32"}
BLOCKS = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_D=32, BLOCK_DV=32)
MGK = dict(DROPOUT=True, M=2, HARD=False, CAUSAL=True, SHARED=False, EVEN_N=False, EVEN_S=False, EVEN_D=False,
           PREC=None, **BLOCKS)
FISH = dict(MP=2, NETWORK=False, NOISE=True, PADDED=True, CAUSAL=True, DROPOUT=True, PREC=None, GROUP=1, **BLOCKS)
KERNELS = {
    "mgk._fwd_kernel": (amt._fwd_kernel, MGK),
    "mgk._bwd_dq_kernel": (amt._bwd_dq_kernel, MGK),
    "mgk._bwd_dkv_kernel": (amt._bwd_dkv_kernel, MGK),
    "fish._fwd_kernel": (aft._fwd_kernel, FISH),
    "fish._bwd_kv_kernel": (aft._bwd_kv_kernel, dict(FISH, HP=8)),
    "fish._fwd_kernel network": (aft._fwd_kernel, dict(FISH, NETWORK=True, GROUP=2)),
    "fish._bwd_kv_kernel network": (aft._bwd_kv_kernel, dict(FISH, NETWORK=True, HP=8, GROUP=2)),
    "fish._noise_kernel network": (aft._noise_kernel, dict(NETWORK=True, MP=2, BLOCK_M=32, BLOCK_N=32)),
    "fish._noise_kernel linear": (aft._noise_kernel, dict(NETWORK=False, MP=2, BLOCK_M=32, BLOCK_N=32)),
    "narrow": (narrow, dict(BLOCK=32)),
    "widened_late": (widened_late, dict(BLOCK=32)),
    "widened_inside": (widened_inside, dict(BLOCK=32)),
    "wide": (wide, dict(BLOCK=32)),
}
out = {}
for name, (fn, consts) in KERNELS.items():
    sig = {a: "constexpr" if a in consts else RUNTIME.get(a, "*bf16" if a in ("Q", "K", "V", "DO", "O") else "*fp32")
           for a in fn.arg_names}
    target = GPUTarget("cuda", int(sys.argv[2]) if len(sys.argv) > 2 else 90, 32)
    out[name] = triton.compile(ASTSource(fn, sig, constexprs=consts), target=target).asm["ttir"]
out["triton"] = triton.__version__
json.dump(out, open(sys.argv[1], "w"))
'''

# The pointer arguments whose tensors can pass 2^31 elements (not the weights, priors, the padding bias (B, S), or
# the per-program partial sums).
_LARGE = {
    "mgk._fwd_kernel": "Q K V X Y O LSE",
    "mgk._bwd_dq_kernel": "Q K V X Y DO LSE DELTA DQ DX",
    "mgk._bwd_dkv_kernel": "Q K V X Y DO LSE DELTA DK DV_OUT DY",
    "fish._fwd_kernel": "Q K V O LSE",
    "fish._bwd_kv_kernel": "Q K V DO LSE DELTA DK DVO DQ",
    "fish._fwd_kernel network": "Q K V O LSE",
    "fish._bwd_kv_kernel network": "Q K V DO LSE DELTA DK DVO DQ",
    "fish._noise_kernel network": "E",
    "fish._noise_kernel linear": "E",
    "narrow": "X Y",
    "widened_late": "X Y",
    "widened_inside": "X Y",
    "wide": "X Y",
}


def _narrow_offsets(ttir, names):
    """What in the IR addresses a large tensor other than by a 64-bit base offset computed in 64 bits; [] if
    nothing. Also an entry when no program id is widened to i64."""
    defs = {m.group(1): m.group(2) for m in re.finditer(r"^\s*(%[\w.#-]+) = (.*)$", ttir, re.M)}
    found = []
    pids = [v for v, d in defs.items() if d.startswith("tt.get_program_id x")]
    if not any(re.match(rf"arith\.extsi {re.escape(p)} : i32 to i64", d) for p in pids for d in defs.values()):
        found.append(f"no program id ({pids}) extended to i64")
    for name in names.split():
        uses = [line.strip() for line in ttir.splitlines()
                if re.search(rf"%{name}\b(?![(:])", line) and "tt.func" not in line]
        if not uses:
            found.append(f"%{name} unused")
        for use in uses:
            m = re.search(rf"tt\.addptr %{name}, (%[\w.#-]+) : !tt\.ptr<\w+>, i64", use)
            if not m:
                found.append(use)
            elif not re.match(r"arith\.(muli|addi) .*: i64", defs.get(m.group(1), "")):
                found.append(f"{use}  [offset {m.group(1)} = {defs.get(m.group(1))}]")
            else:
                found += [f"{use}  [{late}]" for late in _widened_late(m.group(1), defs)]
    return found


def _widened_late(value, defs):
    """The 32-bit products or sums that the 64-bit offset `value` widens on its way (arith.extsi of an i32 muli /
    addi anywhere in its chain of i64 products and sums): they may have wrapped before the widening."""
    found, todo, seen = [], [value], set()
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        d = defs.get(v, "")
        if re.match(r"arith\.(muli|addi) .*: i64", d):
            todo += re.findall(r"%[\w.#-]+", d.split(":")[0])
        elif d.startswith("arith.extsi"):
            src = re.match(r"arith\.extsi (%[\w.#-]+)", d).group(1)
            if re.match(r"arith\.(muli|addi) .*: i32", defs.get(src, "")):
                found.append(f"{v} = {d}, of {src} = {defs[src]}")
    return found


@pytest.mark.slow
def test_base_offsets_are_64_bit_in_the_compiled_kernels(tmp_path):
    """Each kernel (the MGK forward, dq and dk/dv kernels; FiSH's forward, dq, dk/dv and noise kernels) compiled
    for sm_90 with blocks of 32: its large tensors are offset per program in 64 bits. The controls: int32 offsets
    and an int32 product widened afterwards are both caught, the 64-bit one passes."""
    path, script = tmp_path / "ttir.json", tmp_path / "compile_ttir.py"  # @triton.jit reads its source from a file
    script.write_text(textwrap.dedent(_SCRIPT))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(script), str(path)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ttir = json.loads(path.read_text())
    problems = {name: _narrow_offsets(ttir[name], names) for name, names in _LARGE.items()}
    assert len(problems["narrow"]) >= 3 and any(": !tt.ptr<f32>, i32" in p for p in problems["narrow"])
    assert problems["widened_late"] and all("arith.extsi" in p for p in problems["widened_late"][1:])
    assert len(problems["widened_inside"]) == 2 and all("arith.extsi" in p for p in problems["widened_inside"])
    assert problems["wide"] == []
    controls = ("narrow", "widened_late", "widened_inside", "wide")
    kernels = {name: found for name, found in problems.items() if name not in controls}
    assert kernels == {name: [] for name in kernels}
