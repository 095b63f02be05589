"""What users of similar tools expect. Hetero-association from the CLI
(`store --values/--labels`), labelled and scaled grids, per-query tables that are not cut when
piped, shell completion, --quiet, JSON errors under --json, the small public API and the LICENSE.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_one_error_line, write_memory
from PIL import Image

import nphcli
from nphcli.memory.file import load_memory

REPO = Path(nphcli.__file__).resolve().parent.parent


@pytest.fixture
def pairs(tmp_path):
    """30 keys (30, 8), values (30, 5) and labels (30,) as files, row i belonging together."""
    rng = np.random.default_rng(5)
    keys = rng.normal(size=(30, 8)).astype(np.float32)
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)  # unit norm: each key scores itself best
    values = rng.normal(size=(30, 5)).astype(np.float32)
    labels = rng.integers(0, 4, size=30)
    np.save(tmp_path / "keys.npy", keys)
    np.save(tmp_path / "values.npy", values)
    np.savetxt(tmp_path / "labels.csv", labels, fmt="%d")
    return tmp_path, keys, values, labels


# -- hetero-association from the CLI ------------------------------------------------------------


@pytest.mark.parametrize("n", [None, 10])
def test_store_values_and_labels_stay_paired_with_their_keys(invoke, pairs, n):
    folder, keys, values, labels = pairs
    out = folder / "h.safetensors"
    extra = ["--n", str(n), "--seed", "3"] if n else []
    result = invoke(
        "store", folder / "keys.npy", "--values", folder / "values.npy",
        "--labels", folder / "labels.csv", "--out", out, *extra,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    memory = load_memory(out)
    stored = memory.patterns.numpy()
    assert stored.shape == (n or 30, 8)
    # which source row each stored key is, found by comparing rows (not by nph's subset code)
    rows = [int(np.flatnonzero((keys == row).all(axis=1))[0]) for row in stored]
    assert rows == sorted(rows) and len(set(rows)) == len(rows)
    np.testing.assert_array_equal(memory.values.numpy(), values[rows])
    np.testing.assert_array_equal(memory.labels.numpy(), labels[rows])


def test_hetero_memory_from_the_cli_retrieves_values(invoke, pairs):
    folder, keys, values, _ = pairs
    out = folder / "h.safetensors"
    result = invoke("store", folder / "keys.npy", "--values", folder / "values.npy", "--out", out)
    assert result.exit_code == 0, result.stderr
    report = json.loads(invoke("retrieve", "--memory", out, "--beta", "50", "--json").stdout)
    assert report["config"]["memory"]["hetero"] is True
    assert report["config"]["memory"]["d_v"] == 5
    assert report["metrics"]["success"]["mean"] == 1.0


@pytest.mark.parametrize(
    ("option", "content", "words"),
    [
        ("--values", np.zeros((29, 5), np.float32), ["29 rows", "30 patterns"]),
        ("--labels", np.zeros(31), ["31 rows", "30 patterns"]),
        ("--labels", np.full(30, 0.5), ["whole numbers"]),
    ],
)
def test_store_pairing_errors_are_one_line(invoke, pairs, option, content, words):
    folder = pairs[0]
    np.save(folder / "bad.npy", content)
    out = folder / "h.safetensors"
    result = invoke("store", folder / "keys.npy", option, folder / "bad.npy", "--out", out)
    assert_one_error_line(result, *words)
    assert not out.exists()


# -- the grid -----------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1, 3])
def test_grid_rows_are_labelled_and_scaled(invoke, digits, tmp_path, scale):
    path = tmp_path / "g.png"
    args = ["--memory", digits, "--queries", "2", "--save-grid", path, "--scale", str(scale)]
    result = invoke("retrieve", *args)
    assert result.exit_code == 0, result.stderr
    image = np.asarray(Image.open(path))
    grid_width = scale * (2 * 28 + 3 * 2)
    assert image.shape[0] == scale * (3 * 28 + 4 * 2)  # three rows of 28-pixel digits
    margin = image[:, grid_width:]
    assert margin.shape[1] > 10 * scale  # room for the names
    assert (margin == 255).mean() > 0.7 and (margin < 100).any()  # dark text on white
    for r in range(3):  # a name beside each row of cells, nothing in the gutters between
        top = scale * (2 + r * 30)
        assert (margin[top : top + 28 * scale] < 100).any()
    assert not (margin[: scale * 2] < 100).any()


def test_grid_scale_out_of_range_is_refused(invoke, digits, tmp_path):
    result = invoke(
        "retrieve", "--memory", digits, "--save-grid", tmp_path / "g.png", "--scale", "0"
    )
    assert_one_error_line(result, "--scale must be a whole number from 1 to")
    assert not (tmp_path / "g.png").exists()


# -- output for pipes and scripts ---------------------------------------------------------------


def test_per_query_table_is_not_cut_when_piped(invoke, digits):
    # COLUMNS unset (pytest-xdist's workers set it to 80): a set COLUMNS is honoured when piped
    args = ("retrieve", "--memory", digits, "--queries", "4", "--per-query")
    result = invoke(*args, env={"COLUMNS": None})
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Per query"))
    header = lines[start + 2]
    for column in ("query_row", "target_index", "nearest_distance", "cosine", "support"):
        assert column in header, header
    body = [line for line in lines[start + 4 :] if line.startswith("│")]
    assert len(body) == 4  # one line per query: no cell wrapped onto a second line
    assert all("…" not in line for line in lines[start:])
    assert max(len(line) for line in lines[start:]) > 80


def test_shell_completion_is_offered(invoke, monkeypatch):
    # Without this typer asks shellingham for the parent shell, which depends on how pytest was
    # started (it failed once with "Shell  not supported"); with it, the shell is named.
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    result = invoke("--show-completion", "bash")
    assert result.exit_code == 0, result.stderr
    assert "complete" in result.stdout and "_NPH_COMPLETE" in result.stdout.upper()
    assert "--install-completion" in invoke("--help").stdout


def test_quiet_silences_notices_not_errors(invoke, tmp_path):
    path = tmp_path / "v.safetensors"
    write_memory(path, torch.randn(12, 4, generator=torch.Generator().manual_seed(0)))
    loud = invoke("retrieve", "--memory", path)
    assert loud.exit_code == 0 and "note:" in loud.stderr  # β does not suit these norms
    quiet = invoke("--quiet", "retrieve", "--memory", path)
    assert quiet.exit_code == 0 and quiet.stderr == ""
    assert "Metrics" in quiet.stdout
    assert_one_error_line(invoke("-q", "retrieve", "--memory", tmp_path / "missing.safetensors"))


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["retrieve", "--memory", "missing.safetensors", "--json"], 2),
        (["store", "random", "--n", "0", "--json", "--out", "m.safetensors"], 2),
        (["retrieve", "--json", "--no-such-option"], 2),
        (["retrieve", "--json", "--csv"], 2),
    ],
)
def test_errors_under_json_are_a_json_object_on_stderr(invoke, tmp_path, monkeypatch, args, code):
    monkeypatch.chdir(tmp_path)
    result = invoke(*args)
    assert result.exit_code == code
    assert result.stdout == ""
    error = json.loads(result.stderr)
    assert error["exit_code"] == code and isinstance(error["error"], str) and error["error"]


def test_errors_without_json_stay_one_line(invoke, tmp_path):
    result = invoke("retrieve", "--memory", tmp_path / "missing.safetensors")
    assert "{" not in assert_one_error_line(result, "missing.safetensors")


# -- public API, license, install docs ----------------------------------------------------------


PUBLIC = {
    "store": "nphcli.app.store.store_memory",
    "open_memory": "nphcli.memory.open.open_memory",
    "Memory": "nphcli.memory.bank.Memory",
    "create_model": "nphcli.models.create_model",
    "list_models": "nphcli.models.list_models",
    "retrieve": "nphcli.models.retrieve",
    "evaluate": "nphcli.evaluation.evaluate.evaluate",
    "RetrieveSettings": "nphcli.evaluation.settings.RetrieveSettings",
    "Corruption": "nphcli.evaluation.corruption.Corruption",
    "recall": "nphcli.app.recall.recall",
}


def test_public_api_is_lazy_and_works(tmp_path):
    """`import nphcli` stays torch-free; every public name is listed and loads on first use."""
    code = (
        "import sys, nphcli\n"
        "assert 'torch' not in sys.modules, 'import nphcli pulled in torch'\n"
        f"assert {set(PUBLIC)!r} | {{'NphError'}} <= set(dir(nphcli)) & set(nphcli.__all__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": ""},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    import importlib

    for name, where in PUBLIC.items():
        module, attribute = where.rsplit(".", 1)
        assert getattr(nphcli, name) is getattr(importlib.import_module(module), attribute), name
    assert nphcli.NphError is importlib.import_module("nphcli.core.errors").NphError


def test_public_api_stores_opens_retrieves_and_evaluates(tmp_path):
    import nphcli as nph

    path = tmp_path / "m.safetensors"
    patterns = torch.nn.functional.normalize(torch.randn(10, 6), dim=1)
    numpy_file = tmp_path / "patterns.npy"
    np.save(numpy_file, patterns.numpy())
    stored = nph.store(numpy_file, path, normalize="none")
    assert stored.path == path
    memory = nph.open_memory(path)
    assert torch.equal(memory.patterns, patterns)
    settings = nph.RetrieveSettings(
        model="topk", params={"k": 2, "beta": 50.0}, corruption=nph.Corruption(noise=0.01)
    )
    report = nph.evaluate(memory, settings)
    assert report.metrics["success"]["mean"] == 1.0
    bare = nph.retrieve(memory.patterns[:3], memory, model="dense", beta=50.0)
    kept = nph.create_model("dense", beta=50.0).retrieve(memory.patterns[:3], memory.patterns)
    assert bare.patterns.shape == (3, 6) and torch.equal(bare.patterns, kept.patterns)
    assert "topk" in [info.name for info in nph.list_models()]
    with pytest.raises(nph.NphError):
        nph.create_model("no-such-model")
    with pytest.raises(AttributeError):
        nph.no_such_name  # noqa: B018


def test_readme_lists_the_public_api_and_cpu_install():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "import nphcli as nph" in readme
    assert "download.pytorch.org/whl/cpu" in readme
    assert "pip install -e ." in readme


def test_license_is_mit_and_declared():
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License") and "WITHOUT WARRANTY" in text
    assert 'license = { text = "MIT" }' in (REPO / "pyproject.toml").read_text(encoding="utf-8")


@pytest.mark.slow  # builds a wheel
def test_license_is_in_the_wheel(tmp_path):
    import shutil
    import zipfile

    source = tmp_path / "src"  # a copy: building leaves build/ and *.egg-info behind
    skip = shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", ".*cache", ".hyp*")
    shutil.copytree(REPO, source, ignore=skip)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
         "-q", "-w", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if result.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {result.stderr[-300:]}")
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(name.endswith("/LICENSE") and ".dist-info/" in name for name in names), names
