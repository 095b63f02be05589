"""Benchmark sharded retrieval over local gloo processes against one process, in one run.

    python benchmarks/distributed.py [--memories 20000] [--queries 100] [--repeat 3]
                                     [--workers 2] [--out FILE]

A unit-norm random memory (d = 784, float32) is written and split into `--workers` shards. Per
model, in the same run: the time of one `retrieve` of Q queries (median of --repeat, after a
warm-up, all ranks started together by a barrier) for
- `unsharded`: one process over the memory file loaded in RAM (fused kernels where they apply),
- `1 rank`: one process over the shard set (the same code path as the ranks, no peers),
- `N ranks`: N local processes, each over its shard, merged by torch.distributed (gloo);
the bytes each rank hands to collectives per query (counted in `GroupCollective`, for one
retrieve), and each rank's peak resident memory. Each configuration gets this machine's cores
shared evenly (2 cores: one process with 2 threads, or 2 processes with 1 thread each).
Prints one JSON object (also written to --out).
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from nphcli.distributed.group import open_rank_memory
from nphcli.distributed.launch import run_workers
from nphcli.memory.file import load_memory, save_memory
from nphcli.memory.shards import write_shards
from nphcli.models import create_model

DIM = 784
BETA = 10.0  # unit-norm patterns: scores β·cos in [0, β], as in benchmarks/run.py
MODELS = {
    "dense": {},
    "multihead": {"heads": 4},
    "linear": {},
    "random-feature": {},
    "topk": {"k": 10},
    "random": {"k": 10},
    "window": {},
    "sparse": {},
    "entmax": {},
}


def _queries(memory_rows: int, num_queries: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows drawn with seed 1 and their positions; noisy copies are built from the bank."""
    generator = torch.Generator().manual_seed(1)
    return torch.randperm(memory_rows, generator=generator)[:num_queries].sort().values


def _time_models(bank, rows, repeat: int, barrier) -> dict:
    """Per model: median and min seconds of one retrieve, and the bytes this process sent."""
    keys, _ = bank.gather(rows)  # (Q, d) collective on a shard set: every rank the same rows
    noise = torch.randn(keys.shape, generator=torch.Generator().manual_seed(2)) * 0.02
    queries = keys + noise  # (Q, d)
    out = {}
    for name, params in MODELS.items():
        model = create_model(name, beta=BETA, **params)
        model.retrieve(queries, bank, positions=rows)  # warm-up
        sent = bank.collective.bytes_sent
        times = []
        for _ in range(repeat):
            barrier()
            start = time.perf_counter()
            model.retrieve(queries, bank, positions=rows)
            times.append(time.perf_counter() - start)
        per_call = (bank.collective.bytes_sent - sent) / repeat
        out[name] = {
            "median_s": statistics.median(times),
            "min_s": min(times),
            "bytes_per_query": per_call / rows.numel(),
        }
    return out


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _ranks(collective, manifest: Path, rows, repeat: int) -> dict:
    import torch.distributed as dist

    bank = open_rank_memory(manifest, stream=False, collective=collective)
    models = _time_models(bank, rows, repeat, dist.barrier)
    rss = collective.all_cat(torch.tensor([_peak_rss_mb()], dtype=torch.float64), dim=0)
    bytes_by_rank = {}
    for name, result in models.items():  # every rank's count, not only rank 0's
        counts = collective.all_cat(torch.tensor([result["bytes_per_query"]]), dim=0)
        bytes_by_rank[name] = counts.tolist()
    return {"models": models, "bytes_per_query_by_rank": bytes_by_rank, "peak_rss_mb": rss.tolist()}


def _unsharded(collective, path: Path, rows, repeat: int) -> dict:
    memory = load_memory(path)
    models = _time_models(memory, rows, repeat, lambda: None)
    return {"models": models, "peak_rss_mb": [_peak_rss_mb()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        generator = torch.Generator().manual_seed(0)
        patterns = torch.randn(args.memories, DIM, generator=generator)
        patterns = patterns / patterns.norm(dim=1, keepdim=True)  # (M, d) unit norm
        path = folder / "memory.safetensors"
        save_memory(path, patterns)
        del patterns
        manifest = write_shards(path, folder, parts=args.workers)
        rows = _queries(args.memories, args.queries)
        work = functools.partial(_ranks, manifest=manifest, rows=rows, repeat=args.repeat)
        # The unsharded baseline runs in a worker too, so every configuration starts alike.
        baseline = functools.partial(_unsharded, path=path, rows=rows, repeat=args.repeat)
        unsharded = run_workers(1, baseline, timeout=600)
        one = run_workers(1, work, timeout=600)
        many = run_workers(args.workers, work, timeout=600)

    ratios = {
        name: {
            "vs_1_rank": one["models"][name]["median_s"] / many["models"][name]["median_s"],
            "vs_unsharded": unsharded["models"][name]["median_s"]
            / many["models"][name]["median_s"],
        }
        for name in MODELS
    }
    result = {
        "machine": {"platform": platform.platform(), "cpus": torch.get_num_threads()},
        "setup": {
            "M": args.memories,
            "d": DIM,
            "Q": args.queries,
            "dtype": "float32",
            "beta": BETA,
            "workers": args.workers,
            "repeat": args.repeat,
            "params": MODELS,
        },
        "unsharded": unsharded,
        "one_rank": one,
        f"{args.workers}_ranks": many,
        "speedup": ratios,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    for name in MODELS:
        print(
            f"{name:15s} unsharded {unsharded['models'][name]['median_s']:.4f} s  "
            f"1 rank {one['models'][name]['median_s']:.4f} s  "
            f"{args.workers} ranks {many['models'][name]['median_s']:.4f} s  "
            f"({ratios[name]['vs_1_rank']:.2f}x)  "
            f"{many['models'][name]['bytes_per_query']:.0f} B/query/rank",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
