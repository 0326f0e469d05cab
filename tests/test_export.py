"""Export and compile every family as stock BERT / GPT-2 / RoBERTa allow: torch.export, torch.onnx (the dynamo
exporter, checked in ONNX Runtime, and the TorchScript one), torch.compile(fullgraph=True). Each is compared with
the eager model on padded batches, the exported graph run on a batch padded differently from its example (an
exported mask that was baked in, or dropped, shows there)."""

import io

import pytest
import torch

from conftest import assert_close
from hf_mgk import (
    FiSHGPT2Config,
    FiSHGPT2Model,
    MGKBertConfig,
    MGKBertModel,
    MGKGPT2Config,
    MGKGPT2Model,
    NPRFRobertaConfig,
    NPRFRobertaModel,
)
import tiny

pytestmark = pytest.mark.slow  # torch.export / ONNX / compile

BERT = tiny.bert()
GPT2 = tiny.gpt2(use_cache=False)
ROBERTA = tiny.roberta(num_random_features=16, pad_token_id=1)

# A representative attention type per family, and each family's softmax baseline.
CASES = {
    "mgk-softmax": lambda: MGKBertModel(MGKBertConfig(**BERT, attention_type="softmax")),
    "mgk-mgk": lambda: MGKBertModel(MGKBertConfig(**BERT, attention_type="mgk")),
    "fish-softmax": lambda: FiSHGPT2Model(FiSHGPT2Config(**GPT2, attention_type="softmax")),
    "fish-fish": lambda: FiSHGPT2Model(FiSHGPT2Config(**GPT2, attention_type="fish", num_global_heads=2)),
    "mgkgpt2-softmax": lambda: MGKGPT2Model(MGKGPT2Config(**GPT2, attention_type="softmax")),
    "mgkgpt2-mgk": lambda: MGKGPT2Model(MGKGPT2Config(**GPT2, attention_type="mgk")),
    "nprf-softmax": lambda: NPRFRobertaModel(NPRFRobertaConfig(**ROBERTA, attention_type="softmax")),
    "nprf-nprf": lambda: NPRFRobertaModel(NPRFRobertaConfig(**ROBERTA)),
}
NON_SOFTMAX = ["mgk-mgk", "fish-fish", "mgkgpt2-mgk", "nprf-nprf"]


@pytest.fixture
def fresh_dynamo():
    """Compile as a new process would: every decorated forward shares one wrapper code object (as transformers'
    own `can_return_tuple`), so the models compiled by earlier tests count towards dynamo's recompile limit."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def model_for(case):
    model = CASES[case]().eval()
    if case == "nprf-nprf":  # a relative-position bias that matters (it starts at zero)
        with torch.no_grad():
            model.relative_position.weight.normal_()
    return model


def padded(pads, length=9, pad_id=1):
    """Ids and a 0/1 mask, row r padded at the end by pads[r] tokens."""
    ids = torch.randint(3, 99, (len(pads), length))
    mask = torch.ones_like(ids)
    for row, pad in enumerate(pads):
        if pad:
            mask[row, -pad:], ids[row, -pad:] = 0, pad_id
    return ids, mask


def eager(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).last_hidden_state


EXAMPLE = (0, 4)       # the padding the graph is made with
OTHER = (3, 0, 6)      # the padding it is checked on (another batch size too)


@pytest.mark.parametrize("case", list(CASES))
def test_torch_export_gives_the_eager_outputs(case):
    model = model_for(case)
    ids, mask = padded(EXAMPLE)
    # dynamic batch and length: another padding pattern, another shape, the same graph
    dims = {0: torch.export.Dim("batch", max=16), 1: torch.export.Dim("length", max=32)}
    program = torch.export.export(model, (), dict(input_ids=ids, attention_mask=mask),
                                  dynamic_shapes=dict(input_ids=dims, attention_mask=dims))
    for pads, length in ((EXAMPLE, 9), (OTHER, 12)):
        ids, mask = padded(pads, length)
        out = program.module()(input_ids=ids, attention_mask=mask)["last_hidden_state"]
        assert_close(out, eager(model, ids, mask), rtol=1e-5)


@pytest.mark.parametrize("case", NON_SOFTMAX + ["mgk-softmax"])
def test_fullgraph_compile_gives_the_eager_outputs(case, fresh_dynamo):
    model = model_for(case)
    # aot_eager captures the whole graph as inductor does (fullgraph: no graph break allowed) without a C++ build
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for pads in (EXAMPLE, OTHER):
        ids, mask = padded(pads)
        with torch.no_grad():
            out = compiled(input_ids=ids, attention_mask=mask).last_hidden_state
        assert_close(out, eager(model, ids, mask), rtol=1e-5)


def test_fullgraph_compile_with_inductor(fresh_dynamo):
    model = model_for("fish-fish")
    compiled = torch.compile(model, fullgraph=True)
    ids, mask = padded(OTHER)
    with torch.no_grad():
        out = compiled(input_ids=ids, attention_mask=mask).last_hidden_state
    assert_close(out, eager(model, ids, mask), rtol=1e-4)


def _run_onnx(model_bytes, ids, mask):
    import onnxruntime

    session = onnxruntime.InferenceSession(model_bytes)
    names = [i.name for i in session.get_inputs()]
    assert len(names) == 2, names  # input_ids and attention_mask, nothing dropped
    return torch.from_numpy(session.run(None, dict(zip(names, (ids.numpy(), mask.numpy()))))[0])


@pytest.mark.parametrize("case", list(CASES))
def test_onnx_dynamo_export_runs_in_onnxruntime_as_eager(case):
    pytest.importorskip("onnxruntime")
    model = model_for(case)
    ids, mask = padded(EXAMPLE)
    dims = {0: "batch", 1: "length"}
    program = torch.onnx.export(model, (), kwargs=dict(input_ids=ids, attention_mask=mask), dynamo=True,
                                dynamic_shapes=dict(input_ids=dims, attention_mask=dims), verbose=False)
    buffer = io.BytesIO()
    program.save(buffer)
    for pads, length in ((EXAMPLE, 9), (OTHER, 12)):
        ids, mask = padded(pads, length)
        assert_close(_run_onnx(buffer.getvalue(), ids, mask), eager(model, ids, mask), rtol=1e-5)


@pytest.mark.parametrize("case", NON_SOFTMAX + ["mgk-softmax"])
def test_torchscript_onnx_export_keeps_the_attention_mask(case):
    """The TorchScript exporter traces one run: made with an unpadded example, the graph must still take and apply
    the mask (it used to keep only input_ids, off by up to 16% on a padded batch)."""
    pytest.importorskip("onnxruntime")
    model = model_for(case)
    ids, mask = padded((0, 0))
    buffer = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(model, (), buffer, kwargs=dict(input_ids=ids, attention_mask=mask), dynamo=False,
                          input_names=["input_ids", "attention_mask"],
                          dynamic_axes={"input_ids": {0: "batch"}, "attention_mask": {0: "batch"}})
    ids, mask = padded((3, 0, 6))
    expected = eager(model, ids, mask)
    assert (expected - eager(model, ids, torch.ones_like(mask))).abs().max() > 1e-3  # the mask matters here
    assert_close(_run_onnx(buffer.getvalue(), ids, mask), expected, rtol=1e-5)
