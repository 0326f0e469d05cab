"""What differs between the transformers releases a published checkpoint must load on: 4.57 (the last v4) and
every 5.x. Each difference is settled here once, by a feature test, so the model and configuration files use one
form. Everything else they use is API that all of these releases share.

Imports torch, transformers and nothing else (remote code)."""

import dataclasses
import inspect
import types

import torch

try:  # 5.x
    from transformers import PreTrainedConfig
except ImportError:  # 4.x spells it PretrainedConfig
    from transformers import PretrainedConfig as PreTrainedConfig


if dataclasses.is_dataclass(PreTrainedConfig):

    class ConfigCompat:
        """Nothing to add on transformers 5: every config class is made a dataclass whose `__init__` sets the
        annotated fields (the family's own included) and then calls `__post_init__`."""

else:

    class ConfigCompat:
        """transformers 4: configs are plain classes built by `__init__(**kwargs)`. List this mixin right before
        the transformers config class: the fields the family's config classes annotate (`attention_type: str =
        "mgk"`) take their keywords or class defaults as instance attributes (so `to_dict()` saves them), and
        `__post_init__` then runs as on 5.x, where it validates the config."""

        def __init__(self, **kwargs):
            fields = {}
            for klass in type(self).__mro__:
                if klass is ConfigCompat:
                    break
                for name in inspect.get_annotations(klass):
                    if name not in fields:
                        fields[name] = kwargs.pop(name) if name in kwargs else getattr(type(self), name)
            super().__init__(**kwargs)
            for name, value in fields.items():
                setattr(self, name, value)
            self.__post_init__()

        def __post_init__(self, **kwargs):
            """The end of the chain the family's `__post_init__` calls with `super()`: v4 configs have none."""


try:  # 5.x: the helpers leave tensors loaded from a checkpoint (`_is_hf_initialized`) as they are
    from transformers import initialization as init
except ImportError:  # 4.x loads first and initialises only the modules left incomplete; the same rule, by hand

    def _unless_loaded(fill):
        def initialise(tensor, *args, **kwargs):
            if not getattr(tensor, "_is_hf_initialized", False):
                with torch.no_grad():
                    fill(tensor, *args, **kwargs)
            return tensor

        return initialise

    init = types.SimpleNamespace(**{
        name: _unless_loaded(getattr(torch.nn.init, name)) for name in ("normal_", "uniform_", "zeros_", "ones_",
                                                                         "constant_")
    }, copy_=_unless_loaded(torch.Tensor.copy_))


class RopeCompat:
    """List right before a Llama-family config class. transformers 5 keeps the rotary settings in `rope_parameters`;
    4.x reads `rope_theta` and `rope_scaling` and ignores `rope_parameters`, so a config.json saved on 5.x would
    load there with the default rotary base. Saved with both forms, every release reads its own (5.x accepts the
    4.x names too)."""

    def to_dict(self):
        out = super().to_dict()
        rope = out.get("rope_parameters")
        if isinstance(rope, dict) and out.get("rope_theta") is None:
            out["rope_theta"] = rope.get("rope_theta")
            scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
            out["rope_scaling"] = None if set(scaling) <= {"rope_type"} and scaling.get("rope_type", "default") \
                == "default" else scaling
        return out


class TiedParametersCompat:
    """List before `PreTrainedModel`. transformers 5.3.0 drops a custom-code model's tied parameters from the missing
    keys before it ties them (`mark_tied_weights_as_initialized`), so after `from_pretrained` they are left on the
    meta device (an LM head without weights): tie each such target to its source here. Any other release leaves
    no tied parameter on the meta device, and this does nothing."""

    def tie_weights(self, *args, **kwargs):
        result = super().tie_weights(*args, **kwargs)
        tied = getattr(self, "_tied_weights_keys", None)
        for target, source in (tied.items() if isinstance(tied, dict) else ()):
            if self.get_parameter(target).is_meta and not self.get_parameter(source).is_meta:
                owner, _, name = target.rpartition(".")
                setattr(self.get_submodule(owner), name, self.get_parameter(source))
        return result


__all__ = ["ConfigCompat", "PreTrainedConfig", "RopeCompat", "TiedParametersCompat", "init"]
