"""The FiSH fields of a configuration, checked by one code for every stack that carries FiSH attention (FiSH-GPT2's
decoder, FiSH-Llama's).

FiSH: Nguyen et al., "Improving Transformer with an Admixture of Attention Heads" (NeurIPS 2022,
openreview.net/forum?id=0VFQhPGF1M3; first circulated as "FiSHformer: Transformer with a Finite Admixture of
Shared Heads"). Standard library and siblings only: this file travels next to the remote-code configuration
files."""

from .config_checks import (ValidatedConfig, check_backend, check_choice, check_float_range, check_head_dim,
                            check_int_range)

FISH_ATTENTION_TYPES = ("softmax", "fish", "hard_fish", "gfish", "hard_gfish", "mish")
FISH_MIXING_INITS = ("mean", "normal")
# The `backend` field's names: fish_attention's `backend` argument.
FISH_BACKENDS = ("fused", "recomputed", "blocked", "triton")


class FiSHConfigMixin(ValidatedConfig):
    """List first among a configuration's bases. The configuration class declares the fields itself (each
    transformers release builds its config classes from their own annotations):

        attention_type: str = "fish"; num_global_heads: int = 2; fish_noise_init: float = 0.1;
        fish_mixing_init: str = "mean"; backend: str = "auto" (and head_dim where the stock config lacks it)

    `_size_names`: the configuration's own names of the hidden size and the head count (GPT-2: n_embd, n_head);
    `_positions_field`: its position limit; `_all_global_heads`: whether the global heads may be as many as the
    local heads (M = H: a stock model converted head for head), else 1 <= M < H as in the paper."""

    _size_names = ("hidden_size", "num_attention_heads")
    _positions_field = "max_position_embeddings"
    _all_global_heads = False

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.check_fields()

    def check_fields(self):
        check_choice("attention_type", self.attention_type, FISH_ATTENTION_TYPES)
        self.check_inherited_fields()
        hidden, heads = self._size_names
        num_heads = getattr(self, heads)
        check_head_dim(getattr(self, hidden), num_heads, self.head_dim, names=self._size_names)
        check_int_range(self._positions_field, getattr(self, self._positions_field), 1)
        if self.attention_type != "softmax":
            most = num_heads if self._all_global_heads else num_heads - 1
            if most < 1:
                raise ValueError(f"attention_type={self.attention_type!r} needs {heads} >= 2 local heads; got "
                                 f"{num_heads}")
            check_int_range("num_global_heads", self.num_global_heads, 1, most)
        else:
            check_int_range("num_global_heads", self.num_global_heads, 1)  # unused by softmax, but saved
        check_float_range("fish_noise_init", self.fish_noise_init, 0, float("inf"))
        check_choice("fish_mixing_init", self.fish_mixing_init, FISH_MIXING_INITS)
        check_backend(self.backend, self.attention_type, {t: FISH_BACKENDS for t in FISH_ATTENTION_TYPES[1:]})

    @property
    def attention_head_size(self) -> int:
        """The head size actually used: `head_dim`, or the hidden size / the head count."""
        hidden, heads = self._size_names
        return self.head_dim if self.head_dim is not None else getattr(self, hidden) // getattr(self, heads)

    @property
    def is_noisy(self) -> bool:
        return self.attention_type in ("fish", "gfish", "mish")


__all__ = ["FISH_ATTENTION_TYPES", "FISH_BACKENDS", "FISH_MIXING_INITS", "FiSHConfigMixin"]
