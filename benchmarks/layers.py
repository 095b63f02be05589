"""The paper's efficiency experiment (§"Computational efficiency") for nph's layers.

    python benchmarks/layers.py [--sizes 128,256,512,1024,2048] [--repeats 5] [--device cpu]
                                [--out FILE]

For each retrieval rule, an `NPH` self-attention layer (batch 4, hidden size 16, one head) runs
forward on a sequence of M patterns, M the memory size (every pattern is a query and a key).
Per (rule, M): the median and minimum forward time over repeats after a warm-up (synchronising
CUDA), and the FLOPs counted by `torch.utils.flop_counter.FlopCounterMode` (the paper used
fvcore). Both counters count matrix products only (mm/bmm/addmm): the sort of sparsemax and top-k,
the bisection of entmax and the hashes of the random mask are elementwise work they do not see,
which is why the times are measured too. Prints one JSON object (and writes it to --out).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from nphcli.layers import NPH

BATCH = 4
HIDDEN = 16
RULES = {
    "dense": {},
    "sparse": {},
    "entmax": {"alpha": 1.5},
    "topk-20%": {"model": "topk", "k": 0.2},
    "random-masked": {"model": "random", "k": 0.2},
    "window": {"window": 8},
    "linear": {},
    "random-feature": {"features": 64},
}


def build(label: str, device: torch.device) -> NPH:
    params = dict(RULES[label])
    model = params.pop("model", label)
    return NPH(HIDDEN, model=model, beta=0.25, **params).to(device).eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(label: str, size: int, repeats: int, device: torch.device) -> dict:
    torch.manual_seed(0)
    layer = build(label, device)
    x = torch.randn(BATCH, size, HIDDEN, device=device)  # (B, M, d)
    with torch.no_grad():
        with FlopCounterMode(display=False) as counter:
            layer(x)
        flops = counter.get_total_flops()
        layer(x)  # warm-up
        times = []
        for _ in range(repeats):
            _sync(device)
            started = time.perf_counter()
            layer(x)
            _sync(device)
            times.append(time.perf_counter() - started)
    return {
        "rule": label,
        "M": size,
        "flops": flops,
        "median_ms": 1e3 * statistics.median(times),
        "min_ms": 1e3 * min(times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128,256,512,1024,2048")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for size in sizes:
        for label in RULES:
            rows.append(measure(label, size, args.repeats, device))
            row = rows[-1]
            print(
                f"{label:>15} M={size:>5}  {row['flops'] / 1e6:10.1f} MFLOP  "
                f"{row['median_ms']:9.2f} ms",
                file=sys.stderr,
            )
    result = {
        "machine": platform.machine(),
        "device": str(device),
        "threads": args.threads,
        "torch": torch.__version__,
        "batch": BATCH,
        "hidden": HIDDEN,
        "rows": rows,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
