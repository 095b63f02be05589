"""The layers of docs/architecture.md hold in the code: every import of an nph module points to
the same layer or one below it, and no two modules import each other, directly or around a loop.

Every import counts: at module level, inside a function (it runs late, but a reader still sees
two concepts leaning on each other), and a lazy `import_module("nphcli....")` written as a
string (the package's public names load that way). Imports under `if TYPE_CHECKING:` never run
and are not counted. There are no exemptions: a layer reaching back up is moved, not listed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "nphcli"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside `if TYPE_CHECKING:` blocks."""
    hidden = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                hidden.update(id(n) for n in ast.walk(child))
    return hidden


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """`name`, or the longest prefix of it that is a module (`a.b.c` where c is a function)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The nph modules `path` imports, eagerly, lazily or by name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    hidden = _type_checking_nodes(tree)
    found: set[str | None] = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            found.update(_known(a.name, modules) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(_known(f"{node.module}.{a.name}", modules) for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"nphcli(\.\w+)+", node.value):  # import_module("nphcli.x.y")
                found.add(_known(node.value, modules))
    own = _module_name(path)
    return {name for name in found if name and name.startswith("nphcli")} - {own}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) for name, path in modules.items()}


def _layers() -> list[tuple[str, list[str]]]:
    """The architecture table's rows, top first: (layer, the paths it names)."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    start = doc.index("| layer | package |")
    rows = doc[start : doc.index("\n\n", start)].splitlines()[2:]
    return [
        (row.split("|")[1].strip(), re.findall(r"`(nphcli/[\w/.]*)`", row.split("|")[2]))
        for row in rows
    ]


def _layer_of(module: str, layers: list[tuple[str, list[str]]]) -> int:
    """The row of `module`: the row naming its file, else its package folder."""
    path = module.replace(".", "/")
    for depth, (_, paths) in enumerate(layers):
        if f"{path}.py" in paths or f"{path}/__init__.py" in paths:
            return depth
    for depth, (_, paths) in enumerate(layers):
        if any(p.endswith("/") and (path + "/").startswith(p) for p in paths):
            return depth
    raise AssertionError(f"{module} is in no layer of docs/architecture.md")


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_is_read():
    """Eager, function-level and by-name imports are all edges (so the tests below cannot pass
    on an empty or partial graph)."""
    graph = _graph()
    assert len(graph) > 100 and sum(map(len, graph.values())) > 400
    assert "nphcli.memory.format" in graph["nphcli.memory.file"]  # module level
    assert "nphcli.app.store" in graph["nphcli"]  # by name, for import_module
    assert "nphcli.sweeps.reading" in graph["nphcli.cli.report"]  # inside a function


def test_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [frozenset("abc")]


def test_every_module_has_a_layer():
    layers = _layers()
    assert [name for name, _ in layers][:2] == ["entry", "CLI"] and layers[-1][0] == "core"
    for module in _graph():
        _layer_of(module, layers)


@pytest.mark.parametrize("upward", [("nphcli.memory.file", "nphcli.cli.app")])
def test_an_upward_import_is_seen(upward):
    layers = _layers()
    source, target = upward
    assert _layer_of(target, layers) < _layer_of(source, layers)


def test_no_import_runs_back_up():
    layers = _layers()
    upward = [
        f"{source} -> {target}"
        for source, targets in sorted(_graph().items())
        for target in sorted(targets)
        if _layer_of(target, layers) < _layer_of(source, layers)
    ]
    assert not upward, "imports running up the layers of docs/architecture.md:\n" + "\n".join(
        upward
    )


def test_no_import_cycle_between_modules():
    cycles = [sorted(c) for c in _cycles(_graph())]
    assert not cycles, f"import cycles between nph modules: {cycles}"
