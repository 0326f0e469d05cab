"""The MGK self-attention's HF glue shared by every stack that carries it (MGK-BERT's encoder, MGK-GPT2's
decoder): the prior pi (learned, EM or uniform), the variances, the choice of kernel per attention type, and the
initialisation of MGK's own weights. Each stack's attention class adds only its projections (BERT's `query` /
`key` / `value` Linears, GPT-2's fused `c_attn` Conv1D) and, for the decoder, the KV cache.

Nguyen et al., "Improving Transformers with Probabilistic Attention Keys" (ICML 2022, arXiv:2110.08678): Eq. 7
(the MGK attention), Eq. 8 (the M-step for pi), Sec. 2.3 (options A and B for the keys, the fixed variances),
Sec. 2.4 (mixtures of linear keys). The math lives in `attention_mgk.py`.
Imports torch, transformers and siblings only (remote code)."""

import math

import torch
from torch import nn

from transformers.pytorch_utils import Conv1D

from .attention_mgk import mgk_attention, mgk_responsibility_totals, mlk_attention, smgk_attention
from .modeling_common import gathered, is_full_mask, parent_of, softmax_attention
from .transformers_compat import init

# Option A of the paper (Sec. 2.3): keys 2..M have projections of their own (`extra_keys`).
SEPARATE_KEY_TYPES = ("mgk", "mlk")


def _data_parallel():
    """Whether this process is one of several ranks (torch.distributed initialised, world size > 1)."""
    return (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1)


class MGKAttentionCore(nn.Module):
    """What an MGK self-attention holds besides its projections: `key_shift` (sMGK / sMLK, option B: k_jr = k_j +
    b_r), `prior_logits` (learned pi) or the `prior` buffer (EM), and the variances sigma_r^2.

    Keys travel in their stored form (what a KV cache keeps of a position): option A (`mgk`, `mlk`) the M keys
    (B, H, M, S, D); option B (`smgk`, `smlk`) the one key (B, H, S, D), the shifts being weights. `attend` runs
    the kernel the attention type names.

    The EM prior is lagged: a training forward uses the pi in `prior` when it began, and its M-step (from this
    forward's responsibilities) replaces `prior` for the next forward. The model announces each training
    forward by calling `begin_training_forward()` on every attention module before its layers run."""

    def __init__(self, config, num_heads, head_dim, is_causal, dropout_p, key_heads=None):
        """key_heads: the heads holding keys (grouped-query attention: fewer than the query heads, each serving a
        group), which own sMGK's shifts; default num_heads."""
        super().__init__()
        self.config = config
        self.dropout = nn.Dropout(dropout_p)  # on the attention probabilities a_ij
        self.attention_type = config.attention_type
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.is_causal = is_causal
        self.num_keys = config.num_keys if config.attention_type != "softmax" else 1
        if self.attention_type in ("smgk", "smlk"):
            self.key_shift = nn.Parameter(torch.zeros(key_heads or num_heads, self.num_keys, head_dim))
        uses_prior = self.attention_type != "softmax" and not (self.is_gaussian and config.e_step == "hard")
        self.prior_type = config.mgk_prior if uses_prior else None
        if self.prior_type == "learned":
            self.prior_logits = nn.Parameter(torch.zeros(num_heads, self.num_keys))
        elif self.prior_type == "em":
            self.register_buffer("prior", torch.full((num_heads, self.num_keys), 1.0 / self.num_keys))
            self._prior_in_use = None  # the pi of the running training forward (see begin_training_forward)
            self._m_step_due = False
        # sigma_r^2 are fixed multiples of sqrt(D) (Sec. 2.3: "we fix the variance ... to sqrt(D)").
        self.variances = [v * math.sqrt(head_dim) for v in config.mgk_variances[: self.num_keys]]

    @property
    def is_gaussian(self):
        return self.attention_type in ("mgk", "smgk")

    @property
    def has_extra_keys(self):
        """Option A: keys 2..M have projections of their own (`extra_keys`)."""
        return self.attention_type in SEPARATE_KEY_TYPES

    @torch.no_grad()
    def begin_training_forward(self):
        """Once per training forward of the model, before its layers run (as NPRF's feature redraw).

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

    def all_keys(self, keys):
        """(B, H, M, S, D) from the stored form."""
        return keys if self.has_extra_keys else keys[:, :, None] + self.key_shift[None, :, :, None, :]

    @torch.no_grad()
    def _m_step(self, query, all_keys, attention_mask, is_causal):
        """Eq. 8's pi from this forward's finite responsibilities (E-step with the pi in use) into `prior`; heads
        without any finite pair (one non-finite row cannot turn the prior to NaN) keep their pi.

        Under data parallelism (torch.distributed initialised with more than one rank: DDP, FSDP, DeepSpeed) each
        rank holds a shard of the batch: the responsibilities' sums and pair counts are summed over the ranks
        (one all-reduce of H * (M + 1) numbers per layer), so every rank's pi is the whole batch's, as in one
        process. Every rank must then run the training forward, as data parallelism does anyway."""
        self._m_step_due = False
        total, pairs = mgk_responsibility_totals(query, all_keys, variances=self.variances,
                                                 log_prior=self.log_prior(), attention_mask=attention_mask,
                                                 is_causal=is_causal)
        if _data_parallel():
            both = torch.cat([total, pairs], dim=-1)
            torch.distributed.all_reduce(both)
            total, pairs = both[:, :-1], both[:, -1:]
        pi = total / pairs
        self.prior.copy_(torch.where(torch.isfinite(pi).all(-1, keepdim=True), pi, self.prior.float()))

    def attend(self, query, keys, value, attention_mask, return_weights, scale=None, every_key=False):
        """query (B, H, N, D), keys in their stored form (the softmax baseline: (B, H, S, D)), value (B, H, S, Dv);
        attention_mask: None, bool (B, S) or a caller's whole (B, 1, N, S) mask. Returns (output (B, H, N, Dv),
        weights or None). `scale`: the softmax baseline's score scale (None = 1/sqrt(D)).

        every_key: the keys are all M of every position already, (B, H, M, S, D), whatever the type (a stack that
        transforms each key, as rotary positions do, makes option B's shifted keys itself)."""
        dropout_p = self.dropout.p if self.training else 0.0
        if self.attention_type == "softmax":
            return softmax_attention(self, query, keys, value, attention_mask, dropout_p=dropout_p, scale=scale,
                                     return_weights=return_weights)
        is_causal = self.is_causal and not is_full_mask(attention_mask)
        shifted_in_kernel = self.attention_type == "smgk" and not every_key  # q.k once for all M shifted keys
        whole = None if shifted_in_kernel else keys if every_key else self.all_keys(keys)
        if self.prior_type == "em" and self.training and self._m_step_due:
            self._m_step(query, self.all_keys(keys) if whole is None else whole, attention_mask, is_causal)
        kw = dict(log_prior=self.log_prior(), attention_mask=attention_mask, is_causal=is_causal,
                  return_weights=return_weights, backend=self.config.backend)
        if shifted_in_kernel:
            res = smgk_attention(query, keys, self.key_shift, value, variances=self.variances,
                                 e_step=self.config.e_step, dropout_p=dropout_p, **kw)
        elif self.is_gaussian:
            res = mgk_attention(query, whole, value, variances=self.variances, e_step=self.config.e_step,
                                dropout_p=dropout_p, **kw)
        else:
            res = mlk_attention(query, whole, value, **kw)
        out, weights = res if return_weights else (res, None)
        if not self.is_gaussian and dropout_p > 0:
            # Linear attention has no probability matrix to drop: drop on the output instead.
            out = nn.functional.dropout(out, p=dropout_p)
        return out, weights

    def first_key_parameters(self):
        """(weight, bias): the first key projection laid out as each of `extra_keys` (option A's keys 2..M)."""
        raise NotImplementedError

    def first_key_module(self):
        """The module whose parameters hold the first key projection (read by `first_key_parameters`)."""
        raise NotImplementedError


def init_mgk_weights(model, module):
    """MGK's own weights, from a model's `_init_weights` (after its generic rules): the shifts and prior of an MGK
    attention, and its extra keys (which are initialised when they themselves are: see `parent_of`)."""
    std = model.config.initializer_range
    if isinstance(module, MGKAttentionCore):
        if hasattr(module, "key_shift"):
            # sMGK (the paper's option B, Sec. 2.3): k_jr = k_j + b_r; b_1 = 0, the other shifts small random.
            shift = torch.randn_like(module.key_shift) * std
            shift[:, 0] = 0
            init.copy_(module.key_shift, shift)
        if hasattr(module, "prior_logits"):
            init.zeros_(module.prior_logits)  # uniform pi
        if module.prior_type == "em":
            init.constant_(module.prior, 1.0 / module.num_keys)
        return
    holder = parent_of(model, module)
    attention = parent_of(model, holder) if isinstance(holder, nn.ModuleList) else None
    if isinstance(attention, MGKAttentionCore) and holder is getattr(attention, "extra_keys", None):
        # A stock checkpoint brings the first key but no extra keys: start them from that key plus small noise, so
        # the pretrained attention pattern survives and the keys can still separate (identical keys under the hard
        # E-step would give the second one no gradient). (Tensors loaded from a checkpoint are flagged
        # `_is_hf_initialized` on transformers 5; 4.x keeps no such flag, so there they keep the default init.)
        source = attention.first_key_module()
        if not getattr(source.weight, "_is_hf_initialized", False):
            return  # nothing loaded to start from (checked before gathering: a model being built has no checkpoint)
        with gathered(source.parameters()):
            weight, bias = attention.first_key_parameters()
            init.copy_(module.weight, extra_key_start(weight, std))
            if module.bias is not None:  # (Llama's projections have none unless attention_bias)
                init.copy_(module.bias, bias)




def extra_key_start(first_key_weight, std):
    """The weight an extra key (option A's keys 2..M) starts from when a checkpoint brings only the first key: that
    key plus noise of a tenth of the init scale (the bias is the first key's)."""
    return first_key_weight + std * 0.1 * torch.randn_like(first_key_weight)


def plain_projections(*modules):
    """Whether each projection is a bare nn.Linear / Conv1D without hooks, whose weights can be concatenated into
    one product. A projection wrapped by anything (a peft LoRA layer, a forward hook, a quantised layer) must run
    its own forward instead, or the wrapper would be bypassed silently."""
    return all(type(m) in (nn.Linear, Conv1D) and not m._forward_hooks and not m._forward_pre_hooks for m in modules)


__all__ = ["SEPARATE_KEY_TYPES", "MGKAttentionCore", "extra_key_start", "init_mgk_weights", "plain_projections"]
