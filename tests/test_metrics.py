"""hf_mgk.metrics: the shipped evaluate modules, offline, against independent computations.

Classification and correlation metrics are compared with scikit-learn / scipy called here directly; SQuAD with
examples worked by hand from the official scripts' definitions (the arithmetic is in the comments)."""

import logging
import os
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import evaluate
import huggingface_hub
import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

import hf_mgk.metrics
from hf_mgk.metrics import SHIPPED_METRICS, load_metric, shipped_metric_path
from hf_mgk.metrics.squad_scoring import normalize_answer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def offline_and_no_network(monkeypatch):
    """HF_HUB_OFFLINE=1, and any socket connection or name lookup fails the test."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError(f"test_metrics: network access attempted {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    yield
    assert not attempts, f"network touched: {attempts}"


@pytest.fixture
def load_calls(monkeypatch):
    """Records the paths given to evaluate.load (still loading them)."""
    calls, real_load = [], evaluate.load

    def spy(path, *args, **kwargs):
        calls.append(path)
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(evaluate, "load", spy)
    return calls


def labels(seed, n=40, classes=3, shape=None):
    rng = np.random.default_rng(seed)
    return rng.integers(0, classes, size=(n,) if shape is None else shape).tolist()


@pytest.mark.parametrize("name", SHIPPED_METRICS)
def test_offline_load_uses_only_the_shipped_module(name, load_calls):
    metric = load_metric(name, "sst2" if name == "glue" else None)
    assert isinstance(metric, evaluate.Metric)
    assert load_calls == [shipped_metric_path(name)]
    assert Path(load_calls[0], f"{name}.py").is_file()


def test_unknown_metric_name_lists_the_shipped_ones():
    with pytest.raises(ValueError, match="Unknown metric 'bleu'") as err:
        load_metric("bleu")
    for name in SHIPPED_METRICS:
        assert name in str(err.value)


def test_glue_unknown_task_is_a_clear_error():
    with pytest.raises(ValueError, match="glue needs a task.*'mnlii'.*sst2.*stsb.*ax"):
        load_metric("glue", "mnlii")


@pytest.mark.parametrize(
    "env, hub_offline_constant, hub_tried",
    [
        ({}, False, True),
        ({"HF_HUB_OFFLINE": "0"}, False, True),
        ({"HF_HUB_OFFLINE": "1"}, False, False),
        ({"HF_EVALUATE_OFFLINE": "1"}, False, False),
        ({}, True, False),  # huggingface_hub itself in offline mode
    ],
)
def test_hub_tried_only_when_reachable_then_falls_back(monkeypatch, env, hub_offline_constant, hub_tried):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_EVALUATE_OFFLINE", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", hub_offline_constant)
    calls, real_load = [], evaluate.load

    def hub_down(path, *args, **kwargs):  # a bare name is a Hub load: here the Hub "fails"
        calls.append(path)
        if not os.path.isdir(path):
            raise ConnectionError("Hub unreachable")
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(evaluate, "load", hub_down)
    metric = load_metric("accuracy")
    assert calls == (["accuracy"] if hub_tried else []) + [shipped_metric_path("accuracy")]
    assert metric.compute(predictions=[1, 0], references=[1, 1]) == {"accuracy": 0.5}


@pytest.fixture
def hub_unreachable(monkeypatch, load_calls):
    """What a newcomer without a network has: no offline variable set, so load_metric tries the Hub, and
    evaluate.load of a bare name raises what evaluate 0.4 raises then (reproduced with the variables unset on a
    machine without a network). Local folders still load. The once-per-process fallback note is reset."""
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_EVALUATE_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_mgk.metrics, "_fallback_logged", False)
    spy = evaluate.load  # load_calls' spy: records every path, then loads it

    def offline(path, *args, **kwargs):
        if not os.path.isdir(path):
            load_calls.append(path)
            raise FileNotFoundError(
                f"Couldn't find a module script at {os.path.abspath(os.path.join(path, path + '.py'))}. "
                f"Module '{path}' doesn't exist on the Hugging Face Hub either.")
        return spy(path, *args, **kwargs)

    monkeypatch.setattr(evaluate, "load", offline)
    return load_calls


def test_offline_hub_fallback_is_one_info_line_not_a_warning(hub_unreachable, caplog):
    """The main job run offline without HF_HUB_OFFLINE logged a WARNING for this intended path."""
    load_calls = hub_unreachable
    caplog.set_level(logging.DEBUG)
    accuracy = load_metric("accuracy")
    glue = load_metric("glue", "sst2")
    assert load_calls == ["accuracy", shipped_metric_path("accuracy"), "glue", shipped_metric_path("glue")]
    assert accuracy.compute(predictions=[1, 0], references=[1, 1]) == {"accuracy": 0.5}
    assert glue.compute(predictions=[1, 0], references=[1, 1]) == {"accuracy": 0.5}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    ours = [r for r in caplog.records if r.name == "hf_mgk.metrics"]
    assert [r.levelno for r in ours] == [logging.INFO, logging.DEBUG]
    assert "not reachable" in ours[0].getMessage() and "shipped with hf_mgk" in ours[0].getMessage()
    assert "Couldn't find" not in caplog.text  # evaluate's local-path wording is not repeated to the user


def test_real_errors_still_raise_when_the_hub_is_unreachable(hub_unreachable):
    load_calls = hub_unreachable
    with pytest.raises(ValueError, match="Unknown metric 'bleu'"):
        load_metric("bleu")
    assert load_calls == []  # an unknown name fails before the Hub is tried
    with pytest.raises(ValueError, match="glue needs a task.*'mnlii'"):
        load_metric("glue", "mnlii")  # a config the module lacks: the shipped module's own error


def test_a_hub_module_refusing_a_config_falls_back_and_the_shipped_one_decides(monkeypatch, caplog):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_EVALUATE_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_mgk.metrics, "_fallback_logged", False)
    real_load = evaluate.load

    def hub_refuses(path, config_name=None, **kwargs):  # the Hub's glue lacks "ax" (and any misspelt task)
        if not os.path.isdir(path):
            raise KeyError(f"You should supply a configuration name selected in [...], got {config_name!r}")
        return real_load(path, config_name, **kwargs)

    monkeypatch.setattr(evaluate, "load", hub_refuses)
    caplog.set_level(logging.DEBUG)
    assert load_metric("glue", "ax").compute(predictions=[0, 1, 2], references=[0, 1, 1])
    with pytest.raises(ValueError, match="glue needs a task.*'mnlii'"):
        load_metric("glue", "mnlii")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "raised KeyError" in caplog.records[0].getMessage()


def test_hub_module_returned_when_hub_load_succeeds(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_EVALUATE_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    hub_metric, calls = object(), []

    def hub_load(path, config_name=None, **kwargs):
        calls.append((path, config_name, kwargs))
        return hub_metric

    monkeypatch.setattr(evaluate, "load", hub_load)
    assert load_metric("glue", "mrpc", keep_in_memory=True) is hub_metric
    assert calls == [("glue", "mrpc", {"keep_in_memory": True})]


def test_accuracy_against_sklearn():
    refs, preds = labels(0), labels(1)
    weights = np.random.default_rng(2).random(len(refs)).tolist()
    metric = load_metric("accuracy")
    assert metric.compute(predictions=preds, references=refs) == {"accuracy": accuracy_score(refs, preds)}
    assert metric.compute(predictions=preds, references=refs, normalize=False)["accuracy"] == accuracy_score(
        refs, preds, normalize=False
    )
    got = metric.compute(predictions=preds, references=refs, sample_weight=weights)["accuracy"]
    assert got == pytest.approx(accuracy_score(refs, preds, sample_weight=weights), rel=1e-12)
    multi_refs, multi_preds = labels(3, classes=2, shape=(30, 4)), labels(4, classes=2, shape=(30, 4))
    got = load_metric("accuracy", "multilabel").compute(predictions=multi_preds, references=multi_refs)
    assert got == {"accuracy": accuracy_score(np.array(multi_refs), np.array(multi_preds))}


def test_f1_against_sklearn():
    metric = load_metric("f1")
    refs, preds = labels(5, classes=2), labels(6, classes=2)
    assert metric.compute(predictions=preds, references=refs) == {"f1": f1_score(refs, preds)}
    assert metric.compute(predictions=preds, references=refs, pos_label=0)["f1"] == f1_score(refs, preds, pos_label=0)
    refs, preds = labels(7), labels(8)
    for average in ("macro", "micro", "weighted"):
        got = metric.compute(predictions=preds, references=refs, average=average)["f1"]
        assert got == pytest.approx(f1_score(refs, preds, average=average), rel=1e-12)
    per_class = metric.compute(predictions=preds, references=refs, average=None)["f1"]
    np.testing.assert_allclose(per_class, f1_score(refs, preds, average=None), rtol=1e-12)
    assert len(per_class) == 3
    multi_refs, multi_preds = labels(9, classes=2, shape=(30, 4)), labels(10, classes=2, shape=(30, 4))
    got = load_metric("f1", "multilabel").compute(predictions=multi_preds, references=multi_refs, average="macro")
    assert got["f1"] == pytest.approx(f1_score(np.array(multi_refs), np.array(multi_preds), average="macro"), rel=1e-12)


def test_matthews_correlation_against_sklearn():
    refs, preds = labels(11), labels(12)
    got = load_metric("matthews_correlation").compute(predictions=preds, references=refs)
    assert got["matthews_correlation"] == pytest.approx(matthews_corrcoef(refs, preds), rel=1e-12)
    multi_refs = np.array(labels(13, classes=2, shape=(40, 3)))
    multi_preds = np.array(labels(14, classes=2, shape=(40, 3)))
    per_label = [matthews_corrcoef(multi_refs[:, j], multi_preds[:, j]) for j in range(3)]
    metric = load_metric("matthews_correlation", "multilabel")
    got = metric.compute(predictions=multi_preds.tolist(), references=multi_refs.tolist())["matthews_correlation"]
    np.testing.assert_allclose(got, per_label, rtol=1e-12)
    got = metric.compute(predictions=multi_preds.tolist(), references=multi_refs.tolist(), average="macro")
    assert got["matthews_correlation"] == pytest.approx(np.mean(per_label), rel=1e-12)


def test_correlations_against_scipy():
    rng = np.random.default_rng(15)
    # The metrics store float32 (as the Hub ones), so the reference is computed on the same float32 values.
    refs = rng.normal(size=50).astype(np.float32)
    preds = (refs + rng.normal(scale=0.8, size=50)).astype(np.float32)
    got = load_metric("pearsonr").compute(predictions=preds.tolist(), references=refs.tolist(), return_pvalue=True)
    expected = pearsonr(refs.astype(np.float64), preds.astype(np.float64))
    assert list(got) == ["pearsonr", "p-value"]
    assert got["pearsonr"] == pytest.approx(expected[0], rel=1e-9)
    assert got["p-value"] == pytest.approx(expected[1], rel=1e-6)
    got = load_metric("spearmanr").compute(predictions=preds.tolist(), references=refs.tolist(), return_pvalue=True)
    expected = spearmanr(refs, preds)
    assert list(got) == ["spearmanr", "spearmanr_pvalue"]
    assert got["spearmanr"] == pytest.approx(expected[0], rel=1e-12)
    assert got["spearmanr_pvalue"] == pytest.approx(expected[1], rel=1e-9)
    assert list(load_metric("pearsonr").compute(predictions=[1, 2, 4], references=[1, 2, 3])) == ["pearsonr"]
    assert list(load_metric("spearmanr").compute(predictions=[1, 2, 4], references=[1, 2, 3])) == ["spearmanr"]


GLUE_KEYS = {
    "cola": ["matthews_correlation"],
    "stsb": ["pearson", "spearmanr"],
    "mrpc": ["accuracy", "f1"],
    "qqp": ["accuracy", "f1"],
    "ax": ["matthews_correlation", "accuracy"],
    **{task: ["accuracy"] for task in ("sst2", "mnli", "mnli_matched", "mnli_mismatched", "qnli", "rte", "wnli")},
    "hans": ["accuracy"],
}
GLUE_REFERENCE = {
    "accuracy": accuracy_score,
    "f1": f1_score,
    "matthews_correlation": matthews_corrcoef,
    "pearson": lambda refs, preds: pearsonr(refs, preds)[0],
    "spearmanr": lambda refs, preds: spearmanr(refs, preds)[0],
}


@pytest.mark.parametrize("task", sorted(GLUE_KEYS))
def test_glue_task_keys_and_values(task):
    if task == "stsb":
        rng = np.random.default_rng(16)
        refs = (rng.integers(0, 11, size=40) / 2).astype(np.float32)  # 0, 0.5, ..., 5: exact in float32
        preds = np.clip(refs + rng.integers(-2, 3, size=40) / 2, 0, 5).astype(np.float32)
    else:
        n_labels = 3 if task in ("mnli", "mnli_matched", "mnli_mismatched", "ax") else 2
        refs, preds = np.array(labels(17, classes=n_labels)), np.array(labels(18, classes=n_labels))
    got = load_metric("glue", task).compute(predictions=preds.tolist(), references=refs.tolist())
    assert list(got) == GLUE_KEYS[task]
    for key, value in got.items():
        assert isinstance(value, float)
        assert value == pytest.approx(GLUE_REFERENCE[key](refs, preds), rel=1e-6), key


def test_normalize_answer_follows_the_official_rules():
    assert normalize_answer("  The Quick,  brown FOX!! ") == "quick brown fox"  # case, punctuation, spaces
    assert normalize_answer("An apple a day") == "apple day"  # the three articles, as whole words
    assert normalize_answer("theory of the anthem") == "theory of anthem"  # not inside words
    assert normalize_answer("Levi's Stadium") == "levis stadium"  # punctuation deleted, not split on
    assert normalize_answer("The") == ""


def squad_reference(qid, *texts):
    return {"id": qid, "answers": {"text": list(texts), "answer_start": [0] * len(texts)}}


def test_squad_v1_hand_worked():
    predictions = [
        {"id": "q1", "prediction_text": "The Denver Broncos!"},
        {"id": "q2", "prediction_text": "Levi's Stadium in Santa Clara"},
        {"id": "q3", "prediction_text": "the cat the cat sat"},
        {"id": "q4", "prediction_text": "theory"},
        {"id": "q5", "prediction_text": "an Apple"},
    ]
    references = [
        squad_reference("q1", "Denver Broncos"),
        squad_reference("q2", "Santa Clara, California", "Levi's Stadium"),
        squad_reference("q3", "a cat sat"),
        squad_reference("q4", "ory"),
        squad_reference("q5", "pear", "apple."),
    ]
    # q1: "denver broncos" both sides: EM 1, F1 1.
    # q2: pred tokens levis stadium in santa clara (5). vs "santa clara california": overlap 2, P 2/5, R 2/3 -> F1 1/2;
    #     vs "levis stadium": overlap 2, P 2/5, R 1 -> F1 4/7. Max over gold answers: 4/7; EM 0.
    # q3: "cat cat sat" vs "cat sat": overlap min(2,1)+1 = 2, P 2/3, R 1 -> F1 4/5; EM 0.
    # q4: "theory" keeps its "the": no overlap with "ory": 0, 0.
    # q5: "apple" matches the second gold answer: EM 1, F1 1.
    got = load_metric("squad").compute(predictions=predictions, references=references)
    assert list(got) == ["exact_match", "f1"]
    assert got["exact_match"] == pytest.approx(100 * 2 / 5)
    assert got["f1"] == pytest.approx(100 * (1 + 4 / 7 + 4 / 5 + 0 + 1) / 5)


def squad_v2_example():
    predictions = [
        {"id": "q1", "prediction_text": "Denver Broncos", "no_answer_probability": 0.1},
        {"id": "q2", "prediction_text": "Panthers", "no_answer_probability": 0.6},
        {"id": "q3", "prediction_text": "Santa Clara", "no_answer_probability": 0.7},
        {"id": "q4", "prediction_text": "", "no_answer_probability": 0.8},
    ]
    references = [
        squad_reference("q1", "Denver Broncos"),
        squad_reference("q2", "Carolina Panthers"),
        squad_reference("q3"),  # unanswerable
        squad_reference("q4"),  # unanswerable
    ]
    return predictions, references


def test_squad_v2_hand_worked():
    predictions, references = squad_v2_example()
    # Raw scores (EM, F1): q1 (1, 1); q2 "panthers" vs "carolina panthers": P 1, R 1/2 -> (0, 2/3);
    # q3 unanswerable with a non-empty answer: (0, 0); q4 unanswerable with the empty answer: (1, 1).
    # With the default threshold 1.0 no probability exceeds it, so these are the scores.
    got = load_metric("squad_v2").compute(predictions=predictions, references=references)
    expected = {
        "exact": 50.0, "f1": 100 * (1 + 2 / 3 + 0 + 1) / 4, "total": 4,
        "HasAns_exact": 50.0, "HasAns_f1": 100 * (1 + 2 / 3) / 2, "HasAns_total": 2,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
        # Best threshold: abstaining everywhere scores 2 (q3, q4). Answering in order of no-answer probability:
        # q1 (0.1) +1 -> 3; q2 (0.6) +2/3 for F1 -> 11/3 (+0 for EM); q3 (0.7) non-empty wrong answer -1;
        # q4 (0.8) empty answer +0. Best F1 11/3 of 4 at 0.6; best EM 3 of 4 at 0.1.
        "best_exact": 75.0, "best_exact_thresh": float(np.float32(0.1)),
        "best_f1": 100 * (11 / 3) / 4, "best_f1_thresh": float(np.float32(0.6)),
    }
    assert list(got) == list(expected)
    assert got == pytest.approx(expected)
    # Threshold 0.5: q2, q3, q4 abstain; q2 has an answer (0), q3 and q4 have none (1 each).
    got = load_metric("squad_v2").compute(predictions=predictions, references=references, no_answer_threshold=0.5)
    assert got == pytest.approx({
        **expected, "exact": 75.0, "f1": 75.0, "HasAns_exact": 50.0, "HasAns_f1": 50.0,
        "NoAns_exact": 100.0, "NoAns_f1": 100.0,
    })


def test_squad_v2_without_unanswerable_questions_has_no_noans_keys():
    predictions, references = squad_v2_example()
    got = load_metric("squad_v2").compute(predictions=predictions[:2], references=references[:2])
    assert not any(key.startswith("NoAns") for key in got)
    assert got["HasAns_total"] == got["total"] == 2
    assert got["best_f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)  # answering both is best: threshold 0.6
    assert got["best_f1_thresh"] == pytest.approx(0.6)


def test_squad_v2_best_threshold_can_be_to_abstain_everywhere():
    predictions = [
        {"id": "q1", "prediction_text": "Denver Broncos", "no_answer_probability": 0.5},
        {"id": "q2", "prediction_text": "Santa Clara", "no_answer_probability": 0.2},
    ]
    references = [squad_reference("q1", "Denver Broncos"), squad_reference("q2")]
    # Abstaining everywhere: q2 right, 1 of 2. Answering q2 (0.2) loses that point -> 0; then q1 (0.5) +1 -> 1,
    # not better. So the best is 50 at threshold 0.0 (answer nothing), while answering everything scores 50 too.
    got = load_metric("squad_v2").compute(predictions=predictions, references=references)
    best = (got["best_exact"], got["best_exact_thresh"], got["best_f1"], got["best_f1_thresh"])
    assert best == (50.0, 0.0, 50.0, 0.0)
    assert (got["exact"], got["f1"]) == (50.0, 50.0)


@pytest.mark.parametrize("name", ["squad", "squad_v2"])
def test_squad_mismatched_ids_are_a_clear_error(name):
    extra = {"no_answer_probability": 0.0} if name == "squad_v2" else {}
    with pytest.raises(ValueError, match=r"without a prediction \['q1'\].*unknown ids \['qX'\]"):
        load_metric(name).compute(
            predictions=[{"id": "qX", "prediction_text": "a", **extra}], references=[squad_reference("q1", "a")]
        )


def test_squad_v1_unanswerable_question_is_a_clear_error():
    with pytest.raises(ValueError, match="'q1' has no gold answer.*squad_v2"):
        load_metric("squad").compute(
            predictions=[{"id": "q1", "prediction_text": ""}], references=[squad_reference("q1")]
        )


def test_wheel_ships_the_metric_modules(tmp_path):
    """A wheel built from a copy of the project holds every module where load_metric looks, and they load."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO / "pyproject.toml", project)
    shutil.copy(REPO / "README.md", project)
    shutil.copytree(REPO / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (tmp_path / "dist").mkdir()
    build = "import setuptools.build_meta as b, sys; print(b.build_wheel(sys.argv[1]))"
    out = subprocess.run(
        [sys.executable, "-c", build, str(tmp_path / "dist")], cwd=project, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    wheel = tmp_path / "dist" / out.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "installed")
    for name in SHIPPED_METRICS:
        assert f"hf_mgk/metrics/{name}/{name}.py" in names, name
    assert "hf_mgk/metrics/squad_scoring.py" in names
    metric = evaluate.load(str(tmp_path / "installed" / "hf_mgk" / "metrics" / "glue"), "mrpc")
    assert metric.compute(predictions=[1, 0, 1], references=[1, 1, 1]) == {"accuracy": 2 / 3, "f1": 0.8}
