"""Configuration of GPT-2 with a Finite Admixture of Shared Heads.

FiSH: Nguyen et al., "Improving Transformer with an Admixture of Attention Heads" (NeurIPS 2022,
openreview.net/forum?id=0VFQhPGF1M3; first circulated as "FiSHformer: Transformer with a Finite Admixture of
Shared Heads"). The fixed head size `head_dim`: Bhojanapalli et al., "Low-Rank Bottleneck in Multi-head Attention
Models" (ICML 2020, arXiv:2002.07028)."""

from transformers.models.gpt2.configuration_gpt2 import GPT2Config

# transformers 5.8 and 5.9 copy, from a local folder, only the siblings the config file itself imports: so it
# names every sibling its siblings import, too.
from .config_checks import ValidatedConfig  # noqa: F401
from .configuration_fish import FISH_ATTENTION_TYPES, FISH_BACKENDS, FISH_MIXING_INITS, FiSHConfigMixin  # noqa: F401
from .transformers_compat import ConfigCompat


class FiSHGPT2Config(FiSHConfigMixin, ConfigCompat, GPT2Config):
    r"""Every [`GPT2Config`] field, plus:

    attention_type (`str`, defaults to `"fish"`):
        `"softmax"` (stock GPT-2 attention, the baseline); `"fish"` (M global score matrices mixed into the H local
        heads by learned weights p_kj, plus Gaussian noise sigma_k in training), `"hard_fish"` (no noise),
        `"gfish"` / `"hard_gfish"` (mixing by a small network M -> H -> H along the head axis, with / without
        noise), `"mish"` (one mixing vector shared by all local heads, with noise).
    num_global_heads (`int`, defaults to 2): M, the global query/key heads; 1 <= M < n_head for the FiSH types.
    head_dim (`int`, *optional*): the fixed head size D of every global and local head; `None` = n_embd / n_head.
    fish_noise_init (`float`, defaults to 0.1): the initial sigma_k of the noisy types.
    fish_mixing_init (`str`, defaults to `"mean"`): how a new model's mixing starts. `"mean"`: every local head
        starts from the mean of the global patterns, p_kj = 1/M plus N(0, initializer_range) noise, and GFiSH's
        network takes PyTorch's default Linear init. `"normal"`: the FiSH authors' language-modelling code, whose
        training script initialises every Linear layer N(0, 0.02) with zero bias: p_kj (and MiSH's p_k) and the
        GFiSH network's weights N(0, initializer_range), its biases 0. Loaded weights are never re-initialised.
    backend (`str`, defaults to `"auto"`): which exact path computes the attention. `"auto"` picks per call (the
        Triton kernels on a CUDA GPU where they cover the call, else a torch path); `"fused"`, `"recomputed"`,
        `"blocked"` or `"triton"` force one (a call it cannot run is an error naming why). Every path computes
        the same function.
    """

    model_type = "fish-gpt2"
    _stock_model_type = "gpt2"  # its checkpoints convert (the warm start); see config_checks
    _size_names = ("n_embd", "n_head")
    _positions_field = "n_positions"

    attention_type: str = "fish"
    num_global_heads: int = 2
    head_dim: int | None = None
    fish_noise_init: float = 0.1
    fish_mixing_init: str = "mean"
    backend: str = "auto"


__all__ = ["FiSHGPT2Config"]
