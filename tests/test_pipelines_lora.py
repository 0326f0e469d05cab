"""Pipelines and LoRA adapters (peft) on every family, from folders saved for remote code (`hub.save_for_hub`: the
weights, the code files, the full `auto_map`, the tokenizer).

Pipelines: `transformers.pipeline(task, model=folder, trust_remote_code=True)` (fill-mask for the encoders,
text-generation for the decoders, text-classification for every family's sequence classifier) must answer what the
model's logits give by hand: the softmax at the mask, a greedy argmax loop without the cache, the softmax over the
labels. Here hf_mgk is imported, so its registered classes load; in a process without hf_mgk the same pipelines
load the folders' own code (`transformers_modules`) and give the same answers.

LoRA: an adapter on each family's attention projections (docs/usage.md, "LoRA with peft") is trained one step,
saved, and loaded again (`peft.PeftModel.from_pretrained`) on the model loaded from the folder with
`trust_remote_code=True`: the same logits, here and in a process without hf_mgk, and an adapter trained there on
the remote-code classes reloads there too. The family's own small parameters (MGK's prior and sMGK's shifts,
FiSH's mixing matrix and noise scales) stay frozen; modules of their own (gfish's mixing network, NPRF's
relative-position table) can be trained in full with `modules_to_save`. Buffers that training moves (the EM prior,
NPRF's redrawn features) are not in an adapter: merging is the way to keep them."""

import dataclasses
import inspect
import re
import textwrap

import peft
import pytest
import torch
import transformers
from safetensors import safe_open
from transformers import AutoTokenizer

import hf_mgk
from conftest import assert_close, left_padded, roberta_padded_batch
from hf_mgk import bundled
from hf_mgk.hub import assert_same_outputs, run_without_package, save_for_hub
import tiny

TOP_K = 5  # fill-mask candidates compared
NEW_TOKENS = 5  # greedy tokens generated
TEXTS = {"fill-mask": "The quick brown fox {mask} over the lazy dog.", "text-generation": "The quick brown fox jumps",
         "text-classification": "A gripping, beautifully acted film."}
NUM_LABELS = 3
# Larger weights than the default 0.02: logits far enough apart that no top-k or argmax is decided by round-off
# (cross-process sums differ in the last bits, see hub.assert_same_outputs).
PEAKED = dict(initializer_range=0.3)


@dataclasses.dataclass(frozen=True)
class Family:
    lm: str  # hf_mgk class with the LM head
    classifier: str  # hf_mgk sequence classifier
    config: str  # hf_mgk config class
    fields: dict  # tiny config fields; the pipelines' models take the tokenizer's vocabulary
    tokenizer: object  # bundled tokenizer folder (a function)
    task: str  # the LM's pipeline task
    auto: str  # the LM's Auto class


ENCODER = tiny.bert_size(dropout=False, **PEAKED)
DECODER = tiny.gpt2_size(dropout=False, n_positions=tiny.POSITIONS, **PEAKED)
LLAMA = {k: v for k, v in tiny.llama(dropout=False, **PEAKED).items() if k != "vocab_size"}
FAMILIES = {
    "mgk-bert": Family("MGKBertForMaskedLM", "MGKBertForSequenceClassification", "MGKBertConfig",
                       dict(ENCODER, max_position_embeddings=tiny.POSITIONS), bundled.bert_checkpoint_dir,
                       "fill-mask", "AutoModelForMaskedLM"),
    "nprf-roberta": Family("NPRFRobertaForMaskedLM", "NPRFRobertaForSequenceClassification", "NPRFRobertaConfig",
                           dict(ENCODER, max_position_embeddings=tiny.ROBERTA_POSITIONS, num_random_features=16,
                                **tiny.ROBERTA_SPECIAL_IDS), bundled.roberta_tokenizer_dir,
                           "fill-mask", "AutoModelForMaskedLM"),
    "mgk-gpt2": Family("MGKGPT2LMHeadModel", "MGKGPT2ForSequenceClassification", "MGKGPT2Config", DECODER,
                       bundled.gpt2_tokenizer_dir, "text-generation", "AutoModelForCausalLM"),
    "fish-gpt2": Family("FiSHGPT2LMHeadModel", "FiSHGPT2ForSequenceClassification", "FiSHGPT2Config",
                        dict(DECODER, num_global_heads=2), bundled.gpt2_tokenizer_dir, "text-generation",
                        "AutoModelForCausalLM"),
    "mgk-llama": Family("MGKLlamaForCausalLM", "MGKLlamaForSequenceClassification", "MGKLlamaConfig", LLAMA,
                        bundled.gpt2_tokenizer_dir, "text-generation", "AutoModelForCausalLM"),
    "fish-llama": Family("FiSHLlamaForCausalLM", "FiSHLlamaForSequenceClassification", "FiSHLlamaConfig",
                         dict(LLAMA, num_global_heads=2), bundled.gpt2_tokenizer_dir, "text-generation",
                         "AutoModelForCausalLM"),
}


# ------------------------------------------------------------------------------------------------------ pipelines


def pipeline_answers(task, folder, text, top_k, new_tokens):
    """What `transformers.pipeline(task, model=folder, trust_remote_code=True)` answers on `text`, as plain lists
    (fill-mask: the top_k token ids and scores; text-generation: the greedy ids and text; text-classification:
    every label's score), and the module and name of the model class it loaded. Also run in a child process
    without hf_mgk (its source is sent there): imports nothing from this repository."""
    import transformers

    pipe = transformers.pipeline(task, model=folder, trust_remote_code=True)
    if task == "fill-mask":
        out = pipe(text, top_k=top_k)
        answer = {"ids": [o["token"] for o in out], "scores": [o["score"] for o in out]}
    elif task == "text-generation":
        kw = dict(max_new_tokens=new_tokens, do_sample=False)
        answer = {"ids": pipe(text, return_tensors=True, **kw)[0]["generated_token_ids"],
                  "text": pipe(text, **kw)[0]["generated_text"]}
    else:
        answer = {"scores": {o["label"]: o["score"] for o in pipe(text, top_k=None)}}
    return {"module": type(pipe.model).__module__, "class": type(pipe.model).__name__, "answer": answer}


def answers_by_hand(model, tokenizer, task, text):
    """What the pipeline must answer, from the model's logits: the softmax at the mask position (its top TOP_K),
    NEW_TOKENS steps of argmax over a full forward without the cache, the softmax over the labels."""
    model.eval()
    with torch.no_grad():
        if task == "text-generation":
            ids = tokenizer(text, return_tensors="pt")["input_ids"]
            for _ in range(NEW_TOKENS):
                ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            return {"ids": ids[0].tolist(), "text": tokenizer.decode(ids[0])}
        inputs = tokenizer(text, return_tensors="pt")
        logits = model(**inputs).logits[0]
    if task == "fill-mask":
        (position,) = (inputs["input_ids"][0] == tokenizer.mask_token_id).nonzero()[:, 0].tolist()
        top = logits[position].softmax(-1).topk(TOP_K)
        return {"ids": top.indices.tolist(), "scores": top.values.tolist()}
    return {"scores": {model.config.id2label[i]: p for i, p in enumerate(logits.softmax(-1).tolist())}}


def assert_same_answers(got, expected, what):
    assert set(got) == set(expected), what
    for key, value in expected.items():
        if key == "scores" and isinstance(value, dict):  # text-classification: label -> score
            assert set(got[key]) == set(value), what
            assert_close(torch.tensor([got[key][label] for label in value]), torch.tensor(list(value.values())),
                         rtol=1e-5, atol=0, msg=what)
        elif key == "scores":
            assert_close(torch.tensor(got[key]), torch.tensor(value), rtol=1e-5, atol=0, msg=what)
        else:  # token ids, text
            assert got[key] == value, f"{what}: {key} {got[key]!r} != {value!r}"


@pytest.fixture(scope="module")
def pipeline_folders(tmp_path_factory):
    """(family, kind) -> (folder, task, text, the hf_mgk model saved there, its answers by hand), kind "lm" (the
    family's LM task) or "classifier" (text-classification): a tiny model with the family's bundled tokenizer in a
    folder written by save_for_hub."""
    torch.manual_seed(0)
    work = tmp_path_factory.mktemp("pipelines")
    folders, tokenizers = {}, {}
    for name, family in FAMILIES.items():
        path = family.tokenizer()
        if path not in tokenizers:  # GPT-2's serves both decoders
            tokenizers[path] = AutoTokenizer.from_pretrained(path)
        tokenizer = tokenizers[path]
        config_cls = getattr(hf_mgk, family.config)
        for kind, class_name, task, extra in [("lm", family.lm, family.task, {}),
                                              ("classifier", family.classifier, "text-classification",
                                               dict(num_labels=NUM_LABELS))]:
            model = getattr(hf_mgk, class_name)(config_cls(**family.fields, vocab_size=len(tokenizer), **extra))
            folder = work / f"{name}-{kind}"
            save_for_hub(model.eval(), folder, tokenizer=tokenizer)
            text = TEXTS[task].format(mask=tokenizer.mask_token)
            folders[name, kind] = (str(folder), task, text, model, answers_by_hand(model, tokenizer, task, text))
    return folders


CASES = [pytest.param(name, kind, id=f"{name}-{kind}") for name in FAMILIES for kind in ("lm", "classifier")]


@pytest.mark.parametrize("name,kind", CASES)
def test_pipeline_from_the_saved_folder_answers_what_the_logits_give(pipeline_folders, name, kind):
    """Fill-mask / text-generation / text-classification through `pipeline(task, model=folder,
    trust_remote_code=True)` with hf_mgk imported (its registered class loads): the answers by hand, to float32
    round-off (generation: the cached generate against argmax over full forwards)."""
    folder, task, text, model, expected = pipeline_folders[name, kind]
    got = pipeline_answers(task, folder, text, TOP_K, NEW_TOKENS)
    assert got["class"] == type(model).__name__ and got["module"] == type(model).__module__
    assert_same_answers(got["answer"], expected, f"{name} {task}")
    if task == "text-generation":
        assert len(got["answer"]["ids"]) == len(expected["ids"]) and got["answer"]["text"].startswith(text)


@pytest.mark.slow
def test_pipelines_load_the_folders_own_code_without_hf_mgk(pipeline_folders, tmp_path):
    """Every folder's pipeline in one child process where hf_mgk cannot be imported: the model class comes from
    the folder's code (transformers_modules) and the answers are those of the hf_mgk model."""
    jobs = {f"{name}|{kind}": [folder, task, text] for (name, kind), (folder, task, text, _, _) in
            pipeline_folders.items()}
    code = inspect.getsource(pipeline_answers) + textwrap.dedent(f"""
        import json
        jobs = {jobs!r}
        print(json.dumps({{key: pipeline_answers(task, folder, text, {TOP_K}, {NEW_TOKENS})
                          for key, (folder, task, text) in jobs.items()}}))
        """)
    got = run_without_package(code, cwd=str(tmp_path))
    assert set(got) == set(jobs)
    for key, result in got.items():
        folder, task, text, model, expected = pipeline_folders[tuple(key.split("|"))]
        assert result["module"].startswith("transformers_modules") and result["class"] == type(model).__name__, key
        assert_same_answers(result["answer"], expected, key)


# ----------------------------------------------------------------------------------------------------------- LoRA


LR = 1e-2


def lora_round_trip(auto_class, folder, lora, batch, adapter_dir, rank=4, lr=LR):
    """Load `folder` through transformers.<auto_class> with trust_remote_code=True, put a LoRA adapter on it
    (`lora`: LoraConfig arguments), train it one AdamW step on `batch` (with labels), save it to `adapter_dir`, and
    load it again on a fresh load of the folder with peft.PeftModel.from_pretrained.

    Returns (numbers, trained, reloaded): numbers holds the loaded class's module and name, the logits of the base
    model, of the adapter before and after the step and of the reloaded adapter (eval mode), the losses before and
    after, and how far the step moved each trainable tensor (its largest change: about `lr` where a gradient
    reached it, Adam's first step). Also run in a child process without hf_mgk (its source is sent there):
    imports nothing from this repository."""
    import peft
    import torch
    import transformers

    auto = getattr(transformers, auto_class)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    base = auto.from_pretrained(folder, trust_remote_code=True).eval()
    numbers = {"module": type(base).__module__, "class": type(base).__name__}
    with torch.no_grad():
        numbers["base"] = base(**inputs).logits
    trained = peft.get_peft_model(base, peft.LoraConfig(r=rank, lora_alpha=2 * rank, **lora)).eval()
    with torch.no_grad():
        numbers["untrained"] = trained(**inputs).logits
        numbers["loss_before"] = trained(**batch).loss
    start = {n: p.detach().clone() for n, p in trained.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    trained.train()
    trained(**batch).loss.backward()
    optimizer.step()
    trained.eval()
    with torch.no_grad():
        numbers["trained"] = trained(**inputs).logits
        numbers["loss_after"] = trained(**batch).loss
    numbers["moved"] = {n: (p.detach() - start[n]).abs().max().item()
                        for n, p in trained.named_parameters() if n in start}
    trained.save_pretrained(adapter_dir)
    reloaded = peft.PeftModel.from_pretrained(auto.from_pretrained(folder, trust_remote_code=True), adapter_dir).eval()
    with torch.no_grad():
        numbers["reloaded"] = reloaded(**inputs).logits
    return numbers, trained, reloaded


def mgk_keys(num_keys):
    """MGK's key projections: the first key and option A's extra keys (M - 1 of them)."""
    return ["key"] + [f"extra_keys.{r}" for r in range(num_keys - 1)]


@dataclasses.dataclass(frozen=True)
class LoraCase:
    family: str
    fields: dict  # config fields beside the family's tiny ones
    lora: dict  # LoraConfig arguments, as docs/usage.md gives them
    adapted: str  # regex of the module names that must carry LoRA (every attention projection)
    saved: tuple = ()  # modules trained in full (modules_to_save)
    frozen: tuple = ()  # the family's own parameters, left frozen


TINY = {"mgk-bert": tiny.bert(dropout=False), "mgk-gpt2": tiny.gpt2(dropout=False, special_ids=True),
        "fish-gpt2": tiny.gpt2(dropout=False, special_ids=True, num_global_heads=2),
        "nprf-roberta": tiny.roberta(dropout=False, special_ids=True, num_random_features=16),
        "mgk-llama": tiny.llama(dropout=False, pad_token_id=0),
        "fish-llama": tiny.llama(dropout=False, pad_token_id=0, num_global_heads=2)}
NUM_KEYS = 3  # two extra key projections: a target list that names only the first misses one
LORA_CASES = {
    "mgk-bert": LoraCase("mgk-bert", dict(num_keys=NUM_KEYS),
                         dict(target_modules=["query", *mgk_keys(NUM_KEYS), "value", "attention.output.dense"]),
                         r"bert\.encoder\.layer\.\d\.attention\.(self\.(query|key|value|extra_keys\.\d)|output\.dense)",
                         frozen=("prior_logits",)),
    "mgk-bert-smgk": LoraCase("mgk-bert", dict(attention_type="smgk"),
                              dict(target_modules=["query", "key", "value", "attention.output.dense"]),
                              r"bert\.encoder\.layer\.\d\.attention\.(self\.(query|key|value)|output\.dense)",
                              frozen=("prior_logits", "key_shift")),
    "mgk-gpt2": LoraCase("mgk-gpt2", dict(num_keys=NUM_KEYS),
                         dict(target_modules=["c_attn", *mgk_keys(NUM_KEYS)[1:], "attn.c_proj"], fan_in_fan_out=True),
                         r"transformer\.h\.\d\.attn\.(c_attn|c_proj|extra_keys\.\d)", frozen=("prior_logits",)),
    "mgk-gpt2-smgk": LoraCase("mgk-gpt2", dict(attention_type="smgk"),
                              dict(target_modules=["c_attn", "attn.c_proj"], fan_in_fan_out=True),
                              r"transformer\.h\.\d\.attn\.(c_attn|c_proj)", frozen=("prior_logits", "key_shift")),
    "fish-gpt2": LoraCase("fish-gpt2", {}, dict(target_modules=["c_attn", "attn.c_proj"], fan_in_fan_out=True),
                          r"transformer\.h\.\d\.attn\.(c_attn|c_proj)", frozen=("mixing", "noise_std")),
    "fish-gpt2-gfish": LoraCase("fish-gpt2", dict(attention_type="gfish"),
                                dict(target_modules=["c_attn", "attn.c_proj"], modules_to_save=["mixing"],
                                     fan_in_fan_out=True),
                                r"transformer\.h\.\d\.attn\.(c_attn|c_proj)", saved=("mixing",), frozen=("noise_std",)),
    # Llama's names: q_proj, k_proj, v_proj, o_proj (MGK's extra keys beside k_proj)
    "mgk-llama": LoraCase("mgk-llama", dict(num_keys=NUM_KEYS),
                          dict(target_modules=["q_proj", "k_proj", *mgk_keys(NUM_KEYS)[1:], "v_proj", "o_proj"]),
                          r"model\.layers\.\d\.self_attn\.(q_proj|k_proj|v_proj|o_proj|extra_keys\.\d)",
                          frozen=("prior_logits",)),
    "fish-llama": LoraCase("fish-llama", {}, dict(target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
                           r"model\.layers\.\d\.self_attn\.(q_proj|k_proj|v_proj|o_proj)",
                           frozen=("mixing", "noise_std")),
    "nprf-roberta": LoraCase("nprf-roberta", {},
                             dict(target_modules=["query", "key", "value", "attention.output.dense"],
                                  modules_to_save=["relative_position"]),
                             r"roberta\.encoder\.layer\.\d\.attention\.(self\.(query|key|value)|output\.dense)",
                             saved=("relative_position",)),
}
def lora_model(case, **fields):
    """A tiny LM of the case's family (vocabulary 99, no dropout) and a batch with labels (padded rows, -100 at
    the padding) for it."""
    config = getattr(hf_mgk, FAMILIES[case.family].config)(**TINY[case.family], **case.fields, **fields)
    model = getattr(hf_mgk, FAMILIES[case.family].lm)(config).eval()
    if FAMILIES[case.family].task == "fill-mask":
        ids, mask = roberta_padded_batch(b=2, n=10, pad_from=6)
    else:
        ids, mask = left_padded(b=2, n=10, pad=(0, 3))
    return model, {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def saved_lora_case(case, folder, **fields):
    model, batch = lora_model(case, **fields)
    with torch.no_grad():  # a relative-position bias that matters (a fresh model's starts at zero)
        for name, param in model.named_parameters():
            if "relative_position" in name:
                param.normal_()
    save_for_hub(model, folder)
    return model, batch


def learning(moved):
    """How far the first step moved each adapted module (its lora_B: lora_A gets no gradient while lora_B is zero)
    and each module to save (its largest change: a bias can get next to no gradient)."""
    modules = {}
    for name, value in moved.items():
        if ".lora_A." not in name:
            module = re.split(r"\.(?:lora_B|modules_to_save)\.", name)[0]
            modules[module] = max(modules.get(module, 0.0), value)
    return modules


def lora_names(trained):
    return {name for name, module in trained.named_modules() if isinstance(module, peft.tuners.lora.LoraLayer)}


@pytest.mark.parametrize("case_name", sorted(LORA_CASES))
def test_lora_adapter_trained_one_step_reloads_on_the_saved_folder(case_name, tmp_path):
    """Train, save, reload: the adapter sits on every attention projection (MGK's extra keys included) and nowhere
    else; it and the modules to save train, the family's own parameters stay frozen; an untrained adapter changes
    nothing; one step reaches every adapted module and module to save, lowers the loss and changes the logits; the
    adapter file holds exactly the trained tensors; the adapter reloaded on a fresh load of the folder gives the
    trained logits (and greedy generation), and the base's with the adapter disabled."""
    case = LORA_CASES[case_name]
    model, batch = saved_lora_case(case, tmp_path / "base")
    family = FAMILIES[case.family]
    numbers, trained, reloaded = lora_round_trip(family.auto, str(tmp_path / "base"), case.lora, batch,
                                                 str(tmp_path / "adapter"))
    assert numbers["class"] == family.lm

    prefix = "base_model.model."
    adapted = {name[len(prefix):] for name in lora_names(trained)}
    projections = {name for name, _ in model.named_modules() if re.fullmatch(case.adapted, name)}
    assert adapted == projections and projections, (sorted(adapted), sorted(projections))
    trainable = set(numbers["moved"])
    for name in trainable:
        assert re.search(r"\.lora_[AB]\.default\.weight$", name) or ".modules_to_save.default." in name, name
    for owner in case.saved:
        assert any(f".{owner}.modules_to_save.default." in name for name in trainable), owner
    for own in case.frozen:  # the family's own parameters: present, not trained, not in the adapter
        frozen = [p for n, p in trained.named_parameters() if n.endswith("." + own)]
        assert frozen and not any(p.requires_grad for p in frozen), own

    assert_close(numbers["untrained"], numbers["base"], rtol=0, atol=1e-6, msg="an untrained adapter is a no-op")
    stuck = {name: moved for name, moved in learning(numbers["moved"]).items() if moved < LR / 2}
    assert not stuck, f"no gradient reached {sorted(stuck)}"
    assert numbers["loss_after"] < numbers["loss_before"]
    assert (numbers["trained"] - numbers["base"]).abs().max() > 1e-3, "the adapter changes nothing"

    with safe_open(tmp_path / "adapter" / "adapter_model.safetensors", "pt") as f:
        stored = set(f.keys())
    # stored under the names without the adapter's: a module to save under its own module's name
    assert stored == {name.replace(".modules_to_save.default.", ".").replace(".default.", ".")
                      for name in trainable}, sorted(stored)

    assert_close(numbers["reloaded"], numbers["trained"], rtol=1e-6, atol=1e-6, msg="reloaded adapter")
    with reloaded.disable_adapter(), torch.no_grad():
        assert_close(reloaded(**{k: v for k, v in batch.items() if k != "labels"}).logits, numbers["base"],
                     rtol=1e-6, atol=1e-6, msg="the base under the reloaded adapter")
    if family.task == "text-generation":
        prompt = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
        assert torch.equal(reloaded.generate(**prompt, **kw), trained.generate(**prompt, **kw))


@pytest.mark.parametrize("case_name,fields,buffer", [
    pytest.param("mgk-bert", dict(mgk_prior="em"), "prior", id="mgk-em-prior"),
    pytest.param("nprf-roberta", dict(feature_redraw_interval=1), "features", id="nprf-redrawn-features"),
])
def test_buffers_moved_by_training_are_not_in_the_adapter_but_survive_a_merge(case_name, fields, buffer, tmp_path):
    """MGK's EM prior (an M-step every training forward) and NPRF's redrawn random features are buffers: LoRA
    training moves them, an adapter does not hold them, so the adapter reloaded on the saved folder runs with the
    folder's values (other logits). `merge_and_unload()` then `save_pretrained` keeps them: that folder loads with
    the trained logits."""
    case = LORA_CASES[case_name]
    # peaked weights: with the default ones every key scores alike, and the prior hardly matters
    _, batch = saved_lora_case(case, tmp_path / "base", **fields, **PEAKED)
    numbers, trained, reloaded = lora_round_trip(FAMILIES[case.family].auto, str(tmp_path / "base"), case.lora,
                                                 batch, str(tmp_path / "adapter"))
    moved = [b for n, b in trained.named_buffers() if n.endswith("." + buffer)]
    kept = [b for n, b in reloaded.named_buffers() if n.endswith("." + buffer)]
    assert moved and len(moved) == len(kept)
    assert any(not torch.equal(a, b) for a, b in zip(moved, kept)), f"training did not move {buffer}"
    assert (numbers["reloaded"] - numbers["trained"]).abs().max() > 1e-4, "the adapter carried the buffer?"

    merged = trained.merge_and_unload()
    assert type(merged).__name__ == FAMILIES[case.family].lm
    merged.save_pretrained(tmp_path / "merged")
    again = getattr(transformers, FAMILIES[case.family].auto).from_pretrained(tmp_path / "merged",
                                                                              trust_remote_code=True).eval()
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        assert_close(again(**inputs).logits, numbers["trained"], rtol=1e-5, atol=1e-6, msg="merged folder")


@pytest.mark.slow
def test_lora_adapters_reload_on_the_remote_code_models_without_hf_mgk(tmp_path):
    """In one child process without hf_mgk, for every case: an adapter trained here loads on the folder's own code
    (transformers_modules) with the logits it had here, and the whole round trip run there on the remote-code
    classes (train one step, save, reload) gives the trained logits again."""
    jobs, expected = {}, {}
    cases = LORA_CASES
    for name, case in cases.items():
        model, batch = saved_lora_case(case, tmp_path / name / "base")
        numbers, _, _ = lora_round_trip(FAMILIES[case.family].auto, str(tmp_path / name / "base"), case.lora,
                                        batch, str(tmp_path / name / "adapter"))
        torch.save(batch, tmp_path / name / "batch.pt")
        expected[name] = numbers["trained"]
        jobs[name] = FAMILIES[case.family].auto
    code = f"LR = {LR!r}\n" + inspect.getsource(lora_round_trip) + textwrap.dedent(f"""
        import json, os, peft, torch, transformers
        lora = {({name: case.lora for name, case in cases.items()})!r}
        result, logits = {{}}, {{}}
        for name, auto_class in {jobs!r}.items():
            batch = torch.load(os.path.join(name, "batch.pt"))
            inputs = {{k: v for k, v in batch.items() if k != "labels"}}
            base = getattr(transformers, auto_class).from_pretrained(os.path.join(name, "base"), trust_remote_code=True)
            theirs = peft.PeftModel.from_pretrained(base, os.path.join(name, "adapter")).eval()
            numbers, _, _ = lora_round_trip(auto_class, os.path.join(name, "base"), lora[name], batch,
                                            os.path.join(name, "adapter-there"))
            with torch.no_grad():
                logits[name] = {{"parents_adapter": theirs(**inputs).logits, "trained": numbers["trained"],
                                "reloaded": numbers["reloaded"], "base": numbers["base"]}}
            result[name] = {{"module": numbers["module"], "class": numbers["class"],
                            "loss": [numbers["loss_before"].item(), numbers["loss_after"].item()],
                            "moved": numbers["moved"]}}
        torch.save(logits, "logits.pt")
        print(json.dumps(result))
        """)
    got = run_without_package(code, cwd=str(tmp_path))
    logits = torch.load(tmp_path / "logits.pt")
    assert set(got) == set(cases)
    for name, result in got.items():
        assert result["module"].startswith("transformers_modules"), name
        assert result["class"] == FAMILIES[LORA_CASES[name].family].lm, name
        assert_same_outputs(logits[name]["parents_adapter"], expected[name], f"{name}: this adapter there")
        assert min(learning(result["moved"]).values()) >= LR / 2 and result["loss"][1] < result["loss"][0], name
        assert (logits[name]["trained"] - logits[name]["base"]).abs().max() > 1e-3, name
        assert_close(logits[name]["reloaded"], logits[name]["trained"], rtol=1e-6, atol=1e-6,
                     msg=f"{name}: an adapter trained on the remote-code model, reloaded there")
