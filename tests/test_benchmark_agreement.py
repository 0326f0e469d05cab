"""python -m hf_mgk.benchmark.agreement: per path and dtype, the kernels' largest error against the eager path
(output and every gradient), here in Triton's interpreter on tiny shapes. Right kernels agree within the tolerance
auto verifies with; kernels made wrong are flagged, with the error measured."""

import pytest
import torch

pytest.importorskip("triton")

from hf_mgk import attention_fish as af  # noqa: E402
from hf_mgk import attention_mgk as am  # noqa: E402
from hf_mgk.attention_triton import interpreting  # noqa: E402
from hf_mgk.benchmark import agreement  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreting(), reason="CPU tensors need the interpreter (HF_MGK_TEST_CUDA=1)")
TINY = ["--device", "cpu", "--lengths", "37", "--batch", "2", "--heads", "2", "--head-dim", "16", "--repeats", "0"]


def test_every_path_agrees_and_says_each_error(capsys):
    rows = agreement.main(TINY + ["--dtypes", "float32", "bf16"])
    assert [(r[0], r[1]) for r in rows] == [(p, d) for p in agreement.PATHS for d in ("float32", "bf16")]
    for path, dtype, n, eager, found, worst, *_ in rows:
        assert n == 37 and eager != "triton" and worst <= 1.0, (path, dtype, worst)
        names = [name for name, _ in found]
        assert names[0] == "out" and ("W2" in names if path == "hard_gfish" else "v" in names)
        assert dtype != "float32" or all(0 <= err < 1e-5 for _, err in found), (path, found)
    printed = capsys.readouterr().out
    assert printed.count("\n") == len(rows) + 1 and "DISAGREES" not in printed


def test_wrong_kernels_are_flagged(monkeypatch, capsys):
    right = am.mgk_triton
    monkeypatch.setattr(am, "mgk_triton", lambda *args, **kwargs: right(*args, **kwargs) * 1.01)
    [row] = agreement.main(TINY + ["--paths", "mgk soft", "--dtypes", "float32"])
    assert 5 < row[5] < 20 and dict(row[4])["out"] > 9e-3  # 1% off against 0.1%
    assert "DISAGREES" in capsys.readouterr().out
    wrong_grad = af.fish_triton

    class Off(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return g * 1.05

    monkeypatch.setattr(af, "fish_triton", lambda *args, **kwargs: Off.apply(wrong_grad(*args, **kwargs)))
    [row] = agreement.main(TINY + ["--paths", "hard_fish", "--dtypes", "float32"])
    assert dict(row[4])["out"] < 1e-5 and max(err for _, err in row[4][1:]) > 4e-2 and row[5] > 1
