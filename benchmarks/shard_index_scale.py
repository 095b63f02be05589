"""Index-backed retrieval over a shard set at scale: build time, RAM per rank, bytes per query
between ranks, queries per second and recall@10 against the exhaustive sharded answer, for 1, 2
and 4 local ranks (docs/ann-shards.md; the cost model in benchmarks/shard_cost_model.py is
fitted to this file's output).

    nice python benchmarks/shard_index_scale.py --workdir /tmp/nph-scale [--rows 10000000]
        [--dim 128] [--parts 4] [--kind ivfpq] [--lists 1024] [--ranks 1,2,4] [--nprobe 16,64]
        [--out benchmarks/results/shard-index-scale.json]
    python benchmarks/shard_index_scale.py --small --workdir /tmp/nph-scale-small   # dry run

Data: clustered synthetic vectors with a seed: 10,000 unit centres in d dims, each row a
centre plus Gaussian spread (norm ≈ 0.5), normalised to unit length; written to a memory file
block by block (never whole in RAM), split with `nph shard`, indexed with `nph index MANIFEST`
(one index per shard). Queries: --queries stored rows drawn with seed 0, Gaussian noise σ = 0.03
per coordinate (norm ≈ 0.34). Each (ranks, nprobe) runs `distributed_retrieve` in a fresh
process (1 rank: one worker process over all shards, the same code path), with topk, k = 10,
--candidates per shard, and --check-exact queries compared with exhaustive sharded retrieval.
Every stage records its wall time and peak resident memory; the work folder keeps finished
stages, so a rerun resumes. Timings on a shared machine are noisy: the JSON says which machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import struct
import subprocess
import sys
import time
from pathlib import Path

import torch
from _common import provenance

CENTRES = 10_000
SPREAD = 0.5  # norm of a row's offset from its centre, before normalising
NOISE = 0.03  # per-coordinate σ of the query noise
BLOCK = 1_000_000  # rows generated and written at a time


def write_clustered(path: Path, rows: int, dim: int, seed: int) -> None:
    """A float32 nph memory file of clustered unit rows, written block by block (the safetensors
    layout by hand: 8-byte header length, JSON header, then the row bytes)."""
    from nphcli.memory.format import FORMAT_NAME, FORMAT_VERSION
    from nphcli.version import __version__

    generator = torch.Generator().manual_seed(seed)
    centres = torch.nn.functional.normalize(torch.randn(CENTRES, dim, generator=generator), dim=1)
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "nph_version": __version__,
        "created": "synthetic",
        "M": rows,
        "d": dim,
        "dtype": "float32",
        "source": f"clustered synthetic: {CENTRES} centres, spread {SPREAD}, seed {seed}",
    }
    size = rows * dim * 4
    header = {
        "__metadata__": {key: json.dumps(value) for key, value in meta.items()},
        "patterns": {"dtype": "F32", "shape": [rows, dim], "data_offsets": [0, size]},
    }
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    partial = path.with_suffix(".partial")
    with open(partial, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)) + encoded)
        for start in range(0, rows, BLOCK):
            count = min(BLOCK, rows - start)
            which = torch.randint(0, CENTRES, (count,), generator=generator)  # (B,)
            offset = torch.randn(count, dim, generator=generator) * (SPREAD / dim**0.5)
            block = torch.nn.functional.normalize(centres[which] + offset, dim=1)  # (B, d)
            handle.write(block.numpy().tobytes())
    partial.rename(path)


def run_stage(command: list[str], log: Path) -> dict:
    """Run one command; its wall time, stdout, and peak resident memory sampled every 0.2 s:
    of the process itself, and of each of its child processes (the ranks), largest first."""
    import psutil

    start = time.perf_counter()
    peaks: dict[int, int] = {}
    with open(log, "w") as err, open(log.with_suffix(".out"), "w+") as out:
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        watched = psutil.Process(process.pid)
        while process.poll() is None:
            try:
                for each in [watched, *watched.children(recursive=True)]:
                    rss = each.memory_info().rss
                    peaks[each.pid] = max(peaks.get(each.pid, 0), rss)
            except psutil.Error:
                pass
            time.sleep(0.2)
        out.seek(0)
        output = out.read()
    if process.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({process.returncode}); see {log}")
    return {
        "wall_s": round(time.perf_counter() - start, 2),
        "peak_rss_bytes": peaks.get(process.pid, 0),
        "children_peak_rss_bytes": sorted(
            (v for k, v in peaks.items() if k != process.pid), reverse=True
        ),
        "stdout": output,
    }


def one_run(args) -> None:
    """In a fresh process: one index-backed distributed retrieval; prints its report's JSON."""
    from nphcli.distributed.retrieve import distributed_retrieve
    from nphcli.schema.settings import (
        Corruption,
        IndexSettings,
        InputSpec,
        RetrieveSettings,
        Spread,
    )

    settings = RetrieveSettings(
        model="topk",
        params={"k": 10},
        corruption=Corruption(noise=NOISE),
        queries=args.queries,
        repeat=args.repeat,
        index=IndexSettings(
            path=args.kind,
            nprobe=args.one_nprobe,
            candidates=args.candidates,
            check_exact=args.check_exact,
        ),
    )
    spread = Spread(workers=args.one_ranks, timeout=3600)
    report = distributed_retrieve(InputSpec(memory=str(args.one_run)), settings, spread)
    config = report.config
    print(json.dumps({"timing": report.timing, "index": config["index"], **config["distributed"]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--kind", default="ivfpq")
    parser.add_argument("--lists", type=int, default=1024, help="IVF lists per shard")
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--nprobe", default="16,64")
    parser.add_argument("--candidates", type=int, default=64)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--check-exact", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--small", action="store_true", help="a quick dry run: 200,000 rows")
    parser.add_argument(
        "--memory", type=Path, help="real vectors: this memory file instead of synthetic data"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one-run", help=argparse.SUPPRESS)
    parser.add_argument("--one-ranks", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--one-nprobe", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.small:
        args.rows, args.lists, args.queries, args.check_exact = 200_000, 64, 200, 50
    if args.one_run:
        return one_run(args)
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    results_path = work / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    results.update(
        provenance=provenance(),
        machine={
            "cpus": os.cpu_count(),
            "ram_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "platform": platform.platform(),
            "note": "shared with other jobs: timings are noisy",
        },
    )
    if args.memory is None:
        results["data"] = {
            "rows": args.rows,
            "dim": args.dim,
            "centres": CENTRES,
            "spread": SPREAD,
            "seed": args.seed,
            "query_noise": NOISE,
        }
    results.setdefault("runs", [])

    def save() -> None:
        results_path.write_text(json.dumps(results, indent=2) + "\n")
        if args.out:
            args.out.write_text(json.dumps(results, indent=2) + "\n")

    memory = work / "memory.safetensors"
    manifest = work / "shards" / "memory.shards.json"
    nph = [sys.executable, "-m", "nphcli"]
    if args.memory is not None and "generate" not in results:
        from nphcli.memory import open_memory

        source = open_memory(args.memory, stream=True)
        if not memory.exists():
            memory.symlink_to(args.memory.resolve())
        results["generate"] = {"source": str(args.memory), "bytes": memory.stat().st_size}
        results["data"] = {
            "rows": source.num_memories,
            "dim": source.dim,
            "query_noise": NOISE,
            "source": source.meta.get("source", str(args.memory)),
        }
        save()
    if "generate" not in results:
        start = time.perf_counter()
        write_clustered(memory, args.rows, args.dim, args.seed)
        results["generate"] = {
            "wall_s": round(time.perf_counter() - start, 2),
            "bytes": memory.stat().st_size,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
        save()
    if "shard" not in results:
        stage = run_stage(
            [
                *nph,
                "shard",
                str(memory),
                "--parts",
                str(args.parts),
                "--out-dir",
                str(manifest.parent),
                "--force",
            ],
            work / "shard.log",
        )
        stage.pop("stdout")
        results["shard"] = stage
        save()
    if "index" not in results:
        stage = run_stage(
            [
                *nph,
                "index",
                str(manifest),
                "--kind",
                args.kind,
                "--lists",
                str(args.lists),
                "--seed",
                str(args.seed),
                "--force",
                "--json",
            ],
            work / "index.log",
        )
        built = json.loads(stage.pop("stdout"))
        results["index"] = {**stage, "kind": args.kind, "parts": built["parts"]}
        save()
    done = {(r["ranks"], r["nprobe"], r["candidates"]) for r in results["runs"]}
    probes = [int(n) for n in args.nprobe.split(",")]
    every_ranks = [int(r) for r in args.ranks.split(",")]
    for nprobe in probes:
        for ranks in every_ranks:
            # the first nprobe at every rank count; the others at the most ranks (bounded time)
            if (ranks, nprobe, args.candidates) in done or (
                nprobe != probes[0] and ranks != max(every_ranks)
            ):
                continue
            command = [
                sys.executable,
                __file__,
                "--workdir",
                str(work),
                "--one-run",
                str(manifest),
                "--one-ranks",
                str(ranks),
                "--one-nprobe",
                str(nprobe),
                "--kind",
                args.kind,
                "--candidates",
                str(args.candidates),
                "--queries",
                str(args.queries),
                "--repeat",
                str(args.repeat),
                "--check-exact",
                str(args.check_exact),
            ]
            stage = run_stage(command, work / f"run-{ranks}-{nprobe}.log")
            report = json.loads(stage.pop("stdout"))
            results["runs"].append(
                {
                    "ranks": ranks,
                    "nprobe": nprobe,
                    "candidates": args.candidates,
                    "queries": args.queries,
                    "commit": results["provenance"]["commit"],
                    "process": stage,  # the launching process and its ranks, sampled
                    **report,  # peak_rss_bytes: each rank's own peak (getrusage)
                }
            )
            save()
            print(
                f"ranks {ranks} nprobe {nprobe}: {report['timing']['queries_per_s']:.0f} q/s, "
                f"recall@10 {report['index']['check_exact']['recall_at_k']:.3f}",
                file=sys.stderr,
            )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
