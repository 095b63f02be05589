"""A large embedding table through nph, as a user would run it: 10⁶ × 384 unit vectors (the
size of all-MiniLM-L6-v2's embeddings of a million texts) with ids, stored, indexed and recalled
from streamed blocks within a working-memory budget; time per query against a FAISS flat search
(exact inner product, top-10) on the same vectors in the same run.

Each step is a real `nph` process (`python -m nphcli`), timed as a whole and by its own JSON
timings, with its peak resident memory. The vectors are Gaussian, normalised, seeded; queries
are stored rows with noise (σ = 0.02 per value) so recall@1 is measurable.

    python benchmarks/text_large.py --out benchmarks/results/text-large-ci-2core.json
    python benchmarks/text_large.py --small     # 20,000 rows: a dry run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, provenance  # noqa: E402

DIM = 384
QUERIES = 100


# Runs one nph process and prints its own peak RSS (KiB) last: RUSAGE_CHILDREN of a process
# with a single child is that child's peak (in the benchmark itself it is the largest so far).
_ONE_CHILD = (
    "import resource, subprocess, sys; "
    "code = subprocess.call([sys.executable, '-m', 'nphcli', *sys.argv[1:]]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)"
)


def nph(*args: str) -> tuple[dict | None, float, float]:
    """Run `nph ARGS --json`; (its JSON, wall seconds, peak RSS of that process in MiB)."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _ONE_CHILD, *args, "--json"], capture_output=True, text=True
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"nph {' '.join(args)} failed: {done.stderr.strip()}")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    peak = int(lines.pop()) / 1024
    return (json.loads(lines[-1]) if lines else None), seconds, peak


def faiss_flat(vectors: np.ndarray, queries: np.ndarray) -> dict:
    import faiss

    started = time.perf_counter()
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    built = time.perf_counter() - started
    started = time.perf_counter()
    _, found = index.search(queries, 10)
    searched = time.perf_counter() - started
    return {"build_s": built, "us_per_query": 1e6 * searched / len(queries), "top1": found[:, 0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--small", action="store_true", help="20,000 rows")
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows = 20_000 if args.small else args.rows
    rng = np.random.default_rng(0)
    result = {"benchmark": "text_large", **provenance(), "rows": rows, "dim": DIM}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        vectors = rng.standard_normal((rows, DIM), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        np.save(work / "table.npy", vectors)
        (work / "ids.txt").write_text("".join(f"doc-{i}\n" for i in range(rows)))
        targets = rng.choice(rows, QUERIES, replace=False)
        queries = vectors[targets] + 0.02 * rng.standard_normal((QUERIES, DIM), dtype=np.float32)
        np.save(work / "queries.npy", queries.astype(np.float32))
        memory = str(work / "table.safetensors")
        _, store_s, store_peak = nph(
            "store", str(work / "table.npy"), "--ids", str(work / "ids.txt"), "--out", memory
        )
        result["store"] = {"seconds": store_s, "peak_rss_mib": store_peak}
        _, index_s, index_peak = nph("index", memory, "--kind", "ivf")
        result["index_ivf"] = {"seconds": index_s, "peak_rss_mib": index_peak}
        base = ["retrieve", "--memory", memory, "--queries-file", str(work / "queries.npy")]
        base += ["--memory-budget", args.budget, "--beta", "30", "--threads", "2"]
        runs = {
            "topk k=10 streamed": ["--stream", "--model", "topk", "--k", "10"],
            "dense streamed": ["--stream", "--model", "dense"],
            "sparse streamed": ["--stream", "--model", "sparse"],
            "topk k=10 loaded": ["--model", "topk", "--k", "10"],
            "topk k=10 ivf index": [
                "--model",
                "topk",
                "--k",
                "10",
                "--index",
                memory[:-12] + ".ivf.index",
            ],
        }
        for name, extra in runs.items():
            report, seconds, peak = nph(*base, *extra, "--per-query")
            result[name] = {
                "us_per_query": report["timing"]["us_per_query"],
                "process_s": seconds,
                "peak_rss_mib": peak,
                "support_mean": (report["metrics"].get("support") or {}).get("mean"),
            }
        flat = faiss_flat(vectors, queries)
        result["faiss flat top-10"] = {
            "build_s": flat["build_s"],
            "us_per_query": flat["us_per_query"],
            "recall_at_1": float(np.mean(flat["top1"] == targets)),
        }
    for name in runs:
        result[name]["vs_faiss_flat"] = (
            result[name]["us_per_query"] / result["faiss flat top-10"]["us_per_query"]
        )
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
