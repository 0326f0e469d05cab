"""One Trainer optimiser step of tiny MGK models on a fixed batch; run in-process or under torchrun (one run
per --task, in the same processes).

The examples have very different numbers of loss tokens, so a loss that ignores `num_items_in_batch` (the
transformers 5.23 pitfall) gives a different step under gradient accumulation or several processes."""

import argparse
import json
import os
import sys

import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
import hf_mgk  # noqa: E402
from hf_mgk import training  # noqa: E402
import tiny  # noqa: E402 (tests/, this script's folder, is on sys.path)

N_TOKENS = 12
MASKED_PER_EXAMPLE = [1, 9, 2, 6]  # unequal on purpose


class FixedBatch(Dataset):
    def __init__(self, task):
        g = torch.Generator().manual_seed(0)
        self.items = []
        for i, n_masked in enumerate(MASKED_PER_EXAMPLE):
            ids = torch.randint(5, 99, (N_TOKENS,), generator=g)
            item = {"input_ids": ids, "attention_mask": torch.ones(N_TOKENS, dtype=torch.long)}
            if task == "mlm":
                labels = torch.full((N_TOKENS,), -100)
                labels[:n_masked] = ids[:n_masked]
                item["labels"] = labels
            elif task.startswith("clm"):  # a causal LM scores n_masked + 1 positions (labels shift inside the model)
                labels = ids.clone()
                labels[n_masked + 2:] = -100
                item["labels"] = labels
            else:
                item["labels"] = torch.tensor(i % 3)
            self.items.append(item)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def build_model(task):
    torch.manual_seed(0)
    if task == "clm":  # hard FiSH: noise-free, so the two runs draw no different random numbers
        return hf_mgk.FiSHGPT2LMHeadModel(hf_mgk.FiSHGPT2Config(
            **tiny.gpt2(dropout=False), attention_type="hard_fish", num_global_heads=2))
    if task == "clm-mgk":  # MGK-GPT2 with a learned prior (the EM prior would change between micro-batches)
        return hf_mgk.MGKGPT2LMHeadModel(hf_mgk.MGKGPT2Config(
            **tiny.gpt2(dropout=False), attention_type="mgk", num_keys=2))
    cfg = hf_mgk.MGKBertConfig(**tiny.bert(dropout=False, num_labels=3))
    cls = hf_mgk.MGKBertForMaskedLM if task == "mlm" else hf_mgk.MGKBertForSequenceClassification
    return cls(cfg)


def train_once(task, per_device_batch, accumulation, output_dir):
    model = build_model(task)
    args = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=per_device_batch,
                             gradient_accumulation_steps=accumulation, max_steps=1, learning_rate=0.5,
                             optim="sgd", lr_scheduler_type="constant", use_cpu=True, report_to="none",
                             logging_steps=1, save_strategy="no", seed=0, dataloader_drop_last=False)
    trainer = Trainer(model=model, args=args, train_dataset=FixedBatch(task))
    result = trainer.train()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return result.training_loss, flat


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", nargs="+", default=["mlm"], choices=["mlm", "cls", "clm", "clm-mgk"],
                        help="one run per task, in this order, in the same processes")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--accumulation", type=int, required=True)
    parser.add_argument("--out", required=True, help="{task: {'loss': ..., 'params': ...}} (torch.save)")
    a = parser.parse_args()
    results = {}
    for task in a.task:
        loss, flat = train_once(task, a.batch, a.accumulation, os.path.join(os.path.dirname(a.out), task))
        results[task] = {"loss": loss, "params": flat}
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(results, a.out)
    training.close_distributed()  # gloo torn down before exit, as the scripts do


if __name__ == "__main__":
    training.run_script(main)  # under torchrun: no interpreter teardown, where a rank can hang (as the scripts)
