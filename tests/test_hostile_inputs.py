"""Hostile and unlucky inputs at the edges (issue 40): one row per case, each ending in one
`Error:` line (or the documented result), never a traceback. docs/errors.md says what a user
sees. A file larger than memory is tested in tests/test_larger_than_memory.py (slow)."""

from __future__ import annotations

import json
import multiprocessing.context
import os
import signal
from pathlib import Path

import pytest
import torch
from conftest import assert_one_error_line

from nphcli.core.errors import NphError
from nphcli.core.jsontext import parse_json
from nphcli.memory.file import save_memory
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
    from nphcli.core.lock import ResultsLock

    results = tmp_path / "results.jsonl"
    results.write_text("")
    other = tmp_path / "other.jsonl"
    if link == "symlink":
        other.symlink_to(results)
    else:
        os.link(results, other)
    with ResultsLock(results):
        with pytest.raises(NphError, match="being written by another nph process"):
            ResultsLock(other)
    with ResultsLock(other):  # released: the other name locks again
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


# Results files (issue 40 item 4). One tiny sweep per format, then each case spoils a copy.
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
    """safetensors' writer fills the disk: it writes part of the file, then fails as it does on
    a full disk."""
    import safetensors.torch
    from safetensors import SafetensorError

    import nphcli.memory.file

    def save_file(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    monkeypatch.setattr(nphcli.memory.file, "save_file", save_file)


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


# Sizes without a bound (issue 40 item 7).
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


# Smaller ones (issue 40 item 8).
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
