"""Bad input to the training scripts and to `python -m hf_mgk`: each case is refused
before training with one message naming the file or option, or (a TSV's quotes) read as the file's rows."""

import os
import shutil

import pytest

from hf_mgk import __main__ as hf_mgk_main
from hf_mgk import qa, training
from test_run_glue import COMMON as GLUE_COMMON
from test_run_glue import TINY_BERT, bert_tokenizer_dir, run_glue  # noqa: F401 (a fixture)
from test_run_lm import bert_dir, common, new_model, run_mlm, stock_bert_dir, texts, work  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # the scripts end to end on bad files and arguments


def write(path, content):
    """`content` (str, or bytes for a file that is not UTF-8) into `path`; returns the path as a string."""
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return str(path)


def parse_error(capsys, script, argv):
    """The message of a command line refused while its arguments are parsed (exit status 2, argparse's way)."""
    with pytest.raises(SystemExit) as exit_info:
        training.parse_args(script.DataTrainingArguments, argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


# ------------------------------------------------------------------------------- CSV / TSV files (run_glue.py)

def glue_argv(tmp_path, bert_dir, train, validation):
    return ["--train_file", train, "--validation_file", validation, "--model_type", "mgk-bert", "--tokenizer_name",
            bert_dir, "--config_overrides", TINY_BERT, "--do_train", "--do_eval", "--output_dir",
            str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"), *GLUE_COMMON]


def sentences(n, ext):
    sep = "\t" if ext == "tsv" else ","
    return f"sentence{sep}label\n" + "".join(f"sentence number {i}{sep}{('negative', 'positive')[i % 2]}\n"
                                             for i in range(n))


def test_a_tsv_quote_does_not_swallow_the_rows_up_to_the_next_one(tmp_path, bert_tokenizer_dir):
    lines = sentences(40, "tsv").splitlines()
    lines[6] = '"a quote opens here\tpositive'  # row 5 ...
    lines[10] = 'and closes here"\tnegative'  # ... row 9: with quoting on, rows 5-9 became one sentence
    path = write(tmp_path / "train.tsv", "\n".join(lines) + "\n")
    model_args, data_args, training_args = training.parse_args(
        run_glue.DataTrainingArguments, glue_argv(tmp_path, bert_tokenizer_dir, path, path))
    train = run_glue.load_data(data_args, model_args, training_args)["train"]
    assert len(train) == 40
    assert train[5] == {"sentence": '"a quote opens here', "label": "positive"}
    assert train[9] == {"sentence": 'and closes here"', "label": "negative"}


def test_a_header_only_validation_file_is_named(tmp_path, bert_tokenizer_dir):
    train = write(tmp_path / "train.csv", sentences(8, "csv"))
    validation = write(tmp_path / "validation.csv", "sentence,label\n")
    with pytest.raises(ValueError, match=f"--validation_file {validation} has no rows"):
        run_glue.main(glue_argv(tmp_path, bert_tokenizer_dir, train, validation))
    assert not (tmp_path / "out").exists()


def test_an_empty_validation_file_is_refused_with_the_arguments(tmp_path, bert_tokenizer_dir, capsys):
    train = write(tmp_path / "train.csv", sentences(8, "csv"))
    validation = write(tmp_path / "validation.csv", "")
    err = parse_error(capsys, run_glue, glue_argv(tmp_path, bert_tokenizer_dir, train, validation))
    assert f"--validation_file {validation} is empty (0 bytes)" in err


@pytest.mark.parametrize("ext, content, message", [
    ("csv", 'sentence,label\na good one,positive\n"never closed,negative\nthe rest,positive\n',
     "line 3 starts a row that is not valid CSV"),
    ("csv", b"sentence,label\na good one,positive\nfine,negative\ncaf\xe9 latin-1,positive\n",
     "line 4 is not UTF-8 (byte 0xe9 at position 4)"),
    ("tsv", b"sentence\tlabel\na good one\tpositive\nfine\tnegative\ncaf\xe9 latin-1\tpositive\n",
     "line 4 is not UTF-8 (byte 0xe9 at position 4)"),
], ids=["csv-unclosed-quote", "csv-latin-1", "tsv-latin-1"])
def test_an_unreadable_csv_names_the_file_and_line(ext, content, message, tmp_path, bert_tokenizer_dir):
    train = write(tmp_path / f"train.{ext}", sentences(8, ext))
    validation = write(tmp_path / f"validation.{ext}", content)
    with pytest.raises(ValueError) as err:
        run_glue.main(glue_argv(tmp_path, bert_tokenizer_dir, train, validation))
    assert str(err.value).startswith(f"--validation_file {validation} cannot be read: {message}")


@pytest.mark.parametrize("content, message", [
    ('id,context,question,answers\n1,"never closed,why?,"{""text"": [""a""], ""answer_start"": [0]}"\n'
     '2,more,what?,"{""text"": [""m""], ""answer_start"": [0]}"\n', "line 2 starts a row that is not valid CSV"),
    (b'id,context,question,answers\n1,caf\xe9,why?,"{""text"": [""c""], ""answer_start"": [0]}"\n',
     "line 2 is not UTF-8"),
], ids=["unclosed-quote", "latin-1"])
def test_an_unreadable_qa_csv_names_the_file_and_line(content, message, tmp_path):
    path = write(tmp_path / "squad.csv", content)
    with pytest.raises(ValueError) as err:
        qa.load_file(path)
    assert str(err.value).startswith(f"{path} cannot be read: {message}")


# ------------------------------------------------------------------------------------ text files (run_mlm.py)

def mlm_argv(texts, out, work, bert_dir, *extra):
    return [*new_model("mgk-bert", bert_dir), *common(texts, out, work), "--do_train", "--do_eval",
            "--max_seq_length", "32", *extra]


@pytest.mark.parametrize("line_by_line", [False, True], ids=["blocks", "line-by-line"])
def test_a_training_file_of_blank_lines_is_named(line_by_line, texts, work, bert_dir, tmp_path):
    blank = write(tmp_path / "blank.txt", "\n" * 30 + "  \n")
    argv = mlm_argv({**texts, "train": blank}, tmp_path / "out", work, bert_dir,
                    *(["--line_by_line"] if line_by_line else []))
    with pytest.raises(ValueError, match=f"--train_file {blank} holds no text: its 31 lines are all blank"):
        run_mlm.main(argv)
    assert not (tmp_path / "out" / "train_results.json").exists()


def test_too_little_evaluation_text_is_refused_before_training(texts, work, bert_dir, tmp_path):
    short = write(tmp_path / "short.txt", "a\nb\nc\n")  # 15% of 3 tokens: none masked
    with pytest.raises(ValueError, match=f"--validation_file {short} is too little to evaluate on: masking "
                                         "--mlm_probability 0.15 of its 3 tokens"):
        run_mlm.main(mlm_argv({**texts, "validation": short}, tmp_path / "out", work, bert_dir))
    assert not (tmp_path / "out" / "train_results.json").exists()


def test_a_held_out_validation_part_of_no_row_is_named(texts, work, bert_dir, tmp_path):
    with open(texts["train"], encoding="utf-8") as f:
        ten = write(tmp_path / "ten.txt", "".join(f.readlines()[:10]))
    argv = mlm_argv({**texts, "train": ten}, tmp_path / "out", work, bert_dir)
    argv[argv.index("--validation_file"):argv.index("--validation_file") + 2] = []  # 5% of 10 lines held out
    with pytest.raises(ValueError, match=f"--validation_split_percentage 5 of the rows of --train_file {ten} leaves "
                                         "no row for validation"):
        run_mlm.main(argv)


# ------------------------------------------------------------------------------------------- checkpoints

def test_a_warm_start_with_more_heads_than_the_checkpoint_is_refused(texts, work, stock_bert_dir, tmp_path):
    argv = ["--model_name_or_path", stock_bert_dir, "--attention_overrides", "attention_type=mgk,num_attention_heads=8",
            *common(texts, tmp_path / "out", work), "--do_train"]
    with pytest.raises(ValueError, match="num_attention_heads=8 is more than the checkpoint's 4 heads per layer"):
        run_mlm.main(argv)


@pytest.mark.parametrize("case", ["empty", "missing", "a file"])
def test_an_empty_or_missing_model_folder_is_named(case, texts, work, tmp_path, capsys):
    folder = tmp_path / "model"
    if case == "empty":
        folder.mkdir()
    elif case == "a file":
        folder.write_text("not a model")
    message = {"empty": "has no config.json", "missing": "does not exist", "a file": "is a file"}[case]
    err = parse_error(capsys, run_mlm, ["--model_name_or_path", str(folder), *common(texts, tmp_path / "out", work),
                                        "--do_train"])
    assert f"--model_name_or_path {folder} {message}" in err


def test_a_truncated_safetensors_file_is_named(texts, work, stock_bert_dir, tmp_path, capsys):
    folder = shutil.copytree(stock_bert_dir, tmp_path / "model")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])  # a download or a save cut short
    err = parse_error(capsys, run_mlm, ["--model_name_or_path", str(folder), *common(texts, tmp_path / "out", work),
                                        "--do_train"])
    assert f"--model_name_or_path {folder}: model.safetensors cannot be read" in err


def test_a_half_written_last_checkpoint_is_named_with_the_one_to_resume(texts, work, bert_dir, tmp_path):
    out = tmp_path / "out"
    argv = [*new_model("mgk-bert", bert_dir), *common(texts, out, work), "--do_train", "--max_seq_length", "32",
            "--save_strategy", "steps", "--save_steps", "1"]
    run_mlm.main(argv)
    # Killed while saving checkpoint-2: its weights cut short, the files saved after them never written.
    last = out / "checkpoint-2"
    (last / "model.safetensors").write_bytes((last / "model.safetensors").read_bytes()[:1000])
    for name in os.listdir(last):
        if name != "model.safetensors":
            os.remove(last / name)
    with pytest.raises(ValueError, match=f"its last checkpoint {last} is incomplete \\(it has no trainer_state.json; "
                                         f".* --resume_from_checkpoint {out / 'checkpoint-1'}"):
        run_mlm.main(argv)
    with pytest.raises(ValueError, match=f"--resume_from_checkpoint {last} is incomplete"):
        run_mlm.main([*argv, "--resume_from_checkpoint", str(last)])
    # The advice works: resumed from checkpoint-1, the run saves checkpoint-2 anew.
    run_mlm.main([*argv, "--resume_from_checkpoint", str(out / "checkpoint-1")])
    assert training.incomplete_checkpoint(str(last)) is None


# ---------------------------------------------------------------------------------------- python -m hf_mgk

@pytest.mark.parametrize("args, message", [
    (["DIR"], "shakespeare FILE: DIR is a folder"),
    (["DIR/plays.txt", "two"], "N is how many plays to write, a whole number >= 1; got 'two'"),
], ids=["a-folder", "N=two"])
def test_shakespeare_with_a_folder_or_a_word_for_n_is_named(args, message, tmp_path):
    args = [a.replace("DIR", str(tmp_path)) for a in args]
    with pytest.raises(SystemExit) as exit_info:
        hf_mgk_main.main(["shakespeare", *args])
    assert isinstance(exit_info.value.code, str)  # exit status 1, the message on stderr
    assert message.replace("DIR", str(tmp_path)) in exit_info.value.code
    assert os.listdir(tmp_path) == []
