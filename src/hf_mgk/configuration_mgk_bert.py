"""Configuration of BERT with Mixture-of-Gaussian-Keys attention.

MGK: Nguyen et al., "Improving Transformers with Probabilistic Attention Keys" (ICML 2022, arXiv:2110.08678).
The fixed head size `head_dim`: Bhojanapalli et al., "Low-Rank Bottleneck in Multi-head Attention Models"
(ICML 2020, arXiv:2002.07028)."""

from transformers.models.bert.configuration_bert import BertConfig

from .config_checks import (
    ValidatedConfig,
    check_choice,
    check_head_dim,
    check_int_range,
    check_positive_numbers,
)
from .transformers_compat import ConfigCompat


MGK_ATTENTION_TYPES = ("softmax", "mgk", "smgk", "mlk", "smlk")


class MGKBertConfig(ValidatedConfig, ConfigCompat, BertConfig):
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
    """

    model_type = "mgk-bert"

    attention_type: str = "mgk"
    num_keys: int = 2
    e_step: str = "soft"
    mgk_prior: str = "learned"
    mgk_variances: list[float] | None = None
    head_dim: int | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.check_fields()

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        # The default variances follow num_keys: a num_keys given when loading a checkpoint that has no variances (a
        # stock BERT) gets the default for it. Variances a saved MGK config holds are kept (then checked).
        if "num_keys" in kwargs and "mgk_variances" not in kwargs and config_dict.get("mgk_variances") is None:
            kwargs["mgk_variances"] = None
        return super().from_dict(config_dict, **kwargs)

    def check_fields(self):
        check_choice("attention_type", self.attention_type, MGK_ATTENTION_TYPES)
        check_int_range("num_keys", self.num_keys, 1)
        check_choice("e_step", self.e_step, ("soft", "hard"))
        check_choice("mgk_prior", self.mgk_prior, ("learned", "em", "uniform"))
        check_head_dim(self.hidden_size, self.num_attention_heads, self.head_dim)
        check_int_range("max_position_embeddings", self.max_position_embeddings, 1)
        if self.attention_type in ("mlk", "smlk") and self.e_step == "hard":
            raise ValueError(
                f"e_step='hard' is not defined for attention_type={self.attention_type!r}: mixtures of linear keys "
                "use the soft (weighted-sum) form; use e_step='soft' or a Gaussian type ('mgk' / 'smgk')"
            )
        if self.mgk_variances is None:
            self.mgk_variances = [1.0 + 2.0 * r for r in range(self.num_keys)]
        check_positive_numbers("mgk_variances", self.mgk_variances)
        if len(self.mgk_variances) != self.num_keys:
            raise ValueError(
                f"mgk_variances must have num_keys={self.num_keys} entries (one sigma^2 / sqrt(head_dim) per key), "
                f"got {len(self.mgk_variances)}: {self.mgk_variances}"
            )
        self.mgk_variances = [float(v) for v in self.mgk_variances]  # numbers only (checked), saved as floats

    @property
    def attention_head_size(self) -> int:
        """The head size actually used: `head_dim`, or hidden_size / num_attention_heads."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads


__all__ = ["MGKBertConfig"]
