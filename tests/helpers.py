"""Small shared pieces for the tests (tiny configs, a subprocess runner that hides hf_mgk)."""

import json
import os
import subprocess
import sys
import textwrap

# A meta-path finder that refuses `hf_mgk`: proves a saved folder loads with transformers + torch alone.
BLOCK_HF_MGK = textwrap.dedent(
    """
    import sys, importlib.abc
    class _NoHfMgk(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "hf_mgk" or name.startswith("hf_mgk."):
                raise ModuleNotFoundError("hf_mgk is blocked in this test process")
            return None
    sys.meta_path.insert(0, _NoHfMgk())
    """
)


def run_without_hf_mgk(code: str, cwd: str) -> dict:
    """Run `code` in a fresh interpreter where `import hf_mgk` fails; it prints one JSON line, returned as a dict."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_MODULES_CACHE=os.path.join(cwd, "hf_modules"))
    script = BLOCK_HF_MGK + textwrap.dedent(code) + "\nassert 'hf_mgk' not in sys.modules\n"
    proc = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
