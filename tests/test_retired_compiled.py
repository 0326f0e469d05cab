"""The `compiled` backend (torch.compile / inductor) was retired: asking for it is a clear error, and the
folders exported while it existed, which carry its file `attention_compile.py` among their code, still load and
compute the same, with today's classes and through their own remote code without hf_mgk.

tests/data/exported_v2.tar.gz was written by tests/data/make_exported_v2.py with the package at 5ca5f6c."""

import os
import tarfile

import pytest
import torch

import hf_mgk
from conftest import assert_close
from hf_mgk import hub
from hf_mgk import attention_fish, attention_mgk
from hf_mgk.attention_fish import fish_attention
from hf_mgk.attention_mgk import mgk_attention, smgk_attention

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "exported_v2.tar.gz")
FOLDERS = {  # folder -> (today's class, the Auto class its config.json maps)
    "mgk-bert-mgk": ("MGKBertForMaskedLM", "AutoModelForMaskedLM"),
    "mgk-gpt2-smgk-hard": ("MGKGPT2LMHeadModel", "AutoModelForCausalLM"),
    "fish-gpt2-gfish": ("FiSHGPT2LMHeadModel", "AutoModelForCausalLM"),
}
REMOVED = r"backend 'compiled' no longer exists: it was removed .*kernel-notes\.md#compiled-path-retired\); the backends"


def _mgk_call(backend):
    q, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    return mgk_attention(q, torch.randn(1, 2, 2, 5, 8), v, variances=[1.0, 2.0], backend=backend)


def _smgk_call(backend):
    q, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    return smgk_attention(q, torch.randn(1, 2, 5, 8), torch.randn(2, 2, 8), v, variances=[1.0, 2.0], backend=backend)


def _fish_call(backend):
    return fish_attention(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 4, 5, 8),
                          torch.randn(2, 4), backend=backend)


@pytest.mark.parametrize("call,module", [(_mgk_call, attention_mgk), (_smgk_call, attention_mgk),
                                         (_fish_call, attention_fish)], ids=["mgk", "smgk", "fish"])
def test_compiled_backend_is_refused_saying_it_was_removed_and_naming_the_backends(call, module):
    assert "compiled" not in module.BACKENDS and "blocked" in module.BACKENDS
    backends = ", ".join(repr(b) for b in ("auto", *module.BACKENDS))
    with pytest.raises(ValueError, match=REMOVED + " are " + backends + "$"):
        call("compiled")
    assert call("blocked").shape == (1, 4 if call is _fish_call else 2, 5, 8)  # the same call runs on a backend


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("exported")
    with tarfile.open(DATA) as tar:
        tar.extractall(root, filter="data")
    return root / "exported_v2"


def test_the_fixture_carries_the_removed_file(exported):
    """What makes these folders worth testing: each carries the code of its time, attention_compile.py included."""
    for name in FOLDERS:
        assert (exported / name / "attention_compile.py").is_file()
        assert "HF_MGK_COMPILE" in (exported / name / "attention_compile.py").read_text()


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_folder_exported_before_the_removal_computes_the_same_with_todays_classes(exported, name):
    model, info = getattr(hf_mgk, FOLDERS[name][0]).from_pretrained(exported / name, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    expected = torch.load(exported / name / "expected.pt")
    with torch.no_grad():
        out = model.eval()(**torch.load(exported / "inputs.pt"), output_hidden_states=True)
    assert_close(out.logits, expected["logits"], rtol=1e-6)
    for ours, theirs in zip(out.hidden_states, expected["hidden_states"], strict=True):
        assert_close(ours, theirs, rtol=1e-6)


@pytest.mark.slow  # a child process per folder, in a virtualenv without hf_mgk
@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_folder_exported_before_the_removal_runs_its_own_code_without_hf_mgk(exported, name):
    expected = torch.load(exported / name / "expected.pt")
    hub.check_remote_code(str(exported / name), torch.load(exported / "inputs.pt"), FOLDERS[name][1],
                          reference=expected["logits"], python=hub.clean_python())
