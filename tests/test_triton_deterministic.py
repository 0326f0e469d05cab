"""Under torch.use_deterministic_algorithms the kernels whose backward adds gradients by float atomics (FiSH's, and
MGK's hard E-step: one pass) are refused when autograd records the call: auto takes a torch path, and
backend="triton" is a ValueError that says why; without autograd, and for soft MGK (two passes, no atomics), they
still run."""

import pytest
import torch

pytest.importorskip("triton")

from conftest import assert_close, triton_devices  # noqa: E402
from hf_mgk import attention_fish as af  # noqa: E402
from hf_mgk import attention_mgk as am  # noqa: E402
from hf_mgk.attention_fish import fish_attention  # noqa: E402
from hf_mgk.attention_mgk import mgk_attention  # noqa: E402
from test_attention_fish_triton import _case  # noqa: E402
from test_attention_mgk_triton import _inputs, _variances  # noqa: E402

DEVICES = triton_devices()
WHY = "deterministic algorithms"


@pytest.fixture
def deterministic():
    before, warn_only = torch.are_deterministic_algorithms_enabled(), \
        torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # warn_only too: the atomics are refused
    yield
    torch.use_deterministic_algorithms(before, warn_only=warn_only)


@pytest.mark.parametrize("device", DEVICES)
def test_mgk_hard_is_refused_with_autograd_and_runs_without(deterministic, device):
    leaves, lp, mask = _inputs(9, 9, 2, 16, 16, False, "uniform", device)
    kw = dict(variances=_variances(2, 16), attention_mask=mask, backend="triton")
    with pytest.raises(ValueError, match=f"backend 'triton' cannot run this call: {WHY}"):
        mgk_attention(*leaves, e_step="hard", **kw)
    with torch.no_grad():  # no backward, no atomics
        out = mgk_attention(*leaves, e_step="hard", **kw)
        assert_close(out, mgk_attention(*leaves, e_step="hard", **{**kw, "backend": "dense"}))
    soft = mgk_attention(*leaves, e_step="soft", **kw)  # two passes: deterministic
    assert soft.requires_grad


@pytest.mark.parametrize("device", DEVICES)
def test_fish_is_refused_with_autograd_and_runs_without(deterministic, device):
    args, kwargs, _ = _case("hard_fish", 2, 9, 9, 16, 16, True, device)
    with pytest.raises(ValueError, match=f"backend 'triton' cannot run this call: {WHY}"):
        fish_attention(*args, **kwargs, backend="triton")
    with torch.no_grad():
        out = fish_attention(*args, **kwargs, backend="triton")
        assert_close(out, fish_attention(*args, **kwargs, backend="blocked"))


def test_auto_takes_a_torch_path_on_a_gpu(deterministic):
    mgk = dict(e_step="hard", return_weights=False, device_type="cuda", dtype=torch.bfloat16, autocast=False,
               tracing=False, mask=None, triton=True)
    assert am.choose_backend(**mgk, requires_grad=True) == "dense"
    assert am.choose_backend(**mgk, requires_grad=False) == "triton"
    assert am.choose_backend(**{**mgk, "e_step": "soft"}, requires_grad=True) == "triton"
    fish = dict(mixing="heads", noise=False, dropout=False, return_weights=False, device_type="cuda",
                dtype=torch.bfloat16, autocast=False, tracing=False, triton=True)
    assert af.choose_backend(**fish, requires_grad=True) != "triton"
    assert af.choose_backend(**fish, requires_grad=False) == "triton"
    torch.use_deterministic_algorithms(False)
    assert am.choose_backend(**mgk, requires_grad=True) == "triton"
    assert af.choose_backend(**fish, requires_grad=True) == "triton"
