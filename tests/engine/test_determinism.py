"""The same command with the same seed gives the same results: bit for bit when run again,
and up to float rounding in the last bits across --batch-size (docs/retrieving.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import beta_flag, real_valued_models
from typer.testing import CliRunner

from nphcli.cli import app
from nphcli.evaluation.report import TIMINGS
from nphcli.sweeps.results import read_results

RETRIEVING = Path(__file__).resolve().parents[2] / "docs" / "retrieving.md"
TIMING_COLUMNS = set(TIMINGS)  # wall times: the only part of a result that may differ
# Float rounding in the last bits: float32 keeps about 7 significant digits.
RTOL = 1e-5


def _run(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def memory(tmp_path_factory) -> Path:
    """30 random 16-dimensional patterns (N(0, 1) / 4, so β = 1 is a sensible scale)."""
    folder = tmp_path_factory.mktemp("determinism")
    rng = np.random.default_rng(3)
    np.save(folder / "pool.npy", (rng.normal(size=(30, 16)) / 4).astype(np.float32))
    path = folder / "memory.safetensors"
    _run("store", folder / "pool.npy", "--out", path)
    return path


def _retrieve(memory: Path, model: str, *extra: str) -> dict:
    args = ["retrieve", "--memory", memory, "--model", model, *beta_flag(model, 1), "--seed", "5"]
    args += ["--queries", "23", "--mask", "0.25", "--noise", "0.1", "--per-query", "--json"]
    return json.loads(_run(*args, *extra))


def _without_timing(report: dict) -> dict:
    return {key: value for key, value in report.items() if key != "timing"}


@pytest.mark.parametrize("model", real_valued_models())
def test_same_command_twice_gives_identical_json(memory, model):
    first, second = _retrieve(memory, model), _retrieve(memory, model)
    assert _without_timing(first) == _without_timing(second)
    assert set(first["timing"]) == TIMING_COLUMNS


def _close(a, b, path: str) -> None:
    """Equal structure; integers and strings equal; floats equal to RTOL of the values' scale."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for key in a:
            _close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        scale = max((abs(x) for x in a if isinstance(x, float)), default=0.0)
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if isinstance(x, float):
                assert math.isclose(x, y, rel_tol=RTOL, abs_tol=RTOL * scale), (path, i, x, y)
            else:
                _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=RTOL, abs_tol=1e-9), (path, a, b)
    else:
        assert a == b, (path, a, b)


@pytest.mark.parametrize("model", real_valued_models())
def test_batch_size_changes_only_the_last_bits(memory, model):
    everything = _retrieve(memory, model)
    for batch in ("1", "7"):
        report = _retrieve(memory, model, "--batch-size", batch)
        assert report["config"]["batch_size"] == int(batch)
        report["config"]["batch_size"] = everything["config"]["batch_size"]
        _close(_without_timing(report), _without_timing(everything), f"batch {batch}")


@pytest.mark.slow
@pytest.mark.parametrize("model", real_valued_models())
def test_block_sizes_and_streaming_change_only_the_last_bits(memory, model):
    """A tiny --memory-budget makes the models work in small blocks of memories; --stream
    reads them from the file block by block."""
    everything = _retrieve(memory, model)
    for extra in (["--memory-budget", "1K"], ["--stream"], ["--stream", "--memory-budget", "1K"]):
        report = _retrieve(memory, model, *extra)
        for key in ("memory_budget", "memory"):
            report["config"][key] = everything["config"][key]
        _close(_without_timing(report), _without_timing(everything), " ".join(extra))


def test_docs_state_the_batch_size_rounding():
    retrieving = " ".join(RETRIEVING.read_text(encoding="utf-8").split())
    assert "results do not depend on B, up to float rounding in the last bits" in retrieving


def test_same_sweep_twice_gives_identical_rows(memory, tmp_path):
    pool = memory.parent / "pool.npy"
    args = ["sweep", "--dataset", pool, "--model", "dense,topk,random", "--k", "3"]
    args += ["--sizes", "5,9", "--trials", "2", "--beta", "1", "--mask", "0.25", "--noise", "0.1"]
    _run(*args, "--out", tmp_path / "a.csv")
    _run(*args, "--out", tmp_path / "b.csv")
    first, second = read_results(tmp_path / "a.csv"), read_results(tmp_path / "b.csv")
    assert first.header == second.header and len(first.rows) == 3 * 2 * 2
    for a, b in zip(first.rows, second.rows, strict=True):
        assert {k: v for k, v in a.items() if k not in TIMING_COLUMNS} == {
            k: v for k, v in b.items() if k not in TIMING_COLUMNS
        }
