"""A cost model of index-backed retrieval over a shard set (IVF-PQ per shard, exact rescoring
from the shard's patterns, candidates merged over ranks), fitted to a run of
benchmarks/shard_index_scale.py and then used to predict other sizes (docs/ann-shards.md).

    python benchmarks/shard_cost_model.py benchmarks/results/shard-index-scale-*.json
        [--predict-rows 1e9] [--dim 128] [--machines 4] [--ram-gb 256] [--cores 32]
        [--shards-per-machine 32] [--lists 4096] [--nprobe 32] [--candidates 64]
        [--network-gbps 10]

What it counts (per shard of n rows, d dims, L lists, m = d/8 PQ sub-spaces of 8 bits, c
candidates, p lists probed; FAISS's k-means trains on at most 256·L rows for 10 iterations, PQ
on at most 256·256 rows for 25):
- build operations: 2·10·min(n, 256L)·L·d (k-means) + 2·25·min(n, 65536)·256·d (PQ) +
  2·2·n·L·d (assigning every row: adding it, and the lists' radii) + 2·n·256·d (encoding);
- RAM of a rank: a fixed base + its rows' patterns (4·n·d bytes, for exact rescoring) + its
  indexes' files (n·(m + 8) bytes of codes and ids, plus L·d·4 of centroids);
- query operations per shard: 2·2·L·d (choosing lists, and nph's bound on unseen lists) +
  p·(n/L)·m (PQ code look-ups) + 2·c·d (rescoring);
- bytes a rank sends per query: 12·w + 4 + 4·d_v (w = its shards' candidates: int64 ids and
  float32 scores; the bound; its part of Σ w·v), received (R − 1)-fold by each other rank.
Two rates are fitted: build operations per second per core, and query operations per second per
core (fitted through the origin). Both come from this machine; the predictions
scale them by cores, which is an assumption, not a measurement. Recall is not modelled from
first principles: it is the measured recall@10 at the same per-shard setting (lists probed,
candidates), valid as long as each shard's rows are as clustered as the measured ones.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

IVF_ITERS, PQ_ITERS, PQ_CODES, TRAIN_PER_LIST = 10, 25, 256, 256
GB = 1e9


def build_ops(rows: int, lists: int, dim: int, kind: str = "ivfpq") -> float:
    kmeans = 2 * IVF_ITERS * min(rows, TRAIN_PER_LIST * lists) * lists * dim
    assign = 4 * rows * lists * dim
    if kind != "ivfpq":
        return kmeans + assign
    pq = 2 * PQ_ITERS * min(rows, PQ_CODES * 256) * PQ_CODES * dim
    return kmeans + pq + assign + 2 * rows * PQ_CODES * dim


def row_cost(dim: int, kind: str) -> float:
    """Operations to score one listed row: m = d/8 code look-ups (ivfpq), 2·d flops (ivf)."""
    return dim // 8 if kind == "ivfpq" else 2 * dim


def query_ops(
    rows: int, lists: int, dim: int, nprobe: int, candidates: int, kind: str = "ivfpq"
) -> float:
    scan = nprobe * (rows / lists) * row_cost(dim, kind)
    return 4 * lists * dim + scan + 2 * candidates * dim


def index_bytes(rows: int, lists: int, dim: int, kind: str = "ivfpq") -> float:
    per_row = dim // 8 if kind == "ivfpq" else 4 * dim
    return rows * (per_row + 8) + lists * dim * 4


def send_bytes(width: int, value_dim: int) -> float:
    return 12 * width + 4 + 4 * value_dim


def fit(results: dict) -> dict:
    """The rates and the RAM base from a measured run, and the model's fit to each run."""
    data, cores = results["data"], results["machine"]["cpus"]
    dim = data["dim"]
    parts, kind = results["index"]["parts"], results["index"]["kind"]
    rows = [p["rows"] for p in parts]
    lists = parts[0]["params"]["lists"]
    # build: each shard built with every core (FAISS's threads)
    build_rate = sum(build_ops(n, lists, dim, kind) for n in rows) / sum(
        p["build_s"] for p in parts
    )
    build_rate /= cores
    # queries: t = t_merge + ops / (rate · cores in use); least squares on (t_merge, 1/rate)
    points = []
    for run in results["runs"]:
        ops = sum(query_ops(n, lists, dim, run["nprobe"], run["candidates"], kind) for n in rows)
        threads = min(cores, run["ranks"] * max(1, cores // run["ranks"]))
        points.append((ops / threads, run["timing"]["us_per_query"] * 1e-6))
    # one rate through the origin: the runs vary too little in work for a fixed cost to be told
    # apart from noise on a shared machine
    slope = sum(x * y for x, y in points) / sum(x * x for x, _ in points)
    merge_s = 0.0
    base = []
    for run in results["runs"]:
        per_rank = [
            sum(rows[i] for i in owned(len(rows), r, run["ranks"])) for r in range(run["ranks"])
        ]
        for r, measured in enumerate(run["peak_rss_bytes"]):
            data_bytes = per_rank[r] * dim * 4 + index_bytes(per_rank[r], lists, dim, kind)
            base.append(measured - data_bytes)
    model = {
        "build_ops_per_core_s": build_rate,
        "query_ops_per_core_s": 1 / slope,
        "merge_s_per_query": merge_s,
        "rss_base_bytes": sorted(base)[len(base) // 2],
        "lists_per_shard": lists,
        "rows_per_shard": max(rows),
        "kind": kind,
    }
    model["checks"] = [check(model, results, run, rows, dim) for run in results["runs"]]
    return model


def owned(parts: int, rank: int, ranks: int) -> range:
    return range(rank * parts // ranks, (rank + 1) * parts // ranks)


def check(model: dict, results: dict, run: dict, rows: list[int], dim: int) -> dict:
    """Predicted against measured, for one run."""
    cores, lists, ranks = results["machine"]["cpus"], model["lists_per_shard"], run["ranks"]
    threads = min(cores, ranks * max(1, cores // ranks))
    kind = model["kind"]
    ops = sum(query_ops(n, lists, dim, run["nprobe"], run["candidates"], kind) for n in rows)
    seconds = model["merge_s_per_query"] + ops / (model["query_ops_per_core_s"] * threads)
    widest = max(len(owned(len(rows), r, ranks)) for r in range(ranks)) * run["candidates"]
    rank0 = sum(rows[i] for i in owned(len(rows), 0, ranks))
    ram = model["rss_base_bytes"] + rank0 * dim * 4 + index_bytes(rank0, lists, dim, kind)
    return {
        "ranks": ranks,
        "nprobe": run["nprobe"],
        "us_per_query": {"model": seconds * 1e6, "measured": run["timing"]["us_per_query"]},
        # counted by the collective even for one rank, where nothing leaves the process
        "bytes_sent_per_query": {
            "model": send_bytes(widest, dim),
            "measured": run["index"]["bytes_sent_per_query"],
        },
        "rank0_ram_bytes": {"model": ram, "measured": run["peak_rss_bytes"][0]},
        "recall_at_10": run["index"]["check_exact"]["recall_at_k"],
    }


def predict(model: dict, args) -> dict:
    """What `args.predict_rows` × `args.dim` costs on `args.machines` machines, one rank each
    holding shards of `args.rows_per_shard` rows (default: the measured shard, so that each
    shard's lists, probes and candidates are the measured ones and its recall can be taken from
    the measurement)."""
    rows, dim, machines = int(args.predict_rows), args.dim, args.machines
    per_shard = args.rows_per_shard or model["rows_per_shard"]
    lists = args.lists or model["lists_per_shard"]
    nprobe, cand = args.nprobe, args.candidates
    shards = math.ceil(rows / per_shard)
    each = math.ceil(shards / machines)  # shards per machine (one rank)
    patterns = per_shard * dim * 4 * each
    codes = index_bytes(per_shard, lists, dim) * each
    ram = patterns + codes + model["rss_base_bytes"]
    build_core_s = build_ops(per_shard, lists, dim) / model["build_ops_per_core_s"]
    shard_query_s = query_ops(per_shard, lists, dim, nprobe, cand) / model["query_ops_per_core_s"]
    machine_core_s = shard_query_s * each  # every machine searches every query
    sent = send_bytes(each * cand, dim)
    received = (machines - 1) * sent
    wire_s = (sent + received) * 8 / (args.network_gbps * 1e9)
    return {
        "rows": rows,
        "dim": dim,
        "machines": machines,
        "ram_gb_each": args.ram_gb,
        "cores_each": args.cores,
        "shards": shards,
        "shards_per_machine": each,
        "rows_per_shard": per_shard,
        "lists": lists,
        "nprobe": nprobe,
        "candidates": cand,
        "ram_gb_per_machine": {
            "patterns": patterns / GB,
            "index": codes / GB,
            "base": model["rss_base_bytes"] / GB,
            "total": ram / GB,
        },
        "fits_in_ram": ram / GB < 0.9 * args.ram_gb,
        "build_core_s_per_shard": build_core_s,
        "build_hours": build_core_s * each / args.cores / 3600,
        "query_core_ms_per_shard": shard_query_s * 1e3,
        "query_core_ms_per_machine": machine_core_s * 1e3,
        # one query alone: its shards searched in parallel over the cores
        "latency_ms": (machine_core_s / min(args.cores, each) + model["merge_s_per_query"] + wire_s)
        * 1e3,
        "queries_per_s": args.cores / (machine_core_s + model["merge_s_per_query"] * args.cores),
        "bytes_sent_per_query_per_machine": sent,
        "bytes_received_per_query_per_machine": received,
        "network_s_per_query": wire_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--predict-rows", type=float, default=1e9)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--machines", type=int, default=4)
    parser.add_argument("--ram-gb", type=float, default=256)
    parser.add_argument("--cores", type=int, default=32)
    parser.add_argument("--rows-per-shard", type=int, help="[default: the measured shard's]")
    parser.add_argument("--lists", type=int, help="per shard [default: the measured shard's]")
    parser.add_argument("--nprobe", type=int, default=16)
    parser.add_argument("--candidates", type=int, default=64)
    parser.add_argument("--network-gbps", type=float, default=10)
    parser.add_argument("--markdown", action="store_true", help="the measured runs as a table")
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    model = fit(results)
    prediction = predict(model, args)
    if args.markdown:
        print(markdown(results, model))
    else:
        print(json.dumps({"fitted": model, "prediction": prediction}, indent=2))


def markdown(results: dict, model: dict) -> str:
    """The measured runs and the model's fit to them, as markdown tables (docs/ann-shards.md)."""
    lines = [
        "| ranks | nprobe | queries/s | µs/query (model) | bytes sent/query (model) | "
        "peak RSS per rank, GB | rank 0 RAM model, GB | recall@10 | certified |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run, fitted in zip(results["runs"], model["checks"], strict=True):
        rss = " / ".join(f"{b / GB:.2f}" for b in run["peak_rss_bytes"])
        lines.append(
            f"| {run['ranks']} | {run['nprobe']} | {run['timing']['queries_per_s']:.0f} | "
            f"{run['timing']['us_per_query']:.0f} ({fitted['us_per_query']['model']:.0f}) | "
            f"{run['index']['bytes_sent_per_query']:.0f} "
            f"({fitted['bytes_sent_per_query']['model']:.0f}) | {rss} | "
            f"{fitted['rank0_ram_bytes']['model'] / GB:.2f} | "
            f"{run['index']['check_exact']['recall_at_k']:.3f} | "
            f"{run['index']['certified_fraction']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
