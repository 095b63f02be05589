"""Agent memory: nph's recall against what agent builders put beside it, on the same items and
queries in the same run.

Items: M unit vectors of 384 numbers (the size of all-MiniLM-L6-v2's embeddings; Gaussian,
seeded: a sentence model embeds 10⁵ texts too slowly on the CI machine) with ids; queries:
stored rows plus Gaussian noise (cosine ≈ 0.9 to their row). Measured per size:
- nph in-process: `Recaller.recall` (the memory's default, sparse at β = 30; k = 5), one query
  at a time: p50 / p99 latency and recall@1 (the heaviest item is the query's row);
- nph over MCP: the same recall as a `recall` tool call to a `nph serve` subprocess over stdio
  (the official SDK's client), and `remember` throughput (each one a new segment on disk);
- FAISS flat (exact inner product, top-5), one query at a time;
- ChromaDB (in-process client, HNSW, cosine), when `chromadb` is importable.
Recall quality on real texts (the 283 jokes under dropout, swaps and typos) is
`benchmarks/text_recall.py`'s, in docs/text.md.

    python benchmarks/agent_memory.py --out benchmarks/results/agent-memory-ci-2core.json
    python benchmarks/agent_memory.py --small     # a dry run at 2,000 items
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# FAISS's and ONNX Runtime's OpenMP threads spin while idle: on 2 cores they would slow every
# system measured after them in this process. Set before any of them loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, provenance  # noqa: E402

import nphcli as nph  # noqa: E402
from nphcli.app.recall import Recaller  # noqa: E402

DIM = 384
K = 5


def percentiles(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {
        "p50_ms": statistics.median(ordered),
        "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


def timed(run, queries: np.ndarray) -> tuple[dict, list]:
    run(queries[0])  # warm-up
    times, answers = [], []
    for query in queries:
        begin = time.perf_counter()
        answers.append(run(query))
        times.append((time.perf_counter() - begin) * 1000)
    return percentiles(times), answers


def items(size: int, queries: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = rng.normal(size=(size, DIM)).astype(np.float32)
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    rows = rng.choice(size, queries, replace=False)
    noisy = keys[rows] + rng.normal(scale=0.5 / np.sqrt(DIM), size=(queries, DIM))
    return keys, rows, noisy.astype(np.float32)


def nph_in_process(path: Path, noisy: np.ndarray, rows: np.ndarray) -> dict:
    recaller = Recaller.open(path)
    stats, answers = timed(lambda q: recaller.recall(q.tolist(), k=K).items, noisy)
    hits = [bool(a) and a[0]["id"] == f"i{row}" for a, row in zip(answers, rows, strict=True)]
    return {**stats, "recall_at_1": float(np.mean(hits))}


def faiss_flat(keys: np.ndarray, noisy: np.ndarray, rows: np.ndarray) -> dict:
    import faiss

    faiss.omp_set_num_threads(1)  # one query at a time: FAISS's advice, and its fastest here
    index = faiss.IndexFlatIP(DIM)
    index.add(keys)
    stats, answers = timed(lambda q: index.search(q[None], K)[1][0], noisy)
    hits = [a[0] == row for a, row in zip(answers, rows, strict=True)]
    return {**stats, "recall_at_1": float(np.mean(hits))}


def chroma(keys: np.ndarray, noisy: np.ndarray, rows: np.ndarray) -> dict:
    try:
        import chromadb
    except ImportError:
        return {"skipped": "chromadb is not installed"}
    client = chromadb.EphemeralClient()
    name = f"items-{len(keys)}"  # the in-process client is one per process: a name per size
    table = client.create_collection(name, metadata={"hnsw:space": "cosine"})
    begin = time.perf_counter()
    for start in range(0, len(keys), 5000):
        block = keys[start : start + 5000]
        table.add(ids=[f"i{start + i}" for i in range(len(block))], embeddings=block.tolist())
    added = time.perf_counter() - begin

    def query(q):
        return table.query(query_embeddings=[q.tolist()], n_results=K)["ids"][0]

    stats, answers = timed(query, noisy)
    client.delete_collection(name)
    hits = [a[0] == f"i{row}" for a, row in zip(answers, rows, strict=True)]
    return {**stats, "recall_at_1": float(np.mean(hits)), "add_items_per_s": len(keys) / added}


def over_mcp(path: Path, noisy: np.ndarray, remembers: int) -> dict:
    """Recall latency and remember throughput through a `nph serve` subprocess."""
    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    root = Path(__file__).resolve().parents[1]
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "nphcli", "serve", str(path)],
        env={"PYTHONPATH": str(root), "OMP_NUM_THREADS": str(provenance()["threads"])},
    )

    async def session() -> dict:
        async with stdio_client(server) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            times = []
            for query in noisy[:50]:
                begin = time.perf_counter()
                await client.call_tool("recall", {"embedding": query.tolist(), "k": K})
                times.append((time.perf_counter() - begin) * 1000)
            begin = time.perf_counter()
            for i in range(remembers):
                await client.call_tool("remember", {"embedding": noisy[i].tolist(), "id": f"r{i}"})
            per_s = remembers / (time.perf_counter() - begin)
            return {**percentiles(times[1:]), "remember_per_s": per_s}

    return anyio.run(session)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--remembers", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--small", action="store_true", help="2,000 items, 50 queries")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    sizes = [2000] if args.small else [int(s) for s in args.sizes.split(",")]
    queries = 50 if args.small else args.queries
    results = []
    for size in sizes:
        keys, rows, noisy = items(size, queries, args.seed)
        with tempfile.TemporaryDirectory() as folder:
            np.save(Path(folder) / "keys.npy", keys)
            (Path(folder) / "ids.txt").write_text("".join(f"i{i}\n" for i in range(size)))
            path = Path(folder) / "memory.safetensors"
            nph.store(Path(folder) / "keys.npy", path, ids=Path(folder) / "ids.txt")
            entry = {"M": size, "d": DIM, "queries": queries}
            entry["nph_in_process"] = nph_in_process(path, noisy, rows)
            entry["faiss_flat"] = faiss_flat(keys, noisy, rows)
            entry["chromadb"] = chroma(keys, noisy, rows)
            entry["nph_mcp"] = over_mcp(path, noisy, args.remembers)
        print(json.dumps(entry), file=sys.stderr)
        results.append(entry)
    emit({"benchmark": "agent_memory", **provenance(), "results": results}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
