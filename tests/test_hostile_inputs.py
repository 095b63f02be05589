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
    from nphcli.sweeps.lock import ResultsLock

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
