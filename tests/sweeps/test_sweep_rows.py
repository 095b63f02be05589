"""Sweep rows stay what they were: the files in tests/data were written by `nph sweep` before it
took retrieve's options (`--models dense,topk:k=0.5/2,...` then; `--model ... --k ...` now), with
their timings blanked. The same grid must give the same columns and values, and `--resume` must
recognise every run of such a file."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from nphcli.evaluation.report import TIMINGS
from nphcli.sweeps.results import read_results

DATA = Path(__file__).parents[1] / "data"
# The grid of sweep_before.csv, in the new syntax. Before:
#   --models dense,topk:k=0.5,random:k=0.5/2,window:window=2,random-feature:features=8
CSV_GRID = (
    *("--dataset", "random", "--sizes", "6", "--trials", "2", "--queries", "4"),
    *("--beta", "0.1,1", "--noise", "0.3", "--mask", "0.25"),
    *("--model", "dense,topk,random,window,random-feature", "--window", "2", "--features", "8"),
)
# `--k 0.5` for topk and random, and `k = [0.5, 2]` for random alone, need a table.
CSV_TABLE = """
[[models]]
name = "dense"
[[models]]
name = "topk"
k = 0.5
[[models]]
name = "random"
k = [0.5, 2]
[[models]]
name = "window"
window = 2
[[models]]
name = "random-feature"
features = 8
"""
JSONL_GRID = (
    *("--dataset", "random", "--sizes", "6", "--trials", "1", "--noise", "0.2"),
    *("--model", "dense,topk", "--k", "0.5", "--theory"),
)


# Columns added since those files were written, on purpose: where each row came from,
# and the baselines' parameters, the corruptions beside mask and noise and the attractor
# diagnostics (empty for one-step runs). Every other column stays, in its order, with
# its value, but pixel_success, empty now for these plain vectors.
PROVENANCE = (
    *("memory_normalize", "memory_shape", "memory_sha256", "memory_path", "stream", "tf32"),
    *("memory_budget", "nph_version", "drawn_sha256", "run_settings"),
)
ADDED = {
    *PROVENANCE,
    "metric",
    "order",
    "order_seed",
    "occlude",
    "salt_pepper",
    "flip",
    *(
        f"{metric}_{stat}"
        for metric in ("at_pattern", "at_metastable", "at_global", "attractor_size", "energy")
        for stat in ("mean", "std", "median")
    ),
}


def old_columns(columns) -> list[str]:
    return [name for name in columns if name not in ADDED]


def same_rows(before: list[dict], after: list[dict]) -> None:
    """The old columns in their order and equal values (timings apart; floats to float32
    rounding, which a different thread count may change in the last bits)."""
    assert [old_columns(row) for row in after] == [list(row) for row in before]
    assert all(set(row) - set(before[0]) <= ADDED for row in after)
    for row in after:
        assert set(PROVENANCE) <= set(row) and len(str(row["memory_sha256"])) == 64
    for old, new in zip(before, after, strict=True):
        for key, value in old.items():
            if key in TIMINGS:
                continue
            if key.startswith("pixel_success_"):  # random vectors have no pixels
                assert new[key] in (None, ""), key
                continue
            if isinstance(value, float) and not math.isnan(value):
                assert new[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
            else:
                assert new[key] == value, key


def test_csv_rows_and_header_as_before(invoke, tmp_path):
    config = tmp_path / "grid.toml"
    config.write_text(CSV_TABLE)
    before = read_results(DATA / "sweep_before.csv")
    out = tmp_path / "after.csv"
    grid = CSV_GRID[: CSV_GRID.index("--model")]
    result = invoke("sweep", *grid, "--config", config, "--out", out)
    assert result.exit_code == 0, result.stderr
    after = read_results(out)
    assert old_columns(after.header) == before.header
    same_rows(before.rows, after.rows)


def test_csv_rows_from_options_alone(invoke, tmp_path):
    """Options only: random takes k = 0.5 and 2 from a table before; here --k 0.5,2 gives topk
    both values too, so compare the rows the old grid has."""
    before = read_results(DATA / "sweep_before.csv").rows
    out = tmp_path / "after.csv"
    result = invoke("sweep", *CSV_GRID, "--k", "0.5,2", "--out", out)
    assert result.exit_code == 0, result.stderr
    after = {(row["setting"], row["trial"]): row for row in read_results(out).rows}
    same_rows(before, [after[(row["setting"], row["trial"])] for row in before])


def test_jsonl_theory_rows_as_before(invoke, tmp_path):
    before = read_results(DATA / "sweep_before.jsonl").rows
    out = tmp_path / "after.jsonl"
    result = invoke("sweep", *JSONL_GRID, "--out", out)
    assert result.exit_code == 0, result.stderr
    same_rows(before, read_results(out).rows)


@pytest.mark.parametrize("name", ["sweep_before.jsonl", "sweep_before.csv"])
def test_resume_recognises_a_file_written_before(invoke, tmp_path, name):
    out = tmp_path / name
    out.write_bytes((DATA / name).read_bytes())
    if name.endswith(".csv"):
        config = tmp_path / "grid.toml"
        config.write_text(CSV_TABLE)
        grid = [*CSV_GRID[: CSV_GRID.index("--model")], "--config", config]
    else:
        grid = list(JSONL_GRID)
    result = invoke("sweep", *grid, "--out", out, "--resume")
    assert result.exit_code == 0, result.stderr
    assert "runs are already in" in result.stderr and "nothing to run" in result.stderr
    assert out.read_bytes() == (DATA / name).read_bytes()


@pytest.mark.parametrize("option", ["--salt-pepper", "--occlude"])
def test_a_csv_sweep_may_vary_a_corruption_from_zero(invoke, tmp_path, option):
    """A corruption set in one row and unset in the next keeps its column's place, so the rows
    share one header (they did not: the set one moved forward and the sweep stopped)."""
    out = tmp_path / "sweep.csv"
    grid = ("--dataset", "mnist", "--sizes", "6", "--queries", "3", "--model", "dense")
    result = invoke("sweep", *grid, option, "0,0.2", "--out", out)
    assert result.exit_code == 0, result.stderr
    rows = read_results(out).rows
    assert len(rows) == 2 and all(list(row) == list(rows[0]) for row in rows)
    plain = tmp_path / "plain.csv"
    assert invoke("sweep", *grid, "--out", plain).exit_code == 0
    assert list(read_results(plain).rows[0]) == list(rows[0])
