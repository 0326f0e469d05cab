"""scripts/run_mlm.py and scripts/run_clm.py end to end on Shakespeare with tiny models: metrics against an
independent recomputation, the data shapes, resume / refusals, and torchrun against one process."""

import hashlib
import json
import math
import os
import pathlib

import datasets
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import (AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertForMaskedLM,
                          GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM)

import hf_mgk
from hf_mgk import bundled, training
from hf_mgk.scripts import run_clm, run_mlm
from conftest import assert_kept, plant, run_torchrun, write_play_split
import tiny

pytestmark = pytest.mark.slow  # the scripts end to end (and torchrun)

ROOT = pathlib.Path(__file__).resolve().parents[1]



TINY = {  # --config_overrides text (the vocabulary is the tokenizer's)
    "mgk-bert": tiny.overrides(tiny.bert_size(max_position_embeddings=tiny.POSITIONS)),
    "nprf-roberta": tiny.overrides(tiny.bert_size(max_position_embeddings=tiny.ROBERTA_POSITIONS,
                                                  num_random_features=16)),
    "fish-gpt2": tiny.overrides(tiny.gpt2_size(n_inner=37, n_positions=tiny.POSITIONS, num_global_heads=2)),
    "mgk-gpt2": tiny.overrides(tiny.gpt2_size(n_inner=37, n_positions=tiny.POSITIONS, num_keys=2)),
    "mgk-llama": tiny.overrides({k: v for k, v in tiny.llama().items() if k not in ("vocab_size", "rope_parameters")}),
    "fish-llama": tiny.overrides({k: v for k, v in tiny.llama().items() if k not in ("vocab_size", "rope_parameters")}),
}
GPT2_FAMILIES = ("fish-gpt2", "mgk-gpt2", "mgk-llama", "fish-llama")  # (the Llama families too: GPT-2's tokenizer)
NO_DROPOUT = {"mgk-bert": "hidden_dropout_prob=0,attention_probs_dropout_prob=0",
              "fish-gpt2": "attention_type=hard_fish,resid_pdrop=0,embd_pdrop=0,attn_pdrop=0"}


# ---------------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("run_lm")


@pytest.fixture(scope="module")
def texts(work):
    """train.txt / valid.txt: 400 and 100 lines of a play (blank lines and stage directions included)."""
    return write_play_split(work, (200, 600), (600, 700))


@pytest.fixture(scope="module")
def gpt2_dir():
    return bundled.gpt2_tokenizer_dir()


@pytest.fixture(scope="module")
def roberta_dir():
    """GPT-2's BPE laid out as RoBERTa's vocabulary (<s> 0, <pad> 1, </s> 2, <unk> 3, then the BPE, <mask>)."""
    return bundled.roberta_tokenizer_dir()


@pytest.fixture(scope="module")
def bert_dir():
    return bundled.bert_checkpoint_dir()


def save_tiny_stock_gpt2(folder):
    """A tiny stock GPT2LMHeadModel (4 heads of 8, seed 0) with the bundled GPT-2 tokenizer, saved in `folder`."""
    tokenizer = AutoTokenizer.from_pretrained(bundled.gpt2_tokenizer_dir())
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(**tiny.gpt2(vocab_size=len(tokenizer), n_inner=37))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def stock_gpt2_dir(work):
    return save_tiny_stock_gpt2(work / "stock-gpt2")


@pytest.fixture(scope="module")
def stock_llama_dir(work):
    """A tiny stock LlamaForCausalLM (4 query heads and 2 key/value heads of 16, seed 0) with GPT-2's tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(bundled.gpt2_tokenizer_dir())
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**tiny.llama(vocab_size=len(tokenizer)))).save_pretrained(work / "stock-llama")
    tokenizer.save_pretrained(work / "stock-llama")
    return str(work / "stock-llama")


@pytest.fixture(scope="module")
def stock_bert_dir(work, bert_dir):
    """A tiny stock BertForMaskedLM (MLM head included) with the bundled bert-base-uncased tokenizer."""
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(**tiny.bert_size(max_position_embeddings=tiny.POSITIONS)))
    model.save_pretrained(work / "stock-bert")
    AutoTokenizer.from_pretrained(bert_dir).save_pretrained(work / "stock-bert")
    return str(work / "stock-bert")


def common(texts, out, work, *extra, steps=2):
    """The arguments every run shares (CPU, tiny batches, one evaluation batch, the datasets cache in tmp)."""
    return ["--train_file", texts["train"], "--validation_file", texts["validation"], "--output_dir", str(out),
            "--cache_dir", str(work / "cache"), "--use_cpu", "--report_to", "none", "--max_steps", str(steps),
            "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "128", "--logging_steps", "1",
            "--save_strategy", "no", "--seed", "0", *extra]


def new_model(family, tokenizer, *overrides):
    return ["--model_type", family, "--tokenizer_name", tokenizer,
            "--config_overrides", ",".join([TINY[family], *overrides])]


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def losses(folder):
    return [h["loss"] for h in read_json(os.path.join(folder, "trainer_state.json"))["log_history"] if "loss" in h]


def snapshot(folder):
    return {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in pathlib.Path(folder).rglob("*") if p.is_file()}


# ------------------------------------------------------------------------ independent recomputation

def tokenized_lines(path, tokenizer, **kwargs):
    """Each line as datasets' text loader gives it (line breaks kept), tokenized on its own."""
    with open(path, encoding="utf-8") as f:
        return [tokenizer(line, **kwargs) for line in f.readlines()]


def blocks_of(encodings, size, keys=("input_ids",)):
    """The encodings concatenated and cut into blocks of `size`, remainder dropped."""
    joined = {k: [t for e in encodings for t in e[k]] for k in keys}
    n = len(joined["input_ids"]) // size * size
    return [{k: v[i:i + size] for k, v in joined.items()} for i in range(0, n, size)]


def mlm_reference(model, tokenizer, examples, seed=0):
    """Loss and accuracy over the masked tokens of one batch, masked as the script's evaluation masks them."""
    collator = run_mlm.ExampleSeededMasking(tokenizer=tokenizer, mlm_probability=0.15, mask_seed=seed)
    batch = collator(examples)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    scored = batch["labels"] != -100
    loss = F.cross_entropy(logits[scored].double(), batch["labels"][scored])
    accuracy = (logits[scored].argmax(-1) == batch["labels"][scored]).double().mean()
    return loss.item(), accuracy.item(), int(scored.sum())


def check_eval_file(out, results):
    saved = read_json(os.path.join(out, "eval_results.json"))
    assert saved["perplexity"] == pytest.approx(math.exp(saved["eval_loss"]), rel=1e-12)
    for key in ("eval_loss", "eval_accuracy", "perplexity", "eval_samples"):
        assert saved[key] == results[key]
    return saved


# ---------------------------------------------------------------------------------------------- run_clm

def check_clm_metrics(out, results, texts):
    """eval_loss, perplexity and next-token accuracy of a run_clm.py run against its saved model run on blocks of
    32 cut here; returns the model."""
    saved = check_eval_file(out, results)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    blocks = torch.tensor([b["input_ids"] for b in blocks_of(tokenized_lines(texts["validation"], tokenizer), 32)])
    with torch.no_grad():
        logits = model(input_ids=blocks).logits[:, :-1].double()
    targets = blocks[:, 1:]
    assert saved["eval_samples"] == len(blocks)
    assert saved["eval_loss"] == pytest.approx(F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                               targets.reshape(-1)).item(), rel=1e-5)
    assert saved["eval_accuracy"] == pytest.approx((logits.argmax(-1) == targets).double().mean().item(), abs=1e-12)
    return model


@pytest.mark.parametrize("family", ["fish-gpt2", "mgk-gpt2", "nprf-roberta", "mgk-llama", "fish-llama"])
def test_clm_perplexity_and_accuracy_recomputed(family, texts, work, gpt2_dir, roberta_dir, tmp_path):
    """FiSH-GPT2 (arguments from a .json file), MGK-GPT2 and NPRF-RoBERTa as a decoder, from scratch: train 2
    steps, then eval_loss, perplexity and next-token accuracy against the saved model run on blocks cut here."""
    tokenizer_dir = gpt2_dir if family in GPT2_FAMILIES else roberta_dir
    out = tmp_path / "out"
    argv = [*new_model(family, tokenizer_dir), *common(texts, out, work), "--do_train", "--do_eval",
            "--block_size", "32"]
    if family == "fish-gpt2":  # the same run from a .json file of the arguments, typed as JSON
        options = {}
        for i, arg in enumerate(argv):
            if arg.startswith("--"):
                value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else "true"
                try:
                    options[arg[2:]] = json.loads(value)
                except json.JSONDecodeError:
                    options[arg[2:]] = value
        (tmp_path / "args.json").write_text(json.dumps(options))
        argv = [str(tmp_path / "args.json")]
    results = run_clm.main(argv)
    model = check_clm_metrics(out, results, texts)
    assert read_json(out / "trainer_state.json")["global_step"] == 2
    assert model.config.model_type == family
    assert getattr(model.config, "is_decoder", False) == (family == "nprf-roberta")
    run = read_json(out / training.RUN_FILE)
    assert (run["task"], run["family"], run["dataset"], run["base_model"]) == (
        "text-generation", family, "train.txt, valid.txt", None)


@pytest.mark.parametrize("options, attention, heads", [
    (["--attention_overrides", "attention_type=mgk,n_head=2"], "mgk", 2),  # the family from the attention type
    (["--family", "mgk-gpt2", "--attention_overrides", "attention_type=smgk"], "smgk", 4),
    (["--family", "mgk-gpt2"], "mgk", 4),  # the family's default attention
])
def test_clm_warm_starts_mgk_gpt2_from_a_stock_gpt2(options, attention, heads, texts, work, stock_gpt2_dir, tmp_path):
    """A stock GPT-2 warm-starts MGK-GPT2 (with --family, or from an MGK attention_type): the saved model is an
    MGK-GPT2 with the kept heads, two Adam steps away from GPT-2's weights, and its metrics are recomputed."""
    out = tmp_path / "out"
    results = run_clm.main(["--model_name_or_path", stock_gpt2_dir, *options, *common(texts, out, work),
                            "--do_train", "--do_eval", "--block_size", "32"])
    model = check_clm_metrics(out, results, texts)
    config = model.config
    assert (config.model_type, config.attention_type, config.n_head, config.attention_head_size) == (
        "mgk-gpt2", attention, heads, 8)  # the checkpoint's head size, whatever the number of heads kept
    stock = load_file(os.path.join(stock_gpt2_dir, "model.safetensors"))
    start, trained = stock["transformer.wte.weight"], model.transformer.wte.weight.detach()
    assert (trained - start).abs().max() < 1e-3 < start.abs().max()  # two Adam steps of 5e-5 from GPT-2's table
    stock_query = stock["transformer.h.0.attn.c_attn.weight"][:, :8 * heads]  # the first heads' query columns
    kept_query = model.transformer.h[0].attn.c_attn.weight.detach()[:, :8 * heads]
    assert (kept_query - stock_query).abs().max() < 1e-3 < stock_query.abs().max()
    run = read_json(out / training.RUN_FILE)
    assert (run["task"], run["family"]) == ("text-generation", "mgk-gpt2")


@pytest.mark.parametrize("options, family, attention", [
    (["--attention_overrides", "attention_type=hard_fish,num_global_heads=2"], "fish-llama", "hard_fish"),
    (["--family", "mgk-llama"], "mgk-llama", "mgk"),  # the family's default attention
    ([], "mgk-llama", "mgk"),  # a stock Llama warm-starts its first registered family by default
])
def test_clm_warm_starts_the_llama_families_from_a_stock_llama(options, family, attention, texts, work,
                                                                stock_llama_dir, tmp_path):
    """A stock Llama checkpoint converts on --model_name_or_path: the saved model is the family's, two Adam steps
    away from the checkpoint's weights, and its metrics are recomputed."""
    out = tmp_path / "out"
    results = run_clm.main(["--model_name_or_path", stock_llama_dir, *options, *common(texts, out, work),
                            "--do_train", "--do_eval", "--block_size", "32"])
    model = check_clm_metrics(out, results, texts)
    assert (model.config.model_type, model.config.attention_type) == (family, attention)
    stock = load_file(os.path.join(stock_llama_dir, "model.safetensors"))
    start, trained = stock["model.embed_tokens.weight"], model.model.embed_tokens.weight.detach()
    assert (trained - start).abs().max() < 1e-3 < start.abs().max()  # two Adam steps of 5e-5 from the checkpoint's
    run = read_json(out / training.RUN_FILE)
    assert (run["task"], run["family"]) == ("text-generation", family)


def _family(*argv):
    model_args, _, _ = training.parse_args(run_clm.DataTrainingArguments, [
        *argv, "--validation_file", __file__, "--output_dir", "unused"])
    return training.family_of(model_args)


def test_which_family_a_checkpoint_starts(stock_gpt2_dir, stock_bert_dir, tmp_path):
    """A stock GPT-2 warm-starts FiSH-GPT2 or MGK-GPT2: --family, else the only family of the attention type,
    else FiSH-GPT2 (as before MGK-GPT2 existed); an hf-mgk folder is its own family."""
    gpt2 = ["--model_name_or_path", stock_gpt2_dir]
    assert _family(*gpt2) == "fish-gpt2"
    for kind in ("mgk", "smgk", "mlk", "smlk"):
        assert _family(*gpt2, "--attention_overrides", f"attention_type={kind},num_keys=3") == "mgk-gpt2"
    for kind in ("fish", "hard_fish", "gfish", "hard_gfish", "mish"):
        assert _family(*gpt2, "--attention_overrides", f"attention_type={kind}") == "fish-gpt2"
    assert _family(*gpt2, "--attention_overrides", "attention_type=softmax") == "fish-gpt2"
    assert _family(*gpt2, "--family", "mgk-gpt2", "--attention_overrides", "attention_type=softmax") == "mgk-gpt2"
    assert _family(*gpt2, "--family", "fish-gpt2") == "fish-gpt2"
    assert _family("--model_name_or_path", stock_bert_dir, "--attention_overrides", "attention_type=mgk") == "mgk-bert"
    assert _family("--model_type", "mgk-gpt2", "--tokenizer_name", stock_gpt2_dir) == "mgk-gpt2"
    saved = tmp_path / "mgk-gpt2"
    hf_mgk.MGKGPT2Config(**tiny.gpt2_size()).save_pretrained(saved)
    assert _family("--model_name_or_path", str(saved)) == "mgk-gpt2"
    assert _family("--model_name_or_path", str(saved), "--family", "mgk-gpt2") == "mgk-gpt2"
    assert _family("--model_name_or_path", str(saved), "--attention_overrides", "attention_type=softmax") == "mgk-gpt2"


@pytest.mark.parametrize("argv, message", [
    (["--model_name_or_path", "GPT2", "--family", "mgk-bert"],
     r"--family mgk-bert cannot warm-start from a stock 'gpt2' checkpoint \(.*stock-gpt2\); a 'gpt2' checkpoint "
     "warm-starts fish-gpt2 or mgk-gpt2"),
    (["--model_name_or_path", "BERT", "--family", "mgk-gpt2"],
     "--family mgk-gpt2 cannot warm-start from a stock 'bert' checkpoint .* warm-starts mgk-bert$"),
    (["--model_name_or_path", "SAVED", "--tokenizer_name", "GPT2", "--family", "fish-gpt2"],
     "--family fish-gpt2 contradicts .*saved-mgk-gpt2, a saved mgk-gpt2 model"),
    (["--model_name_or_path", "GPT2", "--family", "fish-gpt2", "--attention_overrides", "attention_type=mgk"],
     "attention_type"),  # FiSH-GPT2's config refuses an MGK type
    (["--model_name_or_path", "GPT2", "--model_type", "mgk-gpt2"],
     r"--model_type mgk-gpt2 does not match the checkpoint, which gives fish-gpt2 \(--family mgk-gpt2 chooses it "
     r"for a stock 'gpt2' checkpoint\)"),
])
def test_contradictory_family_is_an_error(argv, message, texts, work, stock_gpt2_dir, stock_bert_dir, tmp_path):
    saved = tmp_path / "saved-mgk-gpt2"
    hf_mgk.MGKGPT2Config(**tiny.gpt2_size()).save_pretrained(saved)
    paths = {"GPT2": stock_gpt2_dir, "BERT": stock_bert_dir, "SAVED": str(saved)}
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=message):
        run_clm.main([paths.get(a, a) for a in argv] + common(texts, out, work) + ["--do_train"])
    assert not out.exists()


def test_family_needs_a_checkpoint(texts, gpt2_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_clm.main(["--model_type", "mgk-gpt2", "--tokenizer_name", gpt2_dir, "--family", "mgk-gpt2",
                      "--train_file", texts["train"], "--do_train", "--output_dir", str(tmp_path / "out")])
    assert "--family goes only with --model_name_or_path" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_clm_text_shorter_than_a_block(texts, work, gpt2_dir, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("To be, or not to be:\nthat is the question.\n", encoding="utf-8")
    n_tokens = sum(len(e["input_ids"]) for e in tokenized_lines(short, AutoTokenizer.from_pretrained(gpt2_dir)))
    out = tmp_path / "out"
    argv = [*new_model("fish-gpt2", gpt2_dir), *common(texts, out, work), "--do_train", "--block_size", "64"]
    argv[argv.index("--train_file") + 1] = str(short)
    with pytest.raises(ValueError, match=f"--train_file {short} has {n_tokens} tokens, not enough for one block of 64 "
                                         r"tokens \(--block_size 64\)"):
        run_clm.main(argv)
    assert not out.exists()


@pytest.mark.parametrize("script, family, option, limit, why", [
    ("mlm", "mgk-bert", "--max_seq_length", 64, r"max_position_embeddings=64\)"),
    # The bundled BERT tokenizer pads with 0, which a new NPRF-RoBERTa takes: positions start at 1.
    ("mlm", "nprf-roberta", "--max_seq_length", 65, "max_position_embeddings=66 minus RoBERTa's padding offset 1"),
    ("clm", "fish-gpt2", "--block_size", 64, r"n_positions=64\)"),
])
def test_too_long_for_the_model(script, family, option, limit, why, texts, work, bert_dir, gpt2_dir, tmp_path):
    tokenizer_dir = gpt2_dir if family == "fish-gpt2" else bert_dir
    main = run_mlm.main if script == "mlm" else run_clm.main
    out = tmp_path / "out"
    argv = [*new_model(family, tokenizer_dir), *common(texts, out, work), "--do_train", option, str(limit + 1)]
    with pytest.raises(ValueError, match=f"{option} {limit + 1} is longer than the model's positions allow: at most "
                                         f"{limit} \\({why}"):
        main(argv)
    assert not out.exists()
    argv[-1] = str(limit)  # the limit itself is accepted
    main(argv)
    assert read_json(out / "trainer_state.json")["global_step"] == 2


def test_sequence_length_defaults_and_no_position_table(bert_dir):
    tokenizer = AutoTokenizer.from_pretrained(bert_dir)  # model_max_length 512
    short = hf_mgk.MGKBertConfig(max_position_embeddings=128)
    assert training.sequence_length(None, "--max_seq_length", tokenizer, short) == 128
    assert training.sequence_length(None, "--max_seq_length", tokenizer, hf_mgk.MGKBertConfig()) == 512
    free = hf_mgk.NPRFRobertaConfig(use_absolute_positions=False, max_position_embeddings=66)
    assert training.position_limit(free)[0] is None
    assert training.sequence_length(4096, "--max_seq_length", tokenizer, free) == 4096
    gpt2 = hf_mgk.FiSHGPT2Config(n_positions=2048)
    tokenizer.model_max_length = 10 ** 30  # a tokenizer built from files has no limit: 1024 is the cap
    assert training.sequence_length(None, "--block_size", tokenizer, gpt2) == 1024


# ---------------------------------------------------------------------------------------------- run_mlm

def test_masks_do_not_depend_on_the_batch(bert_dir):
    """Each example's masks come from (seed, epoch, its tokens): the same alone, in any batch, under either
    padding side; new each epoch; fixed for evaluation; never on special tokens or padding; upstream's rates."""
    tokenizer = AutoTokenizer.from_pretrained(bert_dir)
    with open(bundled.shakespeare_files()[1], encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if line.strip()][:800]
    examples = [tokenizer(line, return_special_tokens_mask=True) for line in lines]

    def masked_rows(collator, batch_size, tok=tokenizer):
        collator.tokenizer = tok
        rows = []
        for i in range(0, len(examples), batch_size):
            part = examples[i:i + batch_size]
            batch = collator([dict(e) for e in part])
            for row, e in enumerate(part):
                n = len(e["input_ids"])
                cols = slice(0, n) if tok.padding_side == "right" else slice(batch["input_ids"].shape[1] - n, None)
                rows.append((batch["input_ids"][row, cols].tolist(), batch["labels"][row, cols].tolist()))
                assert (batch["labels"][row][batch["attention_mask"][row] == 0] == -100).all()
        return rows

    collator = run_mlm.ExampleSeededMasking(tokenizer=tokenizer, mlm_probability=0.15, mask_seed=7, epoch=0)
    reference = masked_rows(collator, len(examples))
    assert masked_rows(collator, 1) == reference
    assert masked_rows(collator, 3) == reference
    left = AutoTokenizer.from_pretrained(bert_dir, padding_side="left")
    assert masked_rows(collator, 5, left) == reference
    collator.epoch = 1
    assert masked_rows(collator, 8) != reference
    collator.epoch = None
    assert masked_rows(collator, 8) == masked_rows(collator, 3)

    mask_id = tokenizer.mask_token_id
    n_tokens = n_masked = n_mask_token = n_kept = 0
    for e, (ids, labels) in zip(examples, reference):
        for original, special_flag, new, label in zip(e["input_ids"], e["special_tokens_mask"], ids, labels):
            n_tokens += not special_flag
            if label == -100:
                assert new == original
                continue
            assert not special_flag and label == original
            n_masked += 1
            n_mask_token += new == mask_id
            n_kept += new == original
    assert n_tokens > 5000
    assert n_masked / n_tokens == pytest.approx(0.15, abs=0.02)
    assert n_mask_token / n_masked == pytest.approx(0.8, abs=0.05)
    assert n_kept / n_masked == pytest.approx(0.1, abs=0.04)


def test_a_run_reads_the_checkpoint_config_once(texts, work, stock_bert_dir, tmp_path, monkeypatch):
    """The model factory's plan reads --model_name_or_path's config.json once; the family, the config checks, the
    card's base model and the model all come from that plan."""
    from hf_mgk.training import models

    calls = []
    original = models.checkpoint_config
    monkeypatch.setattr(models, "checkpoint_config", lambda args: calls.append(1) or original(args))
    run_mlm.main(["--model_name_or_path", stock_bert_dir, "--attention_overrides", "attention_type=mgk",
                  *common(texts, tmp_path / "out", work, steps=1), "--do_train", "--max_seq_length", "32"])
    assert len(calls) == 1
    assert read_json(tmp_path / "out" / training.RUN_FILE)["family"] == "mgk-bert"


def test_mlm_warm_start_with_softmax_is_stock_bert(texts, work, stock_bert_dir, tmp_path):
    """A stock BERT warm-started with softmax attention, evaluated only: the eval loss and masked-token accuracy
    are those of transformers' own BertForMaskedLM on blocks cut here, masked as the script masks them."""
    out = tmp_path / "out"
    results = run_mlm.main(["--model_name_or_path", stock_bert_dir, "--attention_overrides", "attention_type=softmax",
                            *common(texts, out, work), "--do_eval", "--max_seq_length", "32"])
    saved = check_eval_file(out, results)
    tokenizer = AutoTokenizer.from_pretrained(stock_bert_dir)
    examples = blocks_of(tokenized_lines(texts["validation"], tokenizer, return_special_tokens_mask=True), 32,
                         keys=("input_ids", "special_tokens_mask"))
    loss, accuracy, n_masked = mlm_reference(BertForMaskedLM.from_pretrained(stock_bert_dir).eval(), tokenizer,
                                             examples)
    assert n_masked > 50
    assert saved["eval_samples"] == len(examples)
    assert saved["eval_loss"] == pytest.approx(loss, rel=1e-5)
    assert saved["eval_accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert not (out / training.RUN_FILE).exists()  # evaluation only: no training run recorded


@pytest.mark.parametrize("family, line_by_line", [("mgk-bert", False), ("nprf-roberta", True)])
def test_mlm_from_scratch_metrics_recomputed(family, line_by_line, texts, work, bert_dir, tmp_path):
    """Train 2 steps from scratch, then eval_loss / perplexity / accuracy against the saved model on examples built
    here: blocks of 32 (MGK-BERT), or the non-empty lines padded in one batch (NPRF-RoBERTa, --line_by_line)."""
    out = tmp_path / "out"
    length = 16 if line_by_line else 32
    extra = ["--line_by_line"] if line_by_line else []
    results = run_mlm.main([*new_model(family, bert_dir), *common(texts, out, work), "--do_train", "--do_eval",
                            "--max_seq_length", str(length), *extra])
    saved = check_eval_file(out, results)
    model = AutoModelForMaskedLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert (model.config.model_type, model.config.is_decoder) == (family, False)
    assert model.config.pad_token_id == tokenizer.pad_token_id == 0  # NPRF's default 1 replaced by the tokenizer's
    if line_by_line:
        with open(texts["validation"], encoding="utf-8") as f:
            examples = [tokenizer(line, truncation=True, max_length=length, return_special_tokens_mask=True)
                        for line in f.readlines() if line.strip()]
        assert max(len(e["input_ids"]) for e in examples) == length > min(len(e["input_ids"]) for e in examples)
    else:
        examples = blocks_of(tokenized_lines(texts["validation"], tokenizer, return_special_tokens_mask=True), length,
                             keys=("input_ids", "special_tokens_mask"))
    loss, accuracy, _ = mlm_reference(model, tokenizer, [dict(e) for e in examples])
    assert saved["eval_samples"] == len(examples)
    assert saved["eval_loss"] == pytest.approx(loss, rel=1e-5)
    assert saved["eval_accuracy"] == pytest.approx(accuracy, abs=1e-12)
    run = read_json(out / training.RUN_FILE)
    assert (run["task"], run["family"], run["base_model"]) == ("fill-mask", family, None)


def test_line_by_line_padding_and_blocks(bert_dir):
    """The examples each mode gives: lines (truncated), lines padded to --max_seq_length, or full blocks."""
    tokenizer = AutoTokenizer.from_pretrained(bert_dir)
    lines = ["To be, or not to be: that is the question:\n", "\n", "   \n",
             "Whether 'tis nobler in the mind to suffer the slings and arrows of outrageous fortune,\n", "Ay.\n"]
    raw = datasets.DatasetDict({"validation": datasets.Dataset.from_dict({"text": lines})})
    encoded = [tokenizer(line)["input_ids"] for line in lines]

    def examples(*flags, length=16):
        _, data_args, training_args = training.parse_args(run_mlm.DataTrainingArguments, [
            "--model_type", "mgk-bert", "--validation_file", __file__, "--output_dir", "unused",
            "--max_seq_length", str(length), *flags])
        return run_mlm.prepare_datasets(raw, tokenizer, length, data_args, training_args)["validation"]

    by_line = examples("--line_by_line")
    assert by_line["input_ids"] == [encoded[0], encoded[3][:15] + [tokenizer.sep_token_id], encoded[4]]
    padded = examples("--line_by_line", "--pad_to_max_length")
    assert [len(ids) for ids in padded["input_ids"]] == [16, 16, 16]
    assert [sum(m) for m in padded["attention_mask"]] == [len(ids) for ids in by_line["input_ids"]]
    grouped = examples()
    joined = [t for ids in encoded for t in ids]
    assert grouped["input_ids"] == [joined[i:i + 16] for i in range(0, len(joined) // 16 * 16, 16)]
    assert examples(length=64)["input_ids"] == [joined]  # shorter than one block: one shorter block, as upstream


def test_mlm_warm_start_from_the_bundled_bert(texts, work, bert_dir, tmp_path):
    """A real BERT checkpoint (6 layers, 384 wide) warm-starts MGK-BERT: its weights are the start."""
    out = tmp_path / "out"
    run_mlm.main(["--model_name_or_path", bert_dir, *common(texts, out, work), "--do_train", "--max_seq_length",
                  "32"])
    model = AutoModelForMaskedLM.from_pretrained(out)
    assert (model.config.model_type, model.config.attention_type) == ("mgk-bert", "mgk")
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (6, 384)
    bert = load_file(os.path.join(bert_dir, "model.safetensors"))
    key = next(k for k in bert if k.endswith("word_embeddings.weight"))
    start = bert[key]
    trained = model.bert.embeddings.word_embeddings.weight.detach()
    assert (trained - start).abs().max() < 1e-3 < start.abs().max()  # two Adam steps of 5e-5 from BERT's table
    run = read_json(out / training.RUN_FILE)
    # a local stock folder is the base model (said in words on the card, not Hub metadata)
    assert (run["task"], run["family"], run["base_model"]) == ("fill-mask", "mgk-bert", bert_dir)


def test_resume_refuse_and_overwrite(texts, work, bert_dir, tmp_path):
    out = tmp_path / "out"
    argv = [*new_model("mgk-bert", bert_dir), *common(texts, out, work), "--do_train", "--max_seq_length", "32",
            "--lr_scheduler_type", "constant"]  # the same schedule however many steps are asked for
    first = run_mlm.main([*argv, "--save_strategy", "steps", "--save_steps", "2"])
    assert (out / "checkpoint-2").is_dir()
    first_losses = losses(out)

    # The same run again with more steps continues from checkpoint-2.
    resumed = run_mlm.main([*argv, "--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2"])
    assert read_json(out / "trainer_state.json")["global_step"] == 4
    all_losses = losses(out)
    assert len(all_losses) == 4 and all_losses[:2] == first_losses
    assert resumed["train_loss"] == pytest.approx(sum(all_losses[2:]) / 2, rel=1e-6)  # steps 3 and 4 only
    # ... exactly where it stopped: weights, optimizer, data order and masks as in a run never interrupted.
    argv_straight = [*argv, "--max_steps", "4", "--output_dir", str(tmp_path / "straight")]
    run_mlm.main(argv_straight)
    assert all_losses == pytest.approx(losses(tmp_path / "straight"), rel=1e-5)

    # Another run (other layers) is refused, and the folder is left as it was.
    before = snapshot(out)
    other = [a.replace("num_hidden_layers=2", "num_hidden_layers=1") for a in argv]
    with pytest.raises(ValueError, match=r"holds a different run \(config_overrides: .*num_hidden_layers=2.* there, "
                                         r".*num_hidden_layers=1.* now\)"):
        run_mlm.main(other)
    assert snapshot(out) == before

    # --overwrite_output_dir starts anew: old checkpoints gone, the first two steps again.
    again = run_mlm.main([*other, "--overwrite_output_dir"])
    assert not any(p.name.startswith("checkpoint-") for p in out.iterdir())
    assert read_json(out / "trainer_state.json")["global_step"] == 2
    assert again["train_loss"] == pytest.approx(sum(losses(out)) / 2, rel=1e-6)
    assert read_json(out / training.RUN_FILE)["identity"]["config_overrides"].count("num_hidden_layers=1") == 1
    assert first["train_loss"] != again["train_loss"]


def test_overwrite_output_dir_deletes_only_trainers_checkpoints(texts, work, bert_dir, tmp_path):
    out = tmp_path / "out"
    argv = [*new_model("mgk-bert", bert_dir), *common(texts, out, work), "--do_train", "--max_seq_length", "32"]
    run_mlm.main([*argv, "--save_strategy", "steps", "--save_steps", "2"])
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()
    user = plant(out, {"checkpoint-notes/ideas.md": b"lower the lr\n", "checkpoint-7/mine.txt": b"not Trainer's",
                       "notes.md": b"# run notes\n"})
    # A checkpoint that is an input of the new run is refused, before anything is deleted.
    before = snapshot(out)
    with pytest.raises(ValueError, match="would delete the checkpoint .*checkpoint-2, which is --model_name_or_path"):
        run_mlm.main(["--model_name_or_path", str(out / "checkpoint-2"), *common(texts, out, work), "--do_train",
                      "--max_seq_length", "32", "--overwrite_output_dir"])
    assert snapshot(out) == before
    run_mlm.main([*argv, "--overwrite_output_dir"])
    assert not (out / "checkpoint-2").exists()
    assert_kept(out, user)


@pytest.mark.parametrize("argv, message", [
    (["--model_name_or_path", "STOCK", "--config_overrides", "num_hidden_layers=1", "--do_train"],
     "--config_overrides goes only with --model_type"),
    (["--config_overrides", "num_hidden_layers=1", "--do_train", "--tokenizer_name", "STOCK"],
     "--config_overrides goes only with --model_type"),
    (["--model_name_or_path", "STOCK", "--do_train", "--pad_to_max_length"],
     "--pad_to_max_length goes with --line_by_line"),
    (["--model_name_or_path", "STOCK", "--do_train", "--mlm_probability", "0"], "--mlm_probability must be in"),
])
def test_bad_arguments_exit_with_the_reason(argv, message, texts, work, stock_bert_dir, tmp_path, capsys):
    argv = [stock_bert_dir if a == "STOCK" else a for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        run_mlm.main([*argv, "--train_file", texts["train"], "--output_dir", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_nothing_to_do_is_an_error(texts, work, stock_bert_dir, tmp_path):
    with pytest.raises(ValueError, match="nothing to do: give --do_train and/or --do_eval"):
        run_clm.main(["--model_name_or_path", stock_bert_dir, "--train_file", texts["train"],
                      "--output_dir", str(tmp_path / "out")])


@pytest.mark.parametrize("script, options", [
    (run_mlm, ["--max_seq_length", "--line_by_line", "--pad_to_max_length", "--mlm_probability", "--train_file",
               "--config_overrides", "--overwrite_output_dir"]),
    (run_clm, ["--block_size", "--validation_file", "--attention_overrides", "--overwrite_output_dir", "--family",
               "mgk/smgk/mlk/smlk: mgk-gpt2"]),
])
def test_help(script, options, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in options:
        assert option in text
    for f in script.DataTrainingArguments.__dataclass_fields__.values():
        assert f.metadata.get("help"), f.name


# ------------------------------------------------------------------------------------- two processes

@pytest.mark.parametrize("script, family, length_option", [("run_mlm", "mgk-bert", "--max_seq_length"),
                                                           ("run_clm", "fish-gpt2", "--block_size")])
def test_torchrun_two_processes_match_one(script, family, length_option, texts, work, bert_dir, gpt2_dir, tmp_path):
    """Global batch 4: one process x 4 in-process, and torchrun (gloo) with 2 processes x 2 running the script.

    accelerate gives process p the sampler's batches p, p + 2, ... of the same seeded permutation, so each global
    batch holds the same examples; the masks depend on each example alone (not on the process's random stream),
    and the losses honour num_items_in_batch: the per-step losses agree. No dropout, and noise-free hard FiSH."""
    tokenizer_dir = gpt2_dir if family == "fish-gpt2" else bert_dir
    argv = [*new_model(family, tokenizer_dir, NO_DROPOUT[family]), *common(texts, tmp_path / "one", work, steps=3),
            "--do_train", length_option, "32", "--optim", "sgd", "--learning_rate", "0.5", "--lr_scheduler_type",
            "constant", "--seed", "3", "--data_seed", "5"]
    main = run_mlm.main if script == "run_mlm" else run_clm.main
    main(argv)
    one = losses(tmp_path / "one")

    argv[argv.index("--output_dir") + 1] = str(tmp_path / "two")
    argv[argv.index("--per_device_train_batch_size") + 1] = "2"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    # trainer_state.json: rank 0's last file; a rank that has not exited 30 s after it hangs
    proc = run_torchrun([ROOT / "scripts" / f"{script}.py", *argv], env, timeout=180,
                        done=tmp_path / "two" / "trainer_state.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    two = losses(tmp_path / "two")
    assert len(one) == 3 and len(set(one)) == 3
    assert two == pytest.approx(one, rel=1e-5)


@pytest.mark.parametrize("engine", ["ds_zero2", "ds_zero3"])
def test_deepspeed_warm_start_trains_as_ddp(engine, texts, work, stock_gpt2_dir, tmp_path):
    """The launch line of docs/scripts.md with the DeepSpeed config it names (Trainer's "auto" values), on 2 CPU
    ranks: a stock GPT-2 warm-starts MGK-GPT2 (two of its heads kept, extra keys drawn), which ZeRO-3 builds inside
    zero.Init. The losses and the saved model are those of the DDP run of the same command."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is in the dev extra on Linux only")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    runs = {}
    for name, extra in [("ddp", []), (engine, ["--deepspeed", str(ROOT / "scripts" / "launch" / f"{engine}.json")])]:
        out = tmp_path / name
        argv = ["--model_name_or_path", stock_gpt2_dir, "--attention_overrides", "attention_type=mgk,n_head=2",
                *common(texts, out, work, steps=3), "--per_device_train_batch_size", "2", "--do_train",
                "--block_size", "32", "--learning_rate", "1e-3", *extra]
        proc = run_torchrun([ROOT / "scripts" / "run_clm.py", *argv], env, timeout=240,
                            done=out / "trainer_state.json")
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[name] = (losses(out), load_file(out / "model.safetensors"))
    (ddp_losses, ddp), (ds_losses, ds) = runs["ddp"], runs[engine]
    assert len(ddp_losses) == 3 and ds_losses == pytest.approx(ddp_losses, rel=1e-5)
    assert any(".extra_keys." in k for k in ddp)
    # ZeRO-2 hands Trainer's save a state dict of separate tensors, so the tied output embedding is written too
    # (stock GPT-2 alike): the same table
    assert set(ds) - set(ddp) <= {"lm_head.weight"} and set(ddp) <= set(ds)
    if "lm_head.weight" in ds:
        assert torch.equal(ds["lm_head.weight"], ds["transformer.wte.weight"])
    assert max((ds[k] - ddp[k]).abs().max().item() for k in ddp) <= 1e-6


def test_a_hub_dataset_without_network_says_so(work, stock_bert_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ValueError, match="--dataset_name wikitext: the Hugging Face Hub cannot be reached .*"
                                         "--train_file / --validation_file"):
        run_mlm.main(["--model_name_or_path", stock_bert_dir, "--dataset_name", "wikitext", "--dataset_config_name",
                      "wikitext-2-raw-v1", "--do_eval", "--output_dir", str(tmp_path / "out"),
                      "--cache_dir", str(work / "cache")])
    assert not (tmp_path / "out").exists()


def test_report_to_tensorboard_logs_the_losses(texts, work, gpt2_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "out"
    argv = [*new_model("fish-gpt2", gpt2_dir), *common(texts, out, work, steps=3), "--do_train", "--block_size", "32",
            "--report_to", "tensorboard"]
    run_clm.main(argv)
    logged = losses(out)
    events = [p.parent for p in out.rglob("events.out.tfevents.*")]
    assert events, "no TensorBoard event file was written"
    acc = EventAccumulator(str(events[0]))
    acc.Reload()
    assert [round(e.value, 4) for e in acc.Scalars("train/loss")] == [round(v, 4) for v in logged]


@pytest.mark.parametrize("script, family, tokenizer, pipeline_tag", [
    ("run_mlm", "mgk-bert", "bert", "fill-mask"), ("run_clm", "fish-gpt2", "gpt2", "text-generation")])
def test_push_to_hub_ends_with_the_family_card_after_evaluation(script, family, tokenizer, pipeline_tag, texts, work,
                                                                bert_dir, gpt2_dir, tmp_path, fake_hub):
    """--push_to_hub (a local stand-in for the Hub's API): the last upload comes after evaluation, with the
    family's model card (its eval metrics in the model-index) in place of Trainer's draft, as run_glue's."""
    from conftest import check_final_push

    out = tmp_path / "out"
    argv = [*new_model(family, bert_dir if tokenizer == "bert" else gpt2_dir), *common(texts, out, work),
            "--do_train", "--do_eval", "--push_to_hub", "--hub_model_id", "me/tiny-lm",
            *(["--max_seq_length", "32"] if script == "run_mlm" else ["--block_size", "32"])]
    (run_mlm if script == "run_mlm" else run_clm).main(argv)
    meta, card = check_final_push(fake_hub, "me/tiny-lm", family, pipeline_tag, "perplexity")
    assert fake_hub.repos == ["me/tiny-lm"]
    assert (out / "README.md").read_text() == card
