"""`nph store` and `nph info` through the real CLI: results on stdout, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import assert_one_error_line
from safetensors.torch import save_file

import nphcli.sources
from nphcli.memory.file import load_memory


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    """Work in a fresh folder with an empty data root, so MNIST falls back to the sample."""
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("NPH_DATA", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)


def test_store_mnist_writes_100_real_digits_with_labels(invoke, tmp_path):
    result = invoke("store", "mnist", "--n", "100")
    assert result.exit_code == 0, result.stderr
    assert "bundled" in result.stderr and result.stderr.startswith("note:")
    assert "memory.safetensors" in result.stdout and "100 × 784" in result.stdout
    memory = load_memory(tmp_path / "memory.safetensors")
    assert memory.patterns.shape == (100, 784) and memory.patterns.dtype == torch.float32
    assert float(memory.patterns.min()) >= -0.5 and float(memory.patterns.max()) <= 0.5
    assert memory.labels.shape == (100,) and memory.labels.unique().numel() == 10
    meta = memory.meta
    assert meta["source"] == "mnist" and meta["split"] == "train" and meta["fallback"] is True
    assert meta["item_shape"] == [1, 28, 28] and meta["seed"] == 0
    assert meta["normalize"]["method"] == "centered" and meta["value_range"][1] <= 0.5
    assert meta["unretrievable"] == {"count": 0, "checked": 100, "of": 100}
    assert meta["selection"] == {"method": "random_subset", "n": 100, "of": 5000, "seed": 0}


def test_same_command_same_patterns(invoke, tmp_path):
    invoke("store", "mnist", "--n", "30", "--out", "a.safetensors")
    invoke("store", "mnist", "--n", "30", "--out", "b.safetensors")
    invoke("store", "mnist", "--n", "30", "--seed", "1", "--out", "c.safetensors")
    a, b, c = (load_memory(tmp_path / f"{name}.safetensors") for name in "abc")
    assert torch.equal(a.patterns, b.patterns) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.patterns, c.patterns)


def test_store_json_and_info_json_parse(invoke):
    stored = invoke("store", "random", "--n", "40", "--dim", "8", "--json")
    assert stored.exit_code == 0, stored.stderr
    report = json.loads(stored.stdout)
    assert report["path"] == "memory.safetensors" and report["labels"] is False
    assert report["meta"]["M"] == 40 and report["meta"]["format"] == "nph-memory"
    info = invoke("info", "memory.safetensors", "--json")
    assert info.exit_code == 0, info.stderr
    described = json.loads(info.stdout)
    assert (described["M"], described["d"], described["dtype"]) == (40, 8, "float32")
    sep = described["separation"]
    assert sep["m"] > 0 and sep["R"] > 0 and set(sep["delta"]) == {"min", "mean", "median", "max"}
    assert described["meta"]["source"] == "random"


def test_info_table_and_sampling_note(invoke):
    invoke("store", "random", "--n", "50", "--dim", "4", "--dtype", "bfloat16")
    result = invoke("info", "memory.safetensors", "--sample", "10")
    assert result.exit_code == 0, result.stderr
    for fragment in ("50 × 4 bfloat16", "m = max", "R = ", "Δ_μ", "10 of 50", "normalize"):
        assert fragment in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("method", ["centered", "zscore", "l2", "none"])
def test_store_records_the_normalisation(invoke, tmp_path, method):
    result = invoke("store", "cifar10", "--n", "4", "--normalize", method, "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)["meta"]["normalize"]
    assert record["method"] == method and (record["lo"], record["hi"]) == (0.0, 255.0)
    if method == "zscore":
        assert record["std"] > 0


def test_store_files_through_the_cli(invoke, tmp_path):
    np.save(tmp_path / "v.npy", np.arange(12.0).reshape(4, 3))
    result = invoke("store", "v.npy", "--out", "v.safetensors", "--json")
    assert result.exit_code == 0, result.stderr
    assert load_memory(tmp_path / "v.safetensors").patterns.tolist()[3] == [9.0, 10.0, 11.0]
    (tmp_path / "t.csv").write_text("x,y\n1,2\n3,4\n")
    assert invoke("store", "t.csv", "--out", "t.safetensors").exit_code == 0


def test_info_on_a_foreign_file_notes_the_assumption(invoke, tmp_path):
    save_file({"emb": torch.randn(5, 3)}, str(tmp_path / "foreign.safetensors"))
    result = invoke("info", "foreign.safetensors")
    assert result.exit_code == 0
    assert result.stderr.startswith("note:") and "no nph metadata" in result.stderr


def test_existing_file_without_force_fails_fast_and_is_untouched(invoke, tmp_path, monkeypatch):
    invoke("store", "random", "--n", "5", "--dim", "2")
    before = (tmp_path / "memory.safetensors").read_bytes()

    def must_not_load(*args, **kwargs):
        raise AssertionError("data was loaded before the output was checked")

    monkeypatch.setattr(nphcli.sources, "prepare_memory", must_not_load)
    result = invoke("store", "mnist")
    assert_one_error_line(result, "--force")
    assert (tmp_path / "memory.safetensors").read_bytes() == before


def test_force_replaces(invoke, tmp_path):
    invoke("store", "random", "--n", "5", "--dim", "2")
    result = invoke("store", "random", "--n", "7", "--dim", "2", "--force")
    assert result.exit_code == 0
    assert load_memory(tmp_path / "memory.safetensors").num_memories == 7


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["store", "no-such-source"], "unknown source"),
        (["store", "mnist", "--n", "0"], "--n must be at least 1"),
        (["store", "mnist", "--n", "6000"], "--download or --root"),
        (["store", "cifar10", "--n", "21"], "--download"),
        (["store", "mnist", "--dim", "3"], "--dim does not apply to mnist"),
        (["store", "random", "--split", "test"], "--split does not apply"),
        (["store", "random", "--normalize", "bogus"], "Invalid value"),
        (["store", "random", "--out", "missing/dir/m.safetensors"], "does not exist"),
        (["store", "bad.csv"], "line 2"),
        (["store", "two.npz"], "--key"),
        (["store", "pics", "--size", "big"], "WxH"),
        (["info", "absent.safetensors"], "not found"),
        (["info", "bad.csv"], "store it first: `nph store bad.csv`"),
        (["info", "two.npz", "--sample", "-1"], "--sample"),
    ],
)
def test_user_errors_are_one_line_exit_2(invoke, tmp_path, args, fragment):
    (tmp_path / "bad.csv").write_text("1,2\n3,oops\n")
    np.savez(tmp_path / "two.npz", a=np.ones((2, 2)), b=np.ones((2, 2)))
    (tmp_path / "pics").mkdir()
    result = invoke(*args)
    assert_one_error_line(result, fragment)
    assert not (tmp_path / "memory.safetensors").exists()


def test_help_does_not_import_torch():
    code = (
        "import sys\n"
        "from nphcli.cli import app\n"
        "for argv in (['--help'], ['store', '--help'], ['info', '--help']):\n"
        "    try:\n"
        "        app(argv)\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code == 0, argv\n"
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "--normalize" in result.stdout and "fashion-mnist" in result.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["mnsit", "--n", "10"], ["unknown source 'mnsit'", "did you mean 'mnist'?"]),
        (["mnist", "--n", "0"], ["--n must be at least 1, got 0"]),
    ],
)
def test_store_says_what_is_wrong_before_already_exists(invoke, tmp_path, args, words):
    """A mistyped source or --n was answered "already exists": --force would only have met
    the real error; the file is left as it was."""
    out = tmp_path / "memory.safetensors"
    out.write_bytes(b"old")
    result = invoke("store", *args, "--out", out)
    assert "already exists" not in assert_one_error_line(result, *words)
    assert out.read_bytes() == b"old"
