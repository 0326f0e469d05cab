"""The commands and code of README.md and docs/**/*.md work as written after `scripts/setup.sh`.

Fenced ```bash / ```sh / ```shell blocks: every script and `python -m` module a command runs, and every repository
path it names, exists; every `--flag` given to one of this package's scripts or `python -m hf_mgk...` modules is
one its `--help` lists. A command or comment that uses the Hub (`--dataset_name`, `--push_to_hub`, a stock
checkpoint's Hub name, GLUE by `--task_name` alone) says "needs the Hub" on its line or in the comment lines right
above it.

Fenced ```python blocks: a page's blocks run in order, as a reader would run them, in one namespace and a fresh
folder, offline (HF_HUB_OFFLINE=1), except the blocks with a `# needs the Hub` comment, which are only compiled; a
block that names a stock checkpoint on the Hub must carry that marker (or run offline anyway).

Also: every flag of `scripts/quickstart.py --help` is in docs/scripts.md's list of them ("All of them" says the
README), and docs/maintainers.md's table of the files a checkpoint carries is what `save_pretrained` writes.

What needs torch and transformers (the scripts' `--help`, the Python blocks, the saved folders) runs in one child
process, so that their import is paid once."""

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
SHELLS = ("bash", "sh", "shell")
MARKER = "needs the hub"  # compared in lower case
MARKER_LINE = re.compile(r"^\s*#.*needs the hub", re.I | re.M)  # a Python block's marker: a comment line
# Stock checkpoints the docs name by their Hub name; none of them ships offline (only the MiniLM BERT does).
HUB_NAMES = ("bert-base-uncased", "gpt2", "roberta-base")
HUB_NAME_LITERAL = re.compile(r"""["'](%s)["']""" % "|".join(map(re.escape, HUB_NAMES)))
REPO_DIRS = ("scripts/", "src/", "tests/", "docs/", ".ci/")
FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
# reproduce.py hands the flags it does not know to the training scripts' TrainingArguments (parse_known_args).
PASSTHROUGH = {"scripts/reproduce.py": "transformers.TrainingArguments"}


def rel(path):
    return path.relative_to(ROOT).as_posix()


@dataclass
class Block:
    page: str
    line: int  # of the opening fence
    text: str

    def __str__(self):
        return f"{self.page}:{self.line}"


def blocks(langs):
    found = []
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(1) in langs:
                found.append(Block(rel(path), text.count("\n", 0, m.start()) + 1, m.group(2)))
    return found


SHELL_BLOCKS = blocks(SHELLS)
PYTHON_BLOCKS = blocks(("python",))


# ---------------------------------------------------------------------------------------------- shell commands

@dataclass
class Command:
    where: str
    words: list  # one simple command (pipelines and && lists split apart)
    context: str  # its logical line and the comment lines right above it: where a marker counts


def _split_lists(words):
    """A command line's words -> its simple commands (split at &&, ||, ;, |)."""
    out, current = [], []
    for w in words:
        if w in ("&&", "||", ";", "|"):
            out.append(current)
            current = []
        else:
            current.append(w)
    return [c for c in out + [current] if c]


def parse_shell(block):
    """(commands, comment lines) of a shell block. `$(...)` substitutions are commands of their own."""
    commands, comments, above = [], [], []
    lines = block.text.split("\n")
    i = 0
    while i < len(lines):
        start = i
        line = lines[i]
        while line.endswith("\\") and i + 1 < len(lines):  # continuation lines make one logical line
            i += 1
            line = line[:-1] + " " + lines[i]
        i += 1
        where = f"{block.page}:{block.line + start + 1}"
        if not line.strip():
            above = []
            continue
        if line.lstrip().startswith("#"):
            comments.append((where, line, "\n".join(above)))
            above.append(line)
            continue
        context = "\n".join(above + [line])
        above = []
        inner = re.findall(r"\$\(([^()]*)\)", line)
        outer = re.sub(r"\$\(([^()]*)\)", "SUBSTITUTED", line)
        for text in [outer, *inner]:
            for words in _split_lists(shlex.split(text, comments=True)):
                commands.append(Command(where, words, context))
    return commands, comments


def target(words):
    """(kind, name, args) of what a command runs: ("script", path, args) or ("module", name, args); None for
    other programs. Launchers (torchrun, accelerate launch) run the first .py word."""
    while words and re.fullmatch(r"[A-Za-z_]\w*=\S*", words[0]):  # VAR=value prefixes
        words = words[1:]
    if not words:
        return None
    program = words[0]
    if program in ("bash", "sh") and len(words) > 1:
        return "script", words[1], words[2:]
    if re.fullmatch(r"python[\d.]*", Path(program).name):
        if len(words) > 2 and words[1] == "-m":
            return "module", words[2], words[3:]
        if len(words) > 1 and not words[1].startswith("-"):
            return "script", words[1], words[2:]
        return None
    for i, w in enumerate(words):
        if w.endswith(".py"):
            return "script", w, words[i + 1:]
    return None


def is_ours(kind, name):
    return name.startswith(REPO_DIRS) if kind == "script" else name == "hf_mgk" or name.startswith("hf_mgk.")


def needs_hub(words):
    """Whether these words (a command's, or a comment's) use the Hub."""
    if any(w in ("--dataset_name", "--push_to_hub") for w in words):
        return True
    if any(a in ("--model_name_or_path", "--tokenizer_name", "--config_name") and b in HUB_NAMES
           for a, b in zip(words, words[1:])):
        return True
    return "--task_name" in words and "--train_file" not in words  # run_glue reads GLUE from the Hub


def flags_of(words):
    return [w.split("=")[0] for w in words if w.startswith("--") and w != "--"]


ALL_COMMANDS = {str(b): parse_shell(b) for b in SHELL_BLOCKS}
# This package's scripts (that exist: a missing one is reported by the test) and modules, for their --help.
TARGETS = sorted({(t[0], t[1]) for cmds, _ in ALL_COMMANDS.values() for c in cmds
                  if (t := target(c.words)) and is_ours(t[0], t[1]) and not t[1].endswith(".sh")
                  and (t[0] == "module" or (ROOT / t[1]).is_file())})


# ------------------------------------------------------------------------------------- the child process's work

CHILD = textwrap.dedent(r'''
    import contextlib, io, json, os, runpy, sys, traceback
    job = json.load(sys.stdin)
    out = {"blocks": {}, "help": {}, "carried": {}}

    # Each page's Python blocks, in order, in one namespace and a fresh folder: as a reader runs them.
    for page, codes in job["pages"].items():
        folder = os.path.join(job["tmp"], page.replace("/", "__"))
        os.makedirs(folder)
        os.chdir(folder)
        namespace = {"__name__": "__main__"}
        results = out["blocks"][page] = []
        for where, code in codes:
            try:
                exec(compile(code, where, "exec"), namespace)
                results.append(None)
            except BaseException:
                results.append(traceback.format_exc(limit=-4))
    os.chdir(job["root"])

    # The code files save_pretrained puts in a folder, per family (tiny models: only the class matters).
    from hf_mgk.families import FAMILIES
    tiny = {"bert": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=32),
            "gpt2": dict(n_embd=32, n_layer=1, n_head=4)}
    tiny["roberta"] = tiny["bert"]
    tiny["llama"] = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=32)
    for family in FAMILIES.values():
        folder = os.path.join(job["tmp"], "carried", family.name)
        family.auto_map["AutoModel"](family.config_class(**tiny[family.stock])).save_pretrained(folder)
        out["carried"][family.title] = sorted(f for f in os.listdir(folder) if f.endswith(".py"))

    # --help of every script and module the docs run (SystemExit ends each), and the passthrough parsers.
    for kind, name in job["help"]:
        text, argv, path = io.StringIO(), sys.argv, list(sys.path)
        try:
            with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
                sys.argv = [name, "--help"]
                if kind == "script":
                    sys.path.insert(0, os.path.dirname(os.path.abspath(name)))
                    runpy.run_path(name, run_name="__main__")
                else:
                    runpy.run_module(name, run_name="__main__", alter_sys=True)
        except SystemExit:
            pass
        except Exception:
            text = None  # no such module, or it fails before its parser
        finally:
            sys.argv, sys.path[:] = argv, path
        out["help"][name] = text if text is None else text.getvalue()
    for name in job["classes"]:
        import importlib
        from transformers import HfArgumentParser
        module, cls = name.rsplit(".", 1)
        out["help"][name] = HfArgumentParser(getattr(importlib.import_module(module), cls)).format_help()

    with open(job["result"], "w") as f:
        json.dump(out, f)
''')


@pytest.fixture(scope="session")
def child(tmp_path_factory):
    """Runs CHILD once: {"help": {script or module: its --help text}, "ran": {"page:line": None or the error of
    a Python block}, "carried": {family title: the .py files save_pretrained writes}}."""
    tmp = tmp_path_factory.mktemp("docs")
    pages = {}
    for b in PYTHON_BLOCKS:
        if not MARKER_LINE.search(b.text):
            pages.setdefault(b.page, []).append((str(b), b.text))
    job = {"root": str(ROOT), "tmp": str(tmp), "result": str(tmp / "result.json"), "pages": pages,
           "help": TARGETS, "classes": sorted(set(PASSTHROUGH.values()))}
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    done = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(job), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp / "result.json").read_text())
    # Python blocks' results by "page:line" (None: it ran), the ones not run (the Hub's) absent.
    result["ran"] = {where: error for page, codes in pages.items()
                     for (where, _), error in zip(codes, result["blocks"][page])}
    return result


def known_flags(child, name):
    """The flags `name --help` shows (None: no such module, or it failed before its parser)."""
    text = child["help"][name]
    if text is None:
        return None
    flags = set(FLAG.findall(text))
    if name in PASSTHROUGH:
        flags |= set(FLAG.findall(child["help"][PASSTHROUGH[name]]))
    return flags


# ----------------------------------------------------------------------------------------------------- the tests

def test_the_docs_have_commands_and_code():
    # The extraction itself: a change of fence style must not leave the tests below checking nothing.
    assert len(SHELL_BLOCKS) >= 10 and len(PYTHON_BLOCKS) >= 10
    assert ("script", "scripts/quickstart.py") in TARGETS and ("module", "hf_mgk") in TARGETS


# Launchers: the words of a command naming one, and the arguments that print its options.
LAUNCHERS = {("torchrun",): ["--help"], ("accelerate", "launch"): ["launch", "--help"]}


def launcher_of(words):
    """(launcher words, its own flags: those before the script) of a launch command, else None."""
    words = [w for w in words if not re.fullmatch(r"[A-Za-z_]\w*=\S*", w)]  # VAR=value prefixes
    if not words:
        return None
    program = (Path(words[0]).name, *words[1:])
    for launcher in LAUNCHERS:
        if program[:len(launcher)] == launcher:
            script = next((i for i, w in enumerate(words) if w.endswith(".py")), len(words))
            return launcher, flags_of(words[len(launcher):script])
    return None


@pytest.fixture(scope="session")
def launcher_flags():
    """{launcher words: the flags its --help lists}, from the virtualenv's own launchers."""
    bin_dir = Path(sys.executable).parent
    flags = {}
    for launcher, help_args in LAUNCHERS.items():
        done = subprocess.run([str(bin_dir / launcher[0]), *help_args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        flags[launcher] = set(FLAG.findall(done.stdout))
    return flags


def test_launch_lines_use_real_launcher_flags(launcher_flags):
    problems, checked = [], 0
    for commands, _ in ALL_COMMANDS.values():
        for c in commands:
            launch = launcher_of(c.words)
            if launch is None:
                continue
            launcher, flags = launch
            checked += 1
            if not c.words[0].startswith(".venv/bin/"):
                problems.append(f"{c.where}: run the virtualenv's {' '.join(launcher)} (.venv/bin/{launcher[0]})")
            problems += [f"{c.where}: {' '.join(launcher)} has no {f}" for f in flags
                         if f not in launcher_flags[launcher]]
    assert checked >= 8, "the launch lines of docs/scripts.md were not found"
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=str)
def test_shell_commands_name_real_scripts_modules_paths_and_flags(block, child):
    commands, comments = ALL_COMMANDS[str(block)]
    problems, block_flags = [], set()
    for c in commands:
        for w in c.words:  # repository paths, wherever they appear
            if w.startswith(REPO_DIRS) and not (ROOT / w).exists():
                problems.append(f"{c.where}: no file {w}")
        t = target(c.words)
        if t is None:
            continue
        kind, name, args = t
        if kind == "script" and not (ROOT / name).is_file():
            problems.append(f"{c.where}: no script {name}")
            continue
        if not is_ours(kind, name):  # another package's module (pytest): it must exist, its flags are its own
            if kind == "module" and importlib.util.find_spec(name.split(".")[0]) is None:
                problems.append(f"{c.where}: no module {name}")
            continue
        if name.endswith(".sh"):  # no parser: a flag must at least be in the script
            source = (ROOT / name).read_text()
            problems += [f"{c.where}: {name} has no {f}" for f in flags_of(args) if f not in source]
            continue
        known = known_flags(child, name)
        if known is None:
            problems.append(f"{c.where}: `{name} --help` fails")
            continue
        block_flags |= known
        problems += [f"{c.where}: {name} has no {f}" for f in flags_of(args) if f not in known]
        if name == "hf_mgk" and args and not re.search(rf"^\s+{re.escape(args[0])}\s", child["help"][name], re.M):
            problems.append(f"{c.where}: python -m hf_mgk has no command {args[0]}")  # its usage lists them
    for c in commands:
        if needs_hub(c.words) and MARKER not in c.context.lower():
            problems.append(f"{c.where}: uses the Hub without saying it needs the Hub: {' '.join(c.words)}")
    for where, line, above in comments:
        words = line.replace("(", " ").replace(")", " ").replace(",", " ").split()
        # Flags in comments (the real-data variants of a command) belong to the block's scripts.
        if block_flags:
            problems += [f"{where}: no script of the block has {f}" for f in flags_of(words)
                         if f not in block_flags]
        if needs_hub(words) and MARKER not in (above + line).lower():
            problems.append(f"{where}: uses the Hub without saying it needs the Hub: {line.strip()}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=str)
def test_python_blocks_run_offline_or_say_they_need_the_hub(block, child):
    compile(block.text, str(block), "exec")
    for path in re.findall(r"""["']((?:%s)[^"']*)["']""" % "|".join(map(re.escape, REPO_DIRS)), block.text):
        assert (ROOT / path).exists(), f"{block}: no file {path}"
    if MARKER_LINE.search(block.text):
        return  # needs the Hub: compiled, not run
    error = child["ran"][str(block)]
    assert error is None, f"{block} failed offline" + (
        " (it names a Hub checkpoint: mark it `# needs the Hub`)" if HUB_NAME_LITERAL.search(block.text) else "") \
        + f":\n{error}"


def _section(path, heading):
    text = (ROOT / path).read_text(encoding="utf-8")
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def test_every_quickstart_flag_is_in_the_docs_list(child):
    # The README points to docs/scripts.md for "All of them": its section must list every option of --help.
    text = child["help"]["scripts/quickstart.py"]
    options = set(FLAG.findall(text[text.index("\noptions:"):])) - {"--help"}
    section = _section("docs/scripts.md", "## The main job")
    listed = set(re.findall(r"`(--[\w-]+)", section))
    assert options and not options - listed, f"undocumented in docs/scripts.md: {sorted(options - listed)}"
    assert not listed - options - {"--help"}, f"not options of quickstart.py: {sorted(listed - options)}"


def test_the_files_a_checkpoint_carries_are_the_maintainers_table(child):
    rows = {}
    for line in _section("docs/maintainers.md", "## The files a checkpoint carries").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("family", "---"):
            rows[cells[0]] = cells[1:]
    shared = set(re.findall(r"`([\w.]+\.py)`", next(iter(rows.values()))[1]))
    table = {family: set(re.findall(r"`([\w.]+\.py)`", own)) | shared for family, (own, _) in rows.items()}
    saved = {family: set(files) for family, files in child["carried"].items()}
    assert table.keys() == saved.keys()
    wrong = {family: {"not in the table": sorted(saved[family] - files), "not saved": sorted(files - saved[family])}
             for family, files in table.items() if files != saved[family]}
    assert not wrong, wrong
