"""The `nph` command line: a thin layer that parses options, calls the library and renders.

Each command lives in its own module of this package and registers itself on `app` when
imported: every module here is imported, in name order (the order `nph --help` lists them).
"""

import pkgutil
from importlib import import_module

from nphcli.cli.app import app, main

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "reference":  # the page generator, run as a script (`python -m`)
        import_module(f"{__name__}.{_module.name}")

__all__ = ["app", "main"]
