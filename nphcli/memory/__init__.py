"""Memories: what they hold (`bank.MemoryBank`), their files (`format`, `file`, `streamed`,
`shards`) and the one way to open one, `open_memory` (`open.py`).

`open_memory` loads its module (and torch) on first use, so importing one submodule, such as
`nphcli.memory.bank`, does not import the others.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# name → module that defines it
_PUBLIC = {"open_memory": "nphcli.memory.open"}
__all__ = ["open_memory"]

if TYPE_CHECKING:  # for type checkers and IDEs; never run
    from nphcli.memory.open import open_memory


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'nphcli.memory' has no attribute {name!r}")
    value = getattr(import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value
