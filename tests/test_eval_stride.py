"""run_clm.py --eval_stride and `hf_mgk.lm_eval.strided_eval` (the papers' sliding-window perplexity) against a
brute-force recomputation: every token of the stream predicted on its own, from the tokens of its window before it."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel

import hf_mgk
from hf_mgk import bundled
from hf_mgk.lm_eval import strided_eval, window_spans
from conftest import write_play_split
from test_run_lm import common, new_model, read_json, run_clm, tokenized_lines
import tiny

pytestmark = pytest.mark.slow  # run_clm end to end against a brute-force recomputation

BLOCK = 16


# ------------------------------------------------------------------------------------------- reference

def window_start(t, block_size, stride, shift=0):
    """The start of the window that scores token t (None: no window predicts it), from the definition: windows
    start at 0, stride, 2 * stride, ...; the first scores its tokens 1 .. block_size - 1, window k >= 1 the tokens
    k * stride + block_size - stride .. k * stride + block_size - 1 (its last `stride`). shift: a deliberately
    wrong window (one token later), to show the comparison would catch an off-by-one."""
    if t < block_size:
        return 0 if t > 0 else None
    start = ((t - block_size) // stride + 1) * stride + shift
    return start if t > start else None  # at stride = block_size a window's first token has nothing before it


def reference_loss(model, stream, block_size, stride, shift=0):
    """Mean NLL over the scored tokens, each token predicted on its own from its context = stream[start:t]: one
    sequence per token, the logits of its last position. The sequences of one length go through the model as the
    rows of one batch (a row sees only itself: strided_eval's batch size 1 is held to this too), not as one forward
    call each, which cost minutes for the 384-token streams below."""
    contexts = {}  # length -> [(context, target)]
    for t in range(1, len(stream)):
        start = window_start(t, block_size, stride, shift)
        if start is None:
            continue
        assert 1 <= t - start <= block_size - 1
        contexts.setdefault(t - start, []).append((stream[start:t], stream[t]))
    total, count = 0.0, 0
    with torch.no_grad():
        for rows in contexts.values():
            logits = model(input_ids=torch.tensor([c for c, _ in rows])).logits[:, -1].double()
            targets = torch.tensor([target for _, target in rows])
            total -= F.log_softmax(logits, -1).gather(1, targets[:, None]).sum().item()
            count += len(rows)
    return total / count, count


# ------------------------------------------------------------------------------------------- the windows

@pytest.mark.parametrize("n_tokens, stride", [(40, 1), (40, 3), (40, 5), (40, 7), (48, 16), (50, 16), (49, 16),
                                               (10, 4), (16, 16), (17, 1)])
def test_windows_score_each_token_once(n_tokens, stride):
    """Each token is scored once, by the window the definition gives it; the windows advance by the stride and
    none runs past the stream or is longer than a block."""
    spans = window_spans(n_tokens, BLOCK, stride)
    scored = [t for start, end, n in spans for t in range(end - n, end)]
    expected = [t for t in range(n_tokens) if window_start(t, BLOCK, stride) is not None]
    assert scored == expected
    if stride < BLOCK:
        assert expected == list(range(1, n_tokens))
    for start, end, n in spans:
        assert window_start(end - 1, BLOCK, stride) == start
        assert 0 < n < end - start <= BLOCK and end <= n_tokens
    assert [s for s, _, _ in spans] == list(range(0, stride * len(spans), stride))
    # The windows reach the end, but for a last window of one token at stride = block_size (nothing to score).
    assert spans[-1][1] == (n_tokens - 1 if stride == BLOCK and n_tokens % BLOCK == 1 else n_tokens)


@pytest.mark.parametrize("args, message", [((40, BLOCK, 0), "stride must be in 1..16"),
                                           ((40, BLOCK, 17), "stride must be in 1..16"),
                                           ((40, 1, 1), "block_size must be >= 2"),
                                           ((1, BLOCK, 1), "nothing to predict")])
def test_windows_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        window_spans(*args)


# ------------------------------------------------------------------------------------------- strided_eval

# Relative. Seen: at most 1.2e-7 (float32 forwards of other shapes); a window one token off: 1.2e-4 and more.
TOLERANCE = 2e-6

# Weights 25 times larger than the default init: predictions that depend on the context, so that a window one
# token off changes the loss well beyond the comparisons' tolerance.
INIT = 0.5


def tiny_decoder(family):
    torch.manual_seed(0)
    gpt2 = tiny.gpt2(vocab_size=97, n_positions=32, initializer_range=INIT)
    if family == "gpt2":
        return GPT2LMHeadModel(GPT2Config(**gpt2))
    if family == "fish-gpt2":
        return hf_mgk.FiSHGPT2LMHeadModel(hf_mgk.FiSHGPT2Config(**gpt2, num_global_heads=2))
    if family == "mgk-gpt2":
        return hf_mgk.MGKGPT2LMHeadModel(hf_mgk.MGKGPT2Config(**gpt2, num_keys=2))
    return hf_mgk.NPRFRobertaForCausalLM(hf_mgk.NPRFRobertaConfig(**tiny.roberta(
        vocab_size=97, max_position_embeddings=34, num_random_features=16, is_decoder=True, initializer_range=INIT)))


@pytest.mark.parametrize("family", ["gpt2", "fish-gpt2", "mgk-gpt2", "nprf-roberta"])
def test_strided_eval_matches_token_by_token(family):
    """Stock GPT-2, FiSH-GPT2 (noisy FiSH: evaluation is deterministic), MGK-GPT2 and NPRF-RoBERTa as a decoder,
    random weights, left in training mode: every stride kind and batch size against one forward per token."""
    model = tiny_decoder(family).train()
    stream = torch.randint(3, 97, (45,), generator=torch.Generator().manual_seed(1)).tolist()
    for stride in (1, 4, 7, BLOCK):  # 7 divides neither the stream nor the windows' span; 45 - 16 = 29
        expected, count = reference_loss(model.eval(), stream, BLOCK, stride)
        model.train()
        for batch_size in (1, 3, 64):
            result = strided_eval(model, stream, BLOCK, stride, batch_size=batch_size)
            assert result["loss"] == pytest.approx(expected, rel=TOLERANCE), (stride, batch_size)
            assert result["scored_tokens"] == count
            assert result["perplexity"] == pytest.approx(math.exp(result["loss"]), rel=1e-12)
            assert model.training  # the mode is given back
        assert count == (44 if stride < BLOCK else 44 - 2)  # tokens 16 and 32 start windows at stride 16
        wrong, _ = reference_loss(model.eval(), stream, BLOCK, stride, shift=1)
        model.train()
        if stride < BLOCK:  # one token less of context per scored token: the comparison above would fail
            assert wrong != pytest.approx(expected, rel=10 * TOLERANCE)


def test_strided_eval_takes_tensors_and_checks_the_batch():
    model = tiny_decoder("gpt2")
    stream = torch.randint(3, 97, (30,), generator=torch.Generator().manual_seed(2))
    assert strided_eval(model, stream, BLOCK, 5)["loss"] == strided_eval(model, stream.tolist(), BLOCK, 5)["loss"]
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        strided_eval(model, stream, BLOCK, 5, batch_size=0)


# ------------------------------------------------------------------------------------------- run_clm.py

@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("eval_stride")


@pytest.fixture(scope="module")
def texts(work):
    """train.txt: 200 lines of a play; valid.txt: the next 39 lines, 384 GPT-2 tokens, whole blocks of 16."""
    return write_play_split(work, (400, 600), (600, 639))


@pytest.fixture(scope="module")
def trained(texts, work):
    """A tiny MGK-GPT2 (large initial weights, see INIT) trained 2 steps by run_clm.py, evaluated with --eval_stride
    1: (output folder, results)."""
    out = work / "trained"
    results = run_clm.main([*new_model("mgk-gpt2", bundled.gpt2_tokenizer_dir(), f"initializer_range={INIT}"),
                            *common(texts, out, work),
                            "--do_train", "--do_eval", "--block_size", str(BLOCK), "--eval_stride", "1"])
    return out, results


def stream_of(folder, texts):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return [t for e in tokenized_lines(texts["validation"], tokenizer) for t in e["input_ids"]]


@pytest.mark.parametrize("stride", [1, 5, BLOCK])
def test_run_clm_eval_stride_recomputed(stride, trained, texts, work, tmp_path):
    """--eval_stride 1 (the training run), 5 (divides neither 384 nor 384 - 16: a shorter last window) and 16 (the
    block size: the block evaluation's loss) against the saved model run token by token."""
    folder, results = trained
    out = folder
    if stride != 1:  # evaluate the saved model again
        out = tmp_path / "eval"
        results = run_clm.main(["--model_name_or_path", str(folder), *common(texts, out, work), "--do_eval",
                                "--block_size", str(BLOCK), "--eval_stride", str(stride)])
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    stream = stream_of(folder, texts)
    assert len(stream) == 384
    expected, count = reference_loss(model, stream, BLOCK, stride)
    assert count == (383 if stride < BLOCK else 384 - 24)
    for saved in (read_json(out / "eval_results.json"), read_json(out / "all_results.json"), results):
        assert saved["eval_strided_loss"] == pytest.approx(expected, rel=TOLERANCE)
        assert saved["eval_strided_perplexity"] == pytest.approx(math.exp(saved["eval_strided_loss"]), rel=1e-12)
        assert saved["perplexity"] == pytest.approx(math.exp(saved["eval_loss"]), rel=1e-12)  # still there
    if stride < BLOCK:  # windows one token off would fail the comparison above
        wrong, _ = reference_loss(model, stream, BLOCK, stride, shift=1)
        assert wrong != pytest.approx(expected, rel=10 * TOLERANCE)
    if stride == BLOCK:
        assert results["eval_strided_loss"] == pytest.approx(results["eval_loss"], rel=1e-5)
    else:  # more context than the blocks give: a different number
        assert results["eval_strided_loss"] != pytest.approx(results["eval_loss"], rel=1e-5)


def test_run_clm_eval_stride_with_max_eval_samples(trained, texts, work, tmp_path):
    """--max_eval_samples 3: the stream's first 3 blocks' tokens (48)."""
    folder, _ = trained
    results = run_clm.main(["--model_name_or_path", str(folder), *common(texts, tmp_path / "out", work),
                            "--do_eval", "--block_size", str(BLOCK), "--eval_stride", "4", "--max_eval_samples", "3"])
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    expected, _ = reference_loss(model, stream_of(folder, texts)[:48], BLOCK, 4)
    assert results["eval_strided_loss"] == pytest.approx(expected, rel=TOLERANCE)


@pytest.mark.parametrize("extra, message", [
    (["--block_size", "16", "--eval_stride", "0"], "--eval_stride must be in 1..block size .*got 0"),
    (["--block_size", "16", "--eval_stride", "17"], r"--eval_stride 17 is longer than a block \(--block_size 16\): "
                                                    "give 1..16"),
    (["--block_size", "16", "--eval_stride", "-3"], "--eval_stride must be in 1..block size .*got -3"),
])
def test_bad_eval_stride_exits_with_the_reason(extra, message, texts, work, tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_clm.main([*new_model("mgk-gpt2", bundled.gpt2_tokenizer_dir()), *common(texts, tmp_path / "out", work),
                      "--do_train", "--do_eval", *extra])
    assert __import__("re").search(message, capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_eval_stride_beyond_the_default_block_and_without_do_eval(texts, work, tmp_path):
    """Without --block_size the block is the smallest limit (the model's 64 positions here), known only once the
    model is loaded; --eval_stride without --do_eval evaluates nothing."""
    base = [*new_model("mgk-gpt2", bundled.gpt2_tokenizer_dir()), *common(texts, tmp_path / "out", work)]
    with pytest.raises(ValueError, match=r"--eval_stride 65 is longer than a block \(64 tokens, --block_size not "
                                         r"given\): give 1..64"):
        run_clm.main([*base, "--do_train", "--do_eval", "--eval_stride", "65"])
    with pytest.raises(ValueError, match="--eval_stride is an evaluation: give --do_eval with it"):
        run_clm.main([*base, "--do_train", "--eval_stride", "4"])
    assert not (tmp_path / "out").exists()
