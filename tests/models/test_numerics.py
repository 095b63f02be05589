"""Numerical extremes through the whole pipeline, for every registered model: β from 1e-6 to
1e4, float16/bfloat16 memories, huge and tiny norms, all-equal and duplicate patterns, M = 1,
Q = 1. The JSON parses (no NaN tokens), numbers are finite, and a null appears only where the
docs/errors.md documents one; what cannot be computed is an explicit error."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from conftest import beta_flag, family_params, real_valued_models
from typer.testing import CliRunner

from nphcli.cli import app
from nphcli.evaluation import metrics

D = 16
BETAS = ["1e-06", "10000"]


def _pools() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    base = rng.normal(size=(8, D)).astype(np.float32)
    return {
        "normal": base,
        "huge": base * 1e6,
        "tiny": base * 1e-6,
        "all-equal": np.full((8, D), 0.25, dtype=np.float32),
        "all-zero": np.zeros((8, D), dtype=np.float32),
        "duplicates": np.concatenate([base[:4], base[:4]]),
        "M=1": base[:1],
    }


# memory name → (pool, `nph store --dtype`)
MEMORIES = {name: (name, "float32") for name in _pools()}
MEMORIES.update(
    {
        "float16": ("normal", "float16"),
        "bfloat16": ("normal", "bfloat16"),
        "huge bfloat16": ("huge", "bfloat16"),
        "tiny float16": ("tiny", "float16"),
    }
)


def _run(*args) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def memories(tmp_path_factory) -> dict[str, str]:
    """Every memory of MEMORIES, written by `nph store` from a .npy file."""
    folder = tmp_path_factory.mktemp("numerics")
    for name, array in _pools().items():
        np.save(folder / f"{name}.npy", array)
    paths = {}
    for name, (pool, dtype) in MEMORIES.items():
        path = folder / f"{name.replace(' ', '-')}.safetensors"
        code, _, err = _run("store", folder / f"{pool}.npy", "--out", path, "--dtype", dtype)
        assert code == 0, err
        paths[name] = str(path)
    return paths


NULL_METRICS = ("support", "at_pattern", "at_metastable", "at_global", "attractor_size", "energy")
NULL_METRICS += ("pixel_success",)  # plain vectors have no pixels


def _strict_json(text: str):
    """Parse one JSON document, refusing NaN / Infinity tokens (Python's json accepts them)."""

    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def _assert_finite_numbers(value, where: str, *, nulls: tuple[str, ...] = ()) -> None:
    """Every number in `value` is finite; None only at the keys named in `nulls`."""
    if isinstance(value, dict):
        for key, item in value.items():
            if item is None:
                assert key in nulls, f"{where}.{key} is null"
            else:
                _assert_finite_numbers(item, f"{where}.{key}", nulls=nulls)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            assert item is not None, f"{where}[{i}] is null"
            _assert_finite_numbers(item, f"{where}[{i}]", nulls=nulls)
    elif isinstance(value, float):
        assert math.isfinite(value), f"{where} = {value}"


def _check_retrieve_json(stdout: str, model: str) -> dict:
    report = _strict_json(stdout)
    support = report["metrics"]["support"]
    # Documented nulls: `support` for models without exact zeros (docs/retrieving.md, "Metrics"),
    # the attractor diagnostics for one-step runs ("Attractors").
    _assert_finite_numbers(report["metrics"], "metrics", nulls=NULL_METRICS)
    if support is None:
        assert "support" not in report.get("per_query", {})
    _assert_finite_numbers(report["timing"], "timing")
    _assert_finite_numbers(report.get("per_query", {}), "per_query")
    for name in ("sse", "mse", "nearest_distance"):
        assert report["metrics"][name]["mean"] >= 0
    assert -1 <= report["metrics"]["cosine"]["mean"] <= 1
    assert report["config"]["model"] == model
    return report


@pytest.mark.slow
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("memory", list(MEMORIES))
@pytest.mark.parametrize("model", real_valued_models())
def test_every_model_at_the_extremes(memories, model, memory, beta):
    args = ["retrieve", "--memory", memories[memory], "--model", model, *beta_flag(model, beta)]
    code, out, err = _run(*args, "--noise", "0.1", "--per-query", "--json")
    assert code == 0, err
    report = _check_retrieve_json(out, model)
    assert report["config"]["queries"]["Q"] == report["config"]["memory"]["M"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
@pytest.mark.parametrize("model", real_valued_models())
def test_one_query_in_each_retrieval_dtype(memories, model, dtype):
    args = ["retrieve", "--memory", memories["normal"], "--model", model, "--queries", "1"]
    code, out, err = _run(*args, "--dtype", dtype, "--mask", "0.5", "--per-query", "--json")
    assert code == 0, err
    report = _check_retrieve_json(out, model)
    assert report["config"]["queries"]["Q"] == 1
    assert report["metrics"]["sse"]["std"] == 0.0  # one query: population std 0


def test_values_that_overflow_the_retrieval_dtype_are_an_error(memories):
    """1e6 does not fit in float16 (largest 65504): an explicit error, not null metrics."""
    code, out, err = _run("retrieve", "--memory", memories["huge"], "--dtype", "float16")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and "float16" in lines[0], err
    code, out, err = _run("retrieve", "--memory", memories["huge"], "--dtype", "bfloat16")
    assert code == 0, err


def test_scores_that_overflow_are_an_error(tmp_path):
    """Patterns near 1e19 are finite in float32 but their inner products are not."""
    array = np.random.default_rng(1).normal(size=(4, D)).astype(np.float32) * 1e19
    np.save(tmp_path / "vast.npy", array)
    memory = tmp_path / "vast.safetensors"
    assert _run("store", tmp_path / "vast.npy", "--out", memory)[0] == 0
    for model in real_valued_models():
        code, out, err = _run(
            "retrieve", "--memory", memory, "--model", model, *beta_flag(model, 1)
        )
        assert code in (1, 2) and out == "", (model, err)
        lines = err.strip().splitlines()
        assert lines[-1].startswith("Error:") and "Traceback" not in err, (model, err)
        assert "overflow" in lines[-1] or "non-finite" in lines[-1], lines[-1]


@pytest.mark.parametrize("memory", list(MEMORIES))
def test_info_and_analyze_json(memories, memory):
    """`nph info` and `nph analyze` JSON: nulls only where docs/errors.md documents them."""
    one = memory == "M=1"
    code, out, err = _run("info", memories[memory], "--json")
    assert code == 0, err
    info = _strict_json(out)
    separation = info["separation"]
    # R and Δ need two patterns; the sample seed is null when every pattern is used.
    _assert_finite_numbers(
        info, "info", nulls=("R", "delta", "seed", "item_shape", "labels", "values_shape")
    )
    assert (separation["R"] is None) == one and (separation["delta"] is None) == one
    for beta in BETAS:
        code, out, err = _run("analyze", memories[memory], "--beta", beta, "--json")
        assert code == 0, err
        ws = _strict_json(out)["well_separation"]
        zero_r = separation["R"] == 0
        _assert_finite_numbers(ws, "analyze", nulls=("R", "delta", "threshold", "fraction"))
        # threshold: null when R = 0 (ln(·/R) is infinite) or M = 1; fraction: null when no
        # pattern was checked (M = 1).
        assert (ws["threshold"] is None) == (zero_r or one or separation["m"] == 0)
        assert (ws["fraction"] is None) == one
        if zero_r:
            assert ws["well_separated"] == 0


@pytest.mark.parametrize("pool", ["huge", "tiny", "all-equal", "duplicates"])
def test_sweep_over_every_model(memories, tmp_path, pool):
    dataset = memories[pool]  # a memory file is a dataset nph sweep draws from
    out = tmp_path / "runs.jsonl"
    code, stdout, err = _run(
        "sweep",
        "--dataset",
        dataset,
        "--model",
        ",".join(real_valued_models()),
        "--sizes",
        "1,4",
        "--beta",
        ",".join(BETAS),
        "--noise",
        "0.1",
        "--out",
        out,
        "--json",
    )
    assert code == 0, err
    summary = _strict_json(stdout)
    betas = sum(2 if beta_flag(model, 1) else 1 for model in real_valued_models())
    assert summary["runs"]["ran"] == betas * 2  # two β for each model that takes β, two sizes
    for row in summary["summary"]:
        _assert_finite_numbers(row["metrics"], row["setting"], nulls=NULL_METRICS)
    for line in out.read_text().splitlines():
        row = _strict_json(line)
        for key, value in row.items():
            if key.endswith(("_mean", "_std", "_median")) and not key.startswith(NULL_METRICS):
                assert value is not None and math.isfinite(value), (key, row["setting"])


# -- the metrics themselves -----------------------------------------------------------------


@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_metrics_are_finite_at_every_scale(scale, dtype):
    if dtype == torch.float16 and scale > 6e4:
        pytest.skip("not representable in float16")
    generator = torch.Generator().manual_seed(0)
    stored = (torch.randn(6, D, generator=generator) * scale).to(dtype)
    retrieved = stored[[0, 0, 3]].clone()
    targets = torch.cat([stored[:1], torch.zeros(1, D, dtype=dtype), stored[3:4]])
    out = metrics.per_query(retrieved, stored, targets=targets)
    for name, values in out.items():
        assert torch.isfinite(values.double()).all(), name
    assert out["cosine"][1] == 0  # a zero target: cosine defined as 0
    assert out["nearest"].tolist() == [0, 0, 3] and out["success"].tolist() == [1, 0, 1]
    for name in ("sse", "cosine"):
        stats = metrics.summarize(out[name])
        assert all(math.isfinite(v) for v in stats.values())


def test_ties_between_equal_patterns_go_to_the_lowest_index():
    stored = torch.full((5, D), 0.25)
    index, distance = metrics.nearest(stored[[4, 2]], stored)
    assert index.tolist() == [0, 0] and distance.tolist() == [0.0, 0.0]


class _Poisoned:
    """A model whose first retrieved value is NaN, standing in for a numerical failure."""

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model, name)

    def retrieve(self, *args, **kwargs):
        result = self._model.retrieve(*args, **kwargs)
        patterns = result.patterns.clone()
        patterns[0, 0] = float("nan")
        return dataclasses.replace(result, patterns=patterns)


def test_non_finite_model_output_is_an_error_not_a_null(memories, monkeypatch):
    import nphcli.app.request as retrieval

    real = retrieval.build_model
    monkeypatch.setattr(retrieval, "build_model", lambda settings: _Poisoned(real(settings)))
    code, out, err = _run("retrieve", "--memory", memories["normal"], "--beta", "1", "--json")
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1  # under --json: one JSON object
    assert json.loads(err) == {
        "error": "model 'dense' produced non-finite values (NaN or infinity) for 1 of 8 queries "
        "at --dtype float32; try --dtype float64, a smaller --beta, or patterns stored rescaled "
        "(nph store --normalize)",
        "exit_code": 1,
    }


# -- library level: finite inputs whose scores overflow float32 ------------------------------
# The CLI refuses these before a model runs (`evaluation.guards.check_range`); called directly,
# every model must still refuse them (`HopfieldModel.retrieve` checks its output, and the
# candidate engine its scores) or give a finite result, never NaN or a crash.


@pytest.mark.parametrize("model", real_valued_models())
def test_models_given_scores_beyond_float32_fail_clearly(model):
    from nphcli.core.errors import NphError
    from nphcli.models import create_model

    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(8, D, generator=generator) * 1e19  # finite in float32
    queries = keys[:2] + torch.randn(2, D, generator=generator) * 1e18
    try:
        rule = create_model(model, **family_params(model, beta=1.0))
        result = rule.retrieve(queries, keys, positions=torch.arange(2))
    except NphError as error:
        assert "overflow float32" in str(error)
        return
    assert torch.isfinite(result.patterns).all()  # e.g. linear's log-domain features
