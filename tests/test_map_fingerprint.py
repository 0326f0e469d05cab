"""training.map_fingerprint: the datasets cache key of the scripts' tokenizing maps, hashed from what decides their
output instead of datasets pickling the tokenizer for every map. It must change with anything that changes the
result (the data, the tokenizer's vocabulary, added tokens, the attributes its call reads, the options) and stay the
same otherwise, so that a second run reuses the cache and gets what tokenizing again gives."""

import copy

import datasets
import pytest
from transformers import AutoTokenizer

from hf_mgk import bundled, training


@pytest.fixture
def text_dataset(tmp_path):
    """A dataset read from a text file with a cache folder of its own (so maps write cache files)."""
    path = tmp_path / "train.txt"
    path.write_text("To be, or not to be: that is the question:\nWhether 'tis nobler in the mind to suffer\n"
                    "The slings and arrows of outrageous fortune,\n", encoding="utf-8")
    return lambda: datasets.load_dataset("text", data_files={"train": str(path)},
                                         cache_dir=str(tmp_path / "cache"))["train"]


def test_same_inputs_same_key_and_the_cache_is_reused(text_dataset):
    tokenizer = AutoTokenizer.from_pretrained(bundled.gpt2_tokenizer_dir())
    ds = text_dataset()
    key = training.map_fingerprint(ds, tokenizer, "opt", 16)
    again = AutoTokenizer.from_pretrained(bundled.gpt2_tokenizer_dir())
    assert key is not None and key == training.map_fingerprint(text_dataset(), again, "opt", 16)

    def tokenize(batch):
        return tokenizer(batch["text"])

    first = ds.map(tokenize, batched=True, new_fingerprint=key)
    second = text_dataset().map(lambda b: {"input_ids": [[0]] * len(b["text"])}, batched=True, new_fingerprint=key)
    assert first.cache_files and second.cache_files == first.cache_files  # read back, not computed again
    assert second["input_ids"] == first["input_ids"] == ds.map(tokenize, batched=True)["input_ids"]


def test_anything_that_changes_the_result_changes_the_key(text_dataset, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(bundled.gpt2_tokenizer_dir())
    ds = text_dataset()
    key = training.map_fingerprint(ds, tokenizer, "opt", 16)
    assert training.map_fingerprint(ds, tokenizer, "opt", 17) != key  # an option
    other = datasets.Dataset.from_dict({"text": ["another text"]})
    assert training.map_fingerprint(other, tokenizer, "opt", 16) != key  # the data
    bert = AutoTokenizer.from_pretrained(bundled.bert_checkpoint_dir())
    assert training.map_fingerprint(ds, bert, "opt", 16) != key  # another vocabulary
    changes = [lambda t: t.add_tokens(["<new>"]), lambda t: setattr(t, "padding_side", "left"),
               lambda t: setattr(t, "truncation_side", "left"), lambda t: setattr(t, "model_max_length", 7),
               lambda t: t.add_special_tokens({"pad_token": "<pad>"}),
               lambda t: t.backend_tokenizer.enable_truncation(5)]
    for change in changes:
        changed = copy.deepcopy(tokenizer)
        change(changed)
        assert training.map_fingerprint(ds, changed, "opt", 16) != key


def test_a_tokenizer_without_serialized_state_leaves_the_key_to_datasets(text_dataset):
    """A Python-only tokenizer (no backend_tokenizer; transformers 4 still has them) or none: None, so that datasets
    hashes the function itself."""

    class PythonOnly:
        padding_side = "right"

    assert training.map_fingerprint(text_dataset(), PythonOnly(), "opt") is None
    assert training.map_fingerprint(text_dataset(), None, "opt") is None
