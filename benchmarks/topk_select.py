"""Per-block top-k selection: `full_topk` (torch.topk(k + 1) + tie fix, today's CPU path)
against `group_topk` (group maxima, then a sort of k·G scores) on one (Q, B) float32 block of
scores, on one device. Prints JSON: median milliseconds per selection and ratios new/old.

    python benchmarks/topk_select.py --device cuda          # Q = 1024, B = 65,536
    python benchmarks/topk_select.py --device cpu --small   # a quick dry run
"""

from __future__ import annotations

import argparse
import json

import torch
from _common import device_name, device_or_exit, median_ms, provenance

from nphcli.engine.selection import MIN_GROUPS_PER_K, full_topk, group_topk

GROUPS = (32, 64, 128)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--small", action="store_true", help="a small dry run")
    parser.add_argument("--queries", type=int, default=1024)
    parser.add_argument("--block", type=int, default=65536)
    parser.add_argument("--k", type=int, nargs="+", default=[10, 64])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    device = device_or_exit(args.device)
    queries, block, repeats = args.queries, args.block, args.repeats
    if args.small:
        queries, block, repeats = 32, 4096, 2
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(queries, block, generator=g).to(device)  # (Q, B) float32
    rows = []
    for k in args.k:
        old = full_topk(scores, k)
        full_ms = median_ms(lambda k=k: full_topk(scores, k), device, repeats)
        row = {"k": k, "full_topk_ms": full_ms}
        for group in GROUPS:
            if block < MIN_GROUPS_PER_K * k * group:
                continue
            assert torch.equal(group_topk(scores, k, group), old)  # same answer, or no timing
            ms = median_ms(lambda k=k, g=group: group_topk(scores, k, g), device, repeats)
            row[f"group{group}_ms"] = ms
            row[f"group{group}_over_full"] = ms / row["full_topk_ms"]
        rows.append(row)
    info = {
        **provenance(),
        "device": device_name(device),
        "queries": queries,
        "block": block,
        "rows": rows,
    }
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
