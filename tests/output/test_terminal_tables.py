"""Small output details: numbers whole in narrow tables, an exact 0 std for identical values."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

import pytest
import torch
from conftest import write_memory
from rich.console import Console

from nphcli.cli import render
from nphcli.evaluation.metrics import summarize
from nphcli.sweeps.summary import mean_std


def test_a_wide_numeric_table_on_an_80_column_terminal_keeps_every_number(monkeypatch):
    """Twelve columns cannot fit 80 as a table without cutting a header or a number: each row
    is stacked instead, one `column  value` line per column, every value whole."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, force_terminal=True, color_system=None)
    monkeypatch.setattr(render, "stdout_console", lambda: console)
    columns = ["query", "query_row", "target_index", "nearest", "nearest_distance", "success"]
    columns += ["sse", "mse", "cosine", "support", "steps", "pixel_success"]
    row = [0, 19, 19, 19, 0.1284, 1.0, 0.01649, 2.103e-05, 0.9999, 10, 1, 1.0]
    render.print_table("Per query", columns, [row, row])
    lines = buffer.getvalue().splitlines()
    assert "…" not in buffer.getvalue() and max(map(len, lines)) <= 80
    for column, value in zip(columns, row, strict=True):
        found = [line.split() for line in lines if line.split()[:1] == [column]]
        assert found == [[column, render.format_value(value)]] * 2, (column, found)


def test_a_narrow_text_table_still_fits_80_columns(monkeypatch):
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, force_terminal=True, color_system=None)
    monkeypatch.setattr(render, "stdout_console", lambda: console)
    render.print_table("Run", ["setting", "value"], [["model", "a long description " * 8]])
    assert max(len(line) for line in buffer.getvalue().splitlines()) <= 80


def test_a_name_value_table_too_wide_for_80_columns_keeps_a_line_per_name(monkeypatch):
    """`nph info` at 80 columns: a 64-digit hash made the two columns too wide, and the stacked
    form printed 60 lines of alternating `field` / `value`; now a line per name and value."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, force_terminal=True, color_system=None)
    monkeypatch.setattr(render, "stdout_console", lambda: console)
    rows = [["patterns", "100 × 784 float32"], ["content_sha256", "ab" * 32], ["seed", 0]]
    rows.append(["classes", ", ".join(f"{i} - digit {i}" for i in range(10))])
    render.print_table("memory.safetensors", ["field", "value"], rows)
    lines = buffer.getvalue().splitlines()
    assert lines[:5] == [
        "memory.safetensors",
        "field           value",
        "patterns        100 × 784 float32",
        "content_sha256  " + "ab" * 32,
        "seed            0",
    ]
    assert lines[5].startswith("classes         0 - digit 0") and len(lines) == 7
    assert lines[6].startswith(" " * 16) and max(len(line) for line in lines[5:]) <= 80


def test_identical_values_have_a_std_of_exactly_zero():
    values = torch.full((7,), 0.1, dtype=torch.float64) * 3  # torch's std gives ~5e-17 here
    assert summarize(values)["std"] == 0.0
    assert summarize(torch.tensor([1.0, 3.0]))["std"] == 1.0
    assert mean_std([0.1 + 0.2] * 3)["std"] == 0.0
    assert mean_std([1.0, 3.0])["std"] == 1.0


# -- tables at 80 columns, piped widths, closed pipes, narrow encodings -------------


@pytest.fixture(scope="module")
def small_memory(tmp_path_factory):
    path = tmp_path_factory.mktemp("tables") / "m.safetensors"
    write_memory(path, torch.randn(60, 16, generator=torch.Generator().manual_seed(0)))
    return path


def test_the_comparison_table_fits_80_columns_without_hiding_a_value(invoke, small_memory):
    """At 80 columns it showed `beta=0…`, `alpha=…`, `succe…` and cropped its border.
    Piped with COLUMNS=80 (which it ignored before), every line fits and every value shows."""
    args = ["--model", "entmax,topk", "--beta", "0.1,10", "--alpha", "1.5", "--k", "10"]
    result = invoke("retrieve", "--memory", small_memory, *args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in result.stdout
    for word in ("alpha=1.5", "beta=0.1", "beta=10", "k=10", "success", "cosine", "mask 0"):
        assert word in result.stdout, word
    assert lines[-1].startswith("└") and lines[-1].endswith("┘")  # a whole table, not cropped


def test_a_piped_table_takes_the_width_columns_names(invoke, small_memory):
    args = ["retrieve", "--memory", small_memory, "--model", "dense,topk", "--beta", "0.1,10"]
    narrow = invoke(*args, "--noise", "0,0.1", env={"COLUMNS": "50"})
    assert narrow.exit_code == 0, narrow.stderr
    assert max(map(len, narrow.stdout.splitlines())) <= 50 and "…" not in narrow.stdout
    assert "parameters  beta=0.1" in narrow.stdout  # stacked: too narrow for the columns
    wide = invoke(*args, env={"COLUMNS": ""})  # unset: the command's own width
    assert wide.exit_code == 0 and "┏" in wide.stdout


def test_a_table_into_a_closed_pipe_raises_broken_pipe_for_the_exit_path():
    """rich exits with status 1 on a closed pipe; nph's console raises BrokenPipeError, which
    the CLI's one exit path turns into 141 (docs/errors.md), as for `--csv`."""
    read, write = os.pipe()
    os.close(read)
    stream = os.fdopen(write, "w")
    with pytest.raises(BrokenPipeError):
        render._Console(file=stream).print("\n".join(["x" * 70] * 2000))  # > a pipe's buffer
    with contextlib.suppress(BrokenPipeError):  # (what is left in the stream's own buffer)
        stream.close()


@pytest.mark.slow  # a real process (a fork of the zygote) writing into a pipe
def test_a_table_cut_short_by_head_exits_141(zygote, small_memory, tmp_path):
    command = ["retrieve", "--memory", str(small_memory), "--per-query", "--queries", "60"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = zygote.popen(*command, env=env, cwd=tmp_path)
    assert process.stdout.readline()
    process.stdout.close()  # as head does after its lines
    stderr = process.stderr.read()
    assert process.wait(timeout=120) == 141, stderr
    assert "Traceback" not in stderr and "Error" not in stderr


def test_ascii_output_writes_symbols_out():
    """The ASCII fallback printed `V?` and `? K x`."""
    assert render.ascii_text("T(x) = Vᵀ softmax(β K x)") == "T(x) = V^T softmax(beta K x)"
    assert render.ascii_text("O(Q·M·d), ‖x‖² ≤ 2, 5 µs, σ → ∞") == (
        "O(Q*M*d), ||x||^2 <= 2, 5 us, sigma -> inf"
    )
    assert "α-entmax ×".encode("ascii", "nph-ascii") == b"alpha-entmax x"
    assert "∮".encode("ascii", "nph-ascii") == b"?"  # what nph never writes: still no error


def test_an_ascii_stdout_gets_ascii_tables_with_symbols_written_out(monkeypatch):
    buffer = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="nph-ascii")
    monkeypatch.setattr(sys, "stdout", buffer)
    monkeypatch.setattr(render, "stdout_console", lambda: Console(file=buffer, width=80))
    render.print_table("Models", ["model", "T(x)"], [["dense", "T(x) = Vᵀ softmax(β K x)"]])
    buffer.flush()
    text = buffer.buffer.getvalue().decode("ascii")
    assert "V^T softmax(beta K x)" in text and "?" not in text and "+--" in text


# -- what a report holds -----------------------------------------------------------


def test_pixel_success_only_for_image_memories(invoke, small_memory, digits):
    """Plain vectors have no pixels: `pixel_success` is left out (null in JSON, an empty CSV
    cell, no table row); image memories keep it."""
    plain = invoke("retrieve", "--memory", small_memory, "--json", "--per-query")
    assert plain.exit_code == 0, plain.stderr
    report = json.loads(plain.stdout)
    assert report["metrics"]["pixel_success"] is None and report["metrics"]["success"] is not None
    table = invoke("retrieve", "--memory", small_memory)
    assert "pixel_success" not in table.stdout and "cosine" in table.stdout
    images = json.loads(invoke("retrieve", "--memory", digits, "--json").stdout)
    assert images["metrics"]["pixel_success"] is not None


@pytest.mark.parametrize(("given", "written"), [("10", 10), ("10.0", 10), ("0.5", 0.5)])
def test_a_whole_k_is_written_as_an_integer(invoke, small_memory, given, written):
    """`--k 10` was reported as 10.0; a count is an int, a fraction a float."""
    for model in ("topk", "random"):
        args = ["retrieve", "--memory", small_memory, "--model", model, "--k", given]
        result = invoke(*args, "--json")
        assert result.exit_code == 0, result.stderr
        k = json.loads(result.stdout)["config"]["params"]["k"]
        assert k == written and type(k) is type(written)
        csv = invoke(*args, "--csv").stdout.splitlines()
        assert dict(zip(csv[0].split(","), csv[1].split(","), strict=True))["k"] == str(written)
