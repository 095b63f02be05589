"""nph: associative-memory retrieval with the Nonparametric Modern Hopfield model family.

The public API, named after the command line's concepts, in one import style:

    import nphcli as nph

    nph.store("mnist", "memory.safetensors", n=100)   # build and save a memory (`nph store`)
    memory = nph.open_memory("memory.safetensors")    # load it (stream=True: read in blocks)
    out = nph.retrieve(memory.patterns[:5], memory, model="topk", k=10)  # the bare rule T(x)
    settings = nph.RetrieveSettings(model="topk", params={"k": 10},
                                    corruption=nph.Corruption(noise=0.5))
    report = nph.evaluate(memory, settings)           # what `nph retrieve` does
    nph.recall("notes.safetensors", "a cat on a mat", k=3)  # items a text recalls (`nph recall`)

`create_model` builds a rule to keep (`model.retrieve(queries, memory)`), `list_models` lists the
registry (`nph models`), `Memory` holds memories built in Python, and every user error is an
`NphError`. Importing the package is cheap (no torch): each name loads its module on first use,
so `nph --help` stays fast in shell loops.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from nphcli.core.errors import NphError
from nphcli.version import __version__

# name → (module that defines it, its name there); imported (with torch) on first use
_PUBLIC = {
    "store": ("nphcli.app.store", "store_memory"),
    "open_memory": ("nphcli.memory.open", "open_memory"),
    "recall": ("nphcli.app.recall", "recall"),
    "Memory": ("nphcli.memory.bank", "Memory"),
    "create_model": ("nphcli.models", "create_model"),
    "list_models": ("nphcli.models", "list_models"),
    "retrieve": ("nphcli.models", "retrieve"),
    "evaluate": ("nphcli.evaluation.evaluate", "evaluate"),
    "RetrieveSettings": ("nphcli.schema.settings", "RetrieveSettings"),
    "Corruption": ("nphcli.schema.settings", "Corruption"),
}
__all__ = [
    "Corruption",
    "Memory",
    "NphError",
    "RetrieveSettings",
    "__version__",
    "create_model",
    "evaluate",
    "list_models",
    "open_memory",
    "recall",
    "retrieve",
    "store",
]

if TYPE_CHECKING:  # for type checkers and IDEs; never run
    from nphcli.app.recall import recall
    from nphcli.app.store import store_memory as store
    from nphcli.evaluation.evaluate import evaluate
    from nphcli.memory.bank import Memory
    from nphcli.memory.open import open_memory
    from nphcli.models import create_model, list_models, retrieve
    from nphcli.schema.settings import Corruption, RetrieveSettings


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'nphcli' has no attribute {name!r}")
    module, attribute = _PUBLIC[name]
    value = getattr(import_module(module), attribute)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
