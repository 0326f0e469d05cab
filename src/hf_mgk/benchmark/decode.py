"""The decoders' KV cache and decoding step (the llama family): the bytes the cache holds per token, and the time of
one decoding step with N tokens cached, of each model beside stock Llama of the same width. The models are built
in one child and their steps alternate (`measure.alternate`), so the baseline and each model see the same machine
state."""

import torch
from transformers import DynamicCache

from . import measure, models


def cache_bytes(cache):
    """The bytes a cache's keys and values take, every layer."""
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def measure_decode(cases, length, batch, repeats, threads):
    """Runs in the child: each case's base model (`models.build`) with its cache filled by a forward of `length`
    tokens, then `repeats` rounds that each time one decoding step (one new token per row) of every case in turn,
    the cache cut back to `length` tokens after each step. {"bytes_per_token": the cache's bytes / (batch x length),
    "seconds": the median step time}, per case in order."""
    torch.set_num_threads(threads)
    steps, sizes = [], []
    for kind, overrides in cases:
        torch.manual_seed(0)
        model = models.build(kind, overrides, length + 1).eval()
        cache = DynamicCache(config=model.config)
        prompt = torch.randint(3, model.config.vocab_size, (batch, length))
        with torch.no_grad(), models.autocast():
            model(prompt, past_key_values=cache, use_cache=True)
        sizes.append(cache_bytes(cache) / (batch * length))
        new = torch.randint(3, model.config.vocab_size, (batch, 1))

        def step(model=model, cache=cache, new=new):
            with torch.no_grad(), models.autocast():
                model(new, past_key_values=cache, use_cache=True)
            cache.crop(-1)  # back to `length` tokens (a positive length is refused by newer releases)

        step()  # warm-up
        steps.append(step)
    return {"bytes_per_token": sizes, "seconds": measure.alternate(steps, repeats)}


def print_decode_table(args, spec):
    """The family's KV-cache and decoding table: per length, each model's cache bytes per token and decoding step
    time, and both as ratios to the baseline's."""
    names, base = list(spec["cases"]), spec["baseline"]
    print(f"\nKV cache and one decoding step ({args.device}, {args.dtype}, batch {args.batch}, median of "
          f"{args.repeats} steps, the models' steps alternating in one process)")
    print(f"{'N cached':>8}  {'model':<44} {'KV bytes/token':>15} {'vs base':>8} {'decode ms':>10} {'vs base':>8}")
    for length in spec["lengths"]:
        got = measure.call_child("measure_decode", [list(spec["cases"].values()), length, args.batch, args.repeats,
                                                    args.threads])
        if "error" in got:
            print(f"{length:>8}  failed: {got['error']}")
            continue
        sizes, seconds = dict(zip(names, got["bytes_per_token"])), dict(zip(names, got["seconds"]))
        for name in names:
            ms = None if seconds[name] is None else seconds[name] * 1e3
            time_ratio = "" if ms is None or seconds[base] is None else f"{seconds[name] / seconds[base]:.2f}x"
            print(f"{length:>8}  {name:<44} {sizes[name]:>15.0f} {sizes[name] / sizes[base]:>7.2f}x "
                  f"{'-' if ms is None else f'{ms:.2f}':>10} {time_ratio:>8}")


__all__ = ["cache_bytes", "measure_decode", "print_decode_table"]
