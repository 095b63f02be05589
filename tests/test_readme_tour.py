"""The README's quick start and tour run as written: every command, in order, in an empty folder,
offline, with `nph` and `python` on PATH meaning this checkout. Blocks marked no-run (installs,
the test commands) are the only ones left out. Each command is a fresh process that imports
torch, hence `slow`."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def tour_commands() -> list[str]:
    """Shell commands of the quick start's and the tour's ```sh blocks that are not marked
    no-run (the test commands), in order, and the tour's Python block (run with `python -c`)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = []
    for title in ("Quick start", "A tour"):
        section = _section(text, title)
        section = re.sub(r"<!-- no-run: [^>]*-->\n```sh\n.*?```", "", section, flags=re.S)
        for block in re.findall(r"```sh\n(.*?)```", section, re.S):
            commands += [line.strip() for line in block.splitlines() if line.strip()]
        for block in re.findall(r"```python\n(.*?)```", section, re.S):
            commands.append("python -c " + _quote(block))
    return commands


def _quote(code: str) -> str:
    return "'" + code.replace("'", "'\"'\"'") + "'"


@pytest.fixture
def shell_env(tmp_path):
    """PATH with `nph` and `python` from this checkout first; no dataset folders, one thread."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nph").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m nphcli "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    empty = tmp_path / "no-datasets"
    empty.mkdir()
    return dict(
        os.environ,
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH=str(ROOT),
        NPH_DATA=str(empty),
        XDG_CACHE_HOME=str(empty),
        OMP_NUM_THREADS="1",
        NO_COLOR="1",
    )


def test_the_tour_has_the_commands_it_promises():
    commands = tour_commands()
    # the quick start stores with --force, so it runs again where it ran before (the tour's own
    # `nph store` commands replace the quick start's memory file the same way)
    assert commands[0].startswith("nph store mnist") and "--force" in commands[0]
    stores = [c for c in commands if c.startswith("nph store")]
    assert all("--force" in c for c in stores)
    # your own vectors and a comparison of three models come first, within the first screenful
    assert "my_vectors.npy" in commands[1] and commands[2].startswith("nph store my_vectors.npy")
    assert commands[3].startswith("nph retrieve --model dense,sparse,topk")
    assert any("--csv > runs.csv" in c for c in commands)
    assert not any("--no-header" in c for c in commands)  # a file without a header is no CSV
    assert len([c for c in commands if not c.startswith("python -c")]) <= 12
    assert not any("pytest" in c or "pip install" in c for c in commands)


@pytest.mark.slow
def test_quick_start_and_tour_run_as_written(tmp_path, shell_env):
    work = tmp_path / "work"
    work.mkdir()
    for command in tour_commands():
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", command],
            cwd=work,
            env=shell_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (command, done.stderr[-2000:])
        assert "Traceback" not in done.stderr, (command, done.stderr[-2000:])
        if "--json" in command:
            assert json.loads(done.stdout)["config"]
    for made in ("memory.safetensors", "my_vectors.npy", "q.npy", "grid.png"):
        assert (work / made).stat().st_size > 0, made
    rows = list(csv.DictReader((work / "runs.csv").open()))
    assert [row["k"] for row in rows] == ["1.0", "5.0", "10.0"]


def test_plot_of_a_headerless_csv_says_how_to_fix_it(invoke, tmp_path, monkeypatch):
    """The old tour's loop wrote rows with no header; `nph plot` then suggested the very metric
    it had rejected. It must say the header is missing and how to write one."""
    import torch

    from nphcli.memory.file import save_memory

    monkeypatch.chdir(tmp_path)
    save_memory(
        "memory.safetensors", torch.randn(20, 8, generator=torch.Generator().manual_seed(0))
    )
    rows = [invoke("retrieve", "--model", "topk", "--k", k, "--csv", "--no-header") for k in "12"]
    assert all(r.exit_code == 0 for r in rows)
    Path("runs.csv").write_text("".join(r.stdout for r in rows))
    result = invoke("plot", "runs.csv", "--out", "runs.png")
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert "no header row" in line and "--csv > FILE" in line and "try one of" not in line
    assert not Path("runs.png").exists()

    Path("runs.csv").write_text(invoke("retrieve", "--k", "1,2", "--model", "topk", "--csv").stdout)
    result = invoke("plot", "runs.csv", "--metric", "speed", "--out", "runs.png")
    (line,) = result.stderr.strip().splitlines()
    suggested = line.split("try one of:")[1]
    assert "sse" in suggested and "support" in suggested and "speed" not in suggested
