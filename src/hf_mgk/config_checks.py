"""Validation helpers shared by every configuration: each error names the field and the allowed values.

Standard library only: this file travels next to the remote-code configuration files."""


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
