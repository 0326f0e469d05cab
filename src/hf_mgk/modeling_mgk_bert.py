"""BERT with Mixture-of-Gaussian-Keys attention (Nguyen et al., ICML 2022) as an ordinary HF model.

Embeddings, feed-forward, pooler and heads are HF's own BERT modules with BERT's weight names, so a stock BERT
checkpoint folder loads into these classes; only the self-attention changes. The math lives in
`attention_mgk.py` (torch only); this file is the HF glue. Imports: torch, transformers and siblings only, so a
saved folder works with `trust_remote_code=True` without `hf_mgk` installed.
"""

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

# transformers 5.8 and 5.9 copy, from a local folder, only the siblings the model file itself imports: so it
# names every sibling its siblings import, too.
from .attention_autotune import choose  # noqa: F401
from .attention_blocks import row_blocks  # noqa: F401
from .attention_mgk_blocked import mgk_blocked  # noqa: F401
from .attention_mgk_triton import mgk_triton  # noqa: F401
from .attention_triton import available  # noqa: F401
from .attention_masks import allowed_pairs  # noqa: F401
from .attention_mgk import mgk_attention  # noqa: F401
from .config_checks import check_int_range  # noqa: F401
from .configuration_mgk import MGKConfigMixin  # noqa: F401
from .configuration_mgk_bert import MGKBertConfig
from .modeling_common import (
    AttentionImplementationMixin,
    AutoMapMixin,
    attention_mask_from,
    can_return_tuple,
    check_sequence_length,
    output_requested,
    wants_attentions,
)
from .modeling_encoder import Encoder
from .modeling_heads import (
    MaskedLMHeadMixin,
    QuestionAnsweringHeadMixin,
    SequenceClassificationHeadMixin,
    TokenClassificationHeadMixin,
)
from .modeling_mgk import MGKAttentionCore, init_mgk_weights, plain_projections
from .modeling_warm_start import ENCODER_HEAD_TENSORS, HeadSelectionMixin
from .transformers_compat import TiedParametersCompat, init


class MGKBertSelfAttention(MGKAttentionCore):
    """Self-attention of one layer: softmax (baseline) or a mixture of M keys per position (see `MGKAttentionCore`).

    Weight names follow BERT (`query`, `key`, `value`); option A adds `extra_keys` (keys 2..M), option B a
    per-head `key_shift` (H, M, D)."""

    def __init__(self, config: MGKBertConfig, layer_idx=None):
        super().__init__(config, config.num_attention_heads, config.attention_head_size, config.is_decoder,
                         config.attention_probs_dropout_prob)
        self.layer_idx = layer_idx
        inner = self.num_heads * self.head_dim
        self.query = nn.Linear(config.hidden_size, inner)
        self.key = nn.Linear(config.hidden_size, inner)
        self.value = nn.Linear(config.hidden_size, inner)
        if self.has_extra_keys:
            self.extra_keys = nn.ModuleList(nn.Linear(config.hidden_size, inner) for _ in range(self.num_keys - 1))

    def first_key_parameters(self):
        return self.key.weight, self.key.bias

    def first_key_module(self):
        return self.key

    def _heads(self, x):
        return x.view(*x.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)

    def _keys(self, hidden_states):
        """The keys in their stored form: option A (B, H, M, S, D), option B and softmax (B, H, S, D)."""
        if not self.has_extra_keys:
            return self._heads(self.key(hidden_states))
        if plain_projections(self.key, *self.extra_keys):
            # One matmul for all M projections: concatenating the weights costs d*M*H*D, the matmul B*N times more.
            weight = torch.cat([self.key.weight] + [k.weight for k in self.extra_keys])
            bias = torch.cat([self.key.bias] + [k.bias for k in self.extra_keys])
            keys = nn.functional.linear(hidden_states, weight, bias)
        else:  # a wrapped projection (LoRA, a hook) runs its own forward
            keys = torch.cat([self.key(hidden_states)] + [k(hidden_states) for k in self.extra_keys], dim=-1)
        b, s = keys.shape[:2]
        return keys.view(b, s, self.num_keys, self.num_heads, self.head_dim).permute(0, 3, 2, 1, 4)

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        """attention_mask: None, bool (B, S) (True = real token) or a caller's whole (B, 1, N, S) mask (see
        `attention_mask_from`). Returns (output (B, S, H*D), weights or None)."""
        query = self._heads(self.query(hidden_states))
        value = self._heads(self.value(hidden_states))
        out, weights = self.attend(query, self._keys(hidden_states), value, attention_mask,
                                   wants_attentions(self.config, kwargs))
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
        else:
            init_mgk_weights(self, module)


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
