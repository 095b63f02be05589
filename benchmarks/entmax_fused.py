"""Benchmark α-entmax's fused GPU threshold against its eager route and dense, in the same run.

    python benchmarks/entmax_fused.py [--device cuda] [--memories 60000] [--queries 200,1000]
                                      [--rounds 2] [--small] [--out FILE]

Per dtype (float32, bfloat16), Q and regime (`run.REGIMES`: the regimes' own patterns and
queries, `run.synthetic` and `run.queries_for`; β = 1 wide supports, β = 10 narrow): dense,
entmax at α = 1.5 (the active-set kernel) and α = 1.25 (the Newton kernel), each fused
(`triton_entmax`, where `blocks.KERNEL_DEVICES` holds the device) and eager (the tuple
emptied), and random with k = 0.2·M, alternating call by call in `--rounds` rounds. Reports each
call's median ms of 5 per round, the ratios of the best round to dense's, and whether the fused
kernel fell back. On a CPU the "fused" calls take the eager route too (`--small`: a dry run).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import device_name, device_or_exit, emit, median_ms, provenance  # noqa: E402
from run import REGIMES, queries_for, synthetic  # noqa: E402

from nphcli.engine import blocks, entmax_block  # noqa: E402
from nphcli.models import create_model  # noqa: E402

ALPHAS = (1.5, 1.25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--memories", type=int, default=60_000)
    parser.add_argument("--queries", default="200,1000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="M = 3,000: a dry run")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = device_or_exit(args.device)
    memories = 3000 if args.small else args.memories
    keys32 = synthetic(memories, 0, device)  # (M, d)
    fused_devices = blocks.KERNEL_DEVICES
    out: dict = {**provenance(), "device": device_name(device), "memories": memories}
    for dtype in (torch.float32, torch.bfloat16):
        keys = keys32.to(dtype)
        for num_queries in (int(q) for q in args.queries.split(",")):
            queries = queries_for(keys32, num_queries, seed=1).to(dtype)  # (Q, d)
            for label, beta in REGIMES:
                calls = {"dense": (create_model("dense", beta=beta), fused_devices)}
                for alpha in ALPHAS:
                    model = create_model("entmax", alpha=alpha, beta=beta)
                    calls[f"entmax {alpha} fused"] = (model, fused_devices)
                    calls[f"entmax {alpha} eager"] = (model, ())
                calls["random k=0.2"] = (create_model("random", k=0.2, beta=beta), fused_devices)
                row: dict = {name: [] for name in calls}
                for _ in range(args.rounds):
                    for name, (model, devices) in calls.items():
                        blocks.KERNEL_DEVICES = devices
                        run = lambda m=model, x=queries, k=keys: m.retrieve(x, k)  # noqa: E731
                        row[name].append(round(median_ms(run, device, 5), 3))
                blocks.KERNEL_DEVICES = fused_devices
                dense = min(row["dense"])
                ratios = {n: round(min(t) / dense, 2) for n, t in row.items() if n != "dense"}
                row["ratios"] = ratios
                row["fused_failed"] = entmax_block._FUSED["failed"]
                key = f"{str(dtype)[6:]},{label},Q={num_queries}"
                out[key] = row
                print(f"  {key}: dense {dense} ms, {row['ratios']}", file=sys.stderr)
    emit(out, args.out)


if __name__ == "__main__":
    main()
