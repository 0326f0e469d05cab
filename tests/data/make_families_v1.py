"""Writes tests/data/families_v1/: tiny checkpoints of MGK-BERT, MGK-GPT2 and NPRF-RoBERTa (a few attention types
each, a language-model head and a classifier) with the outputs the code that saved them gave. Run once, with the
package as it was before the restructuring into a family registry (commit 42782e1):

    PYTHONPATH=<checkout of 42782e1>/src python tests/data/make_families_v1.py

tests/test_saved_checkpoints.py loads them with today's code and compares (FiSH-GPT2's: fish_gpt2_v1/)."""

import os

import torch

import hf_mgk

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "families_v1")
BERT = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
GPT2 = dict(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2)
ROBERTA = dict(BERT, max_position_embeddings=66, pad_token_id=1, bos_token_id=0, eos_token_id=2,
               num_random_features=16)
CASES = {  # folder: (class name, config class name, fields)
    "mgk-bert-mgk": ("MGKBertForMaskedLM", "MGKBertConfig", dict(BERT, attention_type="mgk")),
    "mgk-bert-smgk-hard-em": ("MGKBertForMaskedLM", "MGKBertConfig",
                              dict(BERT, attention_type="smgk", e_step="hard", mgk_prior="em")),
    "mgk-bert-mlk": ("MGKBertForMaskedLM", "MGKBertConfig", dict(BERT, attention_type="mlk", num_keys=3)),
    "mgk-bert-cls-softmax": ("MGKBertForSequenceClassification", "MGKBertConfig",
                             dict(BERT, attention_type="softmax", num_labels=3)),
    "mgk-gpt2-mgk": ("MGKGPT2LMHeadModel", "MGKGPT2Config", dict(GPT2, attention_type="mgk")),
    "mgk-gpt2-smgk-em": ("MGKGPT2LMHeadModel", "MGKGPT2Config", dict(GPT2, attention_type="smgk", mgk_prior="em")),
    "mgk-gpt2-smlk": ("MGKGPT2LMHeadModel", "MGKGPT2Config", dict(GPT2, attention_type="smlk")),
    "mgk-gpt2-cls-mgk": ("MGKGPT2ForSequenceClassification", "MGKGPT2Config",
                         dict(GPT2, attention_type="mgk", num_labels=3)),
    "nprf-roberta-nprf": ("NPRFRobertaForMaskedLM", "NPRFRobertaConfig", ROBERTA),
    "nprf-roberta-prf-no-rpe": ("NPRFRobertaForMaskedLM", "NPRFRobertaConfig",
                                dict(ROBERTA, normalize_qk=False, use_rpe=False)),
    "nprf-roberta-causal": ("NPRFRobertaForCausalLM", "NPRFRobertaConfig", dict(ROBERTA, is_decoder=True)),
    "nprf-roberta-cls": ("NPRFRobertaForSequenceClassification", "NPRFRobertaConfig", dict(ROBERTA, num_labels=3)),
}


def inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 99, (2, 9), generator=g)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding (the decoders), also a padding mask for the encoders
    return {"input_ids": ids, "attention_mask": mask}


def main():
    os.makedirs(OUT, exist_ok=True)
    batch = inputs()
    torch.save(batch, os.path.join(OUT, "inputs.pt"))
    for name, (cls_name, config_name, fields) in CASES.items():
        torch.manual_seed(0)
        model = getattr(hf_mgk, cls_name)(getattr(hf_mgk, config_name)(**fields)).eval()
        with torch.no_grad():
            out = model(**batch, output_hidden_states=True, output_attentions=True)
        expected = {"logits": out.logits, "hidden_states": out.hidden_states,
                    "attentions": out.attentions}
        folder = os.path.join(OUT, name)
        model.save_pretrained(folder)
        for name_ in os.listdir(folder):  # the code files a checkpoint carries: today's classes load these folders
            if name_.endswith(".py"):
                os.remove(os.path.join(folder, name_))
        torch.save(expected, os.path.join(folder, "expected.pt"))
        print(name, tuple(out.logits.shape))


if __name__ == "__main__":
    main()
