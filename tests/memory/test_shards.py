"""Sharded memories (`nph shard`, manifests, `ShardedBank`): the shards join back into the
memory exactly, every model gives the unsharded result over them, and bad shard sets are refused
before any compute with one clear error."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_one_error_line, real_valued_models

from nphcli.core.errors import NphError
from nphcli.engine.planning import Plan
from nphcli.memory import open_memory
from nphcli.memory.file import load_memory, save_memory
from nphcli.memory.format import read_metadata
from nphcli.memory.sharded_bank import ShardedBank
from nphcli.memory.shards import read_manifest, split_rows, write_shards
from nphcli.models import create_model

PARAMS = {
    "multihead": {"heads": 2},
    "random-feature": {"features": 24},
    "topk": {"k": 3},
    "random": {"k": 2, "seed": 1},
    "window": {"window": 1},
    "entmax": {"alpha": 1.5},
}
SPLITS = {"one-row": [1, 25, 14], "uneven": [7, 3, 19, 1, 10]}


def _memory(folder, *, values: bool = False, dtype=torch.float64):
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(40, 6, generator=generator, dtype=torch.float64)
    stored_values = torch.randn(40, 4, generator=generator, dtype=torch.float64) if values else None
    path = folder / "memory.safetensors"
    save_memory(path, keys, values=stored_values, labels=torch.arange(40) % 3, dtype=dtype)
    return path


def test_split_rows_is_even_and_complete():
    for total, parts in [(10, 3), (7, 7), (100, 1), (5, 2)]:
        sizes = split_rows(total, parts)
        assert sum(sizes) == total and len(sizes) == parts
        assert max(sizes) - min(sizes) <= 1
    with pytest.raises(NphError, match="exceeds"):
        split_rows(3, 4)


@pytest.mark.parametrize("values", [False, True], ids=["auto", "hetero"])
def test_shards_join_back_exactly(tmp_path, values):
    path = _memory(tmp_path, values=values)
    manifest_path = write_shards(path, tmp_path, sizes=SPLITS["uneven"])
    original, joined = load_memory(path), open_memory(manifest_path)
    assert torch.equal(joined.patterns, original.patterns)
    assert torch.equal(joined.values, original.values)
    assert torch.equal(joined.labels, original.labels)
    manifest = read_manifest(manifest_path)
    offset = 0
    for index, part in enumerate(manifest.parts):
        shard = load_memory(part.path)  # each shard is a memory file of its own
        meta = read_metadata(part.path)["shard"]
        assert (meta["index"], meta["offset"], meta["rows"]) == (index, offset, part.rows)
        assert meta["total_M"] == 40 and meta["set_id"] == manifest.set_id
        assert torch.equal(shard.patterns, original.patterns[offset : offset + part.rows])
        offset += part.rows


@pytest.mark.parametrize("name", real_valued_models())
def test_sharded_bank_equals_unsharded(tmp_path, name):
    path = _memory(tmp_path, values=name != "window")
    memory = load_memory(path)
    queries = torch.randn(9, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    model = create_model(name, **PARAMS.get(name, {}))
    expected = model.retrieve(queries, memory.patterns, memory.values if memory.hetero else None)
    for split, sizes in SPLITS.items():
        folder = tmp_path / split
        folder.mkdir()
        manifest = write_shards(path, folder, sizes=sizes)
        everything = range(len(sizes))  # `owned`: a ShardedBank, not the shards joined
        for stream, owned in ((False, None), (False, everything), (True, None)):
            bank = open_memory(manifest, stream=stream, owned=owned)
            assert isinstance(bank, ShardedBank) == (stream or owned is not None)
            assert bank.num_memories == 40 and torch.equal(bank.labels, memory.labels)
            for plan in (None, Plan(query_rows=4, memory_rows=6)):
                got = model.retrieve(queries, bank, plan=plan)
                torch.testing.assert_close(got.patterns, expected.patterns, rtol=0, atol=1e-12)
                if expected.support is not None:
                    assert torch.equal(got.support, expected.support)
            index = torch.tensor([[0, 39, 1], [25, 26, 0]])
            for got_rows, want_rows in zip(bank.gather(index), memory.gather(index), strict=True):
                assert torch.equal(got_rows, want_rows)


def _write_set(tmp_path, sizes=(10, 10, 20), name="memory"):
    path = _memory(tmp_path)
    if name != "memory":
        path = path.rename(tmp_path / f"{name}.safetensors")
    return write_shards(path, tmp_path, sizes=list(sizes))


def _part(manifest_path, index):
    """The path of shard `index` of a manifest, read from the manifest alone."""
    return manifest_path.parent / json.loads(manifest_path.read_text())["parts"][index]["file"]


def _edit(manifest_path, change):
    data = json.loads(manifest_path.read_text())
    change(data)
    manifest_path.write_text(json.dumps(data))


def _bad_sets(tmp_path):
    """(description, manifest) pairs of broken shard sets, each broken one way."""
    folder = tmp_path / "sets"
    cases = {}

    def fresh(label):
        where = folder / label
        where.mkdir(parents=True)
        return _write_set(where)

    missing = fresh("missing")
    _part(missing, 1).unlink()
    cases["missing"] = (missing, "is missing")

    duplicated = fresh("duplicated")
    _edit(duplicated, lambda d: d["parts"].__setitem__(1, dict(d["parts"][0], offset=10)))
    cases["duplicated"] = (duplicated, "listed twice")

    foreign = fresh("foreign")
    other = folder / "other"
    other.mkdir()
    other_path = _memory(other)
    keys = load_memory(other_path).patterns * 2  # another memory, same split
    save_memory(other_path, keys, dtype=torch.float64, force=True)
    other_manifest = write_shards(other_path, other, sizes=[10, 10, 20])
    part = read_manifest(other_manifest).parts[1].path
    _part(foreign, 1).write_bytes(part.read_bytes())
    cases["foreign"] = (foreign, "another shard set")

    overlap = fresh("overlap")
    _edit(overlap, lambda d: d["parts"][1].update(offset=5))
    cases["overlap"] = (overlap, "overlaps rows")

    gap = fresh("gap")
    _edit(gap, lambda d: d["parts"][1].update(offset=12))
    cases["gap"] = (gap, "are in no shard")

    for label, change in (("dim", lambda k: torch.cat([k, k[:, :1]], dim=1)), ("dtype", None)):
        broken = fresh(label)
        target = _part(broken, 2)
        shard = load_memory(target)
        keys = shard.patterns if change is None else change(shard.patterns)
        dtype = torch.float32 if change is None else torch.float64
        meta = {"shard": shard.meta["shard"]}
        save_memory(target, keys, meta=meta, dtype=dtype, force=True)
        cases[label] = (broken, "d 7 ≠ 6" if label == "dim" else "dtype float32 ≠ float64")

    not_manifest = folder / "plain.json"
    not_manifest.write_text('{"hello": 1}')
    cases["not a manifest"] = (not_manifest, "not an nph shard manifest")
    return cases


def test_bad_shard_sets_are_refused_before_any_compute(tmp_path, invoke):
    for label, (manifest, message) in _bad_sets(tmp_path).items():
        with pytest.raises(NphError, match=message):
            read_manifest(manifest)
        out = tmp_path / f"{label.replace(' ', '-')}.safetensors"
        result = invoke("retrieve", "--memory", manifest, "--queries", "3", "--out", out)
        assert_one_error_line(result, message)
        assert not out.exists()


def test_store_parts_refuses_an_existing_manifest_before_writing_the_memory(tmp_path, invoke):
    """A manifest of that name already there (no --force): nothing is written, not even the
    memory file that the shards would have come from."""
    out = tmp_path / "digits.safetensors"
    (tmp_path / "digits.shards.json").write_text("{}")
    result = invoke("store", "random", "--n", "12", "--dim", "8", "-o", out, "--parts", "2")
    assert_one_error_line(result, "--force")
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits.shards.json"]
    forced = invoke(
        "store", "random", "--n", "12", "--dim", "8", "-o", out, "--parts", "2", "--force"
    )
    assert forced.exit_code == 0, forced.output
    assert read_manifest(tmp_path / "digits.shards.json").num_memories == 12


def test_cli_shard_and_retrieve_over_the_manifest(tmp_path, invoke):
    path = _memory(tmp_path)
    result = invoke("shard", path, "--parts", "3", "--out-dir", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    assert [p["rows"] for p in listing["parts"]] == [14, 13, 13]
    manifest = listing["manifest"]
    again = invoke("shard", path, "--parts", "3", "--out-dir", tmp_path)
    assert_one_error_line(again, "--force")
    common = ["--model", "topk", "--k", "4", "--noise", "0.3", "--queries", "11", "--json"]
    common += ["--dtype", "float64", "--per-query"]
    runs = [
        invoke("retrieve", "--memory", memory, *common, *extra)
        for memory, extra in ((path, []), (manifest, []), (manifest, ["--stream"]))
    ]
    for run in runs:
        assert run.exit_code == 0, run.output
    reports = [json.loads(run.stdout) for run in runs]
    for report in reports[1:]:
        assert_same_per_query(report["per_query"], reports[0]["per_query"])
        assert report["config"]["memory"]["M"] == 40
    info = invoke("info", manifest, "--json")
    assert info.exit_code == 0 and json.loads(info.stdout)["M"] == 40


def assert_same_per_query(got: dict, want: dict) -> None:
    """Indices, supports and counts identical; float metrics equal to float64 rounding."""
    assert got.keys() == want.keys()
    for key, values in want.items():
        if all(isinstance(v, int) for v in values):
            assert got[key] == values, key
        else:
            torch.testing.assert_close(
                torch.tensor(got[key]), torch.tensor(values), rtol=0, atol=1e-12
            )


@pytest.mark.parametrize("name", ["../memory.part-1-of-3.safetensors", "/etc/passwd", "a/../../x"])
def test_shard_paths_stay_inside_the_manifests_folder(tmp_path, name):
    manifest = _write_set(tmp_path)
    _edit(manifest, lambda d: d["parts"][1].update(file=name))
    with pytest.raises(NphError, match="not inside the manifest's folder"):
        read_manifest(manifest, check=())  # refused from the manifest alone


def _tampered(tmp_path):
    """A shard set whose shard 1 holds another memory's rows under its own metadata: every
    header check passes, only the checksum can tell."""
    manifest = _write_set(tmp_path)
    target = read_manifest(manifest).parts[1].path
    shard = load_memory(target)
    other = torch.randn(shard.patterns.shape, dtype=torch.float64)
    meta = {k: v for k, v in shard.meta.items() if k not in ("format", "format_version")}
    save_memory(target, other, labels=shard.labels, meta=meta, dtype=torch.float64, force=True)
    return manifest


def test_a_shard_with_replaced_rows_is_refused(tmp_path, invoke):
    manifest = _tampered(tmp_path)
    read_manifest(manifest, verify=False)  # the headers alone agree with the manifest
    for stream, owned in ((False, None), (True, None), (False, range(1, 2)), (True, range(1, 2))):
        with pytest.raises(NphError, match="checksum differs"):
            open_memory(manifest, stream=stream, owned=owned)
    assert open_memory(manifest, owned=range(0, 1)).num_memories == 40  # shard 0 is intact
    assert open_memory(manifest, verify=False).num_memories == 40  # trusted storage: not read
    out = tmp_path / "r.safetensors"
    for extra in ([], ["--stream"]):
        result = invoke("retrieve", "--memory", manifest, "--queries", "3", "--out", out, *extra)
        assert_one_error_line(result, "checksum differs")
        assert not out.exists()


def test_a_manifest_without_checksums_is_refused(tmp_path):
    manifest = _write_set(tmp_path)
    _edit(manifest, lambda d: d.update(format_version=1))
    with pytest.raises(NphError, match="older nph"):
        read_manifest(manifest)


def test_shard_reads_and_writes_one_block_at_a_time(tmp_path, monkeypatch):
    """`nph shard` holds one block of rows in RAM, not a shard: the rows it asks for stay within
    BLOCK_BYTES, and the shards still join back exactly (keys, values, labels)."""
    import nphcli.memory.shards as shards
    from nphcli.memory.streamed import StreamedBank

    path = _memory(tmp_path, values=True)
    asked = []
    rows = StreamedBank.rows
    monkeypatch.setattr(shards, "BLOCK_BYTES", 3 * 6 * 8)  # three float64 rows of d = 6

    def counted(self, start, stop, *, values=False):
        asked.append((stop - start) * (4 if values else 6) * 8)  # bytes: d_v = 4, d = 6
        return rows(self, start, stop, values=values)

    monkeypatch.setattr(StreamedBank, "rows", counted)
    manifest = write_shards(path, tmp_path / "out", sizes=SPLITS["uneven"])
    assert len(asked) > 10 and max(asked) <= shards.BLOCK_BYTES
    original, joined = load_memory(path), open_memory(manifest)
    for name in ("patterns", "values", "labels"):
        assert torch.equal(getattr(joined, name), getattr(original, name)), name
