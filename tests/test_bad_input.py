"""Bad input to the training scripts and to `python -m hf_mgk` (issue 18, parts 2 and 3): each case is refused
before training with one message naming the file or option, or (a TSV's quotes) read as the file's rows."""

import pytest

from test_run_lm import bert_dir, common, run_mlm, stock_bert_dir, texts, work  # noqa: F401 (fixtures)


# ------------------------------------------------------------------------------------------- checkpoints

def test_a_warm_start_with_more_heads_than_the_checkpoint_is_refused(texts, work, stock_bert_dir, tmp_path):
    argv = ["--model_name_or_path", stock_bert_dir, "--attention_overrides", "attention_type=mgk,num_attention_heads=8",
            *common(texts, tmp_path / "out", work), "--do_train"]
    with pytest.raises(ValueError, match="num_attention_heads=8 is more than the checkpoint's 4 heads per layer"):
        run_mlm.main(argv)
