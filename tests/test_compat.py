"""Published checkpoints load on the transformers releases users have.

Every family is saved with this package (each attention type with its language-model head, the other Auto classes
with the default type, a tokenizer per family), then loaded with `trust_remote_code=True` in virtualenvs without
hf_mgk and with another transformers release (built once under .compat/ by `hub.clean_python`, from PyPI; the
release this environment has is taken from it, in `hub.clean_python()`'s virtualenv). There
the config must hold the saved fields, refuse a bad value and survive a save/load round trip; a fresh model must
initialise what is deterministic the same; the loaded weights must be the saved ones bit for bit, every output
equal to float32 round-off (logits, hidden states, attention weights, the tuple form), the greedy generations of
the causal LMs the same tokens and the tokenizers the same ids. One child process per release loads every folder.
HF_MGK_COMPAT_VERSIONS="5.5.4,5.15.1" runs other releases instead of the default ones."""

import inspect
import json
import os

import pytest
import torch
import transformers
from transformers import AutoTokenizer

import hf_mgk
from hf_mgk import bundled, hub
from hf_mgk.hub import assert_same_outputs
import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The last v4 release, the first v5 release, one in the middle (5.9: it copies a local folder's files its own way)
# and the newest at the time of writing. Every 5.x minor release was run by hand (docs/publishing.md).
VERSIONS = os.environ.get("HF_MGK_COMPAT_VERSIONS", "4.57.6,5.0.0,5.9.0,5.23.0").split(",")

BERT = tiny.bert(dropout=False)
GPT2 = tiny.gpt2(dropout=False, special_ids=True)
ROBERTA = tiny.roberta(dropout=False, special_ids=True, max_position_embeddings=64, num_random_features=16)
# a rope_scaling type: every release must read the saved rotary settings (transformers_compat.RopeCompat)
LLAMA = tiny.llama(dropout=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                   rope_scaling={"rope_type": "linear", "factor": 2.0})
# A published folder holds the tokenizer too (the card's snippet loads it with AutoTokenizer): one per family.
TOKENIZERS = {"mgk-mgk": bundled.bert_checkpoint_dir, "fish-fish": bundled.gpt2_tokenizer_dir,
              "nprf-nprf": bundled.roberta_tokenizer_dir, "mgkgpt2-mgk": bundled.gpt2_tokenizer_dir,
              "mgkllama-mgk": bundled.gpt2_tokenizer_dir, "fishllama-fish": bundled.gpt2_tokenizer_dir}
TEXT = "The quick brown fox jumps over the lazy dog. Ünïcödé   spaces!"


def _mgk_cases(name, prefix, lm_head, config, fields, lm_auto):
    """An MGK family's folders: every attention type with the LM head (`prefix + lm_head`), the hard E-step and sMGK
    with the EM prior, the base model and the sequence classifier."""
    lm = prefix + lm_head
    cases = [(f"{name}-{kind}", lm, config, dict(fields, attention_type=kind), lm_auto)
             for kind in ("softmax", "mgk", "smgk", "mlk", "smlk")]
    return cases + [
        (f"{name}-hard-em", lm, config, dict(fields, e_step="hard", mgk_prior="em", num_keys=3), lm_auto),
        (f"{name}-smgk-em", lm, config, dict(fields, attention_type="smgk", mgk_prior="em"), lm_auto),
        (f"{name}-base", prefix + "Model", config, fields, "AutoModel"),
        (f"{name}-seqcls", prefix + "ForSequenceClassification", config, dict(fields, num_labels=3),
         "AutoModelForSequenceClassification"),
    ]


def _cases():
    """(name, hf_mgk class name, config class, config fields, Auto class) of every saved folder."""
    mgk, fish, nprf = hf_mgk.MGKBertConfig, hf_mgk.FiSHGPT2Config, hf_mgk.NPRFRobertaConfig
    cases = []
    cases += _mgk_cases("mgk", "MGKBert", "ForMaskedLM", mgk, BERT, "AutoModelForMaskedLM")
    cases += [
        ("mgk-tokcls", "MGKBertForTokenClassification", mgk, dict(BERT, num_labels=5),
         "AutoModelForTokenClassification"),
        ("mgk-qa", "MGKBertForQuestionAnswering", mgk, BERT, "AutoModelForQuestionAnswering"),
    ]
    for kind in ("softmax", "fish", "hard_fish", "gfish", "hard_gfish", "mish"):
        cases.append((f"fish-{kind}", "FiSHGPT2LMHeadModel", fish, dict(GPT2, attention_type=kind),
                      "AutoModelForCausalLM"))
    cases += [
        ("fish-base", "FiSHGPT2Model", fish, GPT2, "AutoModel"),
        ("fish-seqcls", "FiSHGPT2ForSequenceClassification", fish, dict(GPT2, num_labels=3),
         "AutoModelForSequenceClassification"),
    ]
    cases += _mgk_cases("mgkgpt2", "MGKGPT2", "LMHeadModel", hf_mgk.MGKGPT2Config, GPT2, "AutoModelForCausalLM")
    for name, fields in [("softmax", dict(attention_type="softmax")), ("nprf", {}),
                         ("prf-no-rpe", dict(normalize_qk=False, use_rpe=False)),
                         ("no-absolute", dict(use_absolute_positions=False))]:
        cases.append((f"nprf-{name}", "NPRFRobertaForMaskedLM", nprf, dict(ROBERTA, **fields), "AutoModelForMaskedLM"))
    for kind in ("softmax", "nprf"):
        cases.append((f"nprf-causal-{kind}", "NPRFRobertaForCausalLM", nprf,
                      dict(ROBERTA, attention_type=kind, is_decoder=True), "AutoModelForCausalLM"))
    cases += [
        ("nprf-base", "NPRFRobertaModel", nprf, ROBERTA, "AutoModel"),
        ("nprf-seqcls", "NPRFRobertaForSequenceClassification", nprf, dict(ROBERTA, num_labels=3),
         "AutoModelForSequenceClassification"),
        ("nprf-qa", "NPRFRobertaForQuestionAnswering", nprf, ROBERTA, "AutoModelForQuestionAnswering"),
    ]
    cases += _mgk_cases("mgkllama", "MGKLlama", "ForCausalLM", hf_mgk.MGKLlamaConfig, LLAMA, "AutoModelForCausalLM")
    fish_llama = hf_mgk.FiSHLlamaConfig
    for kind in ("softmax", "fish", "hard_fish", "gfish", "hard_gfish", "mish"):
        cases.append((f"fishllama-{kind}", "FiSHLlamaForCausalLM", fish_llama, dict(LLAMA, attention_type=kind),
                      "AutoModelForCausalLM"))
    cases += [
        ("fishllama-base", "FiSHLlamaModel", fish_llama, LLAMA, "AutoModel"),
        ("fishllama-seqcls", "FiSHLlamaForSequenceClassification", fish_llama, dict(LLAMA, num_labels=3),
         "AutoModelForSequenceClassification"),
    ]
    return cases


def _batch(pad_id, left):
    """(3, 10) random ids, the rows padded by 0, 3 and 5 tokens (at the end, or at the start with `left`)."""
    ids = torch.randint(3, 99, (3, 10))
    mask = torch.ones(3, 10, dtype=torch.long)
    for row, pad in enumerate((0, 3, 5)):
        cut = slice(0, pad) if left else slice(10 - pad, 10)
        mask[row, cut], ids[row, cut] = 0, pad_id
    return ids, mask


def _run(model, inputs, generate):
    """Everything compared: outputs of a plain forward, of one with every optional output, the tuple form, the
    weights, and the greedy generation of a left-padded batch."""
    with torch.no_grad():
        plain = model(**inputs["forward"])
        full = model(**inputs["forward"], output_hidden_states=True, output_attentions=True)
        as_tuple = model(**inputs["forward"], return_dict=False)
    out = {f"forward.{k}": v for k, v in plain.items() if torch.is_tensor(v)}
    for key in ("hidden_states", "attentions"):
        for i, t in enumerate(full[key]):
            out[f"{key}.{i}"] = t
    out["tuple.0"] = as_tuple[0]
    out["weights"] = model.state_dict()
    if generate:
        out["generated"] = model.generate(**inputs["generate"], max_new_tokens=6, do_sample=False)
    return out


def _check(case, workdir):
    """In the child (no hf_mgk, another transformers): the config through AutoConfig (its fields, the refusal of a
    bad value, a save/load round trip), a fresh model from it, and the saved model through its Auto class."""
    import os
    import transformers

    folder, name = case["folder"], case["name"]
    config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=True)
    got = {"fields": {k: getattr(config, k) for k in case["fields"]}, "refused": []}
    for make in (lambda: transformers.AutoConfig.from_pretrained(folder, trust_remote_code=True, **case["bad"]),
                 lambda: type(config)(**case["bad"])):
        try:
            make()
        except ValueError as err:
            got["refused"].append(str(err))
    config.save_pretrained(os.path.join(workdir, name + "-config"))
    again = transformers.AutoConfig.from_pretrained(os.path.join(workdir, name + "-config"), trust_remote_code=True)
    skip = {"_name_or_path", "transformers_version"}
    got["round_trip"] = {k: v for k, v in again.to_dict().items() if k not in skip} == {
        k: v for k, v in config.to_dict().items() if k not in skip}

    auto = getattr(transformers, case["auto"])
    inputs = torch.load(case["inputs"])
    fresh = auto.from_config(config, trust_remote_code=True).eval()
    got["fresh"] = {k: v for k, v in fresh.state_dict().items() if k in case["deterministic"]}
    with torch.no_grad():
        got["fresh_finite"] = bool(torch.isfinite(fresh(**inputs["forward"])[0]).all())

    model = auto.from_pretrained(folder, trust_remote_code=True).eval()
    got["class"] = [type(model).__module__, type(model).__name__]
    got["run"] = _run(model, inputs, case["generate"])
    if case["tokens"] is not None:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        got["tokens"] = tokenizer(case["text"])["input_ids"]
    return got


# The child: `_run` and `_check` above, on every folder, with the folders' own code.
_CHILD = """
import json, traceback, torch, transformers
report = {"transformers": transformers.__version__, "errors": {}}
for case in json.load(open("cases.json")):
    try:
        torch.manual_seed(0)
        torch.save(_check(case, "."), case["output"])
    except Exception:
        report["errors"][case["name"]] = traceback.format_exc(limit=-2)
print(json.dumps(report))
"""


def _deterministic(cls, config):
    """Names of the tensors a fresh model initialises the same whatever the seed (zeros, ones, constants, NPRF's
    seeded features): a fresh model on another release must give exactly these."""
    models = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        models.append(cls(config).state_dict())
    return sorted(k for k, v in models[0].items() if torch.equal(v, models[1][k]))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The folders, their inputs and what this package's models give on them."""
    root = tmp_path_factory.mktemp("compat")
    cases, expected = [], {}
    for i, (name, cls_name, config_cls, fields, auto) in enumerate(_cases()):
        cls, config = getattr(hf_mgk, cls_name), config_cls(**fields)
        torch.manual_seed(i)
        model = cls(config).eval()
        folder = root / name
        model.save_pretrained(folder)
        tokens = None
        if name in TOKENIZERS:
            tokenizer = AutoTokenizer.from_pretrained(TOKENIZERS[name]())
            tokenizer.save_pretrained(folder)
            tokens = tokenizer(TEXT)["input_ids"]
        pad = model.config.pad_token_id
        ids, mask = _batch(pad, left=False)
        inputs = {"forward": {"input_ids": ids, "attention_mask": mask}}
        generate = auto == "AutoModelForCausalLM"
        if generate:
            ids, mask = _batch(pad, left=True)
            inputs["generate"] = {"input_ids": ids, "attention_mask": mask, "pad_token_id": pad}
        torch.save(inputs, root / f"{name}.inputs.pt")
        deterministic = _deterministic(cls, config)
        own = inspect.get_annotations(config_cls)  # the family's own fields
        expected[name] = {"fields": {k: getattr(config, k) for k in own}, "run": _run(model, inputs, generate),
                          "fresh": {k: v for k, v in cls(config).state_dict().items() if k in deterministic}}
        cases.append({"name": name, "folder": str(folder), "auto": auto, "class": cls_name, "generate": generate,
                      "inputs": str(root / f"{name}.inputs.pt"), "fields": sorted(own),
                      "deterministic": deterministic, "bad": {"attention_type": "bogus"}, "tokens": tokens,
                      "text": TEXT})
    return cases, expected


def _compare(got, want, case):
    """AssertionError naming the first difference between the child's results and this package's."""
    assert got["class"] == [got["class"][0], case["class"]] and got["class"][0].startswith("transformers_modules"), (
        f"{case['auto']} loaded {got['class']}, not the folder's {case['class']}")
    assert got["fields"] == want["fields"], f"config fields {got['fields']} vs {want['fields']}"
    assert len(got["refused"]) == 2 and all("attention_type" in e for e in got["refused"]), (
        f"attention_type='bogus' not refused by AutoConfig.from_pretrained and the constructor: {got['refused']}")
    assert got["round_trip"], "the config saved and loaded again differs"
    assert got.get("tokens") == case["tokens"], f"the saved tokenizer gives {got.get('tokens')}, not {case['tokens']}"
    assert got["fresh_finite"], "a fresh model from the config gives non-finite outputs"
    for key, tensor in want["fresh"].items():
        assert torch.equal(got["fresh"][key], tensor), f"a fresh model's {key} is initialised differently"
    got, want = got["run"], want["run"]
    assert got.keys() == want.keys(), f"outputs {sorted(got)} vs {sorted(want)}"
    assert got["weights"].keys() == want["weights"].keys(), "weight names differ"
    for key, tensor in want["weights"].items():
        assert torch.equal(got["weights"][key], tensor), f"weight {key} differs from the saved one"
    if "generated" in want:
        assert got["generated"].tolist() == want["generated"].tolist(), "greedy generations differ"
    for key in want:
        if key not in ("weights", "generated"):
            assert_same_outputs(got[key], want[key], key)


@pytest.mark.parametrize("name", ["modeling_mgk_bert", "modeling_fish_gpt2", "modeling_nprf_roberta",
                                  "modeling_mgk_gpt2", "modeling_mgk_llama", "modeling_fish_llama",
                                  "configuration_mgk_bert", "configuration_fish_gpt2", "configuration_nprf_roberta",
                                  "configuration_mgk_gpt2", "configuration_mgk_llama", "configuration_fish_llama"])
def test_each_entry_file_imports_every_sibling_it_needs_itself(name):
    """transformers 5.8 and 5.9 copy, from a local folder, only the siblings an entry file (the one `auto_map`
    names) imports itself, then import them all: a sibling needed only by a sibling would be missing there."""
    from transformers.dynamic_module_utils import get_relative_import_files, get_relative_imports

    path = os.path.join(os.path.dirname(hf_mgk.__file__), f"{name}.py")
    needed = {os.path.basename(f)[:-3] for f in get_relative_import_files(path)}
    assert needed - set(get_relative_imports(path)) == set()


def _release_python(version):
    """The virtualenv without hf_mgk for `version`: the release installed from PyPI under .compat/ (built once), or,
    for the release this environment has, `clean_python()`'s virtualenv of this environment's own transformers (the
    same files; the one the publish and quickstart tests use), which needs no install."""
    if version == transformers.__version__:
        return hub.clean_python()
    return hub.clean_python(version, root=os.path.join(ROOT, ".compat"))


@pytest.mark.slow
@pytest.mark.network  # the virtualenvs install the other transformers releases from PyPI (once)
@pytest.mark.parametrize("version", VERSIONS)
def test_saved_folders_load_with_identical_outputs(saved, version, tmp_path):
    cases, expected = saved
    cases = [dict(c, output=str(tmp_path / f"{c['name']}.out.pt")) for c in cases]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    python = _release_python(version)
    code = "import torch\n" + inspect.getsource(_run) + inspect.getsource(_check) + _CHILD
    report = hub.run_without_package(code, cwd=str(tmp_path), python=python)
    assert report["transformers"] == version
    problems = dict(report["errors"])
    for case in cases:
        if case["name"] not in problems:
            try:
                _compare(torch.load(case["output"]), expected[case["name"]], case)
            except AssertionError as err:
                problems[case["name"]] = str(err)
    assert not problems, f"transformers {version}: " + "\n".join(f"{k}: {v}" for k, v in problems.items())
