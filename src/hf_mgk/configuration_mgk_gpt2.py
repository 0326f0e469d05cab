"""Configuration of GPT-2 with Mixture-of-Gaussian-Keys attention (causal language modeling, as in the MGK paper's
WikiText-103 experiments).

MGK: Nguyen et al., "Improving Transformers with Probabilistic Attention Keys" (ICML 2022, arXiv:2110.08678).
The fixed head size `head_dim`: Bhojanapalli et al., "Low-Rank Bottleneck in Multi-head Attention Models"
(ICML 2020, arXiv:2002.07028)."""

from transformers.models.gpt2.configuration_gpt2 import GPT2Config

# transformers 5.8 and 5.9 copy, from a local folder, only the siblings the config file itself imports: so it
# names every sibling its siblings import, too.
from .config_checks import ValidatedConfig  # noqa: F401
from .configuration_mgk import MGK_ATTENTION_TYPES, MGKConfigMixin  # noqa: F401
from .transformers_compat import ConfigCompat


class MGKGPT2Config(MGKConfigMixin, ConfigCompat, GPT2Config):
    r"""Every [`GPT2Config`] field, plus the MGK fields of `MGKBertConfig` (checked by the same code):

    attention_type (`str`, defaults to `"mgk"`): `"softmax"` (stock GPT-2 attention, the baseline), `"mgk"` (M
        separate key projections), `"smgk"` (one key projection plus a learned shift per key), `"mlk"` / `"smlk"`
        (their mixture-of-linear-keys counterparts, phi = elu + 1). Every type is causal.
    num_keys (`int`, defaults to 2): M, the keys per position (ignored by `"softmax"`).
    e_step (`str`, defaults to `"soft"`): `"soft"` (log-sum-exp over keys) or `"hard"` (max over keys, pi unused).
    mgk_prior (`str`, defaults to `"learned"`): `"learned"`, `"em"` (M-step estimate of a training forward, used
        from the next forward on, so no token sees later tokens through it) or `"uniform"`.
    mgk_variances (`list[float]`, defaults to `[1, 3]`): sigma_r^2 as multiples of sqrt(head_dim), one per key.
    head_dim (`int`, *optional*): the fixed head size; Q, K, V project n_embd -> n_head * head_dim. `None` means
        n_embd / n_head.
    backend (`str`, defaults to `"auto"`): which exact path computes the attention. `"auto"` picks per call (the
        Triton kernels on a CUDA GPU where they cover the call, else a torch path); `"dense"`, `"sdpa"`,
        `"blocked"` or `"triton"` for `"mgk"` / `"smgk"`, `"dense"` or `"linear"` for `"mlk"` / `"smlk"` force one
        (a call it cannot run is an error naming why). Every path computes the same function.

    GPT-2's `scale_attn_weights` and `scale_attn_by_inverse_layer_idx` apply to the softmax baseline; the MGK
    types' scores are scaled by their variances.
    """

    model_type = "mgk-gpt2"
    _stock_model_type = "gpt2"  # its checkpoints convert (the warm start); see config_checks
    _size_names = ("n_embd", "n_head")
    _positions_field = "n_positions"

    attention_type: str = "mgk"
    num_keys: int = 2
    e_step: str = "soft"
    mgk_prior: str = "learned"
    mgk_variances: list[float] | None = None
    head_dim: int | None = None
    backend: str = "auto"


__all__ = ["MGKGPT2Config"]
