"""The README's quick start and tour run as written: every command, in order, in an empty folder,
offline. Blocks marked no-run (installs, the test commands) are the only ones left out. They run
in-process, as every other example does (tests/docs/test_doc_examples.py); here each output is
checked against what the README says it shows."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from conftest import assert_one_error_line, write_memory
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]


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


def _metric(table: str, name: str) -> float:
    """The mean of `name` in a retrieve's "Metrics (per query)" table."""
    match = re.search(rf"│ {name}\s+│ (\S+)", table)
    assert match, f"no {name} row in:\n{table}"
    return float(match.group(1))


def test_the_tour_prints_and_writes_what_it_says(tmp_path, monkeypatch):
    """Every command of the quick start and the tour, in order, in an empty folder, in-process
    (as the README's other examples run, tests/docs/test_doc_examples.py), each output checked
    against what the README says it shows."""
    from test_doc_examples import run_line

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("NPH_DATA", str(tmp_path / "no-datasets"))  # the bundled digits
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "no-datasets"))
    outputs = [run_line(command, "README", work) for command in tour_commands()]
    quick, _, own, compare, queries, models, digits, info, grid, as_json, runs, python = outputs

    # 100 digits, 50 % noise, top-10: most come back (README's first promise)
    assert "Wrote memory.safetensors" in quick and _metric(quick, "success") >= 0.8
    assert "200 × 32" in own and "100 × 784" in digits
    # one table, one row per model, each retrieving nearly every noisy vector
    header = next(line for line in compare.splitlines() if "┃ model" in line)
    column = [cell.strip() for cell in header.split("┃")].index("success")
    cells = [[c.strip() for c in line.split("│")] for line in compare.splitlines() if "│" in line]
    success = {row[1]: float(row[column]) for row in cells}
    assert set(success) == {"dense", "sparse", "topk"} and min(success.values()) >= 0.9, success
    # three own queries near stored vectors 0, 1, 2: all three retrieved
    assert "3 (from q.npy" in queries and _metric(queries, "success") == 1
    assert all(name in models for name in ("dense", "sparse", "topk", "entmax", "window"))
    assert "1×28×28" in info and "labels" in info
    assert _metric(grid, "success") >= 0.5
    with Image.open(work / "grid.png") as picture:  # a picture of the half-masked digits
        assert picture.format == "PNG" and min(picture.size) > 28
    report = json.loads(as_json)
    assert report["config"]["model"] == "topk" and report["config"]["memory"]["M"] == 100
    assert report["metrics"]["support"]["mean"] == 20  # k = 0.2 of M = 100
    assert report["metrics"]["success"]["mean"] >= 0.5
    table = list(csv.DictReader(runs.splitlines()))
    assert [(row["k"], row["support_mean"]) for row in table] == [
        ("1", "1.0"),  # a count is written as an int, the support mean a float
        ("5", "5.0"),
        ("10", "10.0"),
    ]
    assert (work / "runs.csv").read_text() == runs
    shape, success = python.split(") ")
    assert shape == "torch.Size([5, 784]" and 0.5 <= float(success) <= 1


def test_plot_of_a_headerless_csv_says_how_to_fix_it(invoke, tmp_path, monkeypatch):
    """The old tour's loop wrote rows with no header; `nph plot` then suggested the very metric
    it had rejected. It must say the header is missing and how to write one."""
    import torch

    monkeypatch.chdir(tmp_path)
    write_memory(
        "memory.safetensors", torch.randn(20, 8, generator=torch.Generator().manual_seed(0))
    )
    rows = [invoke("retrieve", "--model", "topk", "--k", k, "--csv", "--no-header") for k in "12"]
    assert all(r.exit_code == 0 for r in rows)
    Path("runs.csv").write_text("".join(r.stdout for r in rows))
    line = assert_one_error_line(invoke("plot", "runs.csv", "--out", "runs.png"))
    assert "no header row" in line and "--csv > FILE" in line and "try one of" not in line
    assert not Path("runs.png").exists()

    Path("runs.csv").write_text(invoke("retrieve", "--k", "1,2", "--model", "topk", "--csv").stdout)
    result = invoke("plot", "runs.csv", "--metric", "speed", "--out", "runs.png")
    (line,) = result.stderr.strip().splitlines()
    suggested = line.split("try one of:")[1]
    assert "sse" in suggested and "support" in suggested and "speed" not in suggested
