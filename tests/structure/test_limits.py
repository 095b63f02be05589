"""Size and placement limits from the project guide, checked on the source itself.

- A command function stays a thin layer: parse, call the library, render (≤ 60 lines from `def`
  to its last line, the options in its signature included; decorators aside). Options come from
  fields and option groups (`nphcli/cli/options.py`), so a signature stays short.
- One concept per module: ≤ 400 lines, except the files listed below.
- Per-device choices live in `nphcli/engine/` and `nphcli/core/devices.py`, never in the models or
  the CLI (architecture.md, "Adding things: a device path").
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "nphcli"
COMMAND_LINES = 60
MODULE_LINES = 400

# Modules over MODULE_LINES, each left whole on purpose. Remove an entry once its module is
# under the limit (the test fails on an entry that no longer needs to be here).
LONG_MODULES: set[str] = set()


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _is_command(node: ast.FunctionDef) -> bool:
    """Decorated `@app.command(...)` or `@app.callback()`."""
    return any(
        isinstance(d, ast.Call)
        and isinstance(d.func, ast.Attribute)
        and d.func.attr in ("command", "callback")
        for d in node.decorator_list
    )


def _commands() -> list[tuple[str, ast.FunctionDef]]:
    found = []
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [
            (f"{path.name}:{node.name}", node)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and _is_command(node)
        ]
    return found


def test_every_command_is_found():
    """The walk below sees the app's commands (so the length test cannot pass by finding none)."""
    from typer.main import get_command

    from nphcli.cli import app

    names = {name.split(":")[1] for name, _ in _commands()}
    for command in get_command(app).commands.values():
        assert command.callback.__name__ in names, command.name


@pytest.mark.parametrize(
    ("name", "node"), _commands(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_command_functions_are_short(name, node):
    # From `def` (decorators aside) to the last line: the options in the signature count, so a
    # command cannot grow by declaring options by hand instead of taking a field or a group.
    lines = _command_lines(node)
    assert lines <= COMMAND_LINES, (
        f"{name} has {lines} lines with its options (limit {COMMAND_LINES}): take options from "
        "fields or option groups, and move the work into the library or a helper"
    )


def _command_lines(node: ast.FunctionDef) -> int:
    return node.end_lineno - node.lineno + 1


def test_the_length_count_includes_the_options():
    """A command whose body is short but whose signature declares many options is too long."""
    options = "".join(f"    o{i}: int = typer.Option(0, '--o{i}'),\n" for i in range(70))
    source = f"@app.command('x')\ndef x(\n{options}) -> None:\n    pass\n"
    (node,) = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)]
    assert _is_command(node)
    assert _command_lines(node) > COMMAND_LINES


def test_modules_are_short():
    long = {}
    for path in _modules():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MODULE_LINES:
            long[path.relative_to(PACKAGE).as_posix()] = lines
    unexpected = {name: n for name, n in long.items() if name not in LONG_MODULES}
    assert not unexpected, f"modules over {MODULE_LINES} lines (split them): {unexpected}"
    stale = LONG_MODULES - set(long)
    assert not stale, f"now under {MODULE_LINES} lines (or gone), remove from LONG_MODULES: {stale}"


def test_every_exemption_names_a_module_that_exists():
    """An exemption must point at a real file: a stale entry (a module split or moved away) fails
    here by name, so the list cannot keep exempting what is no longer there."""
    missing = [name for name in LONG_MODULES if not (PACKAGE / name).is_file()]
    assert not missing, f"LONG_MODULES names modules that do not exist: {missing}"


# `x.device.type == "cuda"`, `device.type != "cpu"`, `t.is_cuda`: a branch on the device kind.
_DEVICE_BRANCH = re.compile(r"\.type\s*[!=]=\s*['\"]|\.is_cuda\b|\.is_mps\b")


@pytest.mark.parametrize("folder", ["models", "cli", "layers", "evaluation", "sweeps"])
def test_no_device_branch_outside_engine(folder):
    """A device path is added in engine/ (kernels) or core/devices.py (resolution); the models, the
    layers and the commands stay device-agnostic."""
    hits = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _DEVICE_BRANCH.search(line)
    ]
    assert not hits, hits


def test_the_device_pattern_finds_a_device_branch():
    """The pattern above is live: it finds the engine's own per-device choices."""
    engine = "\n".join(p.read_text(encoding="utf-8") for p in (PACKAGE / "engine").rglob("*.py"))
    assert _DEVICE_BRANCH.search(engine)
