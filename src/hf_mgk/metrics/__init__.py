"""Evaluation metrics that work offline with their official definitions.

`load_metric(name)` returns `evaluate.load(name)` from the Hub when the Hub may be reached, and otherwise (or when
that fails) the module of the same name shipped in this folder, loaded with `evaluate.load(<folder>)`. The shipped
modules take the same inputs, configs and keyword arguments and return the same keys as the Hub metrics, so code
works with either. They compute with scikit-learn / scipy, and SQuAD with the official scripts' definitions.
"""

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

_MODULES_DIR = Path(__file__).resolve().parent
SHIPPED_METRICS = (
    "accuracy",
    "f1",
    "matthews_correlation",
    "pearsonr",
    "spearmanr",
    "glue",
    "squad",
    "squad_v2",
)
_TRUE = {"1", "ON", "YES", "TRUE"}


def hub_is_offline():
    """True when huggingface_hub is in offline mode or HF_HUB_OFFLINE / HF_EVALUATE_OFFLINE is set true now."""
    from huggingface_hub import constants

    env = (os.environ.get(var, "").upper() in _TRUE for var in ("HF_HUB_OFFLINE", "HF_EVALUATE_OFFLINE"))
    return bool(constants.HF_HUB_OFFLINE) or any(env)


def shipped_metric_path(name):
    """Folder of the shipped module `name` (holds `<name>.py`, what `evaluate.load(folder)` expects)."""
    if name not in SHIPPED_METRICS:
        raise ValueError(f"Unknown metric {name!r}; the metrics shipped with hf_mgk are: {', '.join(SHIPPED_METRICS)}")
    return str(_MODULES_DIR / name)


def load_metric(name, config_name=None, **kwargs):
    """`evaluate.load(name, config_name, **kwargs)` from the Hub when reachable, else the shipped copy.

    Any failure of the Hub load (no connection, a config the Hub module lacks such as glue "ax") falls back to
    the shipped module, which then reports its own errors (e.g. an unknown glue task); a name not shipped here is
    a ValueError before the Hub is tried. The fallback is the intended path offline, so it is not a warning: the
    first one in a process is one info line, later ones debug lines."""
    import evaluate

    path = shipped_metric_path(name)
    if not hub_is_offline():
        try:
            return evaluate.load(name, config_name, **kwargs)
        except Exception as err:  # noqa: BLE001 - whatever went wrong, the shipped module is the fallback
            _log_fallback(name, err)
    return evaluate.load(path, config_name, **kwargs)


_fallback_logged = False


def _log_fallback(name, err):
    """Say once per process (info) that the shipped copy replaces the Hub's, then only at debug level.

    Offline, evaluate raises FileNotFoundError ("Couldn't find a module script at <cwd>/<name>/<name>.py ...
    doesn't exist on the Hugging Face Hub either"); connection errors are OSErrors too. Anything else means the
    Hub module was reached and refused the call; the shipped module then decides (and raises if it refuses too)."""
    global _fallback_logged
    level = logging.DEBUG if _fallback_logged else logging.INFO
    _fallback_logged = True
    if isinstance(err, OSError):
        logger.log(level, "evaluate.load(%r): the Hub is not reachable; using the copy shipped with hf_mgk", name)
    else:
        logger.log(level, "evaluate.load(%r) from the Hub raised %s: %s; using the copy shipped with hf_mgk", name,
                   type(err).__name__, err)
