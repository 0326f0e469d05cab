"""What every stack with FiSH attention shares (FiSH-GPT2's decoder, FiSH-Llama's): the mixing and noise weights
of an attention layer, the call of the attention itself on its global queries and keys and local values, and their
initialisation.

FiSH: Nguyen et al., "Improving Transformer with an Admixture of Attention Heads" (NeurIPS 2022,
openreview.net/forum?id=0VFQhPGF1M3): M global query/key heads give M score matrices; each of the H local heads
attends with a mixture of them (Eqn. 9-12) over its own value head. The math lives in `attention_fish.py`.
Imports torch, transformers and siblings only (remote code)."""

import math

import torch
from torch import nn

from .attention_fish import fish_attention, make_gfish_mixing
from .modeling_common import is_full_mask, parent_of, softmax_attention
from .transformers_compat import init


class FiSHAttentionCore(nn.Module):
    """What a FiSH self-attention holds besides its projections: the mixing (p_kj of FiSH / hard FiSH, MiSH's p_k,
    or GFiSH's network) and the noise scales sigma_k of the noisy types. `attend` runs the attention: softmax over
    the H heads for the baseline, else FiSH over M global query/key heads and H local value heads.

    num_heads: H, the local (value) heads; num_qk_heads: M (H for the softmax baseline)."""

    def __init__(self, config, num_heads, num_qk_heads, head_dim, scaling, dropout_p):
        super().__init__()
        self.config = config
        self.attention_type = config.attention_type
        self.is_causal = True
        self.num_heads = num_heads
        self.num_qk_heads = num_qk_heads
        self.head_dim = head_dim
        self.scaling = scaling
        self.attn_dropout = nn.Dropout(dropout_p)
        m, h = num_qk_heads, num_heads
        if self.attention_type in ("fish", "hard_fish"):
            self.mixing = nn.Parameter(torch.full((m, h), 1.0 / m))  # p_kj
        elif self.attention_type == "mish":
            self.mixing = nn.Parameter(torch.full((m, 1), 1.0 / m))  # p_k, shared by all local heads
        elif self.attention_type in ("gfish", "hard_gfish"):
            self.mixing = make_gfish_mixing(m, h)
        if config.is_noisy:
            self.noise_std = nn.Parameter(torch.full((m,), float(config.fish_noise_init)))  # sigma_k

    def attend(self, query, key, value, attention_mask, return_weights):
        """query, key (B, M, N or S, D), value (B, H, S, D) (the softmax baseline: H query heads, and keys and
        values with as many heads); attention_mask: see `attention_masks.allowed_pairs`. Returns (output
        (B, H, N, D), weights or None)."""
        dropout_p = self.attn_dropout.p if self.training else 0.0
        if self.attention_type == "softmax":
            return softmax_attention(self, query, key, value, attention_mask, dropout_p=dropout_p,
                                     scale=self.scaling, return_weights=return_weights)
        # Evaluation is deterministic: the noise is a training-time regulariser (the authors' LM code adds it at
        # evaluation too).
        noise = self.noise_std if self.training and hasattr(self, "noise_std") else None
        res = fish_attention(query, key, value, self.mixing, scale=self.scaling, noise_std=noise,
                             attention_mask=attention_mask, is_causal=not is_full_mask(attention_mask),
                             return_weights=return_weights, dropout_p=dropout_p, backend=self.config.backend)
        return res if return_weights else (res, None)


def init_fish_weights(model, module):
    """FiSH's own weights, from a model's `_init_weights` (after its generic rules). `fish_mixing_init` "mean":
    every local head starts from the mean of the global patterns (p_kj = 1/M) slightly perturbed so heads differ,
    and GFiSH's network takes PyTorch's default Linear init (the 0.02-normal init shrinks every mixed score ~100x
    at the start); "normal": what the authors' LM training script gives every Linear layer, N(0, std) and zero
    biases."""
    std = model.config.initializer_range
    authors = getattr(model.config, "fish_mixing_init", "mean") == "normal"
    if isinstance(module, nn.Linear) and isinstance(parent_of(model, parent_of(model, module)), FiSHAttentionCore):
        if authors:  # GFiSH's mixing network
            init.normal_(module.weight, mean=0.0, std=std)
            init.zeros_(module.bias)
        else:
            bound = 1.0 / math.sqrt(module.in_features)
            init.uniform_(module.weight, -bound, bound)
            init.uniform_(module.bias, -bound, bound)
    elif isinstance(module, FiSHAttentionCore):
        if isinstance(getattr(module, "mixing", None), nn.Parameter):
            m = module.num_qk_heads
            start = torch.zeros_like(module.mixing) if authors else torch.full_like(module.mixing, 1.0 / m)
            init.copy_(module.mixing, start + std * torch.randn_like(module.mixing))
        if hasattr(module, "noise_std"):
            init.constant_(module.noise_std, float(model.config.fish_noise_init))


__all__ = ["FiSHAttentionCore", "init_fish_weights"]
