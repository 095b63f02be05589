"""Small output details: numbers whole in narrow tables, an exact 0 std for identical values."""

from __future__ import annotations

import io

import torch
from rich.console import Console

from nphcli.cli import render
from nphcli.evaluation.metrics import summarize
from nphcli.sweeps.summary import mean_std


def test_a_wide_numeric_table_on_an_80_column_terminal_keeps_every_number(monkeypatch):
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, force_terminal=True, color_system=None)
    monkeypatch.setattr(render, "stdout_console", lambda: console)
    columns = ["query", "query_row", "target_index", "nearest", "nearest_distance", "success"]
    columns += ["sse", "mse", "cosine", "support", "steps", "pixel_success"]
    row = [0, 19, 19, 19, 0.1284, 1.0, 0.01649, 2.103e-05, 0.9999, 10, 1, 1.0]
    render.print_table("Per query", columns, [row])
    text = buffer.getvalue()
    assert "…" not in text
    for value in row:
        assert f" {render.format_value(value)} " in text
    for column in columns:
        assert f" {column} " in text


def test_a_narrow_text_table_still_fits_80_columns(monkeypatch):
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, force_terminal=True, color_system=None)
    monkeypatch.setattr(render, "stdout_console", lambda: console)
    render.print_table("Run", ["setting", "value"], [["model", "a long description " * 8]])
    assert max(len(line) for line in buffer.getvalue().splitlines()) <= 80


def test_identical_values_have_a_std_of_exactly_zero():
    values = torch.full((7,), 0.1, dtype=torch.float64) * 3  # torch's std gives ~5e-17 here
    assert summarize(values)["std"] == 0.0
    assert summarize(torch.tensor([1.0, 3.0]))["std"] == 1.0
    assert mean_std([0.1 + 0.2] * 3)["std"] == 0.0
    assert mean_std([1.0, 3.0])["std"] == 1.0
