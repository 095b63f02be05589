"""The version has one source (`nphcli/version.py`), and no module below the package's public
face imports from that face: the bottom layers must not climb back to `nphcli/__init__.py`."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import nphcli
from nphcli import version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PACKAGE = Path(nphcli.__file__).parent
ROOT = PACKAGE.parent


def test_pyproject_reads_the_version_from_the_version_module():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    module, _, name = attr.rpartition(".")
    assert module == version.__name__ and getattr(version, name) == version.__version__
    assert nphcli.__version__ == version.__version__


def test_no_module_imports_names_from_the_package_face():
    """`from nphcli import x` is allowed only where x is a submodule (e.g. `dtypes`)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "nphcli" and node.level == 0:
                for alias in node.names:
                    submodule = PACKAGE / alias.name
                    if not (submodule.with_suffix(".py").exists() or submodule.is_dir()):
                        offenders.append(f"{path.relative_to(ROOT)}: {alias.name}")
    assert offenders == []
