"""RoBERTa with normalized positive random features and relative positions (Luo et al. 2021) as an HF model.

Self-attention becomes z_i = phi(q^_i)^T sum_j c_{j-i} phi(k^_j) v_j^T / phi(q^_i)^T sum_j c_{j-i} phi(k^_j)
(Eq. 10 of arXiv:2106.12566), computed exactly in O(N log N) or O(N) by `attention_nprf.py`. The relative-position
bias is one learned table per head shared by all layers; the random features W are a persistent buffer per layer.
Absolute position embeddings are optional, so with `use_absolute_positions=False` any length is accepted. Embedding,
feed-forward and head weights keep RoBERTa's names, so a stock RoBERTa checkpoint folder loads.
Imports: torch, transformers and siblings only (remote code).
"""

import torch
from torch import nn
from transformers.cache_utils import DynamicCache
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions
from transformers.modeling_utils import PreTrainedModel
from transformers.models.roberta.modeling_roberta import RobertaClassificationHead, RobertaLMHead, RobertaPooler

from .attention_nprf import draw_features, nprf_attention, rpe_bias_from_buckets, t5_constant_distance
# transformers 5.8 and 5.9 copy, from a local folder, only the siblings the model file itself imports: so it
# names every sibling its siblings import, too.
from .attention_autotune import choose  # noqa: F401
from .attention_triton import available  # noqa: F401
from .attention_blocks import row_blocks  # noqa: F401
from .attention_masks import allowed_pairs  # noqa: F401
from .config_checks import check_int_range  # noqa: F401
from .configuration_nprf_roberta import NPRFRobertaConfig
from .modeling_common import (
    AttentionImplementationMixin,
    AutoMapMixin,
    attention_mask_from,
    cached_length,
    can_return_tuple,
    check_sequence_length,
    is_full_mask,
    is_tracing,
    mask_for_cached_keys,
    output_requested,
    resolve_use_cache,
    softmax_attention,
    wants_attentions,
)
from .modeling_encoder import Encoder
from .modeling_heads import (
    CausalLMHeadMixin,
    MaskedLMHeadMixin,
    QuestionAnsweringHeadMixin,
    SequenceClassificationHeadMixin,
)
from .modeling_warm_start import ENCODER_HEAD_TENSORS, HeadSelectionMixin
from .transformers_compat import TiedParametersCompat, init


def feature_generator(config, layer_idx, draw):
    """The CPU generator of W for this layer and draw (0 = the initial W), seeded from (random_feature_seed,
    layer, draw) mixed into 32 bits: torch's CPU generator keeps only the low 32 bits of a seed, so packing the
    three side by side (seed << 32 | draw) gave every layer and every seed the same W."""
    mixed = 0
    for value in (config.random_feature_seed, layer_idx or 0, draw):
        # splitmix64 steps: distinct triples give well-spread, practically distinct 32-bit seeds.
        mixed = (mixed ^ value) + 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
        mixed = (mixed ^ mixed >> 30) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        mixed = (mixed ^ mixed >> 27) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        mixed ^= mixed >> 31
    return torch.Generator().manual_seed(mixed & 0xFFFFFFFF)


class NPRFRobertaEmbeddings(nn.Module):
    """RoBERTa's embeddings; the absolute position table exists only with `use_absolute_positions`."""

    def __init__(self, config):
        super().__init__()
        self.padding_idx = config.pad_token_id
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=self.padding_idx)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        if config.use_absolute_positions:
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size,
                                                    padding_idx=self.padding_idx)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None, past_length=0):
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros(inputs_embeds.shape[:2], dtype=torch.long, device=inputs_embeds.device)
        embeddings = inputs_embeds + self.token_type_embeddings(token_type_ids)
        if hasattr(self, "position_embeddings"):
            top = None  # the largest position: read from the ids, or in a trace (which must not read values)
            if position_ids is None:  # bounded by the shapes when counted here
                position_ids = self._roberta_positions(input_ids, inputs_embeds, past_length)
                top = self.padding_idx + past_length + inputs_embeds.shape[1] if is_tracing() else None
            if not is_tracing():
                top = int(position_ids.max())
            if top is not None and top >= self.position_embeddings.num_embeddings:
                usable = self.position_embeddings.num_embeddings - self.padding_idx - 1
                check_sequence_length(top - self.padding_idx, usable, why=(
                    f"max_position_embeddings={self.position_embeddings.num_embeddings} minus RoBERTa's padding "
                    f"offset {self.padding_idx + 1}"))
            embeddings = embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))

    def _roberta_positions(self, input_ids, inputs_embeds, past_length):
        """fairseq/RoBERTa positions: padding_idx + 1, + 2, ... for real tokens, padding_idx for padding."""
        if input_ids is None:
            n = inputs_embeds.shape[1]
            pos = torch.arange(self.padding_idx + 1 + past_length, self.padding_idx + 1 + past_length + n,
                               device=inputs_embeds.device)
            return pos[None].expand(inputs_embeds.shape[:2])
        mask = input_ids.ne(self.padding_idx).long()
        return (torch.cumsum(mask, dim=1) + past_length) * mask + self.padding_idx


class NPRFRelativePositionBias(nn.Module):
    """b_{j-i} (the paper's RPE, Eq. 6): one learned value per head and T5 bucket, shared by every layer."""

    def __init__(self, config):
        super().__init__()
        self.bidirectional = not config.is_decoder
        self.max_distance = config.rpe_max_distance
        self.weight = nn.Parameter(torch.zeros(config.num_attention_heads, config.rpe_num_buckets))
        # Beyond this |j - i| the bucket (so b) no longer changes: the exact O(N) band path may be used. Computed on
        # the CPU explicitly: from_pretrained builds modules on the meta device, where the scan cannot run.
        with torch.device("cpu"):
            self.constant_beyond = t5_constant_distance(self.bidirectional, config.rpe_num_buckets, self.max_distance)

    def forward(self, length):
        """(H, 2 * length - 1) biases for offsets -(length - 1) .. length - 1."""
        return rpe_bias_from_buckets(self.weight, length, bidirectional=self.bidirectional,
                                     max_distance=self.max_distance)


class NPRFRobertaSelfAttention(nn.Module):
    """Softmax (the baseline) or NPRF attention. `relative_position` (the shared bias module) comes as a kwarg."""

    def __init__(self, config: NPRFRobertaConfig, layer_idx=None):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.attention_head_size
        inner = self.num_heads * self.head_dim
        self.query = nn.Linear(config.hidden_size, inner)
        self.key = nn.Linear(config.hidden_size, inner)
        self.value = nn.Linear(config.hidden_size, inner)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.is_causal = config.is_decoder
        if config.attention_type == "nprf":
            # W: draw 0 of (random_feature_seed, layer), here and in _init_weights (which fills it after a build on
            # the meta device, as from_pretrained's), so a module built without weight initialisation has it too.
            features = torch.empty(config.num_random_features, self.head_dim)
            if features.device.type != "meta":
                features.copy_(draw_features(*features.shape, feature_generator(config, layer_idx, 0), device="cpu"))
            self.register_buffer("features", features)
            # Training forwards so far: saved with the model, so a resumed run redraws W at the same steps.
            self.register_buffer("forward_count", torch.zeros((), dtype=torch.long))

    def _heads(self, x):
        return x.view(*x.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)

    @torch.no_grad()
    def begin_training_forward(self):
        """One training forward: count it and redraw W every `feature_redraw_interval` forwards (NPRF only; the
        softmax baseline keeps its unused W and count as they are). Called once per forward of the model by
        `run_layers`, not in the layer's forward, which gradient checkpointing runs again during backward."""
        interval = self.config.feature_redraw_interval
        if interval > 0 and self.config.attention_type == "nprf":
            self.forward_count += 1
            if int(self.forward_count) % interval == 0:
                self.redraw_features()

    @torch.no_grad()
    def redraw_features(self, draw=None):
        """Replace W by draw number `draw` (default: the next one after forward_count's). Draw d comes from its
        own generator (seed, layer, d), not from the global RNG: reproducible, the same on every process, and
        it leaves dropout's random stream alone."""
        if draw is None:
            draw = int(self.forward_count) // max(1, self.config.feature_redraw_interval)
        self.features.copy_(draw_features(*self.features.shape, feature_generator(self.config, self.layer_idx, draw)))

    def forward(self, hidden_states, attention_mask=None, past_key_values=None, relative_position=None, **kwargs):
        query = self._heads(self.query(hidden_states))
        key = self._heads(self.key(hidden_states))
        value = self._heads(self.value(hidden_states))
        past = None  # where the queries sit: after the cached positions (a static cache has free slots after them)
        if past_key_values is not None:
            past = cached_length(past_key_values, self.layer_idx)
            key, value = past_key_values.update(key, value, self.layer_idx)
            attention_mask = mask_for_cached_keys(attention_mask, self.is_causal, past, query.shape[-2],
                                                  key.shape[-2], key.device)
        return_weights = wants_attentions(self.config, kwargs)
        if self.config.attention_type == "softmax":
            dropout_p = self.dropout.p if self.training else 0.0
            out, weights = softmax_attention(self, query, key, value, attention_mask, dropout_p=dropout_p,
                                             return_weights=return_weights)
        else:
            if not self.config.normalize_qk:
                # The PRF ablation estimates the softmax kernel exp(q.k / sqrt(D)), as Performer does: phi is
                # applied to q / D^(1/4) and k / D^(1/4) (Eq. 5 itself, on x W^Q, would estimate exp(q.k)).
                query, key = query * self.head_dim**-0.25, key * self.head_dim**-0.25
            bias, max_distance = None, None
            if relative_position is not None:
                bias = relative_position(key.shape[-2])
                max_distance = relative_position.constant_beyond
            res = nprf_attention(query, key, value, bias, self.features, normalize=self.config.normalize_qk,
                                 max_distance=max_distance, attention_mask=attention_mask,
                                 is_causal=self.is_causal and not is_full_mask(attention_mask),
                                 return_weights=return_weights, query_offset=past, backend=self.config.backend)
            out, weights = res if return_weights else (res, None)
            # No probability matrix is formed on the fast paths, so attention dropout acts on the output.
            out = self.dropout(out)
        out = out.transpose(1, 2).reshape(*hidden_states.shape[:-1], self.num_heads * self.head_dim)
        return out, weights


class NPRFRobertaPreTrainedModel(HeadSelectionMixin, AutoMapMixin, AttentionImplementationMixin, TiedParametersCompat,
                                 PreTrainedModel):
    """`from_pretrained` also takes a stock RoBERTa folder, and fewer heads than it has: `num_attention_heads=H'`
    keeps its first H' heads, `keep_heads=[...]` (one list, or one list per layer) the listed ones (see
    `HeadSelectionMixin`). The relative-position table is shared by all layers: a saved NPRF checkpoint's table
    needs one list of heads for every layer."""

    config_class = NPRFRobertaConfig
    config: NPRFRobertaConfig
    base_model_prefix = "roberta"
    _stock_model_type = "roberta"
    _head_tensors = {**ENCODER_HEAD_TENSORS, r"relative_position\.weight": (0, False)}
    supports_gradient_checkpointing = True
    _no_split_modules = ["NPRFRobertaEmbeddings", "EncoderLayer"]
    _keys_to_ignore_on_load_unexpected = [r"embeddings\.position_ids", r"embeddings\.token_type_ids"]
    _auto_map = {
        "AutoModel": "NPRFRobertaModel",
        "AutoModelForMaskedLM": "NPRFRobertaForMaskedLM",
        "AutoModelForCausalLM": "NPRFRobertaForCausalLM",
        "AutoModelForSequenceClassification": "NPRFRobertaForSequenceClassification",
        "AutoModelForQuestionAnswering": "NPRFRobertaForQuestionAnswering",
    }

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, RobertaLMHead):
            init.zeros_(module.bias)
        elif isinstance(module, NPRFRelativePositionBias):
            init.zeros_(module.weight)  # c = 1 everywhere: training starts from plain NPRF
        elif isinstance(module, NPRFRobertaSelfAttention) and hasattr(module, "features"):
            generator = feature_generator(self.config, module.layer_idx, 0)
            init.copy_(module.features, draw_features(*module.features.shape, generator).to(module.features.device))
            init.zeros_(module.forward_count)


class NPRFRobertaModel(NPRFRobertaPreTrainedModel):
    def __init__(self, config: NPRFRobertaConfig, add_pooling_layer=True):
        super().__init__(config)
        if config.add_cross_attention:
            raise ValueError("NPRF-RoBERTa has no cross-attention: add_cross_attention must be False")
        self.embeddings = NPRFRobertaEmbeddings(config)
        if config.attention_type == "nprf" and config.use_rpe:
            self.relative_position = NPRFRelativePositionBias(config)
        self.encoder = Encoder(config, NPRFRobertaSelfAttention)
        self.pooler = RobertaPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, past_key_values=None, use_cache=None, output_hidden_states=None, **kwargs):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        shape = input_ids.shape if input_ids is not None else inputs_embeds.shape[:-1]
        use_cache = resolve_use_cache(self, use_cache) and self.config.is_decoder
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        embedding_output = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds, past)
        static = getattr(past_key_values, "is_compileable", False)  # its keys: every slot, not past + length
        mask = attention_mask_from(attention_mask, shape[0], shape[1], None if static else past + shape[1])
        sequence_output, hidden_states, attentions = self.encoder(
            embedding_output, mask, past_key_values=past_key_values,
            relative_position=getattr(self, "relative_position", None),
            output_hidden_states=output_requested(self.config, "output_hidden_states", output_hidden_states), **kwargs)
        pooled_output = self.pooler(sequence_output) if self.pooler is not None else None
        return BaseModelOutputWithPoolingAndCrossAttentions(
            last_hidden_state=sequence_output, pooler_output=pooled_output,
            past_key_values=past_key_values if use_cache else None, hidden_states=hidden_states, attentions=attentions)


class NPRFRobertaForMaskedLM(MaskedLMHeadMixin, NPRFRobertaPreTrainedModel):
    _tied_weights_keys = {
        "lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
        "lm_head.decoder.bias": "lm_head.bias",
    }

    def __init__(self, config):
        super().__init__(config)
        self.roberta = NPRFRobertaModel(config, add_pooling_layer=False)
        self.lm_head = RobertaLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    def lm_logits(self, hidden_states):
        return self.lm_head(hidden_states)


class NPRFRobertaForCausalLM(CausalLMHeadMixin, NPRFRobertaPreTrainedModel, GenerationMixin):
    """Causal NPRF (c_{j-i} = 0 for j > i); needs `is_decoder=True`. The KV cache holds keys and values; each new
    token attends to the whole cache on the explicit path (O(S) per token)."""

    _tied_weights_keys = NPRFRobertaForMaskedLM._tied_weights_keys

    def __init__(self, config):
        super().__init__(config)
        if not config.is_decoder:
            raise ValueError("NPRFRobertaForCausalLM needs a causal config: set is_decoder=True")
        self.roberta = NPRFRobertaModel(config, add_pooling_layer=False)
        self.lm_head = RobertaLMHead(config)
        self.post_init()

    get_output_embeddings = NPRFRobertaForMaskedLM.get_output_embeddings
    set_output_embeddings = NPRFRobertaForMaskedLM.set_output_embeddings

    def prepare_inputs_for_generation(self, input_ids, *args, **kwargs):
        """generate() numbers real tokens 0, 1, ... (each transformers release its own way); RoBERTa's table
        starts at padding_idx + 1 and gives padding padding_idx. So the positions of each step's new tokens are
        counted here from the mask of every token so far (`input_ids` holds them all)."""
        inputs = super().prepare_inputs_for_generation(input_ids, *args, **kwargs)
        mask = kwargs.get("attention_mask")
        mask = torch.ones_like(input_ids) if mask is None else mask.long()
        new = inputs.get("input_ids") if inputs.get("input_ids") is not None else inputs["inputs_embeds"]
        positions = mask.cumsum(-1) * mask + self.config.pad_token_id
        inputs["position_ids"] = positions[:, -new.shape[1]:]
        return inputs


class NPRFRobertaForSequenceClassification(SequenceClassificationHeadMixin, NPRFRobertaPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.roberta = NPRFRobertaModel(config, add_pooling_layer=False)
        self.classifier = RobertaClassificationHead(config)
        self.post_init()

    def classify(self, outputs):
        return self.classifier(outputs.last_hidden_state)  # RoBERTa's head reads <s>


class NPRFRobertaForQuestionAnswering(QuestionAnsweringHeadMixin, NPRFRobertaPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.roberta = NPRFRobertaModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()


__all__ = [
    "NPRFRobertaPreTrainedModel",
    "NPRFRobertaModel",
    "NPRFRobertaForMaskedLM",
    "NPRFRobertaForCausalLM",
    "NPRFRobertaForSequenceClassification",
    "NPRFRobertaForQuestionAnswering",
]
