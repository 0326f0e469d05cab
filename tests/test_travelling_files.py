"""The code files that travel with a checkpoint (save_pretrained copies the model's module and every sibling it
imports) must make sense on their own: no references to this repository's SPEC.md or papers/ folder, which do
not travel, nor relative paths into it (notes are named as hf-mgk's docs/...); papers are cited by title, arXiv id
(or venue) and equation."""

import re
from pathlib import Path

import pytest

import hf_mgk
from hf_mgk import (FiSHGPT2Config, FiSHGPT2Model, MGKBertConfig, MGKBertModel, MGKGPT2Config, MGKGPT2Model,
                    NPRFRobertaConfig, NPRFRobertaModel)
import tiny

PACKAGE = Path(hf_mgk.__file__).parent
TRAVELLING = re.compile(r"(configuration_|modeling_|attention_).*\.py|config_checks\.py|transformers_compat\.py")
ENCODER = tiny.roberta()  # MGK-BERT's and NPRF-RoBERTa's


@pytest.fixture(scope="module")
def travelling_files(tmp_path_factory):
    """The .py files save_pretrained writes for each family, checked to be the ones the name pattern covers."""
    copied = set()
    for model in (MGKBertModel(MGKBertConfig(**ENCODER)), NPRFRobertaModel(NPRFRobertaConfig(**ENCODER)),
                  FiSHGPT2Model(FiSHGPT2Config(**tiny.gpt2())), MGKGPT2Model(MGKGPT2Config(**tiny.gpt2()))):
        folder = tmp_path_factory.mktemp(model.config.model_type)
        model.save_pretrained(folder)
        copied |= {p.name for p in folder.glob("*.py")}
        if model.config.model_type == "mgk-gpt2":  # the shared decoder stack and MGK glue travel with it
            assert {"modeling_decoder.py", "modeling_mgk.py", "configuration_mgk.py", "attention_mgk.py",
                    "modeling_mgk_gpt2.py", "configuration_mgk_gpt2.py"} <= {p.name for p in folder.glob("*.py")}
    by_name = {p.name for p in PACKAGE.glob("*.py") if TRAVELLING.fullmatch(p.name)}
    assert copied and copied <= by_name, f"travelling files the pattern misses: {copied - by_name}"
    return sorted(PACKAGE / name for name in by_name)


def test_travelling_files_cite_no_repository_files(travelling_files):
    for path in travelling_files:
        text = path.read_text()
        for word in ("SPEC", "papers/", "../"):  # a relative path means nothing in a checkpoint's folder
            lines = [i + 1 for i, line in enumerate(text.splitlines()) if word in line]
            assert not lines, f"{path.name} mentions {word!r} on lines {lines}"


def test_the_attention_files_cite_their_papers(travelling_files):
    cited = {"attention_mgk.py": "Improving Transformers with Probabilistic Attention Keys",
             "configuration_mgk_bert.py": "arXiv:2110.08678",
             "attention_nprf.py": "arXiv:2106.12566",
             "attention_fish.py": "Improving Transformer with an Admixture of Attention Heads",
             "configuration_fish_gpt2.py": "arXiv:2002.07028",
             "modeling_mgk_gpt2.py": "Improving Transformers with Probabilistic Attention Keys",
             "configuration_mgk_gpt2.py": "arXiv:2110.08678"}
    for path in travelling_files:
        if path.name in cited:
            assert cited[path.name] in path.read_text(), path.name


def test_the_references_stand_apart(travelling_files):
    """hf_mgk/reference/ imports torch, the standard library and its own modules only, and no travelling file
    imports it: a bug in a kernel cannot hide in its reference, and checkpoints do not carry the references."""
    import ast
    import sys

    def imports(path):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                yield from ((0, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                yield node.level, node.module or ""

    own = {p.stem for p in (PACKAGE / "reference").glob("*.py")}
    for path in (PACKAGE / "reference").glob("*.py"):
        for level, module in imports(path):
            if level:
                assert level == 1 and module in own, f"{path.name} imports {'.' * level}{module}"
            else:
                assert module.split(".")[0] == "torch" or module in sys.stdlib_module_names, f"{path.name}: {module}"
    for path in travelling_files:
        assert not any("reference" in module for _, module in imports(path)), path.name


def test_siblings_are_imported_by_name(travelling_files):
    """transformers finds the siblings a checkpoint's code needs by the form `from .name import ...`: a sibling
    imported as `from . import name` is not copied next to the model, and the load fails without hf_mgk."""
    for path in travelling_files:
        lines = [i + 1 for i, line in enumerate(path.read_text().splitlines())
                 if re.match(r"\s*from\s+\.\s+import\b", line)]
        assert not lines, f"{path.name} imports a sibling as `from . import` on lines {lines}"
