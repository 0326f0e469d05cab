"""Imports run one way: `import hf_mgk` registers the families and loads the models, never the publishing,
training, reproduction or script code (which import hf_mgk themselves)."""

import subprocess
import sys

import pytest


def test_importing_the_package_loads_no_tooling():
    code = ("import sys, hf_mgk; tooling = sorted(m for m in sys.modules if m.split('.')[:2] in "
            "(['hf_mgk', 'hub'], ['hf_mgk', 'training'], ['hf_mgk', 'reproduce'], ['hf_mgk', 'bundled'], ['hf_mgk', 'scripts'], ['hf_mgk', 'benchmark'])); "
            "print(tooling)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_publishing_modules_each_have_one_job():
    from hf_mgk import hub
    from hf_mgk.hub import card, export, remote_code, upload

    assert hub.model_card is card.model_card and hub.export_run is export.export_run
    assert hub.push_folder is upload.push_folder and hub.check_remote_code is remote_code.check_remote_code
    # the card is a function of the numbers: it reads no run folder and writes nothing (export does both)
    assert not {"shutil", "tempfile", "json"} & set(card.__dict__) and "read_run" not in card.__dict__


def _public_definitions(module):
    """The names a module defines at top level (functions, classes, assigned constants), not the ones it imports."""
    import ast
    import inspect

    names = []
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return {n for n in names if not n.startswith("_") and n not in ("logger", "__all__")}


@pytest.mark.parametrize("package", ["hf_mgk.hub", "hf_mgk.training", "hf_mgk.reproduce"])
def test_each_package_exports_exactly_what_its_modules_define(package):
    """The packages gather their modules' `__all__`; each `__all__` lists every public name its module defines and
    nothing else, so a new function is exported (or made private) on purpose, and the lists cannot drift."""
    import importlib
    import pkgutil

    pkg = importlib.import_module(package)
    modules = [importlib.import_module(f"{package}.{m.name}") for m in pkgutil.iter_modules(pkg.__path__)]
    gathered = []
    for module in modules:
        assert set(module.__all__) == _public_definitions(module), module.__name__
        gathered += module.__all__
        for name in module.__all__:
            assert getattr(pkg, name) is getattr(module, name), (package, name)
    assert len(gathered) == len(set(gathered)), "two modules export one name"
    assert sorted(pkg.__all__) == sorted(gathered)


def _python(code):
    """What a fresh interpreter running `code` prints (it must exit 0)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def test_the_tooling_resolves_after_import_hf_mgk_alone():
    """`import hf_mgk` then `hf_mgk.flops.fish_cost(...)`, as the docs write it: the tooling loads on first use."""
    code = ("import hf_mgk\n"
            "assert callable(hf_mgk.flops.fish_cost) and callable(hf_mgk.hub.save_for_hub)\n"
            "assert callable(hf_mgk.metrics.load_metric) and callable(hf_mgk.reference.mgk_attention_reference)\n"
            "assert hf_mgk.analysis.__name__ == 'hf_mgk.analysis' and 'flops' in dir(hf_mgk)\n"
            "try:\n    hf_mgk.no_such_thing\nexcept AttributeError as e:\n    print(e)\n")
    assert _python(code) == "module 'hf_mgk' has no attribute 'no_such_thing'"


def test_every_name_the_docs_give_resolves():
    """Each `hf_mgk.a.b` that README.md, docs/ and the model cards name resolves after `import hf_mgk` alone:
    attributes by attribute access, a module path (`python -m hf_mgk.benchmark.tune`) at least by import."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1]
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md")),
             *sorted((root / "src" / "hf_mgk" / "model_cards").glob("*.md"))]
    names = set()
    for page in pages:
        # a name followed by * or … is a pattern ("hf_mgk.MGKBert*"), not a name
        names |= set(re.findall(r"\bhf_mgk(?:\.[A-Za-z_]\w*)+(?![\w*…<{])", page.read_text(encoding="utf-8")))
    assert "hf_mgk.flops.fish_cost" in names and len(names) > 20
    code = ("import importlib, sys, hf_mgk\nbad = []\n"
            f"for name in {sorted(names)!r}:\n"
            "    obj, parts = hf_mgk, name.split('.')[1:]\n"
            "    for i, part in enumerate(parts):\n"
            "        try:\n            obj = getattr(obj, part)\n"
            "        except AttributeError:\n"
            "            try:\n                obj = importlib.import_module('.'.join(['hf_mgk', *parts[:i + 1]]))\n"
            "            except ImportError:\n                bad.append(name)\n                break\n"
            "print(bad)\n")
    assert _python(code) == "[]"


def _imports_of(path, module):
    """The hf_mgk modules that the source of `module` (at `path`) imports anywhere in it, functions included:
    `from ..training import x` names hf_mgk.training, `from .card import y` hf_mgk.hub.card, `from . import card`
    hf_mgk.hub.card. The parent packages Python imports first are not edges of the module's own."""
    import ast

    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            found |= {(a.name, a.name) for a in node.names if a.name.startswith("hf_mgk")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.startswith("hf_mgk"):
                # `from . import card`: the module hf_mgk.hub.card where there is one, else a name of the package
                found |= {(f"{target}.{a.name}", target) for a in node.names}
    return found


def test_the_import_graph_has_no_circle():
    """No hf_mgk module imports, directly or through others, a module that imports it back (function-level imports
    count: a circle held apart by a late import still ties two packages together). `hub` reads a training run's
    record; `training` knows nothing of `hub`."""
    import pathlib

    import hf_mgk

    root = pathlib.Path(hf_mgk.__file__).parent
    graph = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[module] = _imports_of(str(path), module)
    graph = {m: {name if name in graph else package for name, package in targets} for m, targets in graph.items()}
    graph = {m: {t for t in targets if t in graph and t != m} for m, targets in graph.items()}
    assert graph["hf_mgk.hub.upload"] >= {"hf_mgk.hub.export"}  # the walk sees what it should

    state, circles = {}, []

    def visit(module, stack):
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                circles.append(stack[stack.index(target):] + [module, target] if target in stack
                               else [module, target])
            elif target not in state:
                visit(target, stack + [module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert not circles, circles
