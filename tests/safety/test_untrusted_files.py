"""Safety: nph never unpickles user files, downloads only with --download, and uses paths as
given (no shell). The library-level refusals are in memory/test_sources.py; these go through the CLI
and audit the source code itself."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_one_error_line

PACKAGE = Path(__file__).resolve().parents[2] / "nphcli"


class WritesAFile:
    """Unpickling this creates the file `path`: proof that code ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("NPH_DATA", str(tmp_path / "data"))
    rng = np.random.default_rng(0)
    np.save(tmp_path / "good.npy", rng.normal(size=(6, 4)).astype(np.float32))
    assert not (tmp_path / "memory.safetensors").exists()
    return tmp_path


def _pickles(folder: Path) -> dict[str, Path]:
    marker = str(folder / "UNPICKLED")
    files = {
        "npy": folder / "object.npy",
        "npz": folder / "object.npz",
        "pt": folder / "object.pt",
        "pt-dict": folder / "dict.pt",
    }
    objects = np.array([WritesAFile(marker), WritesAFile(marker)], dtype=object)
    np.save(files["npy"], objects, allow_pickle=True)
    np.savez(files["npz"], x=objects)
    torch.save(WritesAFile(marker), files["pt"])
    torch.save({"x": torch.ones(2, 4), "y": WritesAFile(marker)}, files["pt-dict"])
    return files


@pytest.mark.parametrize("kind", ["npy", "npz", "pt", "pt-dict"])
@pytest.mark.parametrize("command", ["store", "queries", "sweep"])
def test_pickled_objects_are_refused_and_never_run(invoke, folder, kind, command):
    path = _pickles(folder)[kind]
    if command == "store":
        result = invoke("store", path)
    elif command == "queries":
        assert invoke("store", "good.npy").exit_code == 0
        result = invoke("retrieve", "--queries-file", path)
    else:
        result = invoke("sweep", "--dataset", path, "--sizes", "2", "--out", "r.jsonl")
    message = assert_one_error_line(result, "cannot read")
    if kind.startswith("pt"):
        assert "weights_only=True" in message
    assert not (folder / "UNPICKLED").exists()
    assert not (folder / "r.jsonl").exists()


def test_paths_are_used_as_given_never_by_a_shell(invoke, folder):
    name = "a; touch SHELL1 $(touch SHELL2) `touch SHELL3` | x.npy"
    (folder / name).write_bytes((folder / "good.npy").read_bytes())
    out = "out $(touch SHELL4).safetensors"
    result = invoke("store", name, "--out", out)
    assert result.exit_code == 0, result.stderr
    assert (folder / out).is_file()
    assert not list(folder.glob("SHELL*"))


def test_no_download_without_the_flag(invoke, folder, monkeypatch):
    """Every torchvision dataset nph opens gets download=False unless --download is given."""
    import torchvision.datasets

    asked = []
    for name in ("MNIST", "FashionMNIST", "CIFAR10"):
        real = getattr(torchvision.datasets, name)

        def recording(*args, real=real, **kwargs):
            asked.append(kwargs.get("download"))
            return real(*args, **kwargs)

        monkeypatch.setattr(torchvision.datasets, name, recording)
    for source in ("mnist", "cifar10"):
        result = invoke("store", source, "--n", "5", "--out", f"{source}.safetensors")
        assert result.exit_code == 0, result.stderr
    result = invoke("store", "fashion-mnist", "--n", "5", "--out", "f.safetensors")
    assert result.exit_code in (0, 2)  # Debian's package may be missing: a clear error then
    assert asked and not any(asked)


# -- the source itself ----------------------------------------------------------------------


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, ast.unparse(node.func)


def _keyword(call: ast.Call, name: str):
    for keyword in call.keywords:
        if keyword.arg == name:
            return ast.unparse(keyword.value)
    return None


def test_source_audit():
    """No pickle, eval/exec, shell or subprocess in nph; torch.load only with
    weights_only=True and np.load only with allow_pickle=False. torchvision's own unpickling
    of md5-checked CIFAR-10 batches (docs/memory-files.md, "Sources") is outside this package."""
    forbidden_modules = {"pickle", "cPickle", "dill", "marshal", "shelve", "subprocess"}
    forbidden_calls = {"eval", "exec", "os.system", "os.popen", "compile", "__import__"}
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20
    loads = 0
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[0]}
            else:
                continue
            assert not names & forbidden_modules, (path, names)
        for call, name in _calls(tree):
            where = f"{path.relative_to(PACKAGE)}:{call.lineno}"
            assert name not in forbidden_calls, where
            assert _keyword(call, "shell") in (None, "False"), where
            if name.endswith("torch.load"):
                assert _keyword(call, "weights_only") == "True", where
                loads += 1
            if name in ("np.load", "numpy.load"):
                assert _keyword(call, "allow_pickle") == "False", where
                loads += 1
    assert loads >= 4  # the audit found the loaders it is meant to check


def test_docs_name_the_one_exception():
    readme = (PACKAGE.parent / "docs" / "errors.md").read_text(encoding="utf-8")
    assert "allow_pickle=False" in readme and "weights_only=True" in readme
    assert "md5" in readme
