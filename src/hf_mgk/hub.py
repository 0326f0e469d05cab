"""Publishing helpers: save a Hub-ready folder safely and prove it loads with `trust_remote_code=True` alone."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import torch

# Run first in the child process: any `import hf_mgk` fails, so the folder's own code files must suffice.
_BLOCK_PACKAGE = textwrap.dedent(
    """
    import importlib.abc, sys
    class _NoHfMgk(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "hf_mgk" or name.startswith("hf_mgk."):
                raise ModuleNotFoundError("hf_mgk is deliberately unavailable in this process")
            return None
    sys.meta_path.insert(0, _NoHfMgk())
    """
)


def save_for_hub(model, folder, tokenizer=None, overwrite=False):
    """`save_pretrained` (safetensors + code files + full `auto_map`) into `folder`, never over a user's files,
    plus a README.md model card saying how to load it (kept if the folder already has one).

    A non-empty folder is refused unless `overwrite=True`."""
    if os.path.isdir(folder) and os.listdir(folder) and not overwrite:
        raise FileExistsError(f"{folder} exists and is not empty; pass overwrite=True to replace its contents")
    model.save_pretrained(folder, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    card = os.path.join(folder, "README.md")
    if not os.path.exists(card):
        with open(card, "w", encoding="utf-8") as f:
            f.write(model_card(model))
    return folder


def model_card(model):
    """A minimal Hub model card: what the model is and the one line that loads it without this package."""
    config = model.config
    auto = next((a for a, name in model._auto_map.items() if name == type(model).__name__), "AutoModel")
    n_params = sum(p.numel() for p in model.parameters())
    fields = {k: getattr(config, k) for k in ("attention_type", "num_keys", "e_step", "mgk_prior", "num_global_heads",
                                              "normalize_qk", "use_rpe", "num_random_features", "head_dim")
              if hasattr(config, k)}
    rows = "\n".join(f"| `{k}` | `{v}` |" for k, v in fields.items())
    return f"""---
library_name: transformers
tags: [{config.model_type}, hf-mgk, custom_code]
---
# {type(model).__name__} ({config.model_type})

{n_params / 1e6:.1f}M parameters. Made with [hf-mgk](https://pypi.org/project/hf-mgk/); loads without it:

```python
import transformers
model = transformers.{auto}.from_pretrained("ORG/NAME", trust_remote_code=True)
```

| attention setting | value |
|---|---|
{rows}
"""


def run_without_package(code, cwd, timeout=600):
    """Run Python `code` in a fresh interpreter where `hf_mgk` cannot be imported; return its last stdout line
    parsed as JSON. Raises RuntimeError with the child's stderr if it fails."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("HF_MODULES_CACHE", os.path.join(cwd, ".hf_modules"))
    # The parent's thread count: a matmul split over another number of threads sums in another order.
    threads = f"import torch\ntorch.set_num_threads({torch.get_num_threads()})\n"
    script = _BLOCK_PACKAGE + threads + textwrap.dedent(code) + "\nassert 'hf_mgk' not in sys.modules\n"
    proc = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the check process failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_remote_code(folder, inputs, auto_class="AutoModel", reference=None):
    """Load `folder` through `transformers.<auto_class>` with `trust_remote_code=True` in a process without
    hf_mgk, run it on `inputs` (a dict of tensors), and return its first output as a tensor. If `reference` (a
    tensor) is given, raise AssertionError unless the outputs agree to float32 round-off."""
    folder = os.path.abspath(folder)
    with tempfile.TemporaryDirectory() as work:
        torch.save(inputs, os.path.join(work, "inputs.pt"))
        result = run_without_package(
            f"""
            import json, torch, transformers
            inputs = torch.load("inputs.pt")
            model = transformers.{auto_class}.from_pretrained({folder!r}, trust_remote_code=True).eval()
            with torch.no_grad():
                out = model(**inputs)
            first = next(v for v in out.values() if torch.is_tensor(v) and v.dim() > 1)
            torch.save(first, "output.pt")
            print(json.dumps({{"module": type(model).__module__}}))
            """,
            cwd=work,
        )
        if not result["module"].startswith("transformers_modules"):
            raise AssertionError(f"{auto_class} did not load the folder's own code: {result['module']}")
        output = torch.load(os.path.join(work, "output.pt"))
    if reference is not None:
        assert_same_outputs(output, reference, "remote-code outputs")
    return output


def assert_same_outputs(output, reference, what="outputs"):
    """Raise AssertionError unless `output` equals `reference` up to float32 round-off.

    Not bit for bit across processes: MKL picks its matmul kernel by buffer alignment, so another process can
    sum in another order (seen: 1.2e-6 on a logit of 0.017 from terms of size ~1). Round-off is relative to the
    size of the terms summed, not of the result, hence the bound on the output's largest magnitude: a wrong
    weight or a missing mask moves outputs by orders of magnitude more."""
    output, reference = torch.as_tensor(output), torch.as_tensor(reference)
    if output.shape != reference.shape:
        raise AssertionError(f"{what} differ in shape: {tuple(output.shape)} vs {tuple(reference.shape)}")
    err = (output - reference).abs().max().item()
    bound = 1e-5 * reference.abs().max().item() + 1e-6
    if not err <= bound:  # also catches NaN
        raise AssertionError(f"{what} differ: max abs diff {err:.3e} > {bound:.3e} (float32 round-off)")
