"""The bundled real data: the movie-review polarity task of the main job, built from the rated sentences."""

import csv

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
