"""Publishing: a Hub-ready folder (safetensors weights, config with the full `auto_map`, the code files, the
tokenizer, a model card with the run's own metrics), its upload, and the proof that it loads with
`trust_remote_code=True` alone — in a process, or a whole virtualenv, where `hf_mgk` cannot be imported.

One job per module: `card` (the model card, pure functions of the run's numbers), `export` (the folder),
`upload` (to the Hub), `remote_code` (loading without hf_mgk). Their public names are gathered here."""

from . import card, export, remote_code, upload
from .card import *  # noqa: F401,F403 (its __all__)
from .export import *  # noqa: F401,F403 (its __all__)
from .remote_code import *  # noqa: F401,F403 (its __all__)
from .upload import *  # noqa: F401,F403 (its __all__)

__all__ = [*card.__all__, *export.__all__, *remote_code.__all__, *upload.__all__]
