"""The static cost report (hf_mgk.benchmark.static): its launches, its SASS counting on a hand-written listing, the
model's bound, and (slow) a real compile of the baseline and soft MGK at small blocks, in a child process (the tests
import triton under TRITON_INTERPRET=1, whose kernels cannot be compiled for a GPU)."""

import json
import os
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")
static = pytest.importorskip("hf_mgk.benchmark.static")
amt = pytest.importorskip("hf_mgk.attention_mgk_triton")
aft = pytest.importorskip("hf_mgk.attention_fish_triton")

ATTRIBUTES = ("kernel", "signature", "constants", "options", "pairs", "per_pair")


@pytest.mark.parametrize("path", static.PATHS)
def test_every_launch_of_every_path_has_what_compiles_and_counts_it(path):
    for direction in ("forward", "backward"):
        found = static.launches(path, direction)
        assert found, (path, direction)
        for ln in found:
            for name in ATTRIBUTES:
                assert hasattr(ln, name), (path, direction, name)
            # every argument typed; the constexpr ones given
            assert set(ln.signature) == set(ln.kernel.arg_names)
            assert {a for a, t in ln.signature.items() if t == "constexpr"} == set(ln.constants)
            # what the real launch uses: MGK's launch_options for its default blocks (every kernel of a call),
            # FiSH's launch_configs' warps for its kind of mixing and pass, the baseline 4 warps; 3 stages (Triton's
            # default) but MGK's
            if "mgk" in path:
                want = amt.launch_options(*amt.block_sizes("cuda", 64, 64, torch.bfloat16))
            elif path == "softmax":
                want = dict(num_warps=4, num_stages=3)
            else:
                configs = aft.launch_configs("cuda", static.GLOBAL_HEADS, 64, 64, torch.bfloat16, 227 * 1024,
                                             path.endswith("gfish"), not path.startswith("hard"))
                want = dict(num_warps=configs[direction == "backward"][2], num_stages=3)
            assert ln.options == want
            assert ln.pairs > 0 and ln.per_pair > 0
            if path != "softmax":
                assert ln.constants.get("DROPOUT") is False and ln.constants.get("CAUSAL") is False


def test_per_pair_weights_and_the_launches_of_a_pass(monkeypatch):
    # MGK: H / 2 heads against softmax's H; backward: dQ, then dK / dV (every key r in one program, key-major:
    # the blocks the other way round)
    assert [ln.per_pair for ln in static.launches("mgk soft", "forward")] == [0.5]
    back = static.launches("mgk soft", "backward")
    assert [ln.per_pair for ln in back] == [0.5, 0.5]
    assert [ln.name for ln in back] == ["_bwd_dq_kernel", "_bwd_dkv_kernel"]
    assert (back[1].constants["BLOCK_M"], back[1].constants["BLOCK_N"]) == (
        amt.dkv_rows(back[0].constants["BLOCK_N"]), back[0].constants["BLOCK_M"])          # keys x half the rows
    assert not back[1].constants["DQ_ATOMIC"]
    # the hard E-step: one pass, the dK / dV programs adding dq and dx (MGK up to 3 keys)
    for path in ("mgk hard", "smgk hard"):
        assert [(ln.name, ln.constants["DQ_ATOMIC"]) for ln in static.launches(path, "backward")] == [
            ("_bwd_dkv_kernel", True)]
    monkeypatch.setattr(static, "GLOBAL_HEADS", 4)
    assert [ln.name for ln in static.launches("mgk hard", "backward")] == ["_bwd_dq_kernel", "_bwd_dkv_kernel"]
    assert [ln.name for ln in static.launches("smgk hard", "backward")] == ["_bwd_dkv_kernel"]
    monkeypatch.undo()
    # FiSH: one local head's block of pairs an iteration, once per pass
    # the backward in one pass, the dK / dV programs adding dq (linear mixing: G = dL/dq'), over fewer rows than the
    # forward's: both passes at aft.launch_configs' blocks and warps for each kind of mixing
    for path, network, noise in (("hard_fish", False, False), ("fish", False, True), ("gfish", True, True)):
        configs = aft.launch_configs("cuda", static.GLOBAL_HEADS, 64, 64, torch.bfloat16, 227 * 1024, network, noise)
        for ln, (rows, keys, warps) in zip((*static.launches(path, "forward"), *static.launches(path, "backward")),
                                           configs):
            assert (ln.constants["BLOCK_M"], ln.constants["BLOCK_N"], ln.options["num_warps"]) == (rows, keys, warps)
            # a network's iteration covers its program's group of local heads, linear mixing's one head
            group = aft.heads_a_program(static.LOCAL_HEADS, network, "cuda", torch.bfloat16)
            assert ln.constants["GROUP"] == group == (2 if network else 1)
            assert ln.pairs == rows * keys * group and ln.per_pair == 1.0
        assert configs[1][0] < configs[0][0]  # the backward's rows an iteration: fewer
    # at given blocks: the backward over a quarter of the rows, a network half, 4 warps
    for path in ("hard_fish", "gfish"):
        back = static.launches(path, "backward", blocks=(64, 32))
        assert [(ln.name, ln.per_pair) for ln in back] == [("_bwd_kv_kernel", 1.0)]
        rows, group = (32, 2) if path == "gfish" else (16, 1)
        assert (back[0].constants["BLOCK_M"], back[0].pairs, back[0].options["num_warps"]) == (rows, rows * 32 * group,
                                                                                                4)
    assert [len(static.launches("softmax", d)) for d in ("forward", "backward")] == [1, 2]
    # MiSH runs FiSH's kernels with the same constants
    for direction in ("forward", "backward"):
        mish, fish = static.launches("mish", direction), static.launches("fish", direction)
        assert [(ln.kernel, ln.constants) for ln in mish] == [(ln.kernel, ln.constants) for ln in fish]
    assert "mish" in static.NOTES
    # the default GPU blocks of each family, overridable; fp16 pointers where asked
    assert static.launches("fish", "forward")[0].pairs == 128 * 32
    assert static.launches("mgk soft", "forward", blocks=(32, 16))[0].pairs == 32 * 16
    assert static.launches("softmax", "forward", dtype="fp16")[0].signature["Q"] == "*fp16"


def test_unknown_path_or_direction_is_refused():
    with pytest.raises(ValueError, match="unknown path"):
        static.launches("mlk", "forward")
    with pytest.raises(ValueError, match="direction"):
        static.launches("softmax", "fwd")


SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
.L_x_1:
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0030*/                   LDS.128 R4, [R2] ;
        /*0040*/                   FFMA R8, R8, R9, R10 ;
        /*0050*/                   FMNMX R8, R8, R11, !PT ;
        /*0060*/                   MUFU.EX2 R12, R8 ;
        /*0070*/                   IMAD R3, R3, 0x2, R0 ;
        /*0080*/                   UIADD3 UR4, UR4, 0x10, URZ ;
        /*0090*/                   ISETP.GE.AND P0, PT, R3, 0x40, PT ;
        /*00a0*/              @!P0 BRA `(.L_x_2) ;
        /*00b0*/                   FADD R13, R13, R14 ;
.L_x_3:
        /*00c0*/                   FSETP.GT.AND P1, PT, R13, 1, PT ;
        /*00d0*/               @P1 BRA `(.L_x_3) ;
.L_x_2:
        /*00e0*/                   HMMA.16816.F32.BF16 R16, R4, R6, R16 ;
        /*00f0*/               @P0 BRA `(.L_x_1) ;
        /*0100*/                   EXIT ;
"""


def test_counting_a_hand_written_listing_by_pipe():
    instrs, labels = static.parse(SASS)
    assert len(instrs) == 17 and labels == {"L_x_1": 2, "L_x_3": 12, "L_x_2": 14}
    inner, back, cold = static.main_loop(instrs, labels)
    # two loops; the small one (a spin on FSETP) holds no tensor-core instruction: the outer one is the main loop,
    # and the forward branch over the region holding the small loop is a cold path
    assert sorted(back) == [(2, 15), (12, 13)]
    assert inner == [(2, 15)]
    assert cold == {11, 12, 13}
    c = static.count(instrs, *inner[0], cold)
    assert c == dict(issue=10, mufu=1, fp32=2, alu=2, mma=2, mma_flops=2 * 64 * 64 * 16 / 4 + 2 * 16 * 8 * 16,
                     mem=1, ctrl=2, uniform=1)
    # a loop nested in the main loop that runs 3 times an iteration (a network's hidden units): everything in the
    # main loop counted, the nested body (FSETP, BRA) twice more
    hot = static.hot_count(instrs, *inner[0], back, cold, trips=3)
    assert hot == {k: v + 2 * static.count(instrs, 12, 13)[k] for k, v in static.count(instrs, 2, 15).items()}
    assert hot["issue"] == c["issue"] + 3 + 2 * 2 and static.hot_count(instrs, *inner[0], back, cold) == c
    assert [ln.trips for ln in static.launches("gfish", "forward")] == [static.LOCAL_HEADS]
    assert [ln.trips for ln in static.launches("fish", "backward")] == [1]
    assert static.pipe_of("HFMA2.MMA") == "fp32" and static.pipe_of("LOP3.LUT") == "alu"
    assert static.pipe_of("MUFU.RCP") == "mufu" and static.pipe_of("ULDC.64") == "uniform"


def test_the_model_takes_the_largest_bound():
    base = dict(issue=100, mufu=10, fp32=50, alu=40, mma_flops=1024 * 60)
    assert static.cycles(base) == 100                               # issue
    assert static.cycles(dict(base, mufu=20)) == 160                # 8 cycles a MUFU
    assert static.cycles(dict(base, fp32=120)) == 120               # 1 cycle an FP32 instruction on sm_90
    assert static.cycles(dict(base, alu=70)) == 140                 # 2 cycles an integer one
    assert static.cycles(dict(base, mma_flops=1024 * 130)) == 130   # 1024 FLOPs a cycle
    assert static.cycles(dict(base, fp32=80), target=80) == 160     # sm_80: 2 cycles an FP32 instruction
    bounds = static.bounds(dict(base, mufu=20))
    assert max(bounds, key=bounds.get) == "mufu"


@pytest.mark.slow
def test_the_report_compiles_the_baseline_and_soft_mgk(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "static.json"
    run = subprocess.run([sys.executable, "-m", "hf_mgk.benchmark.static", "--paths", "softmax", "mgk soft",
                          "--blocks", "32x32", "--json", str(out)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "mgk soft" in run.stdout and "issue" in run.stdout
    rep = json.loads(out.read_text())
    assert set(rep["summary"]) == {"softmax", "mgk soft"}
    for figures in rep["summary"].values():
        assert {"forward", "backward", "both"} <= set(figures)
    assert rep["summary"]["softmax"]["forward"] == rep["summary"]["softmax"]["backward"] == 1.0
    assert rep["summary"]["softmax"]["both"] == 1.0
    # baseline (3 launches), softmax (3), soft MGK (1 + 2): each compiled, its main loop on the tensor cores
    assert len(rep["rows"]) == 9
    for row in rep["rows"]:
        assert row["mma_loop"] and row["mma_flops"] > 0 and row["cycles"] > 0, row
        assert isinstance(row["regs"], int) and row["regs"] > 0 and row["local_bytes"] is not None, row
        assert row["shared"] > 0
    assert rep["summary"]["mgk soft"]["backward"] > 0  # two passes over the keys, as the baseline's


@pytest.mark.slow
def test_aligned_compiles_the_loads_as_a_real_launch_does(tmp_path):
    """--aligned: every kernel, the baseline's too, compiled as a launch on aligned tensors specializes: the loads
    vectorized, so fewer memory instructions in the main loop than the plain compile counts."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "aligned.json"
    code = ("import json, sys; from hf_mgk.benchmark import static\n"
            "ln = static.launches('softmax', 'forward', blocks=(32, 32))[0]\n"
            "print(json.dumps([static.cost(ln, 90)['mem'], static.cost(ln, 90, aligned=True)['mem']]))\n"
            "static.main(['--paths', 'softmax', '--blocks', '32x32', '--aligned', '--json', sys.argv[1]])")
    run = subprocess.run([sys.executable, "-c", code, str(out)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    plain, aligned = json.loads(run.stdout.splitlines()[0])
    assert aligned < plain
    assert json.loads(out.read_text())["aligned"] is True and ", aligned;" in run.stdout
