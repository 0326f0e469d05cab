"""Writes tests/data/fish_gpt2_v1/: tiny FiSH-GPT2 checkpoints saved by the FiSH-GPT2 code as it was before the
move onto the shared decoder stack (commit f4f0510), with the outputs that code gave. tests/test_decoder_stack.py
loads them with today's code and compares. Kept for the record; rerunning it with later code would only restate
what later code computes."""

import os
import shutil
import sys

import torch

from hf_mgk import FiSHGPT2Config, FiSHGPT2ForSequenceClassification, FiSHGPT2LMHeadModel

TINY = dict(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fish_gpt2_v1")


def main():
    if os.path.exists(OUT):
        sys.exit(f"{OUT} exists; it records the old code's outputs and is not rewritten")
    os.makedirs(OUT)
    torch.manual_seed(0)
    ids = torch.randint(3, 99, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :4] = 0
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    torch.save({"input_ids": ids, "attention_mask": mask, "position_ids": pos}, os.path.join(OUT, "inputs.pt"))
    cases = [("fish", {}), ("hard_fish", {}), ("gfish", {}), ("hard_gfish", {"head_dim": 6}), ("mish", {}),
             ("softmax", {})]
    for attention_type, extra in cases:
        torch.manual_seed(1)
        model = FiSHGPT2LMHeadModel(FiSHGPT2Config(**TINY, attention_type=attention_type, **extra)).eval()
        with torch.no_grad():
            out = model(ids, attention_mask=mask, position_ids=pos, output_hidden_states=True,
                        output_attentions=True)
            gen = model.generate(ids[:1, :5], max_new_tokens=6, do_sample=False, pad_token_id=0)
        folder = os.path.join(OUT, f"lm-{attention_type}")
        model.save_pretrained(folder)
        torch.save({"logits": out.logits, "hidden_states": out.hidden_states, "attentions": out.attentions,
                    "generated": gen}, os.path.join(folder, "expected.pt"))
    torch.manual_seed(2)
    model = FiSHGPT2ForSequenceClassification(FiSHGPT2Config(**TINY, num_labels=3)).eval()
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
    folder = os.path.join(OUT, "cls-fish")
    model.save_pretrained(folder)
    torch.save({"logits": logits}, os.path.join(folder, "expected.pt"))
    for root, _, files in os.walk(OUT):  # the weights and config are the record; the copied code is not needed
        for f in files:
            if f.endswith(".py"):
                os.remove(os.path.join(root, f))


if __name__ == "__main__":
    main()
