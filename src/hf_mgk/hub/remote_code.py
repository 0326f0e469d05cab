"""Loading without hf_mgk: a process where `import hf_mgk` fails, or a virtualenv with every package of this
environment except hf_mgk (optionally another transformers release), in which a published folder must load with
`trust_remote_code=True` and give the same outputs."""

import hashlib
import json
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
import textwrap

import torch
import transformers

# The sample the remote-code check runs (short enough for any position limit).
CHECK_TEXT = "The quick brown fox jumps over the lazy dog."


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


# ------------------------------------------------------------------------------------- loading without hf_mgk


def _is_package_entry(name):
    """hf_mgk's own entries of site-packages: the package, its dist-info, an editable install's .pth / finder."""
    return "hf_mgk" in name.lower().replace("-", "_")


def clean_python(transformers_version=None, root=None):
    """The python of a virtualenv that has every package of this environment except hf_mgk.

    Built once (`python -m venv --without-pip`, then a symlink to each entry of this environment's
    site-packages but hf_mgk's own, editable-install hooks included) and kept under `root` (default: the
    temporary folder) in a folder whose name changes with the installed packages and the version asked for.

    transformers_version: None keeps this environment's transformers; a version ("4.57.6") installs that one
    from PyPI into the virtualenv instead (`pip install --no-deps --target`), with the requirements it has that
    this environment's packages do not meet (e.g. huggingface_hub<1.0 for 4.57), found from the installed
    metadata until none is missing; every other package is this environment's. This is how a published folder
    is checked against the transformers releases its users may have.

    Raises RuntimeError if the virtualenv cannot be made or pip fails, if hf_mgk is importable there, or if
    torch / transformers (of the version asked for) are not."""
    sites = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
    entries = sorted((p, name) for p in dict.fromkeys(sites) for name in os.listdir(p)
                     if not _is_package_entry(name) and name != "__pycache__")
    key = hashlib.sha256(repr((sys.executable, sys.version, entries, transformers_version)).encode()).hexdigest()[:12]
    label = "" if transformers_version is None else f"tf-{transformers_version}-"
    root = os.path.abspath(root or tempfile.gettempdir())
    home = os.path.join(root, f"hf-mgk-clean-venv-{label}{key}")
    bindir = "Scripts" if os.name == "nt" else "bin"
    python = os.path.join(home, bindir, "python")
    os.makedirs(root, exist_ok=True)
    _remove_stale_envs(root, label, home)
    if os.path.isfile(python):
        return python
    tmp = tempfile.mkdtemp(prefix=os.path.basename(home) + ".", dir=root)
    try:
        made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp], capture_output=True, text=True)
        if made.returncode != 0:
            raise RuntimeError(f"could not create a virtualenv with `{sys.executable} -m venv`:\n{made.stderr[-2000:]}")
        ask = [os.path.join(tmp, bindir, "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        target = subprocess.run(ask, check=True, capture_output=True, text=True).stdout.strip()
        replaced = set() if transformers_version is None else _install_release(transformers_version, target)
        for path, name in entries:
            if name not in replaced and not os.path.exists(os.path.join(target, name)):
                os.symlink(os.path.join(path, name), os.path.join(target, name))
        expected = transformers_version or _installed_version("transformers")
        probe = ("import importlib.util, torch, transformers\n"
                 "spec = importlib.util.find_spec('hf_mgk')\n"
                 "assert spec is None, f'hf_mgk is importable from {spec.origin}'\n"
                 f"assert transformers.__version__ == {expected!r}, transformers.__version__\n")
        proc = subprocess.run([ask[0], "-c", probe], cwd=tmp, capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        if proc.returncode != 0:
            raise RuntimeError(f"the virtualenv without hf_mgk is not usable:\n{proc.stderr[-2000:]}")
        try:
            os.rename(tmp, home)
        except OSError:  # another process built it meanwhile
            if not os.path.isfile(python):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return python


def _remove_stale_envs(root, label, keep):
    """Remove the virtualenvs made under `root` by this interpreter for the same transformers (`label`) but other
    installed packages: their key will not come again, and each holds a pip-installed release (~50 MB)."""
    pattern = re.compile(rf"hf-mgk-clean-venv-{re.escape(label)}[0-9a-f]{{12}}")
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if not pattern.fullmatch(name) or path == keep:
            continue
        try:
            with open(os.path.join(path, "pyvenv.cfg"), encoding="utf-8") as f:
                ours = f"command = {sys.executable} -m venv" in f.read()
        except OSError:
            continue
        if ours:
            shutil.rmtree(path, ignore_errors=True)


def _installed_version(name):
    import importlib.metadata

    return importlib.metadata.version(name)


def _install_release(transformers_version, target):
    """Install transformers==`transformers_version` into `target`, then each requirement of what is in `target`
    that neither `target` nor this environment meets, until none is left. Returns this environment's
    site-packages entries (packages, dist-infos) of the distributions installed in `target`: they must not be
    linked beside them (two dist-infos of one package, or the old package shadowing the new one)."""
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    def installed(path=None):
        dists = importlib.metadata.distributions(**({"path": [path]} if path else {}))
        return {canonicalize_name(d.metadata["Name"]): d for d in dists}

    here = installed()
    wanted = [f"transformers=={transformers_version}"]
    for _ in range(10):
        if not wanted:
            break
        # --no-compile: pip would byte-compile all of transformers' ~3,000 modules (about 9 of the 10 seconds an
        # install takes); the few hundred a child imports are compiled when it imports them.
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--no-compile", "--target", target, *wanted]
        proc = subprocess.run(pip, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"could not install {' '.join(wanted)} from PyPI (`pip install --target`):\n"
                               f"{proc.stderr[-2000:]}")
        there = installed(target)
        wanted = []
        for dist in there.values():
            for line in dist.requires or ():
                req = Requirement(line)
                if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                    continue
                name = canonicalize_name(req.name)
                have = there.get(name) or here.get(name)
                if have is None or not req.specifier.contains(have.version, prereleases=True):
                    if name in there:
                        raise RuntimeError(f"{dist.metadata['Name']} needs {req}, but {name} {have.version} was "
                                           "installed for another requirement")
                    wanted.append(str(req))
        wanted = sorted(set(wanted))
    else:
        raise RuntimeError(f"the requirements of transformers=={transformers_version} did not settle: {wanted}")
    replaced = set()
    for name in there:
        if name in here:  # its RECORD lists the dist-info folder's files too
            replaced |= {p.parts[0] for p in here[name].files or ()}
    return replaced


def run_without_package(code, cwd, timeout=600, python=None):
    """Run Python `code` in a fresh interpreter where `hf_mgk` cannot be imported; return its last stdout line
    parsed as JSON. Raises RuntimeError with the child's stderr if it fails.

    python: None runs this interpreter with `import hf_mgk` blocked; `clean_python()` runs a virtualenv that
    does not have the package at all."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("HF_MODULES_CACHE", os.path.join(cwd, ".hf_modules"))
    # The parent's thread count: a matmul split over another number of threads sums in another order.
    threads = f"import sys, torch\ntorch.set_num_threads({torch.get_num_threads()})\n"
    block = _BLOCK_PACKAGE if python is None else ""
    script = block + threads + textwrap.dedent(code) + "\nassert 'hf_mgk' not in sys.modules\n"
    proc = subprocess.run([python or sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the check process failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_remote_code(folder, inputs, auto_class="AutoModel", reference=None, python=None):
    """Load `folder` through `transformers.<auto_class>` with `trust_remote_code=True` in a process without
    hf_mgk (`python`: see `run_without_package`), run it on `inputs` (a dict of tensors), and return its first
    output as a tensor. If `reference` (a tensor) is given, raise AssertionError unless the outputs agree to
    float32 round-off."""
    # `auto_class` is written into the code the child runs: only a name of one of transformers' Auto classes may
    # go there, never arbitrary text (e.g. "AutoModel; import os; ...").
    if not (isinstance(auto_class, str) and re.fullmatch(r"Auto[A-Za-z]+", auto_class)
            and hasattr(transformers, auto_class)):
        raise ValueError(f"auto_class must name one of transformers' Auto classes (e.g. 'AutoModel', "
                         f"'AutoModelForMaskedLM'); got {auto_class!r}")
    folder = os.path.abspath(folder)
    with tempfile.TemporaryDirectory() as work:
        torch.save(inputs, os.path.join(work, "inputs.pt"))
        result = run_without_package(
            f"""
            import json, torch, transformers
            inputs = torch.load("inputs.pt")
            model = transformers.{auto_class}.from_pretrained({folder!r}, trust_remote_code=True, dtype="auto")
            model.eval()
            with torch.no_grad():
                out = model(**inputs)
            first = next(v for v in out.values() if torch.is_tensor(v) and v.dim() > 1)
            torch.save(first, "output.pt")
            print(json.dumps({{"module": type(model).__module__}}))
            """,
            cwd=work,
            python=python,
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


__all__ = ["CHECK_TEXT", "clean_python", "run_without_package", "check_remote_code", "assert_same_outputs"]
