"""The MGK fields of a configuration, checked by one code for every stack that carries MGK attention (MGK-BERT's
encoder, MGK-GPT2's decoder).

MGK: Nguyen et al., "Improving Transformers with Probabilistic Attention Keys" (ICML 2022, arXiv:2110.08678).
Standard library and siblings only: this file travels next to the remote-code configuration files."""

from .config_checks import (ValidatedConfig, check_backend, check_choice, check_head_dim, check_int_range,
                            check_positive_numbers)

MGK_ATTENTION_TYPES = ("softmax", "mgk", "smgk", "mlk", "smlk")
# The `backend` field's names per type: the `backend` argument of mgk_attention / smgk_attention and mlk_attention.
MGK_BACKENDS = {"mgk": ("dense", "sdpa", "blocked", "triton"), "smgk": ("dense", "sdpa", "blocked", "triton"),
                "mlk": ("dense", "linear"), "smlk": ("dense", "linear")}


class MGKConfigMixin(ValidatedConfig):
    """List first among a configuration's bases. The configuration class declares the fields itself (each
    transformers release builds its config classes from their own annotations):

        attention_type: str = "mgk"; num_keys: int = 2; e_step: str = "soft"; mgk_prior: str = "learned";
        mgk_variances: list[float] | None = None; head_dim: int | None = None; backend: str = "auto"

    `_size_names`: the configuration's own names of the hidden size and the head count (GPT-2: n_embd, n_head),
    used in error messages; `_positions_field`: its absolute-position limit."""

    _size_names = ("hidden_size", "num_attention_heads")
    _positions_field = "max_position_embeddings"

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.check_fields()

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        # The default variances follow num_keys: a num_keys given when loading a checkpoint that has no variances (a
        # stock BERT or GPT-2) gets the default for it. Variances a saved MGK config holds are kept (then checked).
        if "num_keys" in kwargs and "mgk_variances" not in kwargs and config_dict.get("mgk_variances") is None:
            kwargs["mgk_variances"] = None
        return super().from_dict(config_dict, **kwargs)

    def check_fields(self):
        check_choice("attention_type", self.attention_type, MGK_ATTENTION_TYPES)
        self.check_inherited_fields()
        check_int_range("num_keys", self.num_keys, 1)
        check_choice("e_step", self.e_step, ("soft", "hard"))
        check_choice("mgk_prior", self.mgk_prior, ("learned", "em", "uniform"))
        check_backend(self.backend, self.attention_type, MGK_BACKENDS)
        hidden, heads = self._size_names
        check_head_dim(getattr(self, hidden), getattr(self, heads), self.head_dim, names=self._size_names)
        check_int_range(self._positions_field, getattr(self, self._positions_field), 1)
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
        """The head size actually used: `head_dim`, or the hidden size / the head count."""
        hidden, heads = self._size_names
        return self.head_dim if self.head_dim is not None else getattr(self, hidden) // getattr(self, heads)


__all__ = ["MGK_ATTENTION_TYPES", "MGK_BACKENDS", "MGKConfigMixin"]
