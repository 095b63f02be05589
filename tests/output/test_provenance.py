"""Every result row names the memory it came from (content hash, path, normalisation, shape,
nph's version), and plots never average rows of different memories as trials."""

from __future__ import annotations

import csv
import hashlib
import io
import json

import pytest
import torch

from nphcli.memory import open_memory
from nphcli.memory.file import save_memory
from nphcli.memory.format import read_metadata, tensors_sha256
from nphcli.memory.provenance import content_sha256, provenance, tensors_digest
from nphcli.memory.shards import write_shards
from nphcli.presentation.plot_data import curves
from nphcli.version import __version__


def _reference_digest(tensors: dict[str, torch.Tensor]) -> str:
    """The manifests' checksum written out from its definition: name, dtype code, shape and
    the raw little-endian bytes of each tensor, in name order."""
    codes = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.float16: "F16"}
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        digest.update(json.dumps([name, codes[t.dtype], list(t.shape)]).encode())
        digest.update(t.numpy().tobytes())
    return digest.hexdigest()


def _memory(path, seed=0, labels=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(12, 5, generator=g, dtype=torch.float64)
    label = torch.arange(12) % 3 if labels else None
    save_memory(path, patterns, labels=label, dtype=dtype, meta={"normalize": {"method": "none"}})
    return patterns.to(dtype), label


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_the_recorded_hash_is_the_manifests_checksum(tmp_path, dtype):
    path = tmp_path / "m.safetensors"
    patterns, labels = _memory(path, dtype=dtype)
    want = _reference_digest({"patterns": patterns, "labels": labels})
    assert read_metadata(path)["content_sha256"] == want
    assert tensors_sha256(path) == want
    assert tensors_digest({"patterns": patterns, "labels": labels}) == want


def test_every_way_of_opening_a_memory_names_the_same_content(tmp_path):
    path = tmp_path / "m.safetensors"
    patterns, labels = _memory(path)
    want = tensors_sha256(path)
    manifest = write_shards(path, tmp_path / "shards", parts=3)
    for bank in (
        open_memory(path),
        open_memory(path, stream=True),
        open_memory(manifest),
        open_memory(manifest, stream=True),
    ):
        assert content_sha256(bank) == want
    from nphcli.memory.bank import TensorBank

    assert content_sha256(TensorBank(patterns, labels=labels)) == want  # no file: from RAM
    record = provenance(open_memory(path))
    assert record == {
        "sha256": want,
        "path": str(path.resolve()),
        "normalize": "none",
        "shape": [12, 5],
    }


def test_a_foreign_file_is_hashed_from_disk(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "foreign.safetensors"
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))
    save_file({"x": x}, str(path))
    assert content_sha256(open_memory(path)) == _reference_digest({"x": x})


def _rows(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def test_retrieve_rows_and_json_name_their_memory(tmp_path, invoke):
    path = tmp_path / "m.safetensors"
    _memory(path)
    result = invoke("retrieve", "--memory", path, "--beta", "1,2", "--noise", "0.1", "--csv")
    assert result.exit_code == 0, result.output
    rows = _rows(result.stdout)
    for row in rows:
        assert row["memory_sha256"] == tensors_sha256(path)
        assert row["memory_path"] == str(path.resolve())
        assert row["memory_normalize"] == "none"
        assert row["memory_shape"] == "12x5"
        assert row["nph_version"] == __version__
    result = invoke("retrieve", "--memory", path, "--json")
    memory = json.loads(result.stdout)["config"]["memory"]
    assert memory["sha256"] == tensors_sha256(path) and memory["normalize"] == "none"


def test_batch_objects_name_their_memory(tmp_path, invoke):
    path = tmp_path / "m.safetensors"
    _memory(path)
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"memory": str(path), "beta": [1, 2]}) + "\n")
    result = invoke("batch", jobs)
    assert result.exit_code == 0, result.output
    objects = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(objects) == 2
    assert {o["config"]["memory"]["sha256"] for o in objects} == {tensors_sha256(path)}


def test_rows_of_two_memories_with_one_name_are_never_averaged(tmp_path, invoke):
    """Two folders' memory.safetensors: same name, other contents. Each keeps its own line."""
    texts = []
    for seed in (0, 1):
        folder = tmp_path / f"run{seed}"
        folder.mkdir()
        _memory(folder / "memory.safetensors", seed=seed)
        result = invoke(
            "retrieve", "--memory", folder / "memory.safetensors", "--noise", "1", "--csv"
        )
        texts.append(result.stdout)
    rows = [row for text in texts for row in _rows(text)]
    for row in rows:
        for key, value in row.items():
            try:
                row[key] = float(value)
            except ValueError:
                pass
    data = curves(rows, metric="sse", x="noise")
    lines = data.lines
    assert len(lines) == 2
    means = sorted(points[0][1] for points in lines.values())
    assert means == sorted(row["sse_mean"] for row in rows)
    assert all(points[0][3] == 1 for points in lines.values())  # one row each, not 2 "trials"


def test_sweep_rows_name_the_pool_and_the_drawn_memory(tmp_path):
    from nphcli.sweeps.runner import Pool, draw_memory

    patterns = torch.randn(30, 4, generator=torch.Generator().manual_seed(2))
    pool = Pool(patterns, None, {"normalize": {"method": "none"}}, "random")
    assert pool.content_sha256() == _reference_digest({"patterns": patterns})
    drawn = draw_memory(pool, 10, seed=3)
    assert content_sha256(drawn) == _reference_digest({"patterns": drawn.patterns})
