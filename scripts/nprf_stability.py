#!/usr/bin/env python
"""Does normalizing q/k (with RPE) make kernelized attention trainable from scratch where plain PRF is not?

Luo et al. 2021 (papers/nprf-rpe-fft.txt §3.3, SPEC §3): positive random features φ(x) = exp(Wx − ‖x‖²/2)/√m
estimate exp(q·k) with a variance that grows like exp(‖q + k‖²), so once training makes ‖q‖, ‖k‖ large the
attention (and its gradient) is dominated by a few huge features and training fails; unit-norm q̂, k̂ keep the
estimate tame, and the unbounded relative-position bias b_{j−i} gives back the sharp patterns normalization
removed. This script trains small NPRF-RoBERTa masked LMs from scratch on the same data, from the same seeds,
with the same optimiser and learning rate, differing only in the attention:

    nprf          normalize_qk=True,  use_rpe=True     (the paper's model)
    prf           normalize_qk=False, use_rpe=True     (unnormalized PRF, shown as it behaves: no clipping,
                                                        no stabiliser beyond what every variant gets)
    softmax       attention_type="softmax"             (the baseline)
    nprf-no-rpe   normalize_qk=True,  use_rpe=False

A plain training loop (not Trainer: Trainer clips gradients by default and its logs replace NaN/inf losses by
an average, which would hide exactly what is measured). Every step records the loss, the gradient norm before
the update, and the largest per-head query/key norm seen by any layer. Nothing is skipped: a non-finite gradient
is applied like any other (as a plain loop would), and a variant stops at its first non-finite loss, after which
its weights are NaN for good. For each seed the batches (tokens and masks), the initial weights they share and
the random features W are the same for every variant.

Why the default learning rate is 3e-2 (hidden 128 / 2 layers / 4 heads of 32, m=32, unless said). At lr 1e-3,
3e-3 and 1e-2 (60-400 steps) and with hidden 512 / 8 heads of 64 at 1e-3 (150 steps) every variant stayed finite
and all curves were indistinguishable; the largest per-head |q|, |k| reached 10-25. In this implementation the
unnormalized PRF (features of q / D^(1/4), k / D^(1/4), the softmax kernel as in Performer) breaks only at large
norms: φ underflows in float32, a query's denominator becomes 0 and 0/0 follows (with the q/k projections of a
fresh tiny model scaled x300, |q| ~ 100-180, its first loss is NaN; see tests/test_nprf_long.py), while NPRF is
unchanged by any scale. A fast ramp to a high rate makes training itself produce such norms. With these
defaults (120 steps, 12 warm-up steps, 2000 training blocks) and seeds 0-5 (`--seeds 0 1 2`, then `3 4 5`),
PRF's loss became NaN in 2/6 seeds (seed 0 at step 37, seed 4 at step 53; |q|,|k| up to 78-87), NPRF's,
softmax's and NPRF-without-RPE's in 0/6 (their norms grew to 68-117 without harm: NPRF only sees directions,
softmax subtracts its max). (Earlier runs, while every layer shared one W whatever the seed, failed in 2/3 seeds,
and in 3/3 before PRF's features took the D^(1/4) scaling.) It is a tail event, not a certainty. Caveat: in 120 steps
no variant gets past the unigram plateau (held-out loss ~6.2 for every finite run), so this run speaks to
numerical stability only, not to what each attention can learn.

    python scripts/nprf_stability.py                                  # defaults, ~3 min on 2 idle CPU cores
    python scripts/nprf_stability.py --lr 1e-2 --steps 400 --seeds 0  # another setting, same for all variants
    python scripts/nprf_stability.py --tokenizer roberta-base --text corpus.txt --output_dir runs/stab
"""

import argparse
import json
import math
import os
import time

import torch
from transformers import AutoTokenizer

from hf_mgk import NPRFRobertaConfig, NPRFRobertaForMaskedLM, bundled

VARIANTS = {
    "nprf": dict(attention_type="nprf", normalize_qk=True, use_rpe=True),
    "prf": dict(attention_type="nprf", normalize_qk=False, use_rpe=True),
    "softmax": dict(attention_type="softmax"),
    "nprf-no-rpe": dict(attention_type="nprf", normalize_qk=True, use_rpe=False),
}


def token_blocks(tokenizer, paths, block_size, max_blocks):
    """Consecutive [CLS] ... [SEP] blocks (lists of token ids) of the concatenated texts; reads only what it needs."""
    inner = block_size - 2
    blocks, ids = [], []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            ids.extend(tokenizer(f.read(), add_special_tokens=False, verbose=False)["input_ids"])
        while len(ids) >= inner and len(blocks) < max_blocks:
            blocks.append([tokenizer.cls_token_id] + ids[:inner] + [tokenizer.sep_token_id])
            ids = ids[inner:]
        if len(blocks) >= max_blocks:
            break
    if not blocks:
        raise ValueError(f"the texts give fewer than {block_size} tokens: {paths}")
    return blocks


class Vocabulary:
    """The model's vocabulary: the tokenizer's ids, or (vocab_size > 0) the special tokens plus the most frequent
    tokens of the training blocks, every other token read as [UNK]. Only a renumbering of the tokenizer's output:
    it keeps a small model's time on the attention rather than on a 30k-way output layer."""

    def __init__(self, tokenizer, train_blocks, vocab_size):
        specials = [tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id,
                    tokenizer.mask_token_id]
        specials = list(dict.fromkeys(i for i in specials if i is not None))
        if vocab_size <= 0:
            self.size, self.table = len(tokenizer), None
            self.pad, self.mask = tokenizer.pad_token_id, tokenizer.mask_token_id
            self.specials = torch.tensor(specials)
            return
        if vocab_size <= len(specials):
            raise ValueError(f"--vocab_size must exceed the {len(specials)} special tokens")
        counts = torch.bincount(torch.tensor([i for b in train_blocks for i in b]), minlength=len(tokenizer))
        counts[specials] = -1
        keep = specials + counts.argsort(descending=True)[:vocab_size - len(specials)].tolist()
        unk = tokenizer.unk_token_id if tokenizer.unk_token_id is not None else tokenizer.pad_token_id
        self.table = torch.full((max(len(tokenizer), max(keep) + 1),), keep.index(unk), dtype=torch.long)
        self.table[torch.tensor(keep)] = torch.arange(len(keep))
        self.size = len(keep)
        self.pad, self.mask = int(self.table[tokenizer.pad_token_id]), int(self.table[tokenizer.mask_token_id])
        self.specials = torch.arange(len(specials))
        n_tok = sum(len(b) for b in train_blocks)
        self.coverage = float(counts[keep[len(specials):]].sum()) / max(1, n_tok - 2 * len(train_blocks))

    def encode(self, blocks):
        ids = torch.tensor(blocks, dtype=torch.long)
        return ids if self.table is None else self.table[ids]


def mask_tokens(ids, vocab, generator, probability=0.15):
    """BERT's masking: 15% of the non-special positions are predicted; of those 80% -> [MASK], 10% -> a random
    token, 10% unchanged. Returns (input_ids, labels with -100 elsewhere)."""
    special = torch.isin(ids, vocab.specials)
    chosen = (torch.rand(ids.shape, generator=generator) < probability) & ~special
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    r = torch.rand(ids.shape, generator=generator)
    random_ids = torch.randint(len(vocab.specials), vocab.size, ids.shape, generator=generator)
    inputs = torch.where(chosen & (r < 0.8), torch.full_like(ids, vocab.mask), ids)
    inputs = torch.where(chosen & (r >= 0.8) & (r < 0.9), random_ids, inputs)
    return inputs, labels


def make_batches(ids, vocab, batch_size, count, seed):
    """`count` masked-LM batches of rows of `ids` (cycled through in a seeded order), masks drawn once."""
    g = torch.Generator().manual_seed(seed)
    order = torch.cat([torch.randperm(len(ids), generator=g) for _ in range(-(-count * batch_size // len(ids)))])
    batches = []
    for i in range(count):
        inputs, labels = mask_tokens(ids[order[i * batch_size:(i + 1) * batch_size]], vocab, g)
        batches.append({"input_ids": inputs, "labels": labels})
    return batches


class QKNorms:
    """Forward hooks on every layer's query/key projection: the largest per-head ‖q‖, ‖k‖ of the last forward."""

    def __init__(self, model):
        self.value = 0.0
        self.handles = []
        for layer in model.roberta.encoder.layer:
            attn = layer.attention.self
            for proj in (attn.query, attn.key):
                self.handles.append(proj.register_forward_hook(self._hook(attn.num_heads, attn.head_dim)))

    def _hook(self, heads, head_dim):
        def hook(module, inputs, output):
            with torch.no_grad():
                norm = output.detach().float().view(*output.shape[:-1], heads, head_dim).norm(dim=-1).max()
                self.value = max(self.value, float(norm))
        return hook

    def pop(self):
        value, self.value = self.value, 0.0
        return value


def evaluate(model, batches):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for b in batches:
            n = int((b["labels"] != -100).sum())
            total += float(model(input_ids=b["input_ids"], labels=b["labels"]).loss) * n
            count += n
    model.train()
    return total / count


def train_variant(name, seed, config, batches, eval_batches, args):
    torch.manual_seed(seed)  # the same initial weights for every parameter the variants share
    model = NPRFRobertaForMaskedLM(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    warmup = max(1, args.warmup_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    norms = QKNorms(model)
    rec = dict(variant=name, seed=seed, config=VARIANTS[name], loss=[], grad_norm=[], max_qk_norm=[],
               first_nonfinite_loss=None, first_nonfinite_grad=None)
    start = time.time()
    for step, b in enumerate(batches, 1):
        loss = model(input_ids=b["input_ids"], labels=b["labels"]).loss
        rec["loss"].append(float(loss.detach()))
        rec["max_qk_norm"].append(norms.pop())
        if not math.isfinite(rec["loss"][-1]):
            rec["first_nonfinite_loss"] = step
            rec["grad_norm"].append(float("nan"))
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        gnorm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        rec["grad_norm"].append(gnorm)
        if not math.isfinite(gnorm) and rec["first_nonfinite_grad"] is None:
            rec["first_nonfinite_grad"] = step  # no skipping: the update goes through, as in any plain loop
        if args.max_grad_norm > 0:  # off by default; if set, every variant gets it
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        opt.step()
        sched.step()
        if args.log_every and step % args.log_every == 0:
            print(f"  {name:12s} step {step:4d}  loss {rec['loss'][-1]:7.3f}  grad norm {gnorm:9.3g}  "
                  f"max |q|,|k| {rec['max_qk_norm'][-1]:7.2f}", flush=True)
    rec["steps_run"] = len(rec["loss"])
    rec["seconds"] = time.time() - start
    rec["heldout_loss"] = evaluate(model, eval_batches)
    norms.pop()
    return rec


def summarize(rec):
    losses = [x for x in rec["loss"] if math.isfinite(x)]
    grads = [x for x in rec["grad_norm"] if math.isfinite(x)]
    bad = rec["first_nonfinite_loss"]
    bad_grad = rec["first_nonfinite_grad"]
    return dict(
        first=losses[0] if losses else float("nan"),
        last=rec["loss"][-1],
        min=min(losses) if losses else float("nan"),
        nonfinite="never" if bad is None else str(bad),
        grad="never" if bad_grad is None else str(bad_grad),
        max_grad=max(grads) if grads else float("nan"),
        max_qk=max([x for x in rec["max_qk_norm"] if math.isfinite(x)], default=float("nan")),
        heldout=rec["heldout_loss"],
    )


def print_table(records):
    head = (f"{'variant':12s} {'seed':>4s} {'first':>7s} {'last':>7s} {'min':>7s} {'non-finite loss':>15s} "
            f"{'non-finite grad':>15s} {'max grad':>9s} {'max |q|,|k|':>11s} {'held-out':>8s}")
    print(head)
    print("-" * len(head))
    for rec in records:
        s = summarize(rec)
        print(f"{rec['variant']:12s} {rec['seed']:4d} {s['first']:7.3f} {s['last']:7.3f} {s['min']:7.3f} {s['nonfinite']:>15s} "
              f"{s['grad']:>15s} {s['max_grad']:9.3g} {s['max_qk']:11.2f} {s['heldout']:8.3f}")


def _json_safe(x):
    """Strict JSON: non-finite floats become the strings "nan", "inf", "-inf"."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", help="tokenizer folder or Hub name (default: the bundled bert-base-uncased one)")
    p.add_argument("--text", nargs="*", help="UTF-8 text files; the last is held out, a single file serves both (default: bundled Shakespeare)")
    p.add_argument("--variants", nargs="+", default=["nprf", "prf", "softmax", "nprf-no-rpe"],
                   choices=list(VARIANTS))
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--lr", type=float, default=3e-2)
    p.add_argument("--warmup_steps", type=int, default=12,
                   help="linear warm-up steps, then constant (absolute, so --steps does not change the ramp)")
    p.add_argument("--max_grad_norm", type=float, default=0.0, help="gradient clipping for all variants (0 = off)")
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--hidden_size", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head_dim", type=int, help="head size (default hidden_size / heads)")
    p.add_argument("--num_random_features", type=int, default=32)
    p.add_argument("--vocab_size", type=int, default=4096,
                   help="keep the specials and this many most frequent tokens, the rest [UNK] (0 = full vocabulary)")
    p.add_argument("--eval_batches", type=int, default=4)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                   help="one run per seed and variant; a seed fixes the initial weights, W, batch order and masks")
    p.add_argument("--train_blocks", type=int, default=2000,
                   help="size of the training pool (sampled in a seeded order, so a longer run extends a shorter one)")
    p.add_argument("--log_every", type=int, default=0, help="print every N steps (0 = only the table)")
    p.add_argument("--output_dir", help="write curves.json (per-step loss, grad norm, max q/k norm; non-finite values as strings) here")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --output_dir")
    args = p.parse_args()
    if args.output_dir and os.path.isdir(args.output_dir) and os.listdir(args.output_dir) and not args.overwrite:
        p.error(f"{args.output_dir} is not empty; pass --overwrite or choose another --output_dir")

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or bundled.bert_checkpoint_dir())
    if tokenizer.mask_token is None or tokenizer.pad_token is None:
        p.error("the tokenizer needs a mask and a pad token (a masked-LM tokenizer)")
    if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
        tokenizer.cls_token, tokenizer.sep_token = tokenizer.bos_token, tokenizer.eos_token
    texts = args.text or bundled.shakespeare_files()
    train_files, eval_files = (texts[:-1], texts[-1:]) if len(texts) > 1 else (texts, texts)
    train_blocks = token_blocks(tokenizer, train_files, args.seq_len, args.train_blocks)
    eval_blocks = token_blocks(tokenizer, eval_files, args.seq_len, args.eval_batches * args.batch_size)
    vocab = Vocabulary(tokenizer, train_blocks, args.vocab_size)
    train_ids = vocab.encode(train_blocks)
    # One held-out set for every run (its own fixed generator), so the held-out losses compare across seeds.
    eval_batches = make_batches(vocab.encode(eval_blocks), vocab, args.batch_size, args.eval_batches, 12345)

    base = dict(vocab_size=vocab.size, hidden_size=args.hidden_size, num_hidden_layers=args.layers,
                num_attention_heads=args.heads, head_dim=args.head_dim, intermediate_size=4 * args.hidden_size,
                max_position_embeddings=args.seq_len + vocab.pad + 2, pad_token_id=vocab.pad,
                attention_probs_dropout_prob=0.0, num_random_features=args.num_random_features)
    words = ("full tokenizer vocabulary" if vocab.table is None else
             f"the {vocab.size} most frequent tokens ({vocab.coverage:.1%} of training tokens, the rest [UNK])")
    print(f"data: {len(train_blocks)} training blocks, {len(eval_blocks)} held-out blocks of {args.seq_len} tokens, "
          f"{words}")
    print(f"training: {args.steps} steps of batch {args.batch_size}, AdamW lr {args.lr:g} (linear warm-up "
          f"{args.warmup_steps} steps), gradient clipping {'off' if args.max_grad_norm <= 0 else args.max_grad_norm}, "
          f"seeds {' '.join(map(str, args.seeds))}")
    print(f"model: NPRF-RoBERTa MLM, hidden {args.hidden_size}, {args.layers} layers, {args.heads} heads of "
          f"{args.head_dim or args.hidden_size // args.heads}, m={args.num_random_features}")

    records = []
    for seed in args.seeds:
        batches = make_batches(train_ids, vocab, args.batch_size, args.steps, seed)  # shared by the variants
        for name in args.variants:
            config = NPRFRobertaConfig(**base, **VARIANTS[name], random_feature_seed=seed)
            records.append(train_variant(name, seed, config, batches, eval_batches, args))
            print(f"  {name} seed {seed}: {records[-1]['steps_run']} steps in {records[-1]['seconds']:.0f}s",
                  flush=True)
    print()
    print_table(sorted(records, key=lambda r: list(VARIANTS).index(r["variant"])))
    print()
    for name in args.variants:
        runs = [r for r in records if r["variant"] == name]
        failed = [r for r in runs if r["first_nonfinite_loss"] is not None]
        print(f"{name:12s} non-finite loss in {len(failed)}/{len(runs)} seeds", flush=True)

    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        path = os.path.join(args.output_dir, "curves.json")
        with open(path, "w") as f:
            json.dump(_json_safe(dict(args=vars(args), runs=records,
                                      summary=[dict(variant=r["variant"], seed=r["seed"], **summarize(r))
                                               for r in records])), f, indent=1)
        print(f"\ncurves written to {path}")


if __name__ == "__main__":
    main()
