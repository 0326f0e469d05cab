import os

# Nothing in the suite may reach the Hub: set before transformers is imported anywhere.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def assert_close(actual, expected, rtol=1e-5, atol=1e-6, msg=""):
    """Relative closeness measured against the reference's scale (max-norm), as the issues' 'relative' bounds."""
    scale = expected.abs().max().clamp_min(1e-12)
    err = (actual - expected).abs().max()
    assert err <= rtol * scale + atol, f"{msg} max abs err {err.item():.3e} vs scale {scale.item():.3e}"
