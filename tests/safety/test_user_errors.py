"""Failures a user can provoke end as one `Error:` line with the right exit
code and leave no file behind: a full disk, sizes that cannot be allocated, out of memory, output
names whose extension nph would not honour, a missing matplotlib, a closed pipe, and bare `nph`.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_one_error_line, write_memory
from PIL import Image


def _files(folder: Path) -> list[str]:
    """Every name in `folder`, hidden temporaries included."""
    return sorted(os.listdir(folder))


def _disk_full(*args, **kwargs):
    """Stand-in for a writer on a full disk: some bytes land in the file, then ENOSPC."""
    target = args[1] if len(args) > 1 else kwargs.get("filename")
    if isinstance(target, (str, Path)):
        Path(target).write_bytes(b"partial")
    raise OSError(errno.ENOSPC, "No space left on device")


# -- a full disk --------------------------------------------------------------------------------


def test_a_full_disk_safetensors_error(invoke, digits, tmp_path, monkeypatch):
    """safetensors (writing `retrieve --out`) reports a full disk as its own SafetensorError,
    not OSError."""
    from safetensors import SafetensorError

    def full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No '
            'space left on device" })'
        )

    monkeypatch.setattr("safetensors.torch.save_file", full)
    result = invoke("retrieve", "--memory", digits, "--out", tmp_path / "m.safetensors")
    assert_one_error_line(result, "m.safetensors", "no space left", code=1)
    assert _files(tmp_path) == []


def test_retrieve_out_on_a_full_disk(invoke, digits, tmp_path, monkeypatch):
    monkeypatch.setattr("safetensors.torch.save_file", _disk_full)
    result = invoke("retrieve", "--memory", digits, "--out", tmp_path / "r.safetensors")
    assert_one_error_line(result, "r.safetensors", "no space left", code=1)
    assert _files(tmp_path) == []


def test_retrieve_npz_out_on_a_full_disk(invoke, digits, tmp_path, monkeypatch):
    def full(handle, **arrays):
        handle.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", full)
    result = invoke("retrieve", "--memory", digits, "--out", tmp_path / "r.npz")
    assert_one_error_line(result, "r.npz", "no space left", code=1)
    assert _files(tmp_path) == []


def test_sweep_on_a_full_disk(invoke, tmp_path, monkeypatch):
    pool = tmp_path / "pool.npy"
    np.save(pool, np.random.default_rng(0).normal(size=(20, 8)).astype(np.float32))

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "r.jsonl"
    result = invoke("sweep", "--dataset", pool, "--sizes", "5", "--trials", "1", "--out", out)
    assert_one_error_line(result, "no space left", "free some space", code=1)


def test_full_disk_anywhere_else_is_one_line(invoke, tmp_path, monkeypatch):
    """An OSError ENOSPC from any step (not only nph's own writers) ends in the CLI's one line."""
    import nphcli.sources

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "/tmp/cache")

    monkeypatch.setattr(nphcli.sources, "prepare_memory", full)
    result = invoke("store", "random", "--out", tmp_path / "m.safetensors")
    assert_one_error_line(result, "no space left", "/tmp/cache", code=1)


# -- sizes and memory ---------------------------------------------------------------------------


def test_impossible_size_is_refused_before_allocating(invoke, tmp_path):
    out = tmp_path / "m.safetensors"
    result = invoke("store", "random", "--n", "100000000", "--dim", "100000", "--out", out)
    line = assert_one_error_line(result, "--n", "--dim", "TiB", code=2)
    assert "allocate" not in line  # our check, not the allocator's message
    assert _files(tmp_path) == []


def test_check_allocation_counts_bytes():
    from nphcli.core.errors import NphError
    from nphcli.core.resources import check_allocation, physical_memory

    assert check_allocation((3, 5), 4, what="x", reduce="r") == 60
    ram = physical_memory()
    if ram is None:
        pytest.skip("this platform does not report its memory")
    with pytest.raises(NphError, match="lower --n"):
        check_allocation((ram // 4 + 1,), 4, what="patterns", reduce="lower --n")


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 40000000000000 bytes."
        ),
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
        MemoryError(),
    ],
    ids=["cpu", "cuda", "python"],
)
def test_out_of_memory_is_one_line_saying_what_to_reduce(invoke, digits, monkeypatch, error):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr("nphcli.app.request.evaluate_settings", fail)
    result = invoke("retrieve", "--memory", digits)
    assert_one_error_line(result, "out of memory", "--batch-size", "--memory-budget", code=1)


def test_a_bug_keeps_its_traceback(invoke, digits, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("an index went wrong")

    monkeypatch.setattr("nphcli.app.request.evaluate_settings", fail)
    result = invoke("retrieve", "--memory", digits)
    assert isinstance(result.exception, RuntimeError)


# -- bare nph -----------------------------------------------------------------------------------


def test_bare_nph_prints_the_usual_help(invoke):
    result = invoke()
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("Usage:") and "Commands" in result.stdout
    assert "retrieve" in result.stdout and "Error" not in result.stderr
    assert len(result.stdout.splitlines()) > 10  # laid out, not flattened into one line


# -- output formats -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "magic", "fmt"),
    [("g.png", b"\x89PNG", "PNG"), ("g.jpg", b"\xff\xd8", "JPEG"), ("g.webp", b"RIFF", "WEBP")],
)
def test_save_grid_writes_the_format_its_extension_names(
    invoke, digits, tmp_path, name, magic, fmt
):
    path = tmp_path / name
    result = invoke("retrieve", "--memory", digits, "--queries", "3", "--save-grid", path)
    assert result.exit_code == 0, result.stderr
    assert path.read_bytes().startswith(magic)
    assert Image.open(path).format == fmt


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--save-grid", "g.gif"], ["g.gif", ".png"]),
        (["--save-grid", "g"], [".png"]),
        (["--out", "r.npy"], ["r.npy", ".npz"]),
        (["--out", "r.csv"], ["r.csv", ".npz"]),
    ],
)
def test_unknown_output_extension_is_refused_before_any_work(invoke, tmp_path, args, words):
    """Refused before the memory is even opened: it does not exist here."""
    args = [tmp_path / a if "." in a or a == "g" else a for a in args]
    result = invoke("retrieve", "--memory", tmp_path / "missing.safetensors", *args)
    assert_one_error_line(result, *words, code=2)
    assert _files(tmp_path) == []


def test_retrieve_out_npz_holds_the_results(invoke, digits, tmp_path):
    import json

    npz, safetensors = tmp_path / "r.npz", tmp_path / "r.safetensors"
    args = ["retrieve", "--memory", digits, "--queries", "5", "--noise", "0.2"]
    assert invoke(*args, "--out", npz).exit_code == 0
    assert invoke(*args, "--out", safetensors).exit_code == 0
    from safetensors.numpy import load_file

    reference = load_file(str(safetensors))
    with np.load(npz) as data:
        assert set(data.files) == {*reference, "config"}
        for key, value in reference.items():
            np.testing.assert_array_equal(data[key], value)
        assert json.loads(str(data["config"]))["queries"]["Q"] == 5


def test_store_out_must_be_safetensors(invoke, tmp_path):
    result = invoke("store", "random", "--out", tmp_path / "m.npy")
    assert_one_error_line(result, "m.npy", ".safetensors", code=2)
    assert _files(tmp_path) == []


@pytest.fixture
def results(invoke, tmp_path):
    pool = tmp_path / "pool.npy"
    np.save(pool, np.random.default_rng(0).normal(size=(20, 8)).astype(np.float32))
    out = tmp_path / "r.jsonl"
    args = ["--sizes", "5,8", "--trials", "1", "--beta", "0.5"]
    result = invoke("sweep", "--dataset", pool, *args, "--out", out)
    assert result.exit_code == 0, result.stderr
    return out


@pytest.mark.parametrize(("name", "magic"), [("p.svg", b"<?xml"), ("p.pdf", b"%PDF")])
def test_plot_writes_the_format_its_extension_names(invoke, results, name, magic):
    pytest.importorskip("matplotlib")
    out = results.parent / name
    result = invoke("plot", results, "--out", out)
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes().startswith(magic)
    if name.endswith(".svg"):
        assert b"<svg" in out.read_bytes()[:2000]


def test_plot_unknown_extension_is_refused(invoke, results):
    out = results.parent / "p.gif"
    assert_one_error_line(invoke("plot", results, "--out", out), "p.gif", ".svg", code=2)
    assert not out.exists()


def test_sweep_plot_without_matplotlib_fails_before_the_work(invoke, tmp_path, monkeypatch):
    pool = tmp_path / "pool.npy"
    np.save(pool, np.random.default_rng(0).normal(size=(20, 8)).astype(np.float32))
    for name in [n for n in sys.modules if n.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)  # restored after the test
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    out = tmp_path / "r.jsonl"
    args = ["--sizes", "5", "--trials", "1", "--out", out, "--plot", tmp_path / "p.png"]
    result = invoke("sweep", "--dataset", pool, *args)
    assert_one_error_line(result, "matplotlib", code=2)
    assert not out.exists()  # no run was done


# -- a closed pipe ------------------------------------------------------------------------------


@pytest.mark.slow  # a real process (a fork of the zygote) writing into a pipe
def test_output_cut_short_by_head_exits_quietly(zygote, tmp_path):
    """`nph retrieve ... | head -1`: no message, status 141 (128 + SIGPIPE, what a shell reports
    for other Unix tools stopped by a closed pipe), not 1."""
    path = tmp_path / "m.safetensors"
    write_memory(path, torch.randn(4000, 4, generator=torch.Generator().manual_seed(0)))
    command = ["retrieve", "--memory", str(path), "--per-query", "--csv"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = zygote.popen(*command, env=env, cwd=tmp_path)
    assert process.stdout.readline().startswith("query,")
    process.stdout.close()  # as head does after its lines
    stderr = process.stderr.read()
    assert process.wait(timeout=120) == 141
    assert "Traceback" not in stderr and "Error" not in stderr and "Broken" not in stderr


# -- names a user mistypes, and files given where a memory file goes ----------------


def test_closest_names_a_near_miss_and_nothing_else():
    from nphcli.core.suggest import closest, did_you_mean

    models = ["dense", "entmax", "linear", "multihead", "random", "sparse", "topk", "window"]
    assert [closest(w, models) for w in ("tpok", "sparce", "Dense", "DENSE")] == [
        "topk",
        "sparse",
        "dense",
        "dense",
    ]
    assert closest("mnsit", ["mnist", "fashion-mnist", "cifar10", "random"]) == "mnist"
    assert closest("nosie", ["noise", "noise_clip", "mask", "seed"]) == "noise"
    assert closest("xyzzy", models) is None and did_you_mean("xyzzy", models) == ""
    assert did_you_mean("tpok", models) == " (did you mean 'topk'?)"


def test_a_rule_named_by_its_softmax_points_to_its_model(invoke):
    """`--model softmax` suggested entmax (nearest spelling); the softmax rule is dense."""
    from nphcli.core.suggest import closest

    assert closest("softmax", ["dense", "entmax", "sparse"]) == "dense"
    assert closest("Sparsemax", ["dense", "entmax", "sparse"]) == "sparse"
    assert closest("softmax", ["entmax", "sparse"]) == "entmax"  # no dense: spelling decides
    result = invoke("retrieve", "--model", "softmax")
    assert_one_error_line(result, "'softmax'", "did you mean 'dense'?", "the softmax rule")


@pytest.mark.parametrize(
    ("typed", "meant"), [("tpok", "topk"), ("sparce", "sparse"), ("Dense", "dense")]
)
def test_a_mistyped_model_gets_a_did_you_mean(invoke, digits, typed, meant):
    result = invoke("retrieve", "--memory", digits, "--model", typed)
    assert_one_error_line(result, f"unknown model '{typed}'", f"did you mean '{meant}'?")


def test_a_mistyped_model_in_python_gets_a_did_you_mean():
    from nphcli.core.errors import NphError
    from nphcli.models import create_model

    with pytest.raises(NphError, match=r"did you mean 'topk'\?"):
        create_model("tpok")


def test_a_mistyped_source_gets_a_did_you_mean(invoke, tmp_path):
    result = invoke("store", "mnsit", "--out", tmp_path / "m.safetensors")
    assert_one_error_line(result, "unknown source 'mnsit'", "did you mean 'mnist'?")
    assert not (tmp_path / "m.safetensors").exists()


def test_a_mistyped_batch_key_gets_a_did_you_mean(invoke, digits, tmp_path):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(f'{{"memory": "{digits}", "nosie": 0.1}}\n')
    result = invoke("batch", jobs)
    assert result.exit_code != 0
    assert "unknown key 'nosie' (did you mean 'noise'?)" in result.stdout


def test_a_mistyped_sweep_key_and_parameter_get_a_did_you_mean(invoke, digits, tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text("nosie = [0.1]\n")
    result = invoke("sweep", "--config", config, "--dataset", digits, "--out", tmp_path / "r.csv")
    assert_one_error_line(result, "unknown key 'nosie'", "did you mean 'noise'?")
    config.write_text('[[models]]\nname = "dense"\nbta = [1.0]\n')
    result = invoke("sweep", "--config", config, "--dataset", digits, "--out", tmp_path / "r.csv")
    assert_one_error_line(result, "no parameter 'bta'", "did you mean 'beta'?")
    config.write_text('[[models]]\nname = "tpok"\n')
    result = invoke("sweep", "--config", config, "--dataset", digits, "--out", tmp_path / "r.csv")
    assert_one_error_line(result, "unknown model 'tpok'", "did you mean 'topk'?")


@pytest.mark.parametrize("name", ["x.npy", "x.png", "x.csv"])
def test_a_file_to_store_given_as_memory_says_store_it_first(invoke, tmp_path, name):
    """A `.npy` or `.png` given as --memory got the safetensors parser's message."""
    path = tmp_path / name
    if name.endswith(".npy"):
        np.save(path, np.ones((5, 4), dtype=np.float32))
    elif name.endswith(".png"):
        Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(path)
    else:
        path.write_text("0.1,0.2\n0.3,0.4\n")
    for command in ("retrieve", "info"):
        args = [command, "--memory", path] if command == "retrieve" else [command, path]
        result = invoke(*args)
        assert_one_error_line(result, "not a memory file", f"store it first: `nph store {path}`")


def test_a_broken_safetensors_file_still_says_why(invoke, tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"\xff" * 64)
    result = invoke("retrieve", "--memory", path)
    assert_one_error_line(result, "not a readable safetensors file", "a header of")
