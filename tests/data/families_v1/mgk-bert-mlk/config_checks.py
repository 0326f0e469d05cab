"""Validation helpers shared by every configuration: each error names the field and the allowed values.

Standard library only: this file travels next to the remote-code configuration files."""

import math


class ValidatedConfig:
    """Mixin (listed before the transformers config class): the config's `check_fields()` runs on every path that
    makes or saves one. Direct construction runs it from the config's own initialisation, `save_pretrained` before
    writing. `from_pretrained(path, field=value)` (of a model, the config or `AutoConfig`) builds the config from
    config.json and then *sets* the keyword fields as attributes in transformers' `from_dict`, which no
    constructor check sees: so `from_dict` checks again."""

    def check_fields(self):
        """Check every field of this family (and fill defaults derived from other fields); ValueError naming it."""
        raise NotImplementedError

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        if "num_attention_heads" in kwargs and kwargs.get("head_dim", config_dict.get("head_dim")) is None:
            # A new head count given when loading a checkpoint keeps its head size, as the model's warm start with
            # fewer heads does (modeling_warm_start.py): the new count need not divide the hidden size.
            saved = cls(**dict(config_dict))
            if kwargs["num_attention_heads"] != saved.num_attention_heads:
                kwargs["head_dim"] = saved.attention_head_size
        made = super().from_dict(config_dict, **kwargs)
        (made[0] if isinstance(made, tuple) else made).check_fields()  # a tuple with return_unused_kwargs=True
        return made

    def save_pretrained(self, save_directory, *args, **kwargs):
        self.check_fields()  # a field set by hand after construction: never write a config.json that cannot load
        return super().save_pretrained(save_directory, *args, **kwargs)


def check_choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}; got {value!r}")


def check_int_range(name, value, low, high=None):
    """low <= value (<= high); bools are rejected, they are ints to Python but never what a user meant."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)
    if not ok:
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an integer {bound}; got {value!r}")


def check_float_range(name, value, low, high, *, low_inclusive=True):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (value >= low if low_inclusive else value > low) and value <= high
    if not ok:
        bracket = "[" if low_inclusive else "("
        raise ValueError(f"{name} must be a number in {bracket}{low}, {high}]; got {value!r}")


def check_positive_numbers(name, values):
    """A list of finite numbers > 0. Ints and floats only: strings and bools are refused, not converted."""
    ok = isinstance(values, (list, tuple)) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in values)
    if not ok:
        raise ValueError(f"{name} must be a list of finite numbers > 0; got {values!r}")


def check_bool(name, value):
    """Only True / False: 1 == True in Python, so `check_choice(..., (True, False))` would let 1 and 0 through."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False; got {value!r}")


def check_head_dim(hidden_size, num_heads, head_dim, names=("hidden_size", "num_attention_heads")):
    """`head_dim=None` needs hidden_size divisible by the heads; an explicit head size frees that constraint.

    `names`: the config's own names for the hidden size and the head count (GPT-2: n_embd, n_head)."""
    hidden_name, heads_name = names
    check_int_range(hidden_name, hidden_size, 1)
    check_int_range(heads_name, num_heads, 1)
    if head_dim is None:
        if hidden_size % num_heads != 0:
            raise ValueError(
                f"{hidden_name} ({hidden_size}) is not a multiple of {heads_name} ({num_heads}); "
                "set head_dim to use a fixed head size instead"
            )
    else:
        check_int_range("head_dim", head_dim, 1)
