"""Benchmark the random model with a large k against dense, in the same run (issue 25).

    python benchmarks/random_mask.py [--memories 60000] [--queries 200,1000] [--k 0.2]
                                     [--threads 1,0] [--rounds 5] [--out FILE]

Per case (unit-norm patterns at β = 1, and at β = 10; Q from `--queries`; torch threads from
`--threads`, 0 meaning torch's default): `dense` and `random --k K` retrieve the same queries,
alternating call by call so a change in the machine's load falls on both; also the random mask
alone (`mask`). Reports the median and min seconds of `--rounds` calls after a warm-up, the ratio
random/dense of both, and the load average. Prints one JSON object (also written to --out).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, provenance  # noqa: E402
from run import MEMORIES, REGIME_QUERIES, REGIMES, queries_for, synthetic  # noqa: E402

from nphcli.engine.masks import random_bias, resolve_k  # noqa: E402
from nphcli.models import create_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=MEMORIES[-1])
    parser.add_argument("--queries", default=",".join(map(str, REGIME_QUERIES)))
    parser.add_argument("--k", type=float, default=0.2)
    parser.add_argument("--threads", default="1,0")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    default_threads = torch.get_num_threads()
    keys = synthetic(args.memories, 0, torch.device("cpu"))  # (M, d)
    num_keep = resolve_k(args.k, args.memories)
    out: dict = {**provenance(), "memories": args.memories, "k": args.k, "cases": {}}
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads or default_threads)
        for label, beta in REGIMES:
            for num_queries in (int(q) for q in args.queries.split(",")):
                queries = queries_for(keys, num_queries, seed=1)  # (Q, d)
                positions = torch.arange(num_queries)
                dense = create_model("dense", beta=beta)
                masked = create_model("random", beta=beta, k=args.k)
                calls = {
                    "dense": partial(dense.retrieve, queries, keys),
                    "random": partial(masked.retrieve, queries, keys),
                    "mask": partial(random_bias, 0, positions, args.memories, num_keep, keys.dtype),
                }
                row = {"threads": torch.get_num_threads(), **_timed(calls, args.rounds)}
                row["random/dense median"] = row["random"]["median_s"] / row["dense"]["median_s"]
                row["random/dense min"] = row["random"]["min_s"] / row["dense"]["min_s"]
                row["load"] = os.getloadavg()[0]
                key = f"{label},Q={num_queries},threads={row['threads']}"
                out["cases"][key] = row
                print(
                    f"  {key}: random/dense {row['random/dense median']:.2f} (median), "
                    f"{row['random/dense min']:.2f} (min); load {row['load']:.2f}",
                    file=sys.stderr,
                )
    emit(out, args.out, indent=2)


def _timed(calls: dict, rounds: int) -> dict:
    """Median and min seconds of each call over `rounds`, the calls interleaved round by round."""
    for call in calls.values():
        call()  # warm-up
    times: dict = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {
        name: {"median_s": statistics.median(ts), "min_s": min(ts)} for name, ts in times.items()
    }


if __name__ == "__main__":
    main()
