"""hf_mgk.analysis on matrices whose ranks, head distances and principal components are known in closed form;
collect_attentions against output_attentions for every family; scripts/analyze_heads.py end to end."""

import csv
import importlib.util
import itertools
import json
import math
import pathlib

import matplotlib.image
import numpy as np
import pytest
import torch
from transformers import (AutoModel, AutoTokenizer, BertConfig, BertModel, GPT2TokenizerFast,
                          RobertaTokenizerFast)

import hf_mgk
from hf_mgk import analysis, bundled
from conftest import assert_close
import tiny

ROOT = pathlib.Path(__file__).resolve().parents[1]
N = 8


def _script():
    spec = importlib.util.spec_from_file_location("hf_mgk_analyze_heads", ROOT / "scripts" / "analyze_heads.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


analyze_heads = _script()


def shift(k, n=N):
    """The permutation matrix attending from i to i + k (mod n): row-stochastic, ||P||^2 = n, and P^j, P^k are
    orthogonal (disjoint supports) for j != k mod n."""
    return torch.eye(n).roll(k, dims=1)


def uniform(n=N):
    return torch.full((n, n), 1.0 / n)


# ------------------------------------------------------------------------------------------------ ranks

def test_ranks_of_constructed_matrices():
    g = torch.Generator().manual_seed(0)
    low = [torch.randn(N, k, generator=g, dtype=torch.float64) @ torch.randn(k, N, generator=g, dtype=torch.float64)
           for k in (1, 3, 5)]
    attn = torch.stack([torch.stack([low[0], low[1], low[2]]),
                        torch.stack([torch.eye(N, dtype=torch.float64), uniform().double(), shift(2).double()])])
    ranks = analysis.attention_ranks(attn)
    assert ranks.dtype == torch.long
    assert ranks.tolist() == [[1, 3, 5], [N, 1, N]]
    # a softmax of scores that depend on the key only: every row the same, rank 1
    assert analysis.attention_ranks(torch.softmax(torch.randn(N), 0).expand(N, N)).item() == 1


def test_ranks_are_computed_in_float64_whatever_the_dtype():
    """A rank-3 matrix of small integers / 16, exactly representable in float16 and bfloat16: in float64 its
    spurious singular values are ~1e-14, in float32 ~1e-5 (far above 1e-6, about 20 of them)."""
    g = torch.Generator().manual_seed(1)
    u = torch.randint(-4, 5, (64, 3), generator=g).double()
    v = torch.randint(0, 5, (3, 64), generator=g).double()
    exact = u @ v / 16
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        stored = exact.to(dtype)
        assert torch.equal(stored.double(), exact), dtype
        assert analysis.attention_ranks(stored).item() == 3, dtype


def test_rank_tolerance_is_absolute():
    q, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64))
    singular = torch.tensor([1.0, 1e-2, 1e-5, 1e-8], dtype=torch.float64)
    m = q @ torch.diag(singular) @ q.T
    assert analysis.attention_ranks(m).item() == 3
    assert analysis.attention_ranks(m, tol=1e-3).item() == 2
    assert analysis.attention_ranks(m * 1000).item() == 4  # a relative threshold would still say 3
    assert analysis.attention_ranks(m, tol=0.0).item() == 4
    with pytest.raises(ValueError, match="tol"):
        analysis.attention_ranks(m, tol=-1)


def test_ranks_of_sequences_of_different_lengths():
    layer = [torch.stack([uniform(5), torch.eye(5)]), torch.stack([shift(1, 3), uniform(3)])]
    assert analysis.attention_ranks(layer).tolist() == [[1, 5], [3, 1]]
    with pytest.raises(ValueError, match=r"\(H, n, n\)"):
        analysis.attention_ranks([torch.eye(3)[None], torch.eye(3)[None].expand(2, 3, 3)])
    for empty in ([], torch.zeros(0, 2, 3, 3)):
        with pytest.raises(ValueError, match="no attention matrices"):
            analysis.attention_ranks(empty)


# ------------------------------------------------------------------------------------------------ distances

def test_identical_heads_are_at_distance_zero():
    heads = torch.softmax(torch.randn(3, 1, N, N), -1).expand(3, 4, N, N)
    assert analysis.head_distances(heads) == (0.0, 0.0)


def test_head_distances_in_closed_form():
    """||P^j - P^k||^2 = 2N for j != k. Sequence 1: heads (I, I, P) -> distances 0, 2N, 2N; sequence 2:
    (I, P, P^2) -> 2N, 2N, 2N. Over the six: mean 5N/3, variance 20N^2/6 - (5N/3)^2 = 5N^2/9."""
    attn = torch.stack([torch.stack([shift(0), shift(0), shift(1)]), torch.stack([shift(0), shift(1), shift(2)])])
    mean, var = analysis.head_distances(attn)
    assert mean == pytest.approx(5 * N / 3, rel=1e-12)
    assert var == pytest.approx(5 * N**2 / 9, rel=1e-12)


def _brute_force_distances(layer):
    d = [float(((a[h].double() - a[k].double()) ** 2).sum())
         for a in layer for h, k in itertools.combinations(range(len(a)), 2)]
    return np.mean(d), np.var(d)


def test_head_distances_against_a_loop_over_pairs_also_for_different_lengths():
    layer = [torch.softmax(torch.randn(5, n, n) * 3, -1) for n in (4, 7, 7, 2)]
    expected = _brute_force_distances(layer)
    assert analysis.head_distances(layer) == pytest.approx(expected, rel=1e-10)
    same = torch.softmax(torch.randn(3, 5, 6, 6) * 3, -1).half()  # any dtype; computed in float64
    assert analysis.head_distances(same) == pytest.approx(_brute_force_distances(same), rel=1e-10)
    with pytest.raises(ValueError, match="at least 2 heads"):
        analysis.head_distances(torch.eye(3).expand(2, 1, 3, 3))
    with pytest.raises(ValueError, match=r"\(S, H, N, N\)"):
        analysis.head_distances(torch.eye(3).expand(2, 3, 3))


# ------------------------------------------------------------------------------------------------ principal components

def test_equal_heads_give_one_component():
    attn = torch.softmax(torch.randn(1, 1, N, N), -1).expand(4, 3, N, N)
    for variance in (0.5, 0.95, 1.0):
        assert analysis.principal_components(attn, variance) == 1


def test_orthogonal_patterns_with_known_weights():
    """6, 3 and 1 of the 10 heads are P^0, P^1, P^2 (orthogonal, ||.||^2 = N): Eq. 13's C has the eigenvalues
    0.6N, 0.3N, 0.1N and zeros, so 60%, 90%, 100% of the sum are explained by 1, 2, 3 components."""
    heads = [shift(0)] * 6 + [shift(1)] * 3 + [shift(2)]
    attn = torch.stack(heads).view(5, 2, N, N)
    spectrum = analysis.attention_spectrum(attn)
    assert spectrum.dtype == torch.float64 and spectrum.numel() == 10  # the Gram side: 10 < N^2
    assert_close(spectrum, torch.tensor([0.6, 0.3, 0.1] + [0] * 7, dtype=torch.float64) * N, rtol=1e-12)
    expected = {0.5: 1, 0.6: 1, 0.61: 2, 0.85: 2, 0.9: 2, 0.95: 3, 1.0: 3}
    for variance, count in expected.items():
        assert analysis.principal_components(attn, variance) == count, variance


def test_two_overlapping_patterns_in_closed_form():
    """a copies of I and b of the uniform U: vec(I).vec(I) = N, vec(U).vec(U) = 1, vec(I).vec(U) = 1, so the
    nonzero eigenvalues of C are those of [[a N, sqrt(ab)], [sqrt(ab), b]] / (a + b)."""
    a, b, n = 3, 5, 6
    attn = torch.stack([torch.eye(n)] * a + [uniform(n)] * b)[:, None]  # S = 8 sequences of one head
    tr, det = (a * n + b) / (a + b), (a * b * n - a * b) / (a + b) ** 2
    big = (tr + math.sqrt(tr**2 - 4 * det)) / 2
    small = tr - big
    assert_close(analysis.attention_spectrum(attn)[:2], torch.tensor([big, small], dtype=torch.float64), rtol=1e-12)
    share = big / (big + small)
    assert analysis.principal_components(attn, share - 1e-6) == 1
    assert analysis.principal_components(attn, share + 1e-6) == 2


@pytest.mark.parametrize("n, sequences", [(3, 6), (6, 2)])  # S*H = 24 > N^2 = 9 (covariance side), 8 < 36 (Gram)
def test_spectrum_equals_the_eigenvalues_of_eq_13_written_out(n, sequences):
    attn = torch.softmax(torch.randn(sequences, 4, n, n) * 2, -1)
    x = attn.reshape(-1, n * n).double().numpy()
    c = sum(np.outer(v, v) for v in x) / len(x)  # Eq. 13 literally: (N^2, N^2)
    expected = np.sort(np.linalg.eigvalsh(c))[::-1][: min(len(x), n * n)]
    assert_close(analysis.attention_spectrum(attn), torch.from_numpy(expected.copy()).clamp_min(0), rtol=1e-10,
                 atol=1e-12)
    share = np.cumsum(expected) / expected.sum()
    assert analysis.principal_components(attn, 0.9) == int(np.searchsorted(share, 0.9) + 1)


def test_principal_components_refuse_mixed_lengths_and_bad_shares():
    with pytest.raises(ValueError, match="one length"):
        analysis.principal_components([torch.eye(3)[None], torch.eye(4)[None]])
    for variance in (0, 1.5):
        with pytest.raises(ValueError, match="variance"):
            analysis.principal_components(torch.eye(3).expand(1, 2, 3, 3), variance)
    with pytest.raises(ValueError, match="zero"):
        analysis.principal_components(torch.zeros(1, 2, 3, 3))


# ------------------------------------------------------------------------------------------------ collect_attentions

def _tiny(family, attention_type):
    if family == "mgk-bert":
        return hf_mgk.MGKBertModel(hf_mgk.MGKBertConfig(attention_type=attention_type, **tiny.bert()))
    if family == "fish-gpt2":
        return hf_mgk.FiSHGPT2Model(hf_mgk.FiSHGPT2Config(
            attention_type=attention_type, **tiny.gpt2(n_inner=37, num_global_heads=2)))
    if family == "mgk-gpt2":
        return hf_mgk.MGKGPT2Model(hf_mgk.MGKGPT2Config(attention_type=attention_type, **tiny.gpt2(n_inner=37)))
    if family == "mgk-llama":
        return hf_mgk.MGKLlamaModel(hf_mgk.MGKLlamaConfig(attention_type=attention_type, **tiny.llama()))
    if family == "fish-llama":
        return hf_mgk.FiSHLlamaModel(hf_mgk.FiSHLlamaConfig(attention_type=attention_type,
                                                            **tiny.llama(num_global_heads=2)))
    if family == "nprf-roberta":
        return hf_mgk.NPRFRobertaModel(hf_mgk.NPRFRobertaConfig(
            attention_type=attention_type, **tiny.roberta(num_random_features=16)))
    config = BertConfig(**tiny.bert())
    config._attn_implementation = "eager"  # stock models return attention matrices only from the eager path
    return BertModel(config)


@pytest.mark.parametrize("family, attention_type", [
    ("mgk-bert", "mgk"), ("mgk-bert", "smgk"), ("mgk-bert", "mlk"), ("mgk-bert", "softmax"),
    ("fish-gpt2", "fish"), ("fish-gpt2", "gfish"), ("fish-gpt2", "softmax"),
    ("mgk-gpt2", "mgk"), ("mgk-gpt2", "smgk"), ("mgk-gpt2", "mlk"), ("mgk-gpt2", "softmax"),
    ("nprf-roberta", "nprf"), ("nprf-roberta", "softmax"), ("bert", "stock"),
    ("mgk-llama", "mgk"), ("mgk-llama", "smgk"), ("fish-llama", "fish"), ("fish-llama", "softmax")])
def test_collect_attentions_equals_output_attentions(family, attention_type):
    """Unpadded: exactly the model's output_attentions. Padded (right, left, both): each sequence's matrices
    equal those of its real tokens run alone. The model is used in eval mode and its mode restored."""
    model = _tiny(family, attention_type).train()
    ids = torch.randint(3, 99, (4, 10))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0   # right padding
    mask[2, :3] = 0   # left padding
    mask[3, :2] = mask[3, 8:] = 0
    padded = analysis.collect_attentions(model, ids, mask, batch_size=3)
    full = analysis.collect_attentions(model, ids, batch_size=3)
    assert model.training
    model.eval()
    with torch.no_grad():
        expected = model(ids, output_attentions=True).attentions
        assert len(full) == len(padded) == len(expected) == 2
        for layer, attn in enumerate(expected):
            assert_close(torch.stack(full[layer]), attn, rtol=1e-6, msg=f"layer {layer}")
        for row in range(len(ids)):
            alone = model(ids[row, mask[row].bool()][None], output_attentions=True).attentions
            n = int(mask[row].sum())
            for layer in range(2):
                assert padded[layer][row].shape == (4, n, n)
                assert_close(padded[layer][row], alone[layer][0], rtol=1e-5, msg=f"row {row} layer {layer}")


def test_collect_attentions_refusals():
    sdpa = BertModel(BertConfig(**tiny.bert_size(vocab_size=99, num_hidden_layers=1)))
    ids = torch.randint(3, 99, (2, 5))
    with pytest.raises(ValueError, match="eager"):
        analysis.collect_attentions(sdpa, ids)
    model = _tiny("mgk-bert", "mgk")
    with pytest.raises(ValueError, match="no real token"):
        analysis.collect_attentions(model, ids, torch.tensor([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0]]))
    with pytest.raises(ValueError, match="0 for padding"):
        analysis.collect_attentions(model, ids, torch.full_like(ids, 2))
    with pytest.raises(ValueError, match=r"\(batch, sequence_length\)"):
        analysis.collect_attentions(model, ids[0])


# ------------------------------------------------------------------------------------------------ the script

def _gpt2_bpe():
    encoder_path, merges_path = bundled.gpt2_bpe_files()
    with open(encoder_path, encoding="utf-8") as f:
        encoder = json.load(f)
    with open(merges_path, encoding="utf-8") as f:
        merges = [tuple(line.split()) for line in f.read().splitlines()[1:] if line]
    return encoder, merges


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny saved checkpoints of each family and a stock BERT, each with its tokenizer; a Shakespeare text."""
    work = tmp_path_factory.mktemp("analyze_heads")
    torch.manual_seed(0)
    bert_tok = AutoTokenizer.from_pretrained(bundled.bert_checkpoint_dir())
    encoder, merges = _gpt2_bpe()
    gpt2_tok = GPT2TokenizerFast(encoder, merges)
    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>"])}
    vocab.update({t: i + 4 for t, i in encoder.items()})
    vocab["<mask>"] = len(vocab)
    roberta_tok = RobertaTokenizerFast(vocab=vocab, merges=merges)
    # initializer_range 0.3: peaked attention, so no singular value sits near the 1e-6 threshold
    small = tiny.bert_size(max_position_embeddings=tiny.POSITIONS, initializer_range=0.3)
    small_gpt2 = tiny.gpt2_size(n_inner=37, n_positions=tiny.POSITIONS, initializer_range=0.3)
    models = {
        "mgk": (hf_mgk.MGKBertForMaskedLM(hf_mgk.MGKBertConfig(**small)), bert_tok),
        "bert": (BertModel(BertConfig(**small)), bert_tok),
        "fish": (hf_mgk.FiSHGPT2LMHeadModel(hf_mgk.FiSHGPT2Config(**small_gpt2, num_global_heads=2)), gpt2_tok),
        "mgk-gpt2": (hf_mgk.MGKGPT2LMHeadModel(hf_mgk.MGKGPT2Config(**small_gpt2)), gpt2_tok),
        "nprf": (hf_mgk.NPRFRobertaForMaskedLM(hf_mgk.NPRFRobertaConfig(
            **tiny.roberta(vocab_size=len(roberta_tok), num_random_features=16, initializer_range=0.3))), roberta_tok),
    }
    paths = {}
    for name, (model, tokenizer) in models.items():
        paths[name] = str(work / name)
        model.save_pretrained(paths[name])
        tokenizer.save_pretrained(paths[name])
    with open(bundled.shakespeare_files()[0], encoding="utf-8") as f:
        lines = f.readlines()[300:420]
    text = work / "text.txt"
    text.write_text("".join(lines), encoding="utf-8")
    return work, paths, str(text)


def _blocks(folder, text_file, count, length):
    """The script's blocks built independently: the whole text tokenized, cut, wrapped in the special tokens."""
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok(open(text_file, encoding="utf-8").read(), add_special_tokens=False)["input_ids"]
    prefix = [tok.cls_token_id] if tok.cls_token_id is not None else []
    suffix = [tok.sep_token_id] if tok.sep_token_id is not None else []
    body = length - len(prefix) - len(suffix)
    return torch.tensor([prefix + ids[i * body:(i + 1) * body] + suffix for i in range(count)])


@pytest.mark.slow
def test_script_end_to_end(checkpoints, capsys):
    work, paths, text = checkpoints
    out = work / "out"
    labels = list(paths)
    results = analyze_heads.main(["--model", *paths.values(), "--labels", *labels, "--text_file", text,
                                  "--output_dir", str(out), "--max_sequences", "5", "--max_length", "24",
                                  "--batch_size", "2", "--map_layers", "0", "1", "--device", "cpu"])
    assert "mgk" in capsys.readouterr().err  # the progress bar, named after the model
    pngs = ["ranks.png", "head_distances.png", "principal_components.png", "attention_maps_layer0.png",
            "attention_maps_layer1.png"]
    for name in pngs:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        assert matplotlib.image.imread(out / name).shape[0] > 100, name
    report = json.loads((out / "head_analysis.json").read_text())
    assert report["max_length"] == 24 and report["variance"] == 0.95
    assert [m["label"] for m in report["models"]] == labels
    assert report["models"] == json.loads(json.dumps(results))
    for label, m in zip(labels, report["models"]):
        model = AutoModel.from_pretrained(paths[label], attn_implementation="eager").eval()
        ids = _blocks(paths[label], text, 5, 24)
        if label == "bert":
            assert ids[0, 0] == 101 and ids[0, -1] == 102
        assert (m["sequences"], m["sequence_length"], m["num_layers"], m["num_heads"]) == (5, 24, 2, 4)
        with torch.no_grad():
            attentions = model(ids, output_attentions=True).attentions
        for layer, (attn, row) in enumerate(zip(attentions, m["layers"])):
            ranks = analysis.attention_ranks(attn).flatten()
            assert row["rank_histogram"] == {str(r): int((ranks == r).sum()) for r in ranks.unique().tolist()}
            assert row["rank_mean"] == pytest.approx(ranks.double().mean().item())
            mean, var = analysis.head_distances(attn)
            assert (row["distance_mean"], row["distance_variance"]) == pytest.approx((mean, var), rel=1e-5)
            assert row["principal_components"] == analysis.principal_components(attn, 0.95)
        for key in ("distance_mean", "distance_variance", "principal_components"):
            assert m["layer_average"][key] == pytest.approx(np.mean([row[key] for row in m["layers"]]))
    with open(out / "head_analysis.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(paths) * 3 and [r["layer"] for r in rows[:3]] == ["0", "1", "mean"]
    assert float(rows[0]["distance_mean"]) == pytest.approx(report["models"][0]["layers"][0]["distance_mean"])
    with open(out / "rank_histograms.csv", newline="") as f:
        counts = [int(r["count"]) for r in csv.DictReader(f) if r["model"] == "fish" and r["layer"] == "1"]
    assert sum(counts) == 5 * 4


@pytest.mark.slow
def test_script_refusals(checkpoints, tmp_path, capsys):
    work, paths, text = checkpoints
    mine = tmp_path / "notes.txt"
    mine.write_text("keep me")
    args = ["--model", paths["mgk"], "--text_file", text, "--output_dir", str(tmp_path), "--max_sequences", "2",
            "--no_progress", "--map_layers", "1", "--max_length", "16"]
    with pytest.raises(SystemExit, match="not empty"):
        analyze_heads.main(args)
    (tmp_path / "attention_maps_layer7.png").write_bytes(b"old")  # an earlier run's output: replaced
    analyze_heads.main(args + ["--overwrite"])
    assert mine.read_text() == "keep me"
    assert not (tmp_path / "attention_maps_layer7.png").exists() and (tmp_path / "attention_maps_layer1.png").exists()
    with pytest.raises(SystemExit, match="at most 64 tokens"):
        analyze_heads.main(args[:-1] + ["100", "--overwrite"])
    short = tmp_path / "short.txt"
    short.write_text("To be.")
    with pytest.raises(SystemExit, match="not enough for one block"):
        analyze_heads.main(["--model", paths["mgk"], "--text_file", str(short), "--output_dir",
                            str(tmp_path / "o"), "--max_length", "16"])
    with pytest.raises(SystemExit, match="--map_layers"):
        analyze_heads.main(args + ["--overwrite", "--map_layers", "2"])
    with pytest.raises(SystemExit):
        analyze_heads.main(["--model", paths["mgk"], paths["mgk"], "--text_file", text, "--output_dir", "x"])
    assert "the same label" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        analyze_heads.main(["--model", str(tmp_path), "--text_file", text, "--output_dir", "x"])
    assert "without config.json" in capsys.readouterr().err


def test_script_numbers_of_a_one_head_model():
    """One head has no pair: distances null (not an error); ranks and components as for any model."""
    rows, average = analyze_heads.analyse_layers([[torch.eye(4)[None], shift(1, 4)[None]]], 1e-6, 0.95)
    assert rows[0]["distance_mean"] is None and average["distance_variance"] is None
    assert rows[0]["rank_histogram"] == {"4": 2} and average["principal_components"] == 2  # I, P: 50% each
