"""nph: associative-memory retrieval with the Nonparametric Modern Hopfield model family.

Importing the package is cheap (no torch): the CLI imports library modules only when a command
needs them, so `nph --help` stays fast in shell loops. The public API below is loaded on first
use for the same reason:

    from nphcli import load_memory, create_model, evaluate, RetrieveSettings
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from nphcli.version import __version__

# name → module that defines it; imported (with torch) only when the name is first used
_PUBLIC = {
    "load_memory": "nphcli.memory.file",
    "create_model": "nphcli.models",
    "evaluate": "nphcli.evaluation.evaluate",
    "RetrieveSettings": "nphcli.evaluation.settings",
}
__all__ = ["RetrieveSettings", "__version__", "create_model", "evaluate", "load_memory"]

if TYPE_CHECKING:  # for type checkers and IDEs; never run
    from nphcli.evaluation.evaluate import evaluate
    from nphcli.evaluation.settings import RetrieveSettings
    from nphcli.memory.file import load_memory
    from nphcli.models import create_model


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'nphcli' has no attribute {name!r}")
    value = getattr(import_module(_PUBLIC[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
