"""Validation helpers shared by every configuration: each error names the field and the allowed values.

Standard library only: this file travels next to the remote-code configuration files."""

import logging
import math
import re

# Inherited float fields of the stock configs (BERT / RoBERTa, GPT-2), checked like the family fields: a NaN or
# infinite dropout or epsilon gives NaN outputs far from the field that caused them. (name, low, high).
_PROBABILITIES = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout", "resid_pdrop",
                  "embd_pdrop", "attn_pdrop", "summary_first_dropout", "attention_dropout")
_POSITIVE = ("initializer_range", "layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps")


class ValidatedConfig:
    """Mixin (listed before the transformers config class): the config's `check_fields()` runs on every path that
    makes or saves one. Direct construction runs it from the config's own initialisation, `save_pretrained` before
    writing. `from_pretrained(path, field=value)` (of a model, the config or `AutoConfig`) builds the config from
    config.json and then *sets* the keyword fields as attributes in transformers' `from_dict`, which no
    constructor check sees: so `from_dict` checks again."""

    # The stock model type whose checkpoints this configuration converts (set by each family's configuration).
    _stock_model_type = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("_stock_model_type") and cls.__dict__.get("model_type"):
            _SUPPORTED_CONVERSIONS.add((cls._stock_model_type, cls.model_type))

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        # A stock checkpoint's config.json names its own type ("bert"), which the config would keep as an attribute
        # of its own over the class's: this config is the family's, as to_dict() writes it and the Auto classes,
        # the model card and the exported folder read it.
        self.__dict__.pop("model_type", None)

    def check_fields(self):
        """Check every field of this family (and fill defaults derived from other fields); ValueError naming it."""
        raise NotImplementedError

    def check_inherited_fields(self):
        """The stock config's float fields this config has: probabilities in [0, 1], scales finite and > 0."""
        for name in _PROBABILITIES:
            # classifier_dropout None means "use hidden_dropout_prob" (BERT / RoBERTa)
            if hasattr(self, name) and not (name == "classifier_dropout" and self.classifier_dropout is None):
                check_float_range(name, getattr(self, name), 0, 1)
        for name in _POSITIVE:
            if hasattr(self, name):
                check_float_range(name, getattr(self, name), 0, math.inf, low_inclusive=False)

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


def check_backend(value, attention_type, backends):
    """The `backend` field: "auto" or one of the attention type's exact paths, `backends` {attention_type: names}
    (the names of the attention functions' `backend` argument). The softmax baseline, which has none, accepts
    every name of the family and ignores it, so one config can switch between the baseline and a family type."""
    names = backends.get(attention_type) or sorted({n for group in backends.values() for n in group})
    check_choice(f"backend (for attention_type={attention_type!r})", value, ("auto", *names))


def check_int_range(name, value, low, high=None):
    """low <= value (<= high); bools are rejected, they are ints to Python but never what a user meant."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)
    if not ok:
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an integer {bound}; got {value!r}")


def check_float_range(name, value, low, high, *, low_inclusive=True):
    """A finite number in the range (NaN and +-inf refused, also where high is inf); bools refused."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value >= low if low_inclusive else value > low) and value <= high
    if not ok:
        bracket = "[" if low_inclusive else "("
        upper = f"{high}]" if math.isfinite(high) else "inf)"
        raise ValueError(f"{name} must be a finite number in {bracket}{low}, {upper}; got {value!r}")


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


def check_key_value_heads(num_heads, num_key_value_heads):
    """Grouped-query attention: the key/value heads are a whole divisor of the query heads, each serving a group."""
    check_int_range("num_key_value_heads", num_key_value_heads, 1)
    if num_heads % num_key_value_heads:
        raise ValueError(f"num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads "
                         f"({num_key_value_heads}): each key/value head serves a whole group of query heads")


# transformers warns "You are using a model of type bert to instantiate a model of type mgk-bert ... can yield
# errors" whenever a configuration is read from another model type's config.json. For the stock types a family
# converts, that is the supported warm start, not an accident: the warning is replaced by an info line saying what
# happens. Other mismatches (e.g. a GPT-2 config.json into MGK-BERT) keep transformers' warning.
_SUPPORTED_CONVERSIONS = set()
_MISMATCH = re.compile(r"You are using a model of type `?([\w-]+)`? to instantiate a model of type `?([\w-]+)`?")
_conversion_logger = logging.getLogger("transformers.configuration_conversion")


class _SupportedConversionFilter(logging.Filter):
    def filter(self, record):
        match = _MISMATCH.match(str(record.msg))
        if not match or (match.group(1), match.group(2)) not in _SUPPORTED_CONVERSIONS:
            return True
        stock, ours = match.groups()
        _conversion_logger.info(
            f"Converting a {stock} configuration to {ours}: every {stock} field is kept; the {ours} fields take the "
            f"values passed to from_pretrained or their defaults. The model's from_pretrained converts the weights "
            f"(the kept heads are logged there).")
        return False


def _install_conversion_filter():
    # Each copy of this file (one per remote-code checkpoint folder) adds its own filter, once; a filter drops only
    # the pairs registered through its own copy's configuration classes.
    target = logging.getLogger("transformers.configuration_utils")
    if not any(isinstance(f, _SupportedConversionFilter) for f in target.filters):
        target.addFilter(_SupportedConversionFilter())


_install_conversion_filter()
