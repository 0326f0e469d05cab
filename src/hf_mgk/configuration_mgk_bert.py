"""Configuration of BERT with Mixture-of-Gaussian-Keys attention.

MGK: Nguyen et al., "Improving Transformers with Probabilistic Attention Keys" (ICML 2022, arXiv:2110.08678).
The fixed head size `head_dim`: Bhojanapalli et al., "Low-Rank Bottleneck in Multi-head Attention Models"
(ICML 2020, arXiv:2002.07028)."""

from transformers.models.bert.configuration_bert import BertConfig

# transformers 5.8 and 5.9 copy, from a local folder, only the siblings the config file itself imports: so it
# names every sibling its siblings import, too.
from .config_checks import ValidatedConfig  # noqa: F401
from .configuration_mgk import MGK_ATTENTION_TYPES, MGKConfigMixin  # noqa: F401
from .transformers_compat import ConfigCompat


class MGKBertConfig(MGKConfigMixin, ConfigCompat, BertConfig):
    r"""Every [`BertConfig`] field, plus:

    attention_type (`str`, defaults to `"mgk"`):
        `"softmax"` (stock BERT attention, the baseline), `"mgk"` (M separate key projections, option A),
        `"smgk"` (one key projection plus a learned shift per key, option B), and their linear-attention
        counterparts `"mlk"` / `"smlk"` (mixture of linear keys, phi = elu + 1).
    num_keys (`int`, defaults to 2): M, the keys per position (>= 1; ignored by `"softmax"`).
    e_step (`str`, defaults to `"soft"`): `"soft"` (log-sum-exp over keys) or `"hard"` (max over keys, pi unused).
        The linear types only have the soft form.
    mgk_prior (`str`, defaults to `"learned"`): `"learned"` (softmax of per-head logits, trained by SGD),
        `"em"` (a buffer set in training by the M-step: mean responsibility over valid query/key pairs; each
        training forward's estimate is used from the next forward on, evaluation leaves it alone) or `"uniform"`
        (fixed 1/M).
    mgk_variances (`list[float]`, defaults to `[1, 3]`): sigma_r^2 as multiples of sqrt(head_dim), one per key.
        The paper states [1, 3]; the authors' LM/MT code uses [1, 1/3]. For M > 2 the default is 1, 3, 5, ...
    head_dim (`int`, *optional*): the fixed head size of "concise multi-head attention"; Q, K, V project
        hidden_size -> num_attention_heads * head_dim. `None` means hidden_size / num_attention_heads.
    backend (`str`, defaults to `"auto"`): which exact path computes the attention. `"auto"` picks per call (the
        Triton kernels on a CUDA GPU where they cover the call, else a torch path); `"dense"`, `"sdpa"`,
        `"blocked"` or `"triton"` for `"mgk"` / `"smgk"`, `"dense"` or `"linear"` for `"mlk"` / `"smlk"` force one
        (a call it cannot run is an error naming why). Every path computes the same function.
    """

    model_type = "mgk-bert"
    _stock_model_type = "bert"  # its checkpoints convert (the warm start); see config_checks

    attention_type: str = "mgk"
    num_keys: int = 2
    e_step: str = "soft"
    mgk_prior: str = "learned"
    mgk_variances: list[float] | None = None
    head_dim: int | None = None
    backend: str = "auto"


__all__ = ["MGKBertConfig"]
