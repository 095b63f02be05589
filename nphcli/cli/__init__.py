"""The `nph` command line: a thin layer that parses options, calls the library and renders.

Each command lives in its own module and registers itself on `app` when imported here.
"""

from nphcli.cli import (
    analyze,  # noqa: F401  (registers commands)
    attractors,  # noqa: F401  (registers commands)
    batch,  # noqa: F401  (registers commands)
    doctor,  # noqa: F401  (registers commands)
    grow,  # noqa: F401  (registers commands)
    index,  # noqa: F401  (registers commands)
    info,  # noqa: F401  (registers commands)
    mil,  # noqa: F401  (registers commands)
    models,  # noqa: F401  (registers commands)
    paper,  # noqa: F401  (registers commands)
    paper_mil,  # noqa: F401  (registers commands)
    paper_timeseries,  # noqa: F401  (registers commands)
    plot,  # noqa: F401  (registers commands)
    recall,  # noqa: F401  (registers commands)
    report,  # noqa: F401  (registers commands)
    retrieve,  # noqa: F401  (registers commands)
    serve,  # noqa: F401  (registers commands)
    shard,  # noqa: F401  (registers commands)
    store,  # noqa: F401  (registers commands)
    sweep,  # noqa: F401  (registers commands)
)
from nphcli.cli.app import app, main

__all__ = ["app", "main"]
