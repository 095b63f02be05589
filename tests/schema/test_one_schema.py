"""One declaration of a retrieval field reaches every surface: a field added to `FIELDS` (here a
throwaway copy of `fill` named `fill2`) is an option of `nph retrieve` and `nph sweep`, a key of
an `nph batch` job and a key of a sweep file, with no other edit. The CLI is built anew in a
subprocess that adds the field before anything imports the command line."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nphcli

SCRIPT = r"""
import dataclasses, json, sys

import nphcli.schema.fields as fields

fill2 = dataclasses.replace(fields.get_field("fill"), name="fill2", group="corruption")
fields.FIELDS = (*fields.FIELDS, fill2)
fields._BY_NAME["fill2"] = fill2

from typer.main import get_command
from typer.testing import CliRunner

from nphcli.cli import app
from nphcli.app.batch import MemoryCache, run_job
from nphcli.sweeps import config
from nphcli.sweeps.grid import expand

memory, pool, out = sys.argv[1:]
commands = get_command(app).commands
found = {name: [p.opts for p in commands[name].params] for name in ("retrieve", "sweep")}
runner = CliRunner()
retrieve = runner.invoke(app, ["retrieve", "--memory", memory, "--fill2", "0.1,0.2", "--json"])
sweep = runner.invoke(
    app, ["sweep", "--dataset", pool, "--sizes", "4", "--fill2", "0.1,0.2", "--out", out]
)
jobs = run_job({"memory": memory, "fill2": [0.1, 0.2]}, MemoryCache())
grid = config.resolve(config.parse("fill2 = [0.1, 0.2]\n", "t"), "t", {"dataset": pool})
print(json.dumps({
    "options": found,
    "retrieve": [retrieve.exit_code, retrieve.output[-300:]],
    "sweep": [sweep.exit_code, sweep.output[-300:]],
    "batch": len(jobs),
    "labels": [s.label for s in expand(grid)],
}))
"""


@pytest.mark.slow
def test_a_new_field_reaches_every_surface(invoke, tmp_path):
    pool = tmp_path / "pool.npy"
    np.save(pool, np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32))
    memory = tmp_path / "m.safetensors"
    assert invoke("store", pool, "--out", memory).exit_code == 0
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(memory), str(pool), str(tmp_path / "r.jsonl")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert ["--fill2"] in seen["options"]["retrieve"]
    assert ["--fill2"] in seen["options"]["sweep"]
    assert seen["retrieve"][0] == 0, seen["retrieve"]
    assert seen["sweep"][0] == 0, seen["sweep"]
    assert seen["batch"] == 2  # a list is several values, one setting each
    assert seen["labels"] == ["dense fill2=0.1", "dense fill2=0.2"]
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [row["label"] for row in rows] == ["dense fill2=0.1", "dense fill2=0.2"]


def _option_help(command: str, flag: str) -> str:
    from typer.main import get_command

    from nphcli.cli import app

    click_command = get_command(app).commands[command]
    (option,) = [p for p in click_command.params if flag in getattr(p, "opts", ())]
    return option.help


def test_a_command_can_say_what_a_field_means_for_it():
    """analyze runs no model unless asked and sweep's models come from its grid: their --model
    help says so instead of retrieve's "[default: dense] … on the memory read once"."""
    retrieve = _option_help("retrieve", "--model")
    assert "[default: dense]" in retrieve and "memory read once" in retrieve
    analyze = _option_help("analyze", "--model")
    assert "[default: none" in analyze and "[default: dense]" not in analyze
    sweep = _option_help("sweep", "--model")
    assert "--preset or --config" in sweep and "memory read once" not in sweep


def test_help_for_a_field_the_command_lacks_is_refused():
    from nphcli.cli.field_options import with_fields

    def command(given: dict) -> None:
        """A command taking only --seed."""

    wrapped = with_fields(["seed"], params=False, help={"sed": "typo"})(command)
    with pytest.raises(ValueError, match="sed"):
        _ = wrapped.__signature__


def _typer_options(path: Path) -> list[ast.Call]:
    """The `typer.Option(...)` calls of a module that are not hidden."""
    calls = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "Option"
            and not any(k.arg == "hidden" for k in node.keywords)
        ):
            calls.append(node)
    return calls


def test_no_command_declares_an_option_by_hand():
    """A command takes its options from fields (`with_fields`) or from the named groups of
    `nphcli/cli/options.py`; the application's callback keeps its global flags. A hidden option
    (a retired flag that says what replaced it) is not part of the surface."""
    cli = Path(nphcli.__file__).parent / "cli"
    allowed = {"options.py", "field_options.py", "app.py"}
    by_hand = {
        path.name: len(_typer_options(path))
        for path in sorted(cli.glob("*.py"))
        if path.name not in allowed and _typer_options(path)
    }
    assert not by_hand, f"options declared by hand (make them fields or a named group): {by_hand}"
    assert _typer_options(cli / "options.py"), "the guard must see the named groups"


def _command_options(group=None, prefix="nph"):
    """(command path, click option) for every option of every command."""
    from typer.main import get_command

    from nphcli.cli import app

    group = group or get_command(app)
    for name, command in group.commands.items():
        if hasattr(command, "commands"):  # a group (typer carries its own click classes)
            yield from _command_options(command, f"{prefix} {name}")
            continue
        for param in command.params:
            if param.param_type_name == "option":
                yield f"{prefix} {name}", param


def test_every_output_path_is_the_same_option():
    """Where a command writes a file or folder, its option reads `-o, --out PATH` (or its own
    long flag beside -o), from `nphcli.schema.fields.output_field`."""
    outputs = {(c, o.name): o for c, o in _command_options() if o.name in ("out", "out_dir")}
    assert len(outputs) >= 10, sorted(outputs)
    for (command, name), option in outputs.items():
        assert "-o" in option.opts, (command, option.opts)
        assert option.metavar == "PATH", (command, option.metavar)
        assert option.name == name
