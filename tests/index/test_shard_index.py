"""Indexes of a shard set (`nph index MANIFEST`, `nph retrieve --memory MANIFEST --index KIND`):
the merged answer over shards and ranks equals retrieval from the one file on the same
candidates (and a reference written from the formulas), the candidates are the union of each
shard's own index search, and a missing, stale or tampered shard index, or a dead rank, stops the
run with one line naming it. Skipped without FAISS (the ann extra)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal

import pytest
import torch
from conftest import assert_one_error_line

from nphcli.core.errors import NphError, NphRuntimeError
from nphcli.engine.exact_search import faiss_available
from nphcli.memory import open_memory
from nphcli.memory.bank import TensorBank
from nphcli.memory.file import save_memory
from nphcli.memory.shards import write_shards
from nphcli.models import create_model
from nphcli.schema.settings import IndexSettings

pytestmark = pytest.mark.skipif(not faiss_available(), reason="FAISS (ann extra) not installed")

M, D, PARTS, BETA = 3000, 16, 3, 4.0
MODELS = {"topk": {"k": 5, "beta": BETA}, "sparse": {"beta": BETA}}


def clustered(seed: int, rows: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(20, D, generator=g)
    pick = torch.randint(0, 20, (rows,), generator=g)
    return torch.nn.functional.normalize(centres[pick] + 0.4 * torch.randn(rows, D, generator=g))


def make_set(folder, seed=0, kind="ivf"):
    """A memory of M clustered rows, its 3 shards and their `kind` indexes."""
    from nphcli.ann.shard_index import build_shard_indexes

    keys = clustered(seed, M)
    values = torch.randn(M, 3, generator=torch.Generator().manual_seed(seed + 1))
    save_memory(folder / "memory.safetensors", keys, values=values, force=True)
    manifest = write_shards(
        folder / "memory.safetensors", folder / "shards", parts=PARTS, force=True
    )
    build_shard_indexes(manifest, kind=kind, lists=16, force=True)
    return manifest, keys, values


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shard-index")
    manifest, keys, values = make_set(folder)
    g = torch.Generator().manual_seed(2)
    queries = torch.nn.functional.normalize(keys[::97][:24] + 0.1 * torch.randn(24, D, generator=g))
    return manifest, keys, values, queries


def sharded_model(name, manifest, bank, **search):
    from nphcli.ann.shard_index import sharded_indexed_model

    settings = IndexSettings(path="ivf", nprobe=search.get("nprobe", 2), candidates=8)
    return sharded_indexed_model(create_model(name, **MODELS[name]), settings, bank)


def valid_rows(found) -> list[set[int]]:
    """Each query's candidate rows, padding (score −inf) left out."""
    pairs = zip(found.ids, found.scores, strict=True)
    return [set(ids[torch.isfinite(scores)].tolist()) for ids, scores in pairs]


def on_candidates(name, queries, keys, values, candidates):
    """Reference from the formulas over each query's candidate rows (a set per query): topk a
    softmax of β·s over the k best, sparse the sparsemax of β·s (sort-based threshold)."""
    out = torch.zeros(queries.shape[0], values.shape[1])
    for q in range(queries.shape[0]):
        rows = torch.tensor(sorted(candidates[q]))
        z = BETA * (keys[rows] @ queries[q])  # (c,)
        weights = torch.zeros_like(z)
        if name == "topk":
            top = torch.topk(z, MODELS[name]["k"]).indices
            weights[top] = torch.softmax(z[top], dim=0)
        else:
            ordered = torch.sort(z, descending=True).values
            cumulative = ordered.cumsum(0)
            ks = torch.arange(1, len(z) + 1, dtype=z.dtype)
            support = int((1 + ks * ordered > cumulative).sum())
            tau = (cumulative[support - 1] - 1) / support
            weights = (z - tau).clamp(min=0)
        out[q] = weights @ values[rows]
    return out


def own_union(manifest, queries, count, nprobe):
    """Each query's candidates straight from each shard's FAISS index, as global rows."""
    from nphcli.ann.index_file import open_index
    from nphcli.memory.shards import read_manifest

    parsed = read_manifest(manifest)
    record = json.loads(manifest.read_text())["indexes"]["ivf"]
    found = []
    for part, entry in zip(parsed.parts, record["parts"], strict=True):
        index = open_index(manifest.parent / entry["file"], part.path)
        index.faiss_index.nprobe = nprobe
        _, ids = index.faiss_index.search(queries.numpy(), count)
        found.append(torch.from_numpy(ids) + part.offset)
    return [set(row.tolist()) for row in torch.cat(found, dim=1)]


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("stream", [False, True])
def test_merged_shards_equal_one_file_on_the_same_candidates(scene, name, stream):
    manifest, keys, values, queries = scene
    bank = open_memory(manifest, stream=stream)  # a joined Memory, or a ShardedBank streaming
    model = sharded_model(name, manifest, bank)
    found = model.search(queries, bank)
    assert valid_rows(found) == own_union(manifest, queries, 8, 2)
    assert torch.all(found.ids[:, 1:] >= found.ids[:, :-1])  # sorted by global row
    got = model.retrieve(queries, bank).patterns
    expected = on_candidates(name, queries, keys, values, valid_rows(found))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)  # float32 vs the formula
    # the one file, with the union as its candidates, through the model's own rule
    one_file = TensorBank(keys, values)
    scores = (one_file.gather(found.ids)[0] @ queries.unsqueeze(2)).squeeze(2)  # (Q, c)
    weights, _ = create_model(name, **MODELS[name]).candidate_rule(M).apply(scores)
    torch.testing.assert_close(got, one_file.weighted_sum(found.ids, weights))


def test_certified_queries_equal_exact_retrieval(scene):
    manifest, keys, values, queries = scene
    bank = open_memory(manifest)
    for name in MODELS:
        model = sharded_model(name, manifest, bank, nprobe=16)  # every list: a tight bound
        got = model.retrieve(queries, bank).patterns
        exact = create_model(name, **MODELS[name]).retrieve(queries, TensorBank(keys, values))
        assert model.certified.float().mean() > 0.5
        ok = model.certified
        torch.testing.assert_close(got[ok], exact.patterns[ok], rtol=1e-5, atol=1e-6)


def test_manifest_records_each_shard_index(scene):
    from nphcli.ann.index_file import file_checksum
    from nphcli.memory.shards import read_manifest

    manifest = scene[0]
    record = json.loads(manifest.read_text())["indexes"]["ivf"]
    parts = read_manifest(manifest).parts
    assert [e["shard_sha256"] for e in record["parts"]] == [p.sha256 for p in parts]
    for entry in record["parts"]:
        assert entry["sha256"] == file_checksum(manifest.parent / entry["file"])
        assert entry["params"] == {"lists": 16} and entry["rows"] == M // PARTS


def test_cli_index_and_retrieve_single_process(tmp_path, invoke):
    manifest, *_ = make_set(tmp_path, kind="flat")
    again = invoke("index", manifest, "--kind", "flat")
    assert_one_error_line(again, "already records a flat index", "--force")
    result = invoke("index", manifest, "--kind", "ivf", "--lists", "8", "--json")
    assert result.exit_code == 0, result.stderr
    assert [e["params"] for e in json.loads(result.stdout)["parts"]] == [{"lists": 8}] * PARTS
    args = ("retrieve", "--memory", manifest, "--model", "topk", "--k", "5", "--queries", "30")
    result = invoke(*args, "--index", "flat", "--check-exact", "10", "--json")
    assert result.exit_code == 0, result.stderr
    index = json.loads(result.stdout)["config"]["index"]
    assert index["shards"] == PARTS and index["kind"] == "flat"
    assert index["certified_fraction"] == 1.0  # flat per shard: exact search, tight bound
    assert index["check_exact"]["recall_at_k"] == 1.0
    assert_one_error_line(invoke(*args, "--index", "hnsw"), "records no hnsw index", "nph index")
    assert_one_error_line(invoke(*args, "--index", "x.index"), "names the kind")
    assert_one_error_line(invoke("index", manifest, "--out", tmp_path / "x"), "--out")


@pytest.mark.parametrize("fault", ["missing", "tampered", "stale", "swapped"])
def test_a_bad_shard_index_is_one_line_naming_it(tmp_path, invoke, fault):
    manifest, *_ = make_set(tmp_path)
    record = json.loads(manifest.read_text())["indexes"]["ivf"]
    target = manifest.parent / record["parts"][1]["file"]
    if fault == "missing":
        target.unlink()
        words = ("shard 1", target.name, "missing")
    elif fault == "tampered":
        target.write_bytes(target.read_bytes()[:-7] + b"garbage")
        words = ("shard 1", target.name, "checksum")
    elif fault == "swapped":  # another shard's index, its checksum recorded: built from other rows
        shutil.copy(manifest.parent / record["parts"][0]["file"], target)
        raw = json.loads(manifest.read_text())
        from nphcli.ann.index_file import file_checksum

        raw["indexes"]["ivf"]["parts"][1]["sha256"] = file_checksum(target)
        manifest.write_text(json.dumps(raw))
        words = ("shard 1", target.name, "another memory")
    else:  # the set re-sharded from other data, the old record put back: built from other rows
        old = json.loads(manifest.read_text())["indexes"]
        kept = {e["file"]: (manifest.parent / e["file"]).read_bytes() for e in old["ivf"]["parts"]}
        save_memory(tmp_path / "memory.safetensors", clustered(7, M), force=True)
        write_shards(tmp_path / "memory.safetensors", manifest.parent, parts=PARTS, force=True)
        for name, data in kept.items():  # re-sharding deleted the replaced set's indexes
            (manifest.parent / name).write_bytes(data)
        raw = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({**raw, "indexes": old}))
        words = ("shard 0", "stale")
    args = ("retrieve", "--memory", manifest, "--model", "sparse", "--index", "ivf")
    assert_one_error_line(invoke(*args, "--queries", "5"), *words)


def _index_on_rank(collective, manifest, queries, names, die=False):
    """On each rank: the sharded model's retrieval and candidates, for each model."""
    from nphcli.distributed.group import open_rank_memory

    bank = open_rank_memory(manifest, stream=False, collective=collective)
    out = {}
    for name in names:
        model = sharded_model(name, manifest, bank)
        if die and collective.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        found = model.search(queries, bank)
        out[name] = (valid_rows(found), model.retrieve(queries, bank).patterns, model.bytes_sent)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 3])
def test_ranks_merge_to_the_one_file_answer(scene, workers):
    from nphcli.distributed.launch import run_workers

    manifest, keys, values, queries = scene
    work = functools.partial(_index_on_rank, manifest=manifest, queries=queries, names=MODELS)
    merged = run_workers(workers, work, timeout=600)  # against a hang only
    local = open_memory(manifest)
    for name in MODELS:
        rows, patterns, sent = merged[name]
        alone = sharded_model(name, manifest, local)
        assert rows == valid_rows(alone.search(queries, local))  # the same union
        reference = on_candidates(name, queries, keys, values, rows)
        torch.testing.assert_close(patterns, reference, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(patterns, alone.retrieve(queries, local).patterns)
        # rank 0 sends its width, ids and scores (Q, width), bounds (Q,) and Σ w·v (Q, d_v)
        width = 8 * ((PARTS + workers - 1) // workers)
        assert sent == 8 + queries.shape[0] * (width * 12 + 4 + values.shape[1] * 4)


@pytest.mark.slow
def test_a_dead_rank_fails_the_indexed_query_naming_it(scene):
    from nphcli.distributed.launch import run_workers

    manifest, _, _, queries = scene
    work = functools.partial(
        _index_on_rank, manifest=manifest, queries=queries, names=["sparse"], die=True
    )
    with pytest.raises(NphRuntimeError, match="worker rank 1 died"):
        run_workers(2, work, timeout=600)  # the death is seen by its exit code


@pytest.mark.slow
def test_cli_workers_report_recall_against_exhaustive(zygote, scene, tmp_path, invoke):
    manifest = scene[0]
    args = ["retrieve", "--memory", str(manifest), "--model", "topk", "--k", "5", "--index"]
    args += ["ivf", "--nprobe", "16", "--queries", "20"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = zygote.run(*args, "--workers", "2", "--json", env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["config"]
    assert report["distributed"]["ranks"] == 2
    assert report["index"]["check_exact"]["recall_at_k"] == 1.0  # every list probed
    assert len(report["distributed"]["peak_rss_bytes"]) == 2
    missing = manifest.parent / "nothing.json"  # refused before any worker starts
    done = invoke("retrieve", "--memory", missing, *args[3:], "--workers", "2")
    assert_one_error_line(done, str(missing), "not found")


def test_kind_must_be_known(scene):
    from nphcli.ann.shard_index import index_record
    from nphcli.memory.shards import read_manifest

    with pytest.raises(NphError, match="names the kind"):
        index_record(read_manifest(scene[0]), "annoy")
