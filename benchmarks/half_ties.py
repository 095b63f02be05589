"""topk in half precision against float64 on the same rounded inputs: how often a near tie at
the k-th score swaps a memory, and what a swap costs (docs/retrieving.md, "Near ties").

    python benchmarks/half_ties.py MEMORY.safetensors [--queries 1000]

MEMORY: e.g. `nph store mnist` (offline: the 5,000 bundled digits). Queries are stored patterns
drawn with seed 0, bottom half hidden (0). Prints one JSON object: per (k, β, dtype), how many
queries keep float64's k memories and the relative error ‖out − ref‖/‖ref‖ of both groups.
"""

from __future__ import annotations

import argparse
import json

import torch
from _common import half_masked_queries

from nphcli.engine.masks import topk_mask
from nphcli.engine.precision import matmul
from nphcli.memory.file import load_memory
from nphcli.models import create_model

SETTINGS = ((100, 0.02), (10, 0.02), (100, 0.3))  # (k, β)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("memory")
    parser.add_argument("--queries", type=int, default=1000)
    args = parser.parse_args()
    keys = load_memory(args.memory).patterns.to(torch.float64)  # (M, d)
    queries = half_masked_queries(keys, args.queries)  # (Q, d)
    rows = []
    for k, beta in SETTINGS:
        model = create_model("topk", k=k, beta=beta)
        for dtype in (torch.float16, torch.bfloat16):
            q, m = queries.to(dtype), keys.to(dtype)
            out = model.retrieve(q, m).patterns.double()
            ref = model.retrieve(q.double(), m.double()).patterns
            error = (out - ref).norm(dim=1) / ref.norm(dim=1)  # (Q,)
            exact = topk_mask(q.double() @ m.double().T, k)
            same = (topk_mask(matmul(q, m.T), k) == exact).all(dim=1)  # (Q,)
            rows.append(
                {
                    "k": k,
                    "beta": beta,
                    "dtype": str(dtype).removeprefix("torch."),
                    "same_k_set": int(same.sum()),
                    "queries": int(same.numel()),
                    "error_same": _summary(error[same]),
                    "error_swapped": _summary(error[~same]),
                }
            )
    print(json.dumps({"memory": args.memory, "rows": rows}, indent=1))


def _summary(values: torch.Tensor) -> dict | None:
    if values.numel() == 0:
        return None
    return {"median": float(values.median()), "max": float(values.max())}


if __name__ == "__main__":
    main()
