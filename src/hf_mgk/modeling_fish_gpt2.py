"""GPT-2 with a Finite Admixture of Shared Heads (FiSHformer) as an ordinary HF model.

Nguyen et al., "Improving Transformer with an Admixture of Attention Heads" (NeurIPS 2022,
openreview.net/forum?id=0VFQhPGF1M3). M global query/key heads give M score matrices; each of the H local heads
attends with a mixture of them (Eqn. 9-12 of the paper) over its own value head. Embeddings, MLP, layer norms
and the LM head are HF's GPT-2 modules and weight names. `c_attn` keeps its name but projects to
[Q_1..Q_M, K_1..K_M, V_1..V_H]; a stock GPT-2 checkpoint is converted on load (its first M heads become the
global Q/K heads). The math lives in `attention_fish.py`.
Imports: torch, transformers and siblings only (remote code).
"""

import math
import re

import torch
from torch import nn
from transformers.cache_utils import DynamicCache
from transformers.generation import GenerationMixin
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    SequenceClassifierOutputWithPast,
)
from transformers.modeling_utils import PreTrainedModel
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
from transformers.pytorch_utils import Conv1D

from .attention_fish import fish_attention, make_gfish_mixing
# transformers 5.8 and 5.9 copy, from a local folder, only the siblings the model file itself imports: so it
# names every sibling its siblings import, too.
from .config_checks import check_int_range  # noqa: F401
from .configuration_fish_gpt2 import FiSHGPT2Config
from .modeling_common import (
    AttentionImplementationMixin,
    AutoMapMixin,
    attention_mask_from,
    cached_length,
    can_return_tuple,
    check_sequence_length,
    classification_loss,
    is_checkpointing,
    is_full_mask,
    is_tracing,
    mask_for_cached_keys,
    output_requested,
    parent_of,
    resolve_use_cache,
    run_layers,
    softmax_attention,
    wants_attentions,
)
from .modeling_heads import CausalLMHeadMixin
from .modeling_warm_start import head_index, hub_kwargs, report_kept_heads, resolve_keep_heads, single_device
from .transformers_compat import PreTrainedConfig, TiedParametersCompat, init


class FiSHGPT2Attention(nn.Module):
    """Causal self-attention: softmax (H heads, the baseline) or FiSH (M global Q/K heads, H local value heads).

    The KV cache holds what the next tokens need: the M global keys and the H values."""

    def __init__(self, config: FiSHGPT2Config, layer_idx=None):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.attention_type = config.attention_type
        self.is_causal = True
        self.num_heads = config.n_head
        self.head_dim = config.attention_head_size
        self.num_qk_heads = self.num_heads if self.attention_type == "softmax" else config.num_global_heads
        self.scaling = self.head_dim**-0.5 if config.scale_attn_weights else 1.0
        if config.scale_attn_by_inverse_layer_idx:
            self.scaling /= float(layer_idx + 1)
        self.split = (self.num_qk_heads * self.head_dim, self.num_qk_heads * self.head_dim,
                      self.num_heads * self.head_dim)
        self.c_attn = Conv1D(sum(self.split), config.n_embd)
        self.c_proj = Conv1D(config.n_embd, self.num_heads * self.head_dim)
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        m, h = self.num_qk_heads, self.num_heads
        if self.attention_type in ("fish", "hard_fish"):
            self.mixing = nn.Parameter(torch.full((m, h), 1.0 / m))  # p_kj
        elif self.attention_type == "mish":
            self.mixing = nn.Parameter(torch.full((m, 1), 1.0 / m))  # p_k, shared by all local heads
        elif self.attention_type in ("gfish", "hard_gfish"):
            self.mixing = make_gfish_mixing(m, h)
        if config.is_noisy:
            self.noise_std = nn.Parameter(torch.full((m,), float(config.fish_noise_init)))  # sigma_k

    def _heads(self, x, n_heads):
        return x.view(*x.shape[:-1], n_heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden_states, past_key_values=None, attention_mask=None, **kwargs):
        """attention_mask: None, bool (B, S_past + N) (True = real token) or a caller's whole (B, 1, N, S) mask (see
        `attention_mask_from`)."""
        query, key, value = self.c_attn(hidden_states).split(self.split, dim=-1)
        query, key = self._heads(query, self.num_qk_heads), self._heads(key, self.num_qk_heads)
        value = self._heads(value, self.num_heads)
        if past_key_values is not None:
            past = cached_length(past_key_values, self.layer_idx)
            key, value = self._cache_update(past_key_values, key, value)
            attention_mask = mask_for_cached_keys(attention_mask, True, past, query.shape[-2], key.shape[-2],
                                                  key.device)
        return_weights = wants_attentions(self.config, kwargs)
        dropout_p = self.attn_dropout.p if self.training else 0.0
        if self.attention_type == "softmax":
            out, weights = softmax_attention(self, query, key, value, attention_mask, dropout_p=dropout_p,
                                             scale=self.scaling, return_weights=return_weights)
        else:
            # Evaluation is deterministic: the noise is a training-time regulariser (the authors' LM code adds it
            # at evaluation too).
            noise = self.noise_std if self.training and hasattr(self, "noise_std") else None
            res = fish_attention(query, key, value, self.mixing, scale=self.scaling, noise_std=noise,
                                 attention_mask=attention_mask, is_causal=not is_full_mask(attention_mask),
                                 return_weights=return_weights, dropout_p=dropout_p)
            out, weights = res if return_weights else (res, None)
        out = out.transpose(1, 2).reshape(*hidden_states.shape[:-1], self.num_heads * self.head_dim)
        return self.resid_dropout(self.c_proj(out)), weights

    def _cache_update(self, cache, key, value):
        """Store this step's M keys and H values in the cache; return all keys and values so far.

        A static cache (one that allocates its slots up front, `is_compileable`) gives keys and values one head
        count and, on transformers 4, one head size: there they travel as one head of width max(M, H) * D each,
        zero-padded; other caches keep M key heads and H value heads."""
        m, h = key.shape[1], value.shape[1]
        if m == h or not getattr(cache, "is_compileable", False):
            return cache.update(key, value, self.layer_idx)
        width = max(m, h) * self.head_dim

        def pack(x):  # (B, heads, N, D) -> (B, 1, N, width)
            x = x.transpose(1, 2).flatten(2)
            return nn.functional.pad(x, (0, width - x.shape[-1]))[:, None]

        def unpack(x, heads):  # (B, 1, S, width) -> (B, heads, S, D)
            return x[:, 0, :, :heads * self.head_dim].unflatten(-1, (heads, self.head_dim)).transpose(1, 2)

        key, value = cache.update(pack(key), pack(value), self.layer_idx)
        return unpack(key, m), unpack(value, h)


class FiSHGPT2Block(GradientCheckpointingLayer):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        inner = config.n_inner if config.n_inner is not None else 4 * config.n_embd
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = FiSHGPT2Attention(config, layer_idx=layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = GPT2MLP(inner, config)

    def forward(self, hidden_states, past_key_values=None, attention_mask=None, **kwargs):
        attn_output, weights = self.attn(self.ln_1(hidden_states), past_key_values, attention_mask, **kwargs)
        hidden_states = hidden_states + attn_output
        return hidden_states + self.mlp(self.ln_2(hidden_states)), weights


class FiSHGPT2PreTrainedModel(AutoMapMixin, AttentionImplementationMixin, TiedParametersCompat, PreTrainedModel):
    config_class = FiSHGPT2Config
    config: FiSHGPT2Config
    base_model_prefix = "transformer"
    supports_gradient_checkpointing = True
    _no_split_modules = ["FiSHGPT2Block"]
    _skip_keys_device_placement = ["past_key_values"]
    _keys_to_ignore_on_load_unexpected = [r"attn\.bias", r"attn\.masked_bias"]  # old GPT-2 checkpoints' buffers
    _stock_gpt2_class = "GPT2Model"  # the stock class with the same head, which loads a stock checkpoint for us
    _auto_map = {
        "AutoModel": "FiSHGPT2Model",
        "AutoModelForCausalLM": "FiSHGPT2LMHeadModel",
        "AutoModelForSequenceClassification": "FiSHGPT2ForSequenceClassification",
    }

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, Conv1D):
            parent = parent_of(self, module)
            if isinstance(parent, (FiSHGPT2Attention, GPT2MLP)) and module is parent.c_proj:
                # GPT-2's scaled init of the residual projections: 1/sqrt(2 * n_layer).
                std = std / math.sqrt(2 * self.config.n_layer)
            init.normal_(module.weight, mean=0.0, std=std)
            init.zeros_(module.bias)
        elif isinstance(module, nn.Linear) and isinstance(parent_of(self, parent_of(self, module)), FiSHGPT2Attention):
            # GFiSH's mixing network: PyTorch's default Linear init (the 0.02-normal init would shrink every mixed
            # score ~100x).
            bound = 1.0 / math.sqrt(module.in_features)
            init.uniform_(module.weight, -bound, bound)
            init.uniform_(module.bias, -bound, bound)
        elif isinstance(module, FiSHGPT2Attention):
            if isinstance(getattr(module, "mixing", None), nn.Parameter):
                # Every local head starts from the mean of the global patterns, slightly perturbed so heads differ.
                m = module.num_qk_heads
                init.copy_(module.mixing, torch.full_like(module.mixing, 1.0 / m) + std * torch.randn_like(module.mixing))
            if hasattr(module, "noise_std"):
                init.constant_(module.noise_std, float(self.config.fish_noise_init))

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, keep_heads=None, **kwargs):
        """As HF's, plus: a stock GPT-2 checkpoint (model_type "gpt2") is converted when FiSH heads are asked for.

        Its embeddings, MLPs, norms, values and output projections are copied; the global Q/K heads are its first
        M query/key heads, or the heads listed in `keep_heads` (one list for every layer, or one list per layer;
        M = num_global_heads, or the lists' length when that is not given). Which heads became global is logged
        and, with output_loading_info=True, returned as loading_info["kept_heads"] (one list per layer). Config
        fields (attention_type=..., num_global_heads=...) may be passed as keywords; `dtype` is honoured,
        `device_map` only as a single device."""
        config_dict = {}  # None: no checkpoint to read (weights from `state_dict=`, config from `config=`)
        if pretrained_model_name_or_path is not None:
            config_dict, _ = PreTrainedConfig.get_config_dict(pretrained_model_name_or_path, **hub_kwargs(kwargs))
        if config_dict.get("model_type") != "gpt2" or kwargs.get("attention_type", "fish") == "softmax":
            if keep_heads is not None:
                raise ValueError(
                    "keep_heads chooses which query/key heads of a stock GPT-2 checkpoint become FiSH's global heads; "
                    "it applies only when converting one (model_type 'gpt2', attention_type other than 'softmax')"
                )
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        return _from_stock_gpt2(cls, pretrained_model_name_or_path, config_dict, kwargs, keep_heads)


# Our fields that GPT2Config lacks: the rest of the keywords go to the stock class's own from_pretrained.
_FISH_FIELDS = ("attention_type", "num_global_heads", "head_dim", "fish_noise_init")
_C_ATTN = re.compile(r"(?:^|\.)h\.(\d+)\.attn\.c_attn\.(weight|bias)$")


def _from_stock_gpt2(cls, path, config_dict, kwargs, keep_heads=None):
    """Load the checkpoint with the stock class of the same head (so HF drops, keeps or initialises head weights
    exactly as it does between stock GPT-2 heads), then copy its weights into `cls`."""
    import transformers

    fish_kwargs = {k: kwargs[k] for k in _FISH_FIELDS if k in kwargs}
    stock_kwargs = {k: v for k, v in kwargs.items() if k not in _FISH_FIELDS}
    device = single_device(stock_kwargs.pop("device_map", None))
    output_loading_info = stock_kwargs.pop("output_loading_info", False)
    n_head, d = config_dict.get("n_head", 12), config_dict.get("n_embd", 768)  # the checkpoint's (GPT-2 defaults)
    kept = None
    if keep_heads is not None:  # checked before the weights are read
        kept = resolve_keep_heads(keep_heads, config_dict.get("n_layer", 12), n_head,
                                  fish_kwargs.get("num_global_heads"), "num_global_heads")
        fish_kwargs.setdefault("num_global_heads", len(kept[0]))
    stock, info = getattr(transformers, cls._stock_gpt2_class).from_pretrained(path, output_loading_info=True,
                                                                                **stock_kwargs)
    keep = set(FiSHGPT2Config().to_dict()) - {"model_type", "architectures", "auto_map", "_name_or_path",
                                              "transformers_version"}  # the fields (a dataclass only on v5)
    base = {k: v for k, v in stock.config.to_dict().items() if k in keep}
    config = FiSHGPT2Config(**{**base, **fish_kwargs})
    stock_dim = d // n_head
    if config.attention_head_size != stock_dim or config.n_head != n_head or config.n_embd != d:
        raise ValueError(
            f"cannot convert a GPT-2 checkpoint with {n_head} heads of size {stock_dim} into "
            f"n_head={config.n_head}, head_dim={config.attention_head_size}: keep the checkpoint's heads and size"
        )
    if kept is None:
        kept = resolve_keep_heads(None, config.n_layer, n_head, config.num_global_heads, "num_global_heads")
    model = cls._from_config(config, dtype=stock.dtype)  # stock.dtype: the `dtype` asked for, or "auto"'s
    state = {}
    for name, tensor in stock.state_dict().items():
        match = _C_ATTN.search(name)
        if match:  # Conv1D: (in, out), out = [Q | K | V]; keep the chosen heads' Q and K, every V
            qk = head_index(kept[int(match.group(1))], stock_dim, tensor.device)
            tensor = torch.cat([tensor[..., qk], tensor[..., d + qk], tensor[..., 2 * d:]], dim=-1)
        state[name] = tensor
    missing, unexpected = model.load_state_dict(state, strict=False)
    new_only = (".attn.mixing", ".attn.noise_std")  # FiSH's own parameters, which keep their initialisation
    if unexpected or any(not any(s in k for s in new_only) for k in missing):
        raise RuntimeError(f"GPT-2 conversion left unexpected {unexpected} / missing {missing} weights")
    model.tie_weights()
    report_kept_heads(cls.__name__, path, kept, n_head, "as the global query/key heads (every value head kept)")
    model = (model if device is None else model.to(device)).eval()
    if not output_loading_info:
        return model
    # As HF reports it: FiSH's own parameters are not in the checkpoint.
    info = dict(info, missing_keys=set(info["missing_keys"]) | set(missing), kept_heads=kept)
    return model, info


class FiSHGPT2Model(FiSHGPT2PreTrainedModel):
    def __init__(self, config: FiSHGPT2Config):
        super().__init__(config)
        if config.add_cross_attention:
            raise ValueError("FiSH-GPT2 has no cross-attention: add_cross_attention must be False")
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(FiSHGPT2Block(config, layer_idx=i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.post_init()

    def get_input_embeddings(self):
        return self.wte

    def set_input_embeddings(self, new_embeddings):
        self.wte = new_embeddings

    @can_return_tuple
    def forward(self, input_ids=None, past_key_values=None, attention_mask=None, token_type_ids=None,
                position_ids=None, inputs_embeds=None, use_cache=None, output_hidden_states=None, **kwargs):
        """attention_mask covers the cached and the new tokens (batch, past + new), as `generate()` passes it.
        With left padding, pass position_ids (generate() derives them from the mask)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.wte(input_ids)
        batch, length = inputs_embeds.shape[:2]
        use_cache = resolve_use_cache(self, use_cache)
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            check_sequence_length(past + length, self.config.n_positions, "n_positions")
            position_ids = torch.arange(past, past + length, device=inputs_embeds.device)[None]
        elif not is_tracing() and int(position_ids.max()) >= self.config.n_positions:
            check_sequence_length(int(position_ids.max()) + 1, self.config.n_positions, "n_positions")
        hidden_states = inputs_embeds + self.wpe(position_ids)
        if token_type_ids is not None:
            hidden_states = hidden_states + self.wte(token_type_ids)
        hidden_states = self.drop(hidden_states)
        static = getattr(past_key_values, "is_compileable", False)  # its keys: every slot, not past + length
        mask = attention_mask_from(attention_mask, batch, length, None if static else past + length)
        cache = past_key_values if not (self.training and is_checkpointing(self)) else None
        output_hidden_states = output_requested(self.config, "output_hidden_states", output_hidden_states)
        hidden_states, all_hidden, attentions = run_layers(self.h, hidden_states, cache, mask,
                                                           output_hidden_states=output_hidden_states, **kwargs)
        hidden_states = self.ln_f(hidden_states)
        if all_hidden is not None:  # GPT-2's: the last one after the final layer norm
            all_hidden = all_hidden[:-1] + (hidden_states,)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states,
                                       past_key_values=past_key_values if use_cache else None,
                                       hidden_states=all_hidden, attentions=attentions)


class FiSHGPT2LMHeadModel(CausalLMHeadMixin, FiSHGPT2PreTrainedModel, GenerationMixin):
    _stock_gpt2_class = "GPT2LMHeadModel"
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config):
        super().__init__(config)
        # transformers names the loss from the class name ("...ForCausalLM"), which this one lacks; Trainer counts a
        # causal LM's num_items_in_batch over the shifted labels only when the loss type says so.
        self.loss_type = "ForCausalLM"
        self.transformer = FiSHGPT2Model(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()


class FiSHGPT2ForSequenceClassification(FiSHGPT2PreTrainedModel):
    _stock_gpt2_class = "GPT2ForSequenceClassification"

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.transformer = FiSHGPT2Model(config)
        self.score = nn.Linear(config.n_embd, config.num_labels, bias=False)
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids=None, past_key_values=None, attention_mask=None, token_type_ids=None,
                position_ids=None, inputs_embeds=None, labels=None, use_cache=None, **kwargs):
        """Classifies from the last real token (GPT-2's rule: the rightmost token that is not padding)."""
        outputs = self.transformer(input_ids, past_key_values=past_key_values, attention_mask=attention_mask,
                                   token_type_ids=token_type_ids, position_ids=position_ids,
                                   inputs_embeds=inputs_embeds, use_cache=use_cache, return_dict=True, **kwargs)
        logits = self.score(outputs.last_hidden_state)
        batch = logits.shape[0]
        if attention_mask is not None and attention_mask.dim() == 2:
            positions = torch.arange(attention_mask.shape[-1], device=logits.device)
            last = (positions * attention_mask.to(logits.device).long()).argmax(-1)
            last = last - (attention_mask.shape[-1] - logits.shape[1])  # the mask may cover cached tokens
        elif input_ids is not None and self.config.pad_token_id is not None:
            positions = torch.arange(input_ids.shape[-1], device=logits.device)
            last = (positions * (input_ids != self.config.pad_token_id).long()).argmax(-1)
        elif batch == 1:
            last = torch.full((1,), logits.shape[1] - 1, device=logits.device)
        else:
            raise ValueError("Cannot find the last token of each row: pass attention_mask or set pad_token_id")
        pooled = logits[torch.arange(batch, device=logits.device), last]
        loss = None
        if labels is not None:
            loss = classification_loss(self.config, pooled, labels, kwargs.get("num_items_in_batch"))
        return SequenceClassifierOutputWithPast(loss=loss, logits=pooled, past_key_values=outputs.past_key_values,
                                                hidden_states=outputs.hidden_states, attentions=outputs.attentions)


__all__ = [
    "FiSHGPT2PreTrainedModel",
    "FiSHGPT2Model",
    "FiSHGPT2LMHeadModel",
    "FiSHGPT2ForSequenceClassification",
]
