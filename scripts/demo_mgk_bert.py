#!/usr/bin/env python
"""MGK-BERT in two minutes: build it, train a few masked-LM steps on real text, save a Hub-ready folder, and
reload it through `AutoModelForMaskedLM.from_pretrained(..., trust_remote_code=True)` in a process where
hf_mgk is not installed, checking the logits are identical.

    python scripts/demo_mgk_bert.py                      # bundled tokenizer and Shakespeare
    python scripts/demo_mgk_bert.py --tokenizer bert-base-uncased --text my_corpus.txt --steps 500
"""

import argparse
import math
import os
import time

import torch
from torch.utils.data import Dataset
from transformers import AutoTokenizer, DataCollatorForLanguageModeling, Trainer, TrainingArguments

from hf_mgk import MGKBertConfig, MGKBertForMaskedLM, bundled
from hf_mgk.hub import check_remote_code, save_for_hub


class Blocks(Dataset):
    """Consecutive fixed-length token blocks ([CLS] ... [SEP]) of the concatenated texts."""

    def __init__(self, tokenizer, paths, block_size, max_blocks):
        ids = []
        for path in paths:
            with open(path, encoding="utf-8", errors="replace") as f:
                ids.extend(tokenizer(f.read(), add_special_tokens=False)["input_ids"])
        inner = block_size - 2
        self.blocks = [
            [tokenizer.cls_token_id] + ids[i:i + inner] + [tokenizer.sep_token_id]
            for i in range(0, len(ids) - inner + 1, inner)
        ][:max_blocks]
        if not self.blocks:
            raise ValueError(f"the texts give fewer than {block_size} tokens: {paths}")

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        return {"input_ids": self.blocks[i]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", help="tokenizer folder or Hub name (default: the bundled bert-base-uncased one)")
    p.add_argument("--text", nargs="*", help="UTF-8 text files (default: bundled Shakespeare plays)")
    p.add_argument("--attention_type", default="mgk", choices=["mgk", "smgk", "mlk", "smlk", "softmax"])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--block_size", type=int, default=64)
    p.add_argument("--output_dir", default="outputs/demo-mgk-bert")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --output_dir")
    args = p.parse_args()
    if os.path.isdir(args.output_dir) and os.listdir(args.output_dir) and not args.overwrite:
        p.error(f"{args.output_dir} is not empty; pass --overwrite or choose another --output_dir")

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or bundled.bert_checkpoint_dir())
    texts = args.text or bundled.shakespeare_files()
    train_files, eval_files = (texts[:-1], texts[-1:]) if len(texts) > 1 else (texts, texts)
    train = Blocks(tokenizer, train_files[:3], args.block_size, max_blocks=2000)
    evaluation = Blocks(tokenizer, eval_files, args.block_size, max_blocks=32)
    print(f"data: {len(train)} training / {len(evaluation)} evaluation blocks of {args.block_size} tokens")

    # Half the heads of a 4-head baseline at the same head size, as the paper's App. B.
    config = MGKBertConfig(vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                           head_dim=32, intermediate_size=512, max_position_embeddings=args.block_size,
                           attention_type=args.attention_type, pad_token_id=tokenizer.pad_token_id)
    model = MGKBertForMaskedLM(config)
    print(f"model: MGK-BERT ({config.attention_type}, {config.num_attention_heads} heads x {config.head_dim}, "
          f"M={config.num_keys}), {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")

    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, seed=0)
    targs = TrainingArguments(output_dir=os.path.join(args.output_dir, "trainer"), max_steps=args.steps,
                              per_device_train_batch_size=8, per_device_eval_batch_size=16, learning_rate=1e-3,
                              warmup_steps=0.1, logging_steps=max(1, args.steps // 6), report_to="none",
                              save_strategy="no", use_cpu=True, seed=0)
    trainer = Trainer(model=model, args=targs, train_dataset=train, eval_dataset=evaluation,
                      data_collator=collator)
    before = trainer.evaluate()["eval_loss"]
    start = time.time()
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    print(f"masked-LM loss on held-out text: {before:.3f} -> {after:.3f} (perplexity {math.exp(after):.1f}) "
          f"after {args.steps} steps in {time.time() - start:.0f}s")

    folder = os.path.join(args.output_dir, "model")
    save_for_hub(model.eval(), folder, tokenizer=tokenizer, overwrite=args.overwrite)
    print(f"saved to {folder}: {', '.join(sorted(os.listdir(folder)))}")

    sentence = f"To be, or not to be, that is the {tokenizer.mask_token}."
    enc = tokenizer(sentence, return_tensors="pt")
    inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    with torch.no_grad():
        reference = model(**inputs).logits
    logits = check_remote_code(folder, inputs, auto_class="AutoModelForMaskedLM", reference=reference)
    where = (enc["input_ids"][0] == tokenizer.mask_token_id).nonzero()[0, 0]
    top = tokenizer.convert_ids_to_tokens(logits[0, where].topk(5).indices.tolist())
    print("reloaded with AutoModelForMaskedLM(trust_remote_code=True) in a process without hf_mgk: "
          "identical logits")
    print(f"{sentence!r} -> top predictions {top}")


if __name__ == "__main__":
    main()
