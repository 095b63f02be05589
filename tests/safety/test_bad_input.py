"""Every bad input through the real CLI: one `Error:` line on stderr naming the
problem, exit code 2, no traceback, nothing written, and every file already there unchanged."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_one_error_line
from PIL import Image
from safetensors.torch import save_file

from nphcli.memory.file import FORMAT_NAME, save_memory

M, D = 8, 16  # the scenario memory: 8 patterns of 16 values


def _nph_meta(**extra) -> dict[str, str]:
    meta = {"format": FORMAT_NAME, "format_version": 1, **extra}
    return {key: json.dumps(value) for key, value in meta.items()}


def _png(path: Path, size: tuple[int, int]) -> None:
    Image.new("L", size, color=128).save(path)


@pytest.fixture
def scene(tmp_path, monkeypatch):
    """A folder of good and bad inputs; the tests run inside it with an empty data root."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("NPH_DATA", str(tmp_path / "data"))
    rng = np.random.default_rng(0)
    patterns = rng.normal(size=(M, D)).astype(np.float32)
    save_memory(tmp_path / "mem.safetensors", torch.from_numpy(patterns))
    good = (tmp_path / "mem.safetensors").read_bytes()
    # Broken memory files.
    (tmp_path / "adir").mkdir()
    (tmp_path / "folder.safetensors").mkdir()  # a folder where a memory file goes
    (tmp_path / "empty.safetensors").write_bytes(b"")
    (tmp_path / "truncated.safetensors").write_bytes(good[: len(good) // 2])
    _png(tmp_path / "picture.png", (4, 4))
    (tmp_path / "picture.safetensors").write_bytes((tmp_path / "picture.png").read_bytes())
    (tmp_path / "text.safetensors").write_text("patterns: 1 2 3\n")
    save_file({"patterns": torch.ones(D)}, str(tmp_path / "flat.safetensors"), _nph_meta())
    save_file({"patterns": torch.ones(M, 4, 4)}, str(tmp_path / "cube.safetensors"), _nph_meta())
    ints = torch.ones(M, D, dtype=torch.int64)
    save_file({"patterns": ints}, str(tmp_path / "ints.safetensors"), _nph_meta())
    save_file({"patterns": torch.ones(D)}, str(tmp_path / "foreign1d.safetensors"))
    newer = {"format": FORMAT_NAME, "format_version": 99}
    save_file(
        {"patterns": torch.ones(M, D)},
        str(tmp_path / "newer.safetensors"),
        {k: json.dumps(v) for k, v in newer.items()},
    )
    nan_memory = torch.ones(M, D)
    nan_memory[2, 3] = float("nan")
    save_file({"patterns": nan_memory}, str(tmp_path / "nanmem.safetensors"), _nph_meta())
    # Arrays with NaN / inf, queries and targets.
    np.save(tmp_path / "pool.npy", patterns)
    np.savetxt(tmp_path / "pool.csv", patterns, delimiter=",")
    bad = patterns.copy()
    bad[1, 2] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    bad[1, 2] = np.inf
    np.save(tmp_path / "inf.npy", bad)
    np.save(tmp_path / "q.npy", patterns[:3])
    np.save(tmp_path / "q15.npy", patterns[:3, :15])
    np.save(tmp_path / "t2.npy", patterns[:2])
    bad_q = patterns[:3].copy()
    bad_q[0, 0] = np.nan
    np.save(tmp_path / "nanq.npy", bad_q)
    bad_q[0, 0] = -np.inf
    np.save(tmp_path / "infq.npy", bad_q)
    # Folders of images and CSV tables.
    (tmp_path / "mixed").mkdir()
    _png(tmp_path / "mixed" / "a.png", (4, 4))
    _png(tmp_path / "mixed" / "b.png", (5, 4))
    (tmp_path / "withtext").mkdir()
    _png(tmp_path / "withtext" / "a.png", (4, 4))
    (tmp_path / "withtext" / "readme.txt").write_text("not a picture\n")
    (tmp_path / "word.csv").write_text("1,2,3\n4,five,6\n")
    (tmp_path / "ragged.csv").write_text("1,2,3\n4,5\n")
    (tmp_path / "notes.txt").write_text("a regular file, not a folder\n")
    # Sweep inputs.
    (tmp_path / "badkey.toml").write_text("sizez = [4]\n")
    (tmp_path / "results.jsonl").write_text("this is not a results file\n")
    (tmp_path / "results.txt").write_text("1,2\n")
    return tmp_path


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every file's bytes (None for folders) under `folder`, by relative path."""
    out: dict[str, bytes | None] = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        out[key] = None if path.is_dir() else path.read_bytes()
    return out


def check_refused(invoke, folder: Path, args, pattern: str):
    """Run `nph ARGS`; assert the bad-input contract and return the error line."""
    before = snapshot(folder)
    line = assert_one_error_line(invoke(*args))
    assert re.search(pattern, line, re.IGNORECASE), (args, pattern, line)
    after = snapshot(folder)
    assert after == before, f"files changed: {sorted(set(after) ^ set(before))}"
    return line


# -- memory files: every command that reads one -------------------------------------------------

BROKEN_MEMORIES = [
    ("missing", "nope.safetensors", r"not found|no such file"),
    ("directory", "adir", r"directory|no PNG or JPEG"),
    ("empty", "empty.safetensors", r"empty"),
    ("truncated", "truncated.safetensors", r"not a readable safetensors"),
    ("png", "picture.safetensors", r"not a readable safetensors"),
    ("text", "text.safetensors", r"not a readable safetensors"),
    ("1-D", "flat.safetensors", r"2-D|shape \(16,\)"),
    ("3-D", "cube.safetensors", r"2-D"),
    ("integer", "ints.safetensors", r"floating point"),
    ("foreign 1-D", "foreign1d.safetensors", r"2-D|shape \(16,\)"),
    ("newer version", "newer.safetensors", r"version 99.*upgrade"),
    ("NaN inside", "nanmem.safetensors", r"NaN"),
]
# `nph store` reads any safetensors file as a source: a 3-D tensor is one image per item and
# integers are numbers there, so those two are fine inputs for it.
STORE_ACCEPTS = {"3-D", "integer"}


def _memory_commands(file: str) -> dict[str, list[str]]:
    return {
        "info": ["info", file],
        "retrieve": ["retrieve", "--memory", file],
        "analyze": ["analyze", file],
        "store": ["store", file, "--out", "new.safetensors"],
        "retrieve-queries": ["retrieve", "--memory", "mem.safetensors", "--queries-file", file],
    }


MEMORY_CASES = [
    pytest.param(args, pattern, id=f"{name}-{command}")
    for name, file, pattern in BROKEN_MEMORIES
    for command, args in _memory_commands(file).items()
    if not (command in ("store", "retrieve-queries") and name in STORE_ACCEPTS)
]


@pytest.mark.parametrize(("args", "pattern"), MEMORY_CASES)
def test_broken_memory_files(invoke, scene, args, pattern):
    if args[0] == "retrieve" and "--queries-file" in args and args[-1] == "nope.safetensors":
        pattern = "not found"
    check_refused(invoke, scene, args, pattern)


# -- everything else ------------------------------------------------------------------------------

R = ["retrieve", "--memory", "mem.safetensors"]
SWEEP = ["sweep", "--dataset", "pool.npy", "--sizes", "4", "--out", "r.jsonl"]
CASES = [
    # NaN or inf from .npy files
    ("store NaN", ["store", "nan.npy"], r"NaN"),
    ("store inf", ["store", "inf.npy"], r"infinite"),
    ("queries NaN", [*R, "--queries-file", "nanq.npy"], r"NaN"),
    ("queries inf", [*R, "--queries-file", "infq.npy"], r"infinite"),
    ("targets NaN", [*R, "--queries-file", "q.npy", "--targets-file", "nanq.npy"], r"NaN"),
    ("sweep NaN", ["sweep", "--dataset", "nan.npy", "--sizes", "4"], r"NaN"),
    # --n
    ("n 0", ["store", "random", "--n", "0"], r"--n"),
    ("n negative", ["store", "random", "--n", "-3"], r"--n"),
    ("n too large", ["store", "pool.npy", "--n", "9"], r"more than the 8"),
    ("n not a number", ["store", "random", "--n", "many"], r"--n"),
    # --k
    ("k 0", [*R, "--model", "topk", "--k", "0"], r"--k"),
    ("k > M", [*R, "--model", "topk", "--k", "9"], r"--k"),
    ("k fraction <= 0", [*R, "--model", "topk", "--k", "-0.5"], r"--k"),
    ("k fraction >= 1", [*R, "--model", "random", "--k", "1.5"], r"--k"),
    ("k not a number", [*R, "--model", "topk", "--k", "half"], r"--k"),
    ("k 0 sweep", [*SWEEP, "--model", "topk", "--k", "0"], r"--k|k must"),
    ("k > M sweep", [*SWEEP, "--model", "topk", "--k", "5"], r"\bk\b"),
    ("k 0 analyze", ["analyze", "mem.safetensors", "--k", "0"], r"--k|\bk\b"),
    # --beta
    ("beta 0", [*R, "--beta", "0"], r"--beta"),
    ("beta negative", [*R, "--beta", "-1"], r"--beta"),
    ("beta inf", [*R, "--beta", "inf"], r"--beta"),
    ("beta nan", [*R, "--beta", "nan"], r"--beta"),
    ("beta 0 analyze", ["analyze", "mem.safetensors", "--beta", "0"], r"--beta"),
    ("beta nan analyze", ["analyze", "mem.safetensors", "--beta", "nan"], r"--beta"),
    ("beta 0 sweep", [*SWEEP, "--beta", "0"], r"beta"),
    ("beta inf sweep", [*SWEEP, "--beta", "inf"], r"beta"),
    # --steps, --heads, --window, --features
    ("steps 0", [*R, "--steps", "0"], r"--steps"),
    ("steps negative", [*R, "--steps", "-2"], r"--steps"),
    ("heads not dividing d", [*R, "--model", "multihead", "--heads", "3"], r"--heads|divide"),
    ("heads 0", [*R, "--model", "multihead", "--heads", "0"], r"--heads"),
    ("window negative", [*R, "--model", "window", "--window", "-1"], r"--window"),
    ("features 0", [*R, "--model", "random-feature", "--features", "0"], r"--features"),
    # --mask, --noise
    ("mask negative", [*R, "--mask", "-0.1"], r"--mask"),
    ("mask above 1", [*R, "--mask", "1.5"], r"--mask"),
    ("mask nan", [*R, "--mask", "nan"], r"--mask"),
    ("mask sweep", [*SWEEP, "--mask", "2"], r"mask"),
    ("noise negative", [*R, "--noise", "-1"], r"--noise"),
    ("noise inf", [*R, "--noise", "inf"], r"--noise"),
    ("noise sweep", [*SWEEP, "--noise", "-1"], r"noise"),
    ("noise overflowing float32", [*R, "--noise", "1e300"], r"--noise.*overflow"),
    ("fill nan", [*R, "--mask", "0.5", "--fill", "nan"], r"--fill"),
    ("fill overflowing float32", [*R, "--mask", "0.5", "--fill", "1e300"], r"--fill"),
    ("noise analyze", ["analyze", "mem.safetensors", "--model", "dense", "--noise", "-1"], "noise"),
    # flags a model does not take; unknown names
    ("flag not taken k", [*R, "--model", "dense", "--k", "5"], r"--k"),
    ("flag not taken window", [*R, "--model", "topk", "--window", "2"], r"--window"),
    ("flag not taken sweep", [*SWEEP, "--model", "dense", "--k", "3"], r"takes 'k'"),
    ("unknown model", [*R, "--model", "hopscotch"], r"hopscotch"),
    ("unknown model sweep", [*SWEEP, "--model", "hopscotch"], r"hopscotch"),
    ("unknown model analyze", ["analyze", "mem.safetensors", "--model", "hopscotch"], "hopscotch"),
    ("unknown dataset", ["store", "imagenet"], r"unknown source 'imagenet'"),
    ("unknown dataset sweep", ["sweep", "--dataset", "imagenet"], r"imagenet"),
    ("unknown preset", ["sweep", "--preset", "paper-nope"], r"unknown preset"),
    ("unknown config key", ["sweep", "--config", "badkey.toml"], r"unknown key 'sizez'"),
    ("missing config", ["sweep", "--config", "absent.toml"], r"not found"),
    # devices and dtypes
    ("device unknown", [*R, "--device", "tpu"], r"unknown device"),
    ("device cuda:7", [*R, "--device", "cuda:7"], r"cuda:7"),
    ("device sweep", [*SWEEP, "--device", "tpu"], r"unknown device"),
    ("dtype unknown", [*R, "--dtype", "int8"], r"dtype"),
    ("dtype unknown store", ["store", "random", "--dtype", "int8"], r"--dtype"),
    ("dtype unknown sweep", [*SWEEP, "--dtype", "float8"], r"dtype"),
    # own queries and targets
    ("queries dimension", [*R, "--queries-file", "q15.npy"], r"d = 16"),
    ("targets count", [*R, "--queries-file", "q.npy", "--targets-file", "t2.npy"], r"2 targets"),
    ("target index range", [*R, "--queries-file", "q.npy", "--target-indices", "0,1,8"], r"\b8\b"),
    ("target indices count", [*R, "--queries-file", "q.npy", "--target-indices", "0,1"], "2 tar"),
    (
        "target indices file",
        [*R, "--queries-file", "q.npy", "--target-indices", "@nope.txt"],
        "cannot read",
    ),
    # outputs
    ("out missing folder store", ["store", "random", "--out", "no/m.safetensors"], r"no.*exist"),
    ("out missing folder retrieve", [*R, "--out", "no/r.safetensors"], r"does not exist"),
    ("grid missing folder", [*R, "--save-grid", "no/g.png"], r"does not exist"),
    ("out missing folder sweep", ["sweep", "--dataset", "pool.npy", "--out", "no/r.jsonl"], "no"),
    ("out missing folder plot", ["plot", "results.txt", "--out", "no/p.png"], r"does not exist"),
    ("out under a file store", ["store", "random", "--out", "notes.txt/m.safetensors"], "folder"),
    ("out under a file retrieve", [*R, "--out", "notes.txt/r.safetensors"], r"not a folder"),
    (
        "out under a file sweep",
        ["sweep", "--dataset", "pool.npy", "--out", "notes.txt/r.jsonl"],
        "folder",
    ),
    ("out is the memory", [*R, "--out", "mem.safetensors", "--force"], r"input"),
    ("grid is the memory", [*R, "--save-grid", "mem.safetensors", "--force"], r"input"),
    ("out is the queries", [*R, "--queries-file", "q.npy", "--out", "q.npy", "--force"], "input"),
    (
        "store out is the source",
        ["store", "mem.safetensors", "--out", "mem.safetensors", "--force"],
        "input",
    ),
    (
        "sweep out is the dataset",
        ["sweep", "--dataset", "pool.csv", "--out", "pool.csv", "--force"],
        "input",
    ),
    ("out exists", ["store", "random", "--out", "mem.safetensors"], r"--force"),
    (
        "out is a folder",
        ["store", "random", "--out", "folder.safetensors", "--force"],
        r"directory",
    ),
    # image folders and CSV tables
    ("mixed sizes", ["store", "mixed"], r"--size"),
    ("non-image file", ["store", "withtext"], r"readme.txt"),
    ("mixed sizes queries", [*R, "--queries-file", "mixed"], r"--size"),
    ("non-numeric csv", ["store", "word.csv"], r"'five'"),
    ("ragged csv", ["store", "ragged.csv"], r"line 2"),
    ("non-numeric csv queries", [*R, "--queries-file", "word.csv"], r"'five'"),
    # plot
    ("plot missing results", ["plot", "absent.jsonl"], r"not found"),
    ("plot bad results", ["plot", "results.jsonl"], r"results"),
    ("plot wrong ending", ["plot", "results.txt"], r"\.jsonl"),
    ("plot picture as results", ["plot", "picture.png"], r"\.jsonl"),
    ("plot bad size", ["plot", "results.jsonl", "--size", "huge"], r"--size"),
    # analyze
    ("analyze sample", ["analyze", "mem.safetensors", "--sample", "-1"], r"--sample"),
    ("analyze unstructured model", ["analyze", "mem.safetensors", "--model", "sparse"], r"4\.1"),
    # the other commands
    ("attractors one step", ["attractors", "--memory", "mem.safetensors"], r"--steps > 1"),
    (
        "attractors flip of real values",
        ["attractors", "--memory", "mem.safetensors", "--steps", "3", "--flip", "0.1"],
        r"--flip flips bits",
    ),
    ("batch missing jobs", ["batch", "absent.jsonl"], r"cannot read jobs file absent\.jsonl"),
    ("index missing memory", ["index", "absent.safetensors"], r"absent\.safetensors not found"),
    ("shard no parts", ["shard", "mem.safetensors", "--parts", "0"], r"--parts"),
    ("mil unknown preset", ["mil", "--preset", "nope"], r"--preset must be one of paper, quick"),
    ("mil no epochs", ["mil", "--epochs", "0"], r"--epochs must be ≥ 1"),
    ("paper unknown table", ["paper", "nope"], r"No such command 'nope'"),
    ("paper mil protocol", ["paper", "mil", "--protocol", "x"], r"protocol.*'x' is not one"),
    ("paper mil no data", ["paper", "mil", "--data", "absent"], r"absent not found"),
    ("models extra argument", ["models", "nope"], r"unexpected extra argument.*nope"),
    ("doctor unknown option", ["doctor", "--bogus"], r"No such option: --bogus"),
    ("report of a missing file", ["report", "absent.jsonl"], r"absent\.jsonl"),
    ("recall an empty query", ["recall", "mem.safetensors", " "], r"the query is empty"),
    ("add to a memory without ids", ["add", "mem.safetensors", "pool.npy"], r"has no ids"),
    ("forget no ids", ["forget", "mem.safetensors"], r"give the ids to forget"),
    ("compact missing memory", ["compact", "absent.safetensors"], r"absent\.safetensors not"),
    ("serve missing memory", ["serve", "absent.safetensors"], r"not found|MCP SDK"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("args", "pattern"), [pytest.param(a, p, id=i) for i, a, p in CASES])
def test_bad_input(invoke, scene, args, pattern):
    if args[-1] == "cuda:7" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    check_refused(invoke, scene, args, pattern)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_cuda(invoke, scene):
    check_refused(invoke, scene, [*R, "--device", "cuda"], r"CUDA")


@pytest.mark.parametrize(
    "args",
    [
        ["store", "random", "--out", "locked/m.safetensors"],
        [*R, "--out", "locked/r.safetensors"],
        [*R, "--save-grid", "locked/g.png"],
        ["sweep", "--dataset", "pool.npy", "--sizes", "4", "--out", "locked/r.jsonl"],
        ["plot", "results.txt", "--out", "locked/p.png"],
    ],
    ids=["store", "retrieve-out", "retrieve-grid", "sweep", "plot"],
)
def test_out_into_a_folder_that_is_not_writable(invoke, scene, monkeypatch, args):
    """Root may write anywhere, so the refusal is simulated where nph asks the system."""
    (scene / "locked").mkdir()
    real = os.access

    def access(path, mode, *rest, **kwargs):
        if Path(path).resolve() == (scene / "locked").resolve() and mode & os.W_OK:
            return False
        return real(path, mode, *rest, **kwargs)

    monkeypatch.setattr(os, "access", access)
    check_refused(invoke, scene, args, r"not writable")


def test_every_command_has_a_bad_input_case():
    """Each command of the app (read from it, so a new command is counted) is refused at least
    once above: a new command comes with its bad-input case."""
    from typer.main import get_command

    from nphcli.cli import app

    covered = {case.values[0][0] for case in MEMORY_CASES} | {args[0] for _, args, _ in CASES}
    assert set(get_command(app).commands) <= covered, set(get_command(app).commands) - covered


# -- --debug / NPH_DEBUG ---------------------------------------------------------------------------


def test_debug_shows_the_traceback_of_a_user_error(invoke, scene):
    plain = invoke("info", "nope.safetensors")
    assert plain.exit_code == 2 and "Traceback" not in plain.stderr
    debug = invoke("--debug", "info", "nope.safetensors")
    assert debug.exit_code == 2  # the same exit code, so scripts behave the same
    assert "Traceback" in debug.stderr and "NphError" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].startswith("Error: memory file nope")
    again = invoke("info", "nope.safetensors")  # --debug lasts one invocation only
    assert "Traceback" not in again.stderr


def test_debug_environment_variable(invoke, scene, monkeypatch):
    monkeypatch.setenv("NPH_DEBUG", "1")
    result = invoke("retrieve", "--memory", "mem.safetensors", "--beta", "0")
    assert result.exit_code == 2
    assert "Traceback" in result.stderr and "--beta" in result.stderr.splitlines()[-1]
    monkeypatch.setenv("NPH_DEBUG", "0")  # 0 and the empty string mean off
    assert "Traceback" not in invoke("info", "nope.safetensors").stderr


@pytest.mark.slow
def test_debug_traceback_in_a_real_process(zygote, scene):
    env = {k: v for k, v in os.environ.items() if k != "NPH_DEBUG"}
    debug = zygote.run("--debug", "info", "nope.safetensors", env=env)
    assert debug.returncode == 2
    assert "Traceback" in debug.stderr and "NphError" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].endswith("create one with `nph store`")


# -- failures that are not the input's fault: exit 1, one line ------------------------------------


def test_a_full_disk_during_a_sweep_is_one_line_exit_1(invoke, scene, monkeypatch):
    import errno

    import nphcli.sweeps.results

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(nphcli.sweeps.results.os, "fsync", full)
    result = invoke(*SWEEP)
    assert result.exit_code == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [
        "Error: could not write r.jsonl: no space left on the device; free some space or write "
        "elsewhere"
    ], result.stderr
    assert "Traceback" not in result.stderr


def test_foreign_file_note_comes_once_its_tensor_is_usable(invoke, scene):
    save_file({"emb": torch.ones(5, D)}, str(scene / "foreign.safetensors"))
    for extra in ([], ["--stream"]):
        result = invoke(*R[:1], "--memory", "foreign.safetensors", "--beta", "1", *extra)
        assert result.exit_code == 0, result.stderr
        assert "foreign.safetensors has no nph metadata: using tensor 'emb'" in result.stderr


def test_docs_document_errors_exit_codes_and_debugging():
    section = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text("utf-8")
    for text in ("0 success", "2 a usage or input error", "1 any other failure", "130"):
        assert text in " ".join(section.split()), text
    for text in ("nph --debug", "NPH_DEBUG=1", "--force", ".NAME.HOST-PID.XXXXXXXX.tmp"):
        assert text in section, text


def test_resume_needs_only_the_results_file_writable(invoke, scene, monkeypatch):
    (scene / "locked").mkdir()
    out = scene / "locked" / "r.jsonl"
    assert invoke(*SWEEP[:-1], out, "--trials", "1").exit_code == 0
    real = os.access

    def access(path, mode, *rest, **kwargs):
        if Path(path).resolve() == (scene / "locked").resolve() and mode & os.W_OK:
            return False
        return real(path, mode, *rest, **kwargs)

    monkeypatch.setattr(os, "access", access)
    resumed = invoke(*SWEEP[:-1], out, "--trials", "2", "--resume")
    assert resumed.exit_code == 0, resumed.stderr
    check_refused(invoke, scene, [*SWEEP[:-1], "locked/new.jsonl"], r"not writable")
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **k: not mode & os.W_OK)
    args = [*SWEEP[:-1], out, "--trials", "3", "--resume"]
    check_refused(invoke, scene, args, r"cannot continue .*r.jsonl: the file is not writable")
