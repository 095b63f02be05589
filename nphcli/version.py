"""The version of nph: the one place it is written.

pyproject.toml reads it from here (`[tool.setuptools.dynamic]`), and every module that records
it (memory files, index files, reports) imports it from here, a module that imports nothing,
so the bottom layers never import the package's public face (`nphcli/__init__.py`).
"""

__version__ = "0.1.0"
