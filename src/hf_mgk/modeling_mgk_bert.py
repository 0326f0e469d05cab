"""BERT with Mixture-of-Gaussian-Keys attention (Nguyen et al., ICML 2022) as an ordinary HF model.

Embeddings, feed-forward, pooler and heads are HF's own BERT modules with BERT's weight names, so a stock BERT
checkpoint folder loads into these classes; only the self-attention changes. The math lives in
`attention_mgk.py` (torch only); this file is the HF glue. Imports: torch, transformers and siblings only, so a
saved folder works with `trust_remote_code=True` without `hf_mgk` installed.
"""

import math

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions
from transformers.modeling_utils import PreTrainedModel
from transformers.models.bert.modeling_bert import (
    BertEmbeddings,
    BertLMPredictionHead,
    BertOnlyMLMHead,
    BertPooler,
)

from .attention_mgk import mgk_attention, mgk_responsibilities, mlk_attention, smgk_attention
# transformers 5.8 and 5.9 copy, from a local folder, only the siblings the model file itself imports: so it
# names every sibling its siblings import, too.
from .config_checks import check_int_range  # noqa: F401
from .configuration_mgk_bert import MGKBertConfig
from .modeling_common import (
    AttentionImplementationMixin,
    AutoMapMixin,
    attention_mask_from,
    can_return_tuple,
    check_sequence_length,
    is_full_mask,
    output_requested,
    parent_of,
    softmax_attention,
    wants_attentions,
)
from .modeling_encoder import Encoder
from .modeling_heads import (
    MaskedLMHeadMixin,
    QuestionAnsweringHeadMixin,
    SequenceClassificationHeadMixin,
    TokenClassificationHeadMixin,
)
from .modeling_warm_start import ENCODER_HEAD_TENSORS, HeadSelectionMixin
from .transformers_compat import TiedParametersCompat, init


class MGKBertSelfAttention(nn.Module):
    """Self-attention of one layer: softmax (baseline) or a mixture of M keys per position.

    Weight names follow BERT (`query`, `key`, `value`); option A adds `extra_keys` (keys 2..M), option B a
    per-head `key_shift` (M, D). The prior is `prior_logits` (learned), the `prior` buffer (em) or absent.

    The EM prior is lagged: a training forward uses the pi in `prior` when it began, and its M-step (from this
    forward's responsibilities) replaces `prior` for the next forward. The model announces each training
    forward by calling `begin_training_forward()` on every attention module before its layers run."""

    def __init__(self, config: MGKBertConfig, layer_idx=None):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.attention_type = config.attention_type
        self.num_heads = config.num_attention_heads
        self.head_dim = config.attention_head_size
        self.num_keys = config.num_keys if config.attention_type != "softmax" else 1
        inner = self.num_heads * self.head_dim
        self.query = nn.Linear(config.hidden_size, inner)
        self.key = nn.Linear(config.hidden_size, inner)
        self.value = nn.Linear(config.hidden_size, inner)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.is_causal = config.is_decoder
        if self.attention_type in ("mgk", "mlk"):
            self.extra_keys = nn.ModuleList(nn.Linear(config.hidden_size, inner) for _ in range(self.num_keys - 1))
        if self.attention_type in ("smgk", "smlk"):
            self.key_shift = nn.Parameter(torch.zeros(self.num_heads, self.num_keys, self.head_dim))
        uses_prior = self.attention_type != "softmax" and not (self.is_gaussian and config.e_step == "hard")
        self.prior_type = config.mgk_prior if uses_prior else None
        if self.prior_type == "learned":
            self.prior_logits = nn.Parameter(torch.zeros(self.num_heads, self.num_keys))
        elif self.prior_type == "em":
            self.register_buffer("prior", torch.full((self.num_heads, self.num_keys), 1.0 / self.num_keys))
            self._prior_in_use = None  # the pi of the running training forward (see begin_training_forward)
            self._m_step_due = False
        # sigma_r^2 are fixed multiples of sqrt(D) (Sec. 2.3: "we fix the variance ... to sqrt(D)").
        self.variances = [v * math.sqrt(self.head_dim) for v in config.mgk_variances[: self.num_keys]]

    @property
    def is_gaussian(self):
        return self.attention_type in ("mgk", "smgk")

    @torch.no_grad()
    def begin_training_forward(self):
        """Once per training forward of the model, before its layers run (as NPRF's `count_forward`).

        EM prior: freeze the pi this forward uses (the estimate of the previous forward) and let this forward's
        first pass through the layer run the M-step into `prior`, for the next forward. Inside the layer alone
        this could not work: gradient checkpointing runs the layer again in backward, which would repeat the
        M-step and recompute with another pi than the forward's (other gradients); and in a causal model a pi
        estimated from this forward's responsibilities would let every token see the batch's later tokens."""
        if self.prior_type == "em":
            self._prior_in_use = self.prior.clone()
            self._m_step_due = True

    def log_prior(self):
        if self.prior_type == "learned":
            return torch.log_softmax(self.prior_logits, dim=-1)
        if self.prior_type == "em":
            prior = self._prior_in_use if self.training and self._prior_in_use is not None else self.prior
            return prior.clamp_min(torch.finfo(prior.dtype).tiny).log()
        return None  # uniform: a constant that cancels in the softmax over keys

    @torch.no_grad()
    def _m_step(self, query, keys, attention_mask, is_causal):
        """Eq. 8's pi from this forward's finite responsibilities (E-step with the pi in use) into `prior`; heads
        without any finite pair (one non-finite row cannot turn the prior to NaN) keep their pi."""
        self._m_step_due = False
        pi = mgk_responsibilities(query, keys, variances=self.variances, log_prior=self.log_prior(),
                                  attention_mask=attention_mask, is_causal=is_causal)
        self.prior.copy_(torch.where(torch.isfinite(pi).all(-1, keepdim=True), pi, self.prior.float()))

    def _heads(self, x):
        return x.view(*x.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)

    def _keys(self, hidden_states):
        """(B, H, M, S, D): the M keys of every position."""
        if self.attention_type in ("mgk", "mlk"):
            # One matmul for all M projections: concatenating the weights costs d*M*H*D, the matmul B*N times more.
            weight = torch.cat([self.key.weight] + [k.weight for k in self.extra_keys])
            bias = torch.cat([self.key.bias] + [k.bias for k in self.extra_keys])
            keys = nn.functional.linear(hidden_states, weight, bias)
            b, s = keys.shape[:2]
            return keys.view(b, s, self.num_keys, self.num_heads, self.head_dim).permute(0, 3, 2, 1, 4)
        key = self._heads(self.key(hidden_states))                                   # (B, H, S, D)
        return key[:, :, None] + self.key_shift[None, :, :, None, :]

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        """attention_mask: None, bool (B, S) (True = real token) or a caller's whole (B, 1, N, S) mask (see
        `attention_mask_from`). Returns (output (B, S, H*D), weights or None)."""
        return_weights = wants_attentions(self.config, kwargs)
        dropout_p = self.dropout.p if self.training else 0.0
        query = self._heads(self.query(hidden_states))
        value = self._heads(self.value(hidden_states))
        if self.attention_type == "softmax":
            out, weights = softmax_attention(self, query, self._heads(self.key(hidden_states)), value, attention_mask,
                                             dropout_p=dropout_p, return_weights=return_weights)
        else:
            is_causal = self.is_causal and not is_full_mask(attention_mask)
            # sMGK hands its one key and the shifts to smgk_attention (q.k once for all M keys), not M keys
            shared = self.attention_type == "smgk"
            keys = None if shared else self._keys(hidden_states)
            if self.prior_type == "em" and self.training and self._m_step_due:
                self._m_step(query, self._keys(hidden_states) if shared else keys, attention_mask, is_causal)
            kw = dict(variances=self.variances, log_prior=self.log_prior(), e_step=self.config.e_step,
                      attention_mask=attention_mask, is_causal=is_causal, dropout_p=dropout_p,
                      return_weights=return_weights)
            if shared:
                res = smgk_attention(query, self._heads(self.key(hidden_states)), self.key_shift, value, **kw)
            elif self.is_gaussian:
                res = mgk_attention(query, keys, value, **kw)
            else:
                res = mlk_attention(query, keys, value, log_prior=self.log_prior(), attention_mask=attention_mask,
                                    is_causal=is_causal, return_weights=return_weights)
            out, weights = res if return_weights else (res, None)
            if not self.is_gaussian and dropout_p > 0:
                # Linear attention has no probability matrix to drop: drop on the output instead.
                out = nn.functional.dropout(out, p=dropout_p)
        out = out.transpose(1, 2).reshape(*hidden_states.shape[:-1], self.num_heads * self.head_dim)
        return out, weights


class MGKBertPreTrainedModel(HeadSelectionMixin, AutoMapMixin, AttentionImplementationMixin, TiedParametersCompat,
                             PreTrainedModel):
    """`from_pretrained` also takes a stock BERT folder, and fewer heads than it has: `num_attention_heads=H'`
    keeps its first H' heads, `keep_heads=[...]` (one list, or one list per layer) the listed ones (see
    `HeadSelectionMixin`); MGK's extra keys then start from the kept heads' keys."""

    config_class = MGKBertConfig
    config: MGKBertConfig
    base_model_prefix = "bert"
    _stock_model_type = "bert"
    _head_tensors = {  # MGK's per-head weights, besides the encoder's, sliced when heads are selected
        **ENCODER_HEAD_TENSORS,
        r"attention\.self\.extra_keys\.\d+\.(weight|bias)": (0, True),
        r"attention\.self\.(key_shift|prior_logits|prior)": (0, False),
    }
    supports_gradient_checkpointing = True
    _no_split_modules = ["BertEmbeddings", "EncoderLayer"]
    _auto_map = {
        "AutoModel": "MGKBertModel",
        "AutoModelForMaskedLM": "MGKBertForMaskedLM",
        "AutoModelForSequenceClassification": "MGKBertForSequenceClassification",
        "AutoModelForTokenClassification": "MGKBertForTokenClassification",
        "AutoModelForQuestionAnswering": "MGKBertForQuestionAnswering",
    }

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, BertLMPredictionHead):
            init.zeros_(module.bias)
        elif isinstance(module, BertEmbeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
            init.zeros_(module.token_type_ids)
        elif isinstance(module, nn.Linear):
            attention = parent_of(self, parent_of(self, module))
            if isinstance(attention, MGKBertSelfAttention) and parent_of(self, module) is attention.extra_keys:
                self._init_extra_key(attention, module)
        elif isinstance(module, MGKBertSelfAttention):
            self._init_mgk_attention(module)

    def _init_extra_key(self, attention, extra):
        """A stock BERT checkpoint brings `key` but no extra keys: start them from that key plus small noise, so
        the pretrained attention pattern survives and the keys can still separate (identical keys under the hard
        E-step would give the second one no gradient). (Tensors loaded from a checkpoint are flagged
        `_is_hf_initialized` on transformers 5; 4.x keeps no such flag, so there they keep the default init.)"""
        std = self.config.initializer_range
        if getattr(attention.key.weight, "_is_hf_initialized", False):
            init.copy_(extra.weight, attention.key.weight + std * 0.1 * torch.randn_like(attention.key.weight))
            init.copy_(extra.bias, attention.key.bias)

    def _init_mgk_attention(self, module):
        std = self.config.initializer_range
        if hasattr(module, "key_shift"):
            # sMGK (the paper's option B, Sec. 2.3): k_jr = k_j + b_r; b_1 = 0, the other shifts small random.
            shift = torch.randn_like(module.key_shift) * std
            shift[:, 0] = 0
            init.copy_(module.key_shift, shift)
        if hasattr(module, "prior_logits"):
            init.zeros_(module.prior_logits)  # uniform pi
        if getattr(module, "prior_type", None) == "em":
            init.constant_(module.prior, 1.0 / module.num_keys)


class MGKBertModel(MGKBertPreTrainedModel):
    """BERT encoder with MGK self-attention. Takes a (batch, seq) padding mask, like BERT's tokenizer gives."""

    def __init__(self, config: MGKBertConfig, add_pooling_layer=True):
        super().__init__(config)
        if config.add_cross_attention:
            raise ValueError("MGK-BERT has no cross-attention: add_cross_attention must be False")
        self.embeddings = BertEmbeddings(config)
        self.encoder = Encoder(config, MGKBertSelfAttention)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, output_hidden_states=None, **kwargs):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        shape = input_ids.shape if input_ids is not None else inputs_embeds.shape[:-1]
        if position_ids is None:
            check_sequence_length(shape[-1], self.config.max_position_embeddings)
        if self.training:
            for layer in self.encoder.layer:
                layer.attention.self.begin_training_forward()
        embedding_output = self.embeddings(input_ids=input_ids, position_ids=position_ids,
                                           token_type_ids=token_type_ids, inputs_embeds=inputs_embeds)
        mask = attention_mask_from(attention_mask, shape[0], shape[1], shape[1])
        output_hidden_states = output_requested(self.config, "output_hidden_states", output_hidden_states)
        sequence_output, hidden_states, attentions = self.encoder(embedding_output, mask,
                                                                  output_hidden_states=output_hidden_states, **kwargs)
        pooled_output = self.pooler(sequence_output) if self.pooler is not None else None
        return BaseModelOutputWithPoolingAndCrossAttentions(last_hidden_state=sequence_output,
                                                            pooler_output=pooled_output, hidden_states=hidden_states,
                                                            attentions=attentions)


class MGKBertForMaskedLM(MaskedLMHeadMixin, MGKBertPreTrainedModel):
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config):
        super().__init__(config)
        self.bert = MGKBertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings
        self.cls.predictions.bias = new_embeddings.bias

    def lm_logits(self, hidden_states):
        return self.cls(hidden_states)


def _classifier_dropout(config):
    return nn.Dropout(config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob)


class MGKBertForSequenceClassification(SequenceClassificationHeadMixin, MGKBertPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = MGKBertModel(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def classify(self, outputs):
        return self.classifier(self.dropout(outputs.pooler_output))  # BERT's pooled [CLS]


class MGKBertForTokenClassification(TokenClassificationHeadMixin, MGKBertPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = MGKBertModel(config, add_pooling_layer=False)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()


class MGKBertForQuestionAnswering(QuestionAnsweringHeadMixin, MGKBertPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = MGKBertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()


__all__ = [
    "MGKBertPreTrainedModel",
    "MGKBertModel",
    "MGKBertForMaskedLM",
    "MGKBertForSequenceClassification",
    "MGKBertForTokenClassification",
    "MGKBertForQuestionAnswering",
]
