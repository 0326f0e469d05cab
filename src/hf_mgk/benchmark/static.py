"""A static cost report of the Triton attention kernels, with no GPU: each launch of a path's pass is compiled by
Triton for a GPU target (its own frontend and ptxas run on the CPU), the cubin disassembled (nvdisasm, bundled with
Triton), and the kernel's main loop counted by pipe, per (query, key) pair and per softmax head, against a
flash-attention baseline compiled the same way (the "softmax" path: its kernels are here, in the Triton tutorial's
pattern, no bounds masks).

    python -m hf_mgk.benchmark.static                       # every path, sm_90, bf16, head size 64
    python -m hf_mgk.benchmark.static --paths "mgk soft" fish --target 80 --json cost.json
    python -m hf_mgk.benchmark.static --no-best-baseline    # the baseline at its default blocks only

The main loop: of the loops of the SASS (a backward branch to an earlier label), the innermost one that holds a
tensor-core instruction (spin-waits and the like inside it are counted); a cold path inside it (a forward branch
over a region holding a loop of its own and no tensor-core instruction: libdevice's slow argument reduction of
sin / cos) is skipped. Its instructions go to pipes (`pipe_of`): mufu (exp2, log2, rcp, ...), fp32 (FFMA, FMUL,
FMNMX, F2FP, HFMA2, ...), mma (HGMMA / HMMA: their FLOPs from the shape; an HGMMA is issued by each of the 4 warps
of its warpgroup, a quarter of its FLOPs each), mem, ctrl, uniform (U*: the uniform datapath, no issue slot of the
vector pipes counted) and alu (the rest: integer, logic, moves, conversions; IMAD is counted here though it may
run on the FMA pipe, the pessimistic side). Per SM partition, the loop body as one warp runs it costs

    cycles = max(issue, mufu_cycles * mufu, fp32_cycles * fp32, alu_cycles * alu, mma_flops / mma_rate)

(sm_90: 8, 1, 2 and 1024 bf16 FLOPs a cycle; sm_80 and sm_86 their published per-SM rates, `RATES`), and a launch
per pair and softmax head costs cycles / 4 partitions x warps / pairs (one iteration's pairs) x per_pair (how often
the pass runs that loop per pair and softmax head). A pass sums its launches; a path's figure is its cycles over
the baseline's (the baseline at its best of `BASELINE_BLOCKS`, or at its default blocks), the issue-slot ratio
beside it.

Left out: latency (the dependent chains of one warp, barriers' waits), occupancy (registers and shared memory
bound the warps an SM holds: they are printed, not modelled), memory (bandwidth, cache, the loads' latency),
the code outside the main loop (prologue, epilogue, the MGK delta pass's reduction in torch), and the pipelining
across warps. The figure is a throughput bound of the loop bodies; one GPU run (scripts/gpu_check.sh's measured
ratios against these figures) calibrates how far each path sits from it."""

import argparse
import json
import os
import re
import subprocess
import tempfile
from types import SimpleNamespace

from .. import attention_fish_triton as aft
from .. import attention_mgk_triton as amt
import torch

from ..attention_triton import SHARED_MEMORY, SMALL_SHARED_MEMORY, interpreting, precision, tl, triton

PATHS = ("softmax", "mgk soft", "smgk soft", "mgk hard", "smgk hard", "hard_fish", "fish", "mish", "hard_gfish",
         "gfish")
NOTES = {"mish": "the same launches as fish: the Triton path runs MiSH as FiSH with its one mixing column expanded "
                 "to every local head (fish_triton), so its kernels and their cost are fish's"}
BASELINE_BLOCKS = ((64, 64), (64, 32), (32, 64), (128, 64))
LOCAL_HEADS, GLOBAL_HEADS = 8, 2  # FiSH: H local heads from M global ones (M is also MGK's keys per head)
WARPS, STAGES = 4, 3
# per target: cycles a warp instruction takes on its pipe of one SM partition, and tensor-core FLOPs a cycle
RATES = {90: dict(mufu=8, fp32=1, alu=2, mma=1024),   # H100 SXM: 128 FP32, 64 INT32, 16 SFU lanes an SM; dense bf16
         80: dict(mufu=8, fp32=2, alu=2, mma=512),    # A100: 64 FP32, 64 INT32, 16 SFU
         86: dict(mufu=8, fp32=1, alu=2, mma=128)}    # GA10x: 128 FP32 (half shared with INT32), fp32 accumulation

if triton is not None:

    @triton.jit
    def _softmax_step(q, K, V, base, offs_m, offs_n, offs_d, m_i, l_i, acc, scale_log2, BLOCK_D: tl.constexpr,
                      MASK: tl.constexpr):
        """One key block of the online softmax: (m_i, l_i, acc) updated; MASK hides keys past the query (causal)."""
        k = tl.load(K + base + offs_n[:, None] * BLOCK_D + offs_d[None, :])
        qk = tl.dot(q, tl.trans(k)) * scale_log2
        if MASK:
            qk = tl.where(offs_n[None, :] <= offs_m[:, None], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + base + offs_n[:, None] * BLOCK_D + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return m_new, l_i, acc

    @triton.jit
    def softmax_fwd(Q, K, V, O, LSE, N, scale_log2, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        """Flash attention's forward for one (batch x head, query block): online softmax over the key blocks (causal:
        the blocks below the diagonal unmasked, the diagonal one masked)."""
        base = tl.program_id(0) * N * BLOCK_D
        start_m = tl.program_id(1) * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        q = tl.load(Q + base + offs_m[:, None] * BLOCK_D + offs_d[None, :])
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for start_n in range(0, start_m if CAUSAL else N, BLOCK_N):
            m_i, l_i, acc = _softmax_step(q, K, V, base, offs_m, start_n + tl.arange(0, BLOCK_N), offs_d, m_i, l_i,
                                          acc, scale_log2, BLOCK_D, False)
        if CAUSAL:  # the diagonal block, masked
            m_i, l_i, acc = _softmax_step(q, K, V, base, offs_m, start_m + tl.arange(0, BLOCK_N), offs_d, m_i, l_i,
                                          acc, scale_log2, BLOCK_D, True)
        tl.store(O + base + offs_m[:, None] * BLOCK_D + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty))
        tl.store(LSE + tl.program_id(0) * N + offs_m, m_i + tl.log2(l_i))

    @triton.jit
    def softmax_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK_OUT, DV_OUT, N, scale_log2, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        """dK and dV of one (batch x head, key block), over the query blocks (weights recomputed from the lse)."""
        base = tl.program_id(0) * N * BLOCK_D
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        k = tl.load(K + base + offs_n[:, None] * BLOCK_D + offs_d[None, :])
        v = tl.load(V + base + offs_n[:, None] * BLOCK_D + offs_d[None, :])
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        for start_m in range(0, N, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            q = tl.load(Q + base + offs_m[:, None] * BLOCK_D + offs_d[None, :])
            do = tl.load(DO + base + offs_m[:, None] * BLOCK_D + offs_d[None, :])
            lse = tl.load(LSE + tl.program_id(0) * N + offs_m)
            delta = tl.load(DELTA + tl.program_id(0) * N + offs_m)
            p = tl.exp2(tl.dot(q, tl.trans(k)) * scale_log2 - lse[:, None])
            dv += tl.dot(tl.trans(p).to(do.dtype), do)
            ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
            dk += tl.dot(tl.trans(ds).to(q.dtype), q)
        tl.store(DK_OUT + base + offs_n[:, None] * BLOCK_D + offs_d[None, :], dk.to(DK_OUT.dtype.element_ty))
        tl.store(DV_OUT + base + offs_n[:, None] * BLOCK_D + offs_d[None, :], dv.to(DV_OUT.dtype.element_ty))

    @triton.jit
    def softmax_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ_OUT, N, scale_log2, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr):
        """dQ of one (batch x head, query block), over the key blocks."""
        base = tl.program_id(0) * N * BLOCK_D
        offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        q = tl.load(Q + base + offs_m[:, None] * BLOCK_D + offs_d[None, :])
        do = tl.load(DO + base + offs_m[:, None] * BLOCK_D + offs_d[None, :])
        lse = tl.load(LSE + tl.program_id(0) * N + offs_m)
        delta = tl.load(DELTA + tl.program_id(0) * N + offs_m)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for start_n in range(0, N, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = tl.load(K + base + offs_n[:, None] * BLOCK_D + offs_d[None, :])
            v = tl.load(V + base + offs_n[:, None] * BLOCK_D + offs_d[None, :])
            p = tl.exp2(tl.dot(q, tl.trans(k)) * scale_log2 - lse[:, None])
            ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
            dq += tl.dot(ds.to(k.dtype), k)
        tl.store(DQ_OUT + base + offs_m[:, None] * BLOCK_D + offs_d[None, :], dq.to(DQ_OUT.dtype.element_ty))


# ---- the launches ---------------------------------------------------------------------------------------------------
INTS = {"N", "S", "D", "DV", "M", "H", "stride_kr", "SEED", "NSEED"}
FLOATS = {"scale", "P_DROP", "scale_log2"}
HALF = {"Q", "K", "V", "DO", "O", "DK_OUT", "DV_OUT", "DQ_OUT"}  # the baseline's tensors in the compute dtype
HALF_KERNELS = {"Q", "K", "V", "DO", "O"}             # the project's kernels: gradients and the rest float32


def signature(fn, constants, dtype, half):
    """ASTSource's signature of `fn`: constexpr, i32, fp32 or a pointer (`half` names in `dtype`, others fp32)."""
    return {a: "constexpr" if a in constants else "i32" if a in INTS else "fp32" if a in FLOATS
            else "*" + (dtype if a in half else "fp32") for a in fn.arg_names}


def launch(fn, constants, dtype, pairs, per_pair, half=HALF_KERNELS, name=None, options=None, trips=1):
    """One kernel launch of a pass: what compiles it (kernel, signature, constants, options: the launch's
    num_warps / num_stages, by default WARPS / STAGES) and how its main loop counts (pairs: (query, key) pairs x
    heads one iteration covers; per_pair: the times a pass runs that loop per pair and softmax head; trips: the
    times a loop nested in the main loop runs an iteration, `hot_count`)."""
    return SimpleNamespace(kernel=fn, name=name or fn.__name__, signature=signature(fn, constants, dtype, half),
                           constants=dict(constants), options=dict(options or dict(num_warps=WARPS, num_stages=STAGES)),
                           pairs=pairs, per_pair=per_pair, trips=trips)


def launches(path, direction, target=90, dtype="bf16", head_size=64, blocks=None):
    """Every launch the pass `direction` ("forward" / "backward") of `path` (PATHS) makes, at the families' default
    GPU block sizes for `target`'s shared memory in `dtype` (`block_sizes("cuda", ...)`; "fp32" as the kernels run
    float32 calls on a GPU: MGK's products in IEEE float32, FiSH's in three TF32 products) or `blocks` (BLOCK_M,
    BLOCK_N); dropout and causal off, M = 2 (FiSH: 8 local heads from 2 global), head size = value size."""
    if path not in PATHS:
        raise ValueError(f"unknown path {path!r}: one of {', '.join(PATHS)}")
    if direction not in ("forward", "backward"):
        raise ValueError(f"direction {direction!r}: 'forward' or 'backward'")
    if triton is None:
        raise RuntimeError("the static report compiles the kernels with Triton, which is not installed")
    shared = SHARED_MEMORY.get(target, SMALL_SHARED_MEMORY)
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    bd = max(16, triton.next_power_of_2(head_size))
    if path == "softmax":
        bm, bn = blocks or (64, 64)
        fa = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd)
        if direction == "forward":
            return [launch(softmax_fwd, {**fa, "CAUSAL": False}, dtype, bm * bn, 1.0, HALF)]
        return [launch(softmax_bwd_dkdv, fa, dtype, bm * bn, 1.0, HALF),
                launch(softmax_bwd_dq, fa, dtype, bm * bn, 1.0, HALF)]
    if "mgk" in path:
        # one program per (batch x MGK head, query block): forward and dQ; per (batch x MGK head, key block), every
        # key r in it: dK / dV. MGK runs H / 2 heads against softmax's H: 0.5 per softmax head, each launch. Lengths
        # a multiple of the blocks and head size = value size = a power of two (EVEN_*), as at the tables' shapes
        bm, bn = blocks or amt.block_sizes("cuda", head_size, head_size, torch_dtype,
                                           1 if path.startswith("smgk") else GLOBAL_HEADS)
        base = dict(DROPOUT=False, M=GLOBAL_HEADS, HARD=path.endswith("hard"), CAUSAL=False,
                    SHARED=path.startswith("smgk"), EVEN_N=True, EVEN_S=True, EVEN_D=head_size == bd,
                    PREC=precision(torch_dtype, "cuda"),
                    BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, BLOCK_DV=bd)
        opts = amt.launch_options(bm, bn)
        if direction == "forward":
            return [launch(amt._fwd_kernel, base, dtype, bm * bn, 0.5, options=opts)]
        # dK / dV: key-major tiles, bm keys x dkv_rows(bn, M) query rows an iteration; the hard E-step's one pass
        # (is_one_pass: dq and dx added by the dK / dV programs), the others' dQ before it
        rows = amt.dkv_rows(bn, GLOBAL_HEADS)
        one_pass = amt.is_one_pass(base["HARD"], base["SHARED"], GLOBAL_HEADS)
        dkv = launch(amt._bwd_dkv_kernel, dict(base, BLOCK_M=rows, BLOCK_N=bm, DQ_ATOMIC=one_pass), dtype, bm * rows,
                     0.5, options=opts)
        if one_pass:
            return [dkv]
        return [launch(amt._bwd_dq_kernel, base, dtype, bm * bn, 0.5, options=opts), dkv]
    # FiSH: forward per (batch x local head, query block) over key blocks; the backward in one pass, per (batch x
    # local head, key block) over blocks of query rows, adding dq too. Each inner iteration covers one local head's
    # block of pairs, once per pass: 1.0 per pair and local head, and FiSH's H local heads stand against softmax's H
    # heads. The launches of aft.launch_configs, or at `blocks` (the backward over aft.kv_rows of its rows), 4 warps
    kind = "fish" if path == "mish" else path
    network, noise = kind.endswith("gfish"), not kind.startswith("hard")
    if blocks:
        fwd, bwd = aft.block_launches(*blocks, network)
    else:
        fwd, bwd = aft.launch_configs("cuda", GLOBAL_HEADS, head_size, head_size, torch_dtype, shared, network, noise,
                                      dropout=False)
    group = aft.heads_a_program(LOCAL_HEADS, network, "cuda", torch_dtype)  # a network's program: its group's heads
    base = dict(MP=triton.next_power_of_2(GLOBAL_HEADS), NETWORK=network, NOISE=noise, PADDED=False, CAUSAL=False,
                DROPOUT=False, PREC=precision(torch_dtype, "cuda", float32="tf32x3"), BLOCK_D=bd, BLOCK_DV=bd,
                GROUP=group)
    trips = LOCAL_HEADS if network else 1  # the network's loop over its H hidden units, nested
    rows, keys, warps = fwd if direction == "forward" else bwd
    consts = dict(base, BLOCK_M=rows, BLOCK_N=keys)
    opts = dict(num_warps=warps, num_stages=STAGES)
    if direction == "forward":
        return [launch(aft._fwd_kernel, consts, dtype, rows * keys * group, 1.0, options=opts, trips=trips)]
    return [launch(aft._bwd_kv_kernel, dict(consts, HP=triton.next_power_of_2(LOCAL_HEADS)), dtype,
                   rows * keys * group, 1.0, options=opts, trips=trips)]


# ---- compile and count ----------------------------------------------------------------------------------------------
PIPES = (
    ("mufu", re.compile(r"^MUFU")),
    ("mma", re.compile(r"^(HGMMA|HMMA|IMMA|QGMMA|BGMMA)")),
    ("fp32", re.compile(r"^(FFMA|FMUL|FADD|FMNMX|FSEL|FSETP|FSET|FCHK|FRND|FMUL2|FADD2|FFMA2|F2FP|HADD2|HMUL2|HFMA2"
                        r"|HMNMX2)")),
    ("mem", re.compile(r"^(LDG|STG|LDS|STS|LDSM|STSM|LDGSTS|LDGDEPBAR|UTMA|UBLKCP|LD|ST|ATOM|RED|LDC|SYNCS|UTMALDG"
                       r"|UTMASTG)")),
    ("ctrl", re.compile(r"^(BRA|BAR|WARPSYNC|DEPBAR|NOP|EXIT|RET|CALL|BSSY|BSYNC|YIELD|WARPGROUP|ELECT|ACQBULK|BMOV"
                        r"|PLOP3|VOTE|S2R|S2UR|CS2R|R2UR|ENDCOLLECTIVE|NANOSLEEP|MEMBAR|ERRBAR|CCTL|FENCE)")),
    ("uniform", re.compile(r"^U")),
)
MMA_SHAPE = re.compile(r"\.(\d+)x(\d+)x(\d+)")
MMA_SYNC = {"16816": (16, 8, 16), "1688": (16, 8, 8), "884": (8, 8, 4)}
INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)(.*?);")
LABEL = re.compile(r"^\s*\.?(L_x_\d+|\.L_\w+):")
TARGET_LABEL = re.compile(r"(L_x_\d+)")
COUNTED = ("issue", "mufu", "fp32", "alu", "mma", "mma_flops", "mem", "ctrl", "uniform")


def pipe_of(op):
    """The pipe of an opcode (matched by its start, modifiers included); alu for the rest (IMAD, IADD3, LOP3, SHF,
    ISETP, SEL, PRMT, MOV, conversions, ...)."""
    return next((name for name, rx in PIPES if rx.match(op)), "alu")


def parse(sass):
    """The instructions (opcode, operands) of nvdisasm's listing and the index each label points at."""
    instrs, labels = [], {}
    for line in sass.splitlines():
        if (m := LABEL.match(line)):
            labels[m.group(1).lstrip(".")] = len(instrs)
        elif (m := INSTR.match(line)):
            instrs.append((m.group(2), m.group(3)))
    return instrs, labels


def main_loop(instrs, labels):
    """(loops, all the loops as (first, last) index, cold): the innermost loop holding a tensor-core instruction
    (or, if none does, every loop), and the indices of the cold paths to skip."""
    back = []
    for i, (op, rest) in enumerate(instrs):
        if op.startswith("BRA") and (t := TARGET_LABEL.search(rest)) and labels.get(t.group(1), i + 1) <= i:
            back.append((labels[t.group(1)], i))
    has_mma = [(a, b) for a, b in back if any(pipe_of(op) == "mma" for op, _ in instrs[a:b + 1])]
    cold = set()
    for i, (op, rest) in enumerate(instrs):
        if op.startswith("BRA") and (t := TARGET_LABEL.search(rest)) and t.group(1) in labels:
            j = labels[t.group(1)]
            if j > i and any(i < a and b < j for a, b in back) and not any(
                    pipe_of(o) == "mma" for o, _ in instrs[i:j]):
                cold.update(range(i + 1, j))
    inner = [min(has_mma, key=lambda ab: ab[1] - ab[0])] if has_mma else back
    return inner, back, cold


def count(instrs, first, last, cold=()):
    """Warp instructions of instrs[first..last] by pipe (cold ones skipped); issue: all but the uniform ones;
    mma_flops: the tensor-core FLOPs one warp's instructions stand for."""
    c = dict.fromkeys(COUNTED, 0)
    for i in range(first, last + 1):
        if i in cold:
            continue
        op, rest = instrs[i]
        pipe = pipe_of(op)
        c[pipe] += 1
        if pipe == "uniform":
            continue
        c["issue"] += 1
        if pipe == "mma":
            m = MMA_SHAPE.search(op + rest)
            shape = tuple(int(x) for x in m.groups()) if m else MMA_SYNC.get(op.split(".")[1] if "." in op else "")
            if shape:
                c["mma_flops"] += 2 * shape[0] * shape[1] * shape[2] / (4 if op.startswith("HGMMA") else 1)
    return c


def hot_count(instrs, first, last, back, cold, trips=1):
    """count() of the main loop instrs[first..last]: its cold paths skipped, or with trips > 1 (the loops nested in
    it run `trips` times an iteration: a GFiSH network's loop over its H hidden units, whose guard branch looks like
    a cold path) everything in it counted and each nested loop's body `trips` times."""
    if trips == 1:
        return count(instrs, first, last, cold)
    c = count(instrs, first, last)
    for a, b in back:
        if first <= a and b <= last and (a, b) != (first, last):
            extra = count(instrs, a, b)
            c = {k: c[k] + (trips - 1) * extra[k] for k in c}
    return c


def bounds(c, target=90):
    """The cycles of one SM partition for counts `c` by each bound; the model takes their max."""
    r = RATES[target]
    return dict(issue=c["issue"], mufu=r["mufu"] * c["mufu"], fp32=r["fp32"] * c["fp32"], alu=r["alu"] * c["alu"],
                mma=c["mma_flops"] / r["mma"])


def cycles(c, target=90):
    return max(bounds(c, target).values())


def _tool(name):
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


_CACHE = {}


# What a real launch specializes, with its tensors 16-byte aligned (fresh torch tensors are) and its lengths and
# head sizes multiples of 16: Triton marks those arguments divisible by 16, vectorizes and pipelines the loads
# (cp.async), and holds more tiles in shared memory than the plain compile the cost model counts.
ALIGNED_INTS = {"N", "S", "D", "DV", "stride_kr"}


def compiled(ln, target, aligned=False):
    """(resources, SASS) of a launch for sm_<target>: cached per (kernel, constants, options, target, aligned) in
    this process. `aligned`: compiled as a launch on aligned tensors and lengths specializes (ALIGNED_INTS)."""
    key = (ln.kernel.__module__, ln.kernel.__name__, tuple(sorted(ln.constants.items(), key=str)),
           tuple(sorted(ln.signature.items())), tuple(sorted(ln.options.items())), target, aligned)
    if key not in _CACHE:
        if interpreting():
            raise RuntimeError("the kernels were made for Triton's interpreter (TRITON_INTERPRET=1 when triton was "
                               "imported): run the static report without it")
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(ln.kernel.arg_names) if aligned and (
            ln.signature[a].startswith("*") or (a in ALIGNED_INTS and ln.signature[a] == "i32"))}
        k = triton.compile(ASTSource(ln.kernel, ln.signature, constexprs=ln.constants, attrs=attrs),
                           target=GPUTarget("cuda", target, 32), options=ln.options)
        with tempfile.TemporaryDirectory() as work:
            cubin = os.path.join(work, "k.cubin")
            with open(cubin, "wb") as f:
                f.write(k.asm["cubin"])
            res = subprocess.run([_tool("cuobjdump"), "-res-usage", cubin], capture_output=True, text=True)
            sass = subprocess.run([_tool("nvdisasm"), "-c", cubin], capture_output=True, text=True)
        if not sass.stdout:
            raise RuntimeError(f"nvdisasm gave nothing for {ln.name}: {sass.stderr[-300:]}")
        info = res.stdout + res.stderr
        # spilled bytes: ptxas puts spills in the stack frame (cuobjdump's STACK), LOCAL counts only local arrays;
        # so local_bytes is the two together (a kernel with STACK > 0 and no calls spills: LDL / STL in its SASS)
        regs, local, stack = (re.search(rf"{w}:(\d+)", info) for w in ("REG", "LOCAL", "STACK"))
        _CACHE[key] = (dict(regs=int(regs.group(1)) if regs else None,
                            local_bytes=int(local.group(1)) + int(stack.group(1) if stack else 0) if local else None,
                            shared=k.metadata.shared), sass.stdout)
    return _CACHE[key]


def shared_overruns(target=90, dtype="bf16", paths=PATHS, head_size=64):
    """The launches of `paths` (both passes, at the default blocks for `target` and `dtype`, compiled as a launch on
    aligned tensors specializes: `compiled(aligned=True)`) whose shared memory passes what one program may use on
    `target` (attention_triton.SHARED_MEMORY): (path, kernel, bytes, limit) each; empty where every one fits."""
    limit = SHARED_MEMORY.get(target, SMALL_SHARED_MEMORY)
    over = []
    for path in dict.fromkeys(paths):
        for direction in ("forward", "backward"):
            for ln in launches(path, direction, target, dtype, head_size):
                shared = compiled(ln, target, aligned=True)[0]["shared"]
                if shared > limit:
                    over.append((path, ln.name, shared, limit))
    return over


def cost(ln, target=90, aligned=False):
    """A launch's row: its resources, its main loop's counts and the model's cycles, per pair and softmax head
    (`aligned`: compiled as a launch on aligned tensors specializes, `compiled`)."""
    meta, sass = compiled(ln, target, aligned)
    instrs, labels = parse(sass)
    inner, back, cold = main_loop(instrs, labels)
    if not inner:
        raise RuntimeError(f"{ln.name}: no loop in its SASS")
    c = max((hot_count(instrs, a, b, back, cold, ln.trips) for a, b in inner), key=lambda x: x["issue"])
    scale = ln.options["num_warps"] / ln.pairs * ln.per_pair
    bound = bounds(c, target)
    row = dict(kernel=ln.name, **meta, loops=len(back), mma_loop=c["mma"] > 0, body=c["issue"] + c["uniform"],
               bound=max(bound, key=bound.get), cycles=max(bound.values()) * scale / 4)
    row.update({k: c[k] * scale for k in ("issue", "mufu", "fp32", "alu", "mma_flops", "mem")})
    return row


def pass_cost(path, direction, target=90, dtype="bf16", head_size=64, blocks=None, aligned=False):
    """The rows of a pass's launches and their sums (cycles, issue, ... per pair and softmax head)."""
    rows = [dict(path=path, direction=direction, **cost(ln, target, aligned))
            for ln in launches(path, direction, target, dtype, head_size, blocks)]
    return rows, {k: sum(r[k] for r in rows) for k in ("cycles", "issue", "mufu", "fp32", "alu", "mma_flops", "mem")}


def baseline(target=90, dtype="bf16", head_size=64, best=True, blocks=None, aligned=False):
    """The softmax baseline's rows and sums per direction: at its best (lowest cycles) of BASELINE_BLOCKS per pass,
    or at `blocks` (default 64x64)."""
    out = {}
    for direction in ("forward", "backward"):
        tries = [(b, *pass_cost("softmax", direction, target, dtype, head_size, b, aligned))
                 for b in (BASELINE_BLOCKS if best else [blocks or BASELINE_BLOCKS[0]])]
        blocks, rows, sums = min(tries, key=lambda t: t[2]["cycles"])
        out[direction] = (rows, dict(sums, blocks=f"{blocks[0]}x{blocks[1]}"))
    return out


def report(paths=PATHS, target=90, dtype="bf16", head_size=64, best_baseline=True, blocks=None, aligned=False):
    """The summary (per path: forward, backward and both as cycles against the baseline's; issue-slot ratios) and
    every launch's row; `blocks`: every path and the baseline at these (BLOCK_M, BLOCK_N) instead; `aligned`: every
    kernel, the baseline's too, compiled as a launch on aligned tensors and lengths specializes (vectorized,
    pipelined loads), not plainly (scalar loads: the memory slots of a kernel that loads more weigh more)."""
    base = baseline(target, dtype, head_size, best_baseline and blocks is None, blocks, aligned)
    rows = [dict(r, baseline=True) for d in base.values() for r in d[0]]
    summary = {}
    for path in paths:
        sums = {}
        for direction in ("forward", "backward"):
            r, sums[direction] = pass_cost(path, direction, target, dtype, head_size, blocks, aligned)
            rows += r
        f, b = sums["forward"], sums["backward"]
        bf, bb = base["forward"][1], base["backward"][1]
        summary[path] = dict(forward=f["cycles"] / bf["cycles"], backward=b["cycles"] / bb["cycles"],
                             both=(f["cycles"] + b["cycles"]) / (bf["cycles"] + bb["cycles"]),
                             forward_issue=f["issue"] / bf["issue"], backward_issue=b["issue"] / bb["issue"],
                             both_issue=(f["issue"] + b["issue"]) / (bf["issue"] + bb["issue"]))
        if path in NOTES:
            summary[path]["note"] = NOTES[path]
    return dict(target=target, dtype=dtype, head_size=head_size, warps=WARPS, stages=STAGES, aligned=aligned,
                baseline_blocks={d: base[d][1]["blocks"] for d in base}, summary=summary, rows=rows)


def print_report(rep):
    print(f"sm_{rep['target']}, {rep['dtype']}, head size {rep['head_size']}, {rep['warps']} warps, "
          f"{rep['stages']} stages{', aligned' if rep.get('aligned') else ''}; per (query, key) pair and softmax head against flash attention compiled the same "
          f"way (baseline blocks: forward {rep['baseline_blocks']['forward']}, backward "
          f"{rep['baseline_blocks']['backward']})\n")
    print(f"{'path':<12} {'forward':>8} {'fwd issue':>10} {'backward':>9} {'bwd issue':>10} {'both':>6} "
          f"{'both issue':>11}")
    for path, s in rep["summary"].items():
        print(f"{path:<12} {s['forward']:>8.2f} {s['forward_issue']:>10.2f} {s['backward']:>9.2f} "
              f"{s['backward_issue']:>10.2f} {s['both']:>6.2f} {s['both_issue']:>11.2f}")
    for path, s in rep["summary"].items():
        if "note" in s:
            print(f"  {path}: {s['note']}")
    print(f"\nper launch (counts per pair and softmax head; regs, local = spilled bytes, shared bytes a program)\n"
          f"{'path':<12} {'pass':<4} {'kernel':<28} {'cycles':>7} {'bound':>6} {'issue':>7} {'mufu':>6} {'fp32':>6} "
          f"{'alu':>6} {'mma':>6} {'mem':>6} {'regs':>5} {'local':>6} {'shared':>7}")
    for r in rep["rows"]:
        name = "softmax*" if r.get("baseline") else r["path"]
        print(f"{name:<12} {r['direction'][:3]:<4} {r['kernel'][:28]:<28} {r['cycles']:>7.3f} {r['bound']:>6} "
              f"{r['issue']:>7.3f} {r['mufu']:>6.3f} {r['fp32']:>6.3f} {r['alu']:>6.3f} {r['mma_flops']:>6.0f} "
              f"{r['mem']:>6.3f} {r['regs']!s:>5} {r['local_bytes']!s:>6} {r['shared']!s:>7}")
    print("\nsoftmax*: the baseline the figures divide by. mma: tensor-core FLOPs.")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m hf_mgk.benchmark.static", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS, metavar="PATH",
                    help=f"the paths to report (default all: {', '.join(PATHS)})")
    ap.add_argument("--target", type=int, default=90, choices=sorted(RATES), help="compute capability (default 90)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("--no-best-baseline", dest="best", action="store_false",
                    help=f"the baseline at 64x64 only, not its best of {len(BASELINE_BLOCKS)} block sizes")
    ap.add_argument("--blocks", metavar="MxN", help="every path and the baseline at these block sizes (e.g. 32x32)")
    ap.add_argument("--aligned", action="store_true",
                    help="compile every kernel (the baseline's too) as a launch on aligned tensors specializes")
    ap.add_argument("--json", metavar="FILE", help="write the summary and every launch's row as JSON")
    args = ap.parse_args(argv)
    blocks = tuple(int(x) for x in args.blocks.split("x")) if args.blocks else None
    rep = report(args.paths, args.target, args.dtype, args.head_size, args.best, blocks, args.aligned)
    print_report(rep)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
