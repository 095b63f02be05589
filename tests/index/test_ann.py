"""Hopfield retrieval over an approximate index (`nph index`, `nph retrieve --index`).

References are written here from the definitions: all M scores, a stable sort for top-k
(ties to the lower index), sort-based sparsemax. Certified queries must equal them; a flat
index must equal them everywhere. Skipped without FAISS (the ann extra)."""

from __future__ import annotations

import hashlib
import json
import re
import sys

import pytest
import torch
from conftest import assert_one_error_line, write_memory

from nphcli.core.errors import NphError
from nphcli.engine.exact_search import faiss_available
from nphcli.memory.file import load_memory
from nphcli.models import create_model

pytestmark = pytest.mark.skipif(not faiss_available(), reason="FAISS (ann extra) not installed")

M, D = 600, 16


def clustered(seed: int, rows: int) -> torch.Tensor:
    """Unit vectors around 12 centres: neighbours are close, lists are meaningful."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(12, D, generator=g)
    pick = torch.randint(0, 12, (rows,), generator=g)
    return torch.nn.functional.normalize(centres[pick] + 0.4 * torch.randn(rows, D, generator=g))


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ann")
    keys = clustered(0, M)
    write_memory(folder / "memory.safetensors", keys)
    g = torch.Generator().manual_seed(1)
    queries = torch.nn.functional.normalize(keys[:80] + 0.1 * torch.randn(80, D, generator=g))
    return folder, keys, queries


def built(folder, kind, *, seed=0, name=None):
    from nphcli.ann.index_file import build_index, write_index

    memory_path = folder / "memory.safetensors"
    index, meta, extra = build_index(load_memory(memory_path), memory_path, kind=kind, seed=seed)
    path = folder / (name or f"memory.{kind}.index")
    write_index(path, index, meta, extra, force=True)
    return path


def reference(name, queries, keys, beta, k=10):
    """Retrieval over all M scores, from the formulas."""
    scores = beta * queries.double() @ keys.double().T  # (Q, M)
    if name == "topk":
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
        weights = torch.zeros_like(scores).scatter(
            1, order, torch.softmax(scores.gather(1, order), dim=1)
        )
    else:  # sparsemax: p = [s − τ]_+ with Σp = 1, τ from the sorted scores
        z = torch.sort(scores, dim=1, descending=True).values  # (Q, M)
        ranks = torch.arange(1, scores.shape[1] + 1, dtype=scores.dtype)
        support = (1 + ranks * z > z.cumsum(1)).sum(1, keepdim=True)  # (Q, 1)
        tau = (z.cumsum(1).gather(1, support - 1) - 1) / support
        weights = torch.clamp(scores - tau, min=0)
    return (weights @ keys.double()).float()  # (Q, d)


def open_model(folder, path, name, **search):
    from nphcli.ann.index_file import open_index
    from nphcli.ann.search import IndexedModel

    params = {"k": 10} if name == "topk" else {}
    model = create_model(name, beta=8.0, **params)
    return IndexedModel(model, open_index(path, folder / "memory.safetensors"), **search)


@pytest.mark.parametrize("name", ["topk", "sparse"])
def test_flat_index_is_exact_and_certified(scene, name):
    folder, keys, queries = scene
    model = open_model(folder, built(folder, "flat"), name)
    memory = load_memory(folder / "memory.safetensors")
    result = model.retrieve(queries, memory)
    torch.testing.assert_close(
        result.patterns, reference(name, queries, keys, 8.0), atol=2e-5, rtol=0
    )
    assert bool(model.certified.all())


@pytest.mark.parametrize("kind", ["ivf", "hnsw", "ivfpq"])
@pytest.mark.parametrize("name", ["topk", "sparse", "entmax"])
def test_certified_queries_equal_exact_retrieval(scene, kind, name):
    folder, keys, queries = scene
    memory = load_memory(folder / "memory.safetensors")
    model = open_model(
        folder, built(folder, kind), name, candidates=16, nprobe=2 if "ivf" in kind else None
    )
    result = model.retrieve(queries, memory)
    exact = model.model.retrieve(queries, memory).patterns  # the model's own exact path
    if name != "entmax":
        torch.testing.assert_close(exact, reference(name, queries, keys, 8.0), atol=2e-5, rtol=0)
    certified = model.certified
    gap = torch.linalg.vector_norm(result.patterns - exact, dim=1)
    assert bool((gap[certified] < 1e-4).all())
    if kind == "ivf" and name != "entmax":  # list bounds certify some queries of clustered data
        assert bool(certified.any())


def test_ivf_certifies_with_every_list_probed(scene):
    """nprobe = nlist scans every list exactly: all queries certified once c exceeds the support."""
    folder, keys, queries = scene
    model = open_model(folder, built(folder, "ivf"), "sparse", nprobe=10_000)
    model.retrieve(queries, load_memory(folder / "memory.safetensors"))
    assert bool(model.certified.all())


def test_threshold_cut_separates_support(scene):
    """Scores above the cut have weight, scores below have none (the cut is sparsemax's τ/β)."""
    folder, keys, queries = scene
    rule = create_model("sparse", beta=8.0).candidate_rule(M)
    scores = queries @ keys.T  # (Q, M): every memory a candidate
    weights, cut = rule.apply(scores)
    assert bool((weights[scores < cut[:, None] - 1e-5] == 0).all())
    assert bool((weights[scores > cut[:, None] + 1e-5] > 0).all())


def test_compare_exact_reports_recall_against_brute_force(scene):
    folder, keys, queries = scene
    memory = load_memory(folder / "memory.safetensors")
    flat = open_model(folder, built(folder, "flat"), "topk")
    report = flat.compare_exact(queries, memory, sample=30, seed=0, targets=keys[:80])
    assert report["recall_at_k"] == 1.0 and report["queries"] == 30
    assert report["pattern_gap_max"] < 1e-4
    pq = open_model(folder, built(folder, "ivfpq"), "topk", candidates=10, nprobe=1)
    report = pq.compare_exact(queries, memory, sample=30, seed=0)
    # Reference recall: the sampled rows are the seeded permutation's first 30.
    rows = torch.sort(torch.randperm(80, generator=torch.Generator().manual_seed(0))[:30]).values
    found = pq.search(queries[rows], memory)
    exact = torch.sort(queries[rows] @ keys.T, dim=1, descending=True, stable=True).indices[:, :10]
    hits = [
        len(set(f.tolist()) & set(e.tolist())) / 10 for f, e in zip(found.ids, exact, strict=True)
    ]
    assert report["recall_at_k"] == pytest.approx(sum(hits) / len(hits))


def test_seeded_builds_are_identical(scene):
    from nphcli.ann.index_file import read_index_meta

    folder, _, _ = scene
    digest = {
        name: read_index_meta(built(folder, "ivf", seed=seed, name=name))["payload_sha256"]
        for name, seed in (("a.index", 3), ("b.index", 3), ("c.index", 4))
    }
    assert digest["a.index"] == digest["b.index"] != digest["c.index"]


def test_cli_index_and_retrieve(scene, invoke):
    folder, _, _ = scene
    memory = folder / "memory.safetensors"
    out = folder / "cli.index"
    result = invoke("index", memory, "--kind", "ivf", "--out", out, "--force", "--json")
    assert result.exit_code == 0, result.stderr
    built = json.loads(result.stdout)
    assert built["kind"] == "ivf"
    assert built["memory_file_sha256"] == hashlib.sha256(memory.read_bytes()).hexdigest()
    args = ["retrieve", "--memory", memory, "--model", "topk", "--k", "5", "--beta", "8"]
    result = invoke(*args, "--noise", "0.1", "--index", out, "--check-exact", "20", "--json")
    assert result.exit_code == 0, result.stderr
    config = json.loads(result.stdout)["config"]
    assert built["memory_sha256"] == config["memory"]["sha256"]  # the rows' name for the memory
    index = config["index"]
    assert index["check_exact"]["queries"] == 20 and index["check_exact"]["k"] == 5
    assert 0 <= index["certified_fraction"] <= 1


def test_auto_device_on_a_cpu_only_machine_searches_the_index(scene, invoke, monkeypatch):
    """Regression: `--device auto --index` on a machine without a GPU was refused with "use
    --device cpu", because the raw `--device` text reached the index checks."""
    from nphcli.ann.run import check_index_run
    from nphcli.core.devices import resolve_device
    from nphcli.schema.settings import IndexSettings

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("nphcli.core.devices._mps_available", lambda: False)
    folder, _, _ = scene
    memory, path = folder / "memory.safetensors", built(folder, "flat", name="m.flat.index")
    model = create_model("topk", k=5, beta=8.0)
    check_index_run(IndexSettings(path=str(path)), memory, model, resolve_device("auto"))
    args = ["retrieve", "--memory", memory, "--model", "topk", "--k", "5", "--queries", "5"]
    result = invoke(*args, "--device", "auto", "--index", path, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["config"]["index"]["kind"] == "flat"
    assert report["config"]["index"]["certified_fraction"] == 1.0


def refused(invoke, args, pattern):
    line = assert_one_error_line(invoke(*args))
    assert re.search(pattern, line), line


def test_bad_indexes_are_refused(scene, invoke):
    from nphcli.ann.index_file import build_index, write_index

    folder, keys, _ = scene
    memory = folder / "memory.safetensors"
    good = built(folder, "ivf", name="good.index")
    write_memory(folder / "other.safetensors", keys.flip(0))
    base = ["retrieve", "--model", "topk", "--k", "5", "--queries", "5"]
    refused(
        invoke, [*base, "--memory", folder / "other.safetensors", "--index", good], "another memory"
    )
    truncated = folder / "truncated.index"
    truncated.write_bytes(good.read_bytes()[:300])
    refused(invoke, [*base, "--memory", memory, "--index", truncated], "not a readable")
    flipped = folder / "flipped.index"
    data = bytearray(good.read_bytes())
    data[-50] ^= 0xFF
    flipped.write_bytes(bytes(data))
    refused(invoke, [*base, "--memory", memory, "--index", flipped], "damaged")
    refused(invoke, [*base, "--memory", memory, "--index", memory], "not an nph index")
    refused(
        invoke,
        ["retrieve", "--memory", memory, "--model", "dense", "--index", good],
        "cannot use an index",
    )
    refused(invoke, [*base, "--memory", memory, "--index", good, "--ef", "9"], "hnsw")
    refused(invoke, [*base, "--memory", memory, "--nprobe", "3"], "--check-exact go with --index")
    index, meta, extra = build_index(load_memory(memory), memory, kind="flat")
    for field, value, pattern in (
        ("nph_version", "99.0.0", "newer than this nph"),
        ("faiss_version", "99.0", "newer than the installed"),
    ):
        path = folder / f"new-{field}.index"
        write_index(path, index, {**meta, field: value}, extra, force=True)
        refused(invoke, [*base, "--memory", memory, "--index", path], pattern)


def test_without_faiss_clear_error(scene, invoke, monkeypatch):
    folder, _, _ = scene
    monkeypatch.setitem(sys.modules, "faiss", None)
    refused(
        invoke, ["index", folder / "memory.safetensors", "--out", folder / "x.index"], "pip install"
    )
    assert not (folder / "x.index").exists()
    from nphcli.ann.index_file import require_faiss

    with pytest.raises(NphError, match="pip install faiss-cpu"):
        require_faiss()


@pytest.mark.parametrize(
    ("kind", "options", "expected"),
    [
        ("hnsw", ["--ef", "4", "--candidates", "50"], {"ef": 50, "nprobe": None}),
        ("ivf", ["--nprobe", "100000"], {"nprobe": "lists", "ef": None}),
    ],
)
def test_the_report_gives_the_search_depth_used(scene, invoke, kind, options, expected):
    """efSearch is at least the candidates fetched and nprobe at most the index's lists: the
    report says what the search used, not the option given."""
    from nphcli.ann.index_file import require_faiss

    folder, _, _ = scene
    path = built(folder, kind)
    memory = folder / "memory.safetensors"
    args = ["--model", "topk", "--k", "5", "--index", path, *options, "--json"]
    result = invoke("retrieve", "--memory", memory, *args)
    assert result.exit_code == 0, result.stderr
    index = json.loads(result.stdout)["config"]["index"]
    if expected["nprobe"] == "lists":
        from nphcli.ann.index_file import open_index

        lists = require_faiss().extract_index_ivf(open_index(path, memory).faiss_index).nlist
        expected = {**expected, "nprobe": lists}
    assert {key: index[key] for key in expected} == expected
