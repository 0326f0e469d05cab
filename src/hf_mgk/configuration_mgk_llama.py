"""Configuration of a Llama-architecture decoder (rotary positions, grouped-query attention, RMSNorm, SwiGLU) with
Mixture-of-Gaussian-Keys attention.

MGK: Nguyen et al., "Improving Transformers with Probabilistic Attention Keys" (ICML 2022, arXiv:2110.08678).
Neither the paper nor its code puts MGK on this stack: a new combination, not a reproduction."""

from transformers.models.llama.configuration_llama import LlamaConfig

# transformers 5.8 and 5.9 copy, from a local folder, only the siblings the config file itself imports: so it
# names every sibling its siblings import, too.
from .config_checks import ValidatedConfig, check_key_value_heads  # noqa: F401
from .configuration_mgk import MGK_ATTENTION_TYPES, MGKConfigMixin  # noqa: F401
from .transformers_compat import ConfigCompat, RopeCompat


class MGKLlamaConfig(MGKConfigMixin, ConfigCompat, RopeCompat, LlamaConfig):
    r"""Every [`LlamaConfig`] field (rotary positions with its `rope_scaling` / `rope_parameters` types,
    `num_key_value_heads`, `head_dim`, `attention_bias`, `attention_dropout`, ...), plus the MGK fields of
    `MGKBertConfig`, checked by the same code:

    attention_type (`str`, defaults to `"mgk"`): `"softmax"` (stock Llama attention, the baseline), `"mgk"` (M
        separate key projections: `k_proj` the first, `extra_keys` the others), `"smgk"` (one key projection plus
        a learned shift per key), `"mlk"` / `"smlk"` (their mixture-of-linear-keys counterparts). Every type is
        causal.
    num_keys (`int`, defaults to 2): M, the keys per position (ignored by `"softmax"`).
    e_step (`str`, defaults to `"soft"`), mgk_prior (`str`, defaults to `"learned"`), mgk_variances
        (`list[float]`, defaults to `[1, 3]`), backend (`str`, defaults to `"auto"`): as in `MGKGPT2Config`.

    Grouped-query attention groups the keys and the values: each of the `num_key_value_heads` heads holds M keys
    and one value per position, shared by its group of query heads (the shifts of `"smgk"` too). Rotary positions
    rotate the queries and every one of the M keys (for `"smgk"` the shifted keys k_j + b_r, so its cache holds
    the M rotated keys, as `"mgk"`'s does).
    """

    model_type = "mgk-llama"
    _stock_model_type = "llama"  # its checkpoints convert (the warm start); see config_checks
    # No tensor- or pipeline-parallel plan: LlamaConfig's shards Llama's own projections by heads, which this
    # family's attention lays out otherwise.
    base_model_tp_plan = None
    base_model_pp_plan = None

    attention_type: str = "mgk"
    num_keys: int = 2
    e_step: str = "soft"
    mgk_prior: str = "learned"
    mgk_variances: list[float] | None = None
    backend: str = "auto"

    def check_fields(self):
        super().check_fields()
        check_key_value_heads(self.num_attention_heads, self.num_key_value_heads)


__all__ = ["MGKLlamaConfig"]
