"""Configuration of a Llama-architecture decoder (rotary positions, grouped-query attention, RMSNorm, SwiGLU) with
a Finite Admixture of Shared Heads.

FiSH: Nguyen et al., "Improving Transformer with an Admixture of Attention Heads" (NeurIPS 2022,
openreview.net/forum?id=0VFQhPGF1M3). Neither the paper nor its code puts FiSH on this stack: a new combination,
not a reproduction."""

from transformers.models.llama.configuration_llama import LlamaConfig

# transformers 5.8 and 5.9 copy, from a local folder, only the siblings the config file itself imports: so it
# names every sibling its siblings import, too.
from .config_checks import ValidatedConfig, check_key_value_heads  # noqa: F401
from .configuration_fish import FISH_ATTENTION_TYPES, FiSHConfigMixin  # noqa: F401
from .transformers_compat import ConfigCompat, RopeCompat


class FiSHLlamaConfig(FiSHConfigMixin, ConfigCompat, RopeCompat, LlamaConfig):
    r"""Every [`LlamaConfig`] field (rotary positions with its `rope_scaling` / `rope_parameters` types,
    `num_key_value_heads`, `head_dim`, `attention_bias`, `attention_dropout`, ...), plus the FiSH fields of
    `FiSHGPT2Config`:

    attention_type (`str`, defaults to `"fish"`): `"softmax"` (stock Llama attention, the baseline), `"fish"`,
        `"hard_fish"`, `"gfish"`, `"hard_gfish"` or `"mish"`.
    num_global_heads (`int`, defaults to 2): M, the global query/key heads (`q_proj` and `k_proj` project to M
        heads), 1 <= M <= num_attention_heads (M equal to it: a stock model converted head for head).
    fish_noise_init, fish_mixing_init, backend: as in `FiSHGPT2Config`.

    The H = `num_attention_heads` local heads read the `num_key_value_heads` value heads by groups, as grouped-query
    attention's query heads do: local head j reads value head j // (H / num_key_value_heads). Rotary positions
    rotate the M global queries and keys. The cache holds the M global keys and the value heads.
    """

    model_type = "fish-llama"
    _stock_model_type = "llama"  # its checkpoints convert (the warm start); see config_checks
    # No tensor- or pipeline-parallel plan: LlamaConfig's shards Llama's own projections by heads, which this
    # family's attention lays out otherwise.
    base_model_tp_plan = None
    base_model_pp_plan = None
    _all_global_heads = True

    attention_type: str = "fish"
    num_global_heads: int = 2
    fish_noise_init: float = 0.1
    fish_mixing_init: str = "mean"
    backend: str = "auto"

    def check_fields(self):
        super().check_fields()
        check_key_value_heads(self.num_attention_heads, self.num_key_value_heads)


__all__ = ["FiSHLlamaConfig"]
