"""docs/architecture.md stays true: its layer table names every package and top-level module, the
modules it calls torch-free are, the tests it cites exist, and the core does not import the
CLI's libraries."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "nphcli"
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def _layer_table() -> str:
    start = DOC.index("| layer | package |")
    return DOC[start : DOC.index("\n\n", start)]


def test_the_layer_table_names_every_package_and_top_level_module():
    table = _layer_table()
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    missing = [name for name in packages if f"`nphcli/{name}/`" not in table]
    assert not missing, f"packages missing from the layer table: {missing}"
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    missing = [name for name in modules if f"`nphcli/{name}`" not in table]
    assert not missing, f"top-level modules missing from the layer table: {missing}"


def test_the_modules_called_torch_free_are():
    paragraph = DOC[DOC.index("Torch-free modules:") :].split("\n\n")[0]
    files = re.findall(r"`([\w/]+\.py)`", paragraph)
    assert "core/dtypes.py" in files and "schema/fields.py" in files  # the parse finds them
    names = [
        ("nphcli/" + f.removeprefix("nphcli/")).removesuffix(".py").replace("/", ".") for f in files
    ]
    code = f"import sys\nfor n in {names!r}: __import__(n)\nprint('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert done.stdout.strip() == "False", (names, done.stderr)


def test_the_tests_it_cites_exist():
    cited = re.findall(r"`tests/([\w/]+\.py)(?:::(\w+))?`", DOC)
    assert len(cited) >= 5
    for file, name in cited:
        path = ROOT / "tests" / file
        assert path.exists(), file
        if name:
            assert re.search(rf"^def {name}\(", path.read_text(encoding="utf-8"), re.M), name


def test_the_core_imports_no_cli_library():
    """typer and rich belong to `nphcli/cli/`; the library is usable without them."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if (PACKAGE / "cli") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            found += [
                f"{path.relative_to(ROOT)}: {name}"
                for name in names
                if name.split(".")[0] in ("typer", "rich", "click")
            ]
    assert not found, found
