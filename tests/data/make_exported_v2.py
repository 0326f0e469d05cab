"""Writes tests/data/exported_v2/ (committed as exported_v2.tar.gz, so that its copies of old code files are data, not
source of this tree): tiny checkpoints exported, code files included, by the package as it was before
the `compiled` backend was retired (package at commit 5ca5f6c). Each folder carries the code that
version copied with it (`attention_compile.py` among them), as a folder published then does on the Hub, and the
outputs that code gave. tests/test_exported_v2.py loads them with today's classes and, through remote code, in an
environment without hf_mgk. Kept for the record; rerunning it with later code would only restate what later code
computes."""

import os
import sys

import torch

from hf_mgk import FiSHGPT2Config, FiSHGPT2LMHeadModel, MGKBertConfig, MGKBertForMaskedLM, MGKGPT2Config
from hf_mgk import MGKGPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import tiny  # noqa: E402

OUT = os.path.join(HERE, "exported_v2")
CASES = {  # folder -> (class, config)
    "mgk-bert-mgk": (MGKBertForMaskedLM, MGKBertConfig(**tiny.bert(dropout=False), attention_type="mgk")),
    "mgk-gpt2-smgk-hard": (MGKGPT2LMHeadModel, MGKGPT2Config(**tiny.gpt2(dropout=False, special_ids=True),
                                                             attention_type="smgk", e_step="hard")),
    "fish-gpt2-gfish": (FiSHGPT2LMHeadModel, FiSHGPT2Config(**tiny.gpt2(dropout=False, special_ids=True),
                                                            attention_type="gfish")),
}


def main():
    os.makedirs(OUT)  # FileExistsError if it exists: it records the old code's outputs and is not rewritten
    generator = torch.Generator().manual_seed(0)
    inputs = {"input_ids": torch.randint(3, 99, (2, 12), generator=generator),
              "attention_mask": torch.tensor([[1] * 12, [1] * 8 + [0] * 4])}  # the second row padded from 8 on
    torch.save(inputs, os.path.join(OUT, "inputs.pt"))
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    for i, (name, (cls, config)) in enumerate(CASES.items()):
        torch.manual_seed(1 + i)
        model = cls(config).eval()
        with torch.no_grad():
            out = model(ids, attention_mask=mask, output_hidden_states=True)
        folder = os.path.join(OUT, name)
        model.save_pretrained(folder)
        assert os.path.exists(os.path.join(folder, "attention_compile.py")), "the old code was not copied"
        torch.save({"logits": out.logits, "hidden_states": out.hidden_states}, os.path.join(folder, "expected.pt"))


if __name__ == "__main__":
    main()
