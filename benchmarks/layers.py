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

    python benchmarks/layers.py --pooling [--sizes 20,50,100] [--batch 128] [--threads 2]

times `NPHPooling` on the MIL network's shapes instead (d = 256, 2 prototypes, 4 heads × 64,
β = 0.1; forward and backward together, as training runs them) with its folded path against the
same layer with `folds()` forced off (W_K and W_V applied to every stored row), in the same run:
the ratio folded / projected is what to read; the two paths' outputs are compared too.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import torch
from _common import device_or_exit, emit, sync
from torch.utils.flop_counter import FlopCounterMode

from nphcli.layers import NPH, NPHPooling
from nphcli.models import create_model

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
    return NPH(HIDDEN, rule=create_model(model, beta=0.25, **params)).to(device).eval()


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
            sync(device)
            started = time.perf_counter()
            layer(x)
            sync(device)
            times.append(time.perf_counter() - started)
    return {
        "rule": label,
        "M": size,
        "flops": flops,
        "median_ms": 1e3 * statistics.median(times),
        "min_ms": 1e3 * min(times),
    }


POOLING_RULES = {
    "dense": {},
    "sparse": {},
    "topk-20%": {"model": "topk", "k": 0.2},
    "random-masked": {"model": "random", "k": 0.2},
}


def build_pooling(label: str, device: torch.device) -> NPHPooling:
    params = dict(POOLING_RULES[label])
    model = params.pop("model", label)
    torch.manual_seed(0)
    rule = create_model(model, beta=0.1, **params)
    layer = NPHPooling(256, prototypes=2, rule=rule, heads=4, head_dim=64)
    return layer.to(device)


def step_seconds(layer: NPHPooling, stored: torch.Tensor, repeats: int) -> list[float]:
    """Forward and backward times of `layer` on `stored`, after one warm-up step."""
    times = []
    for i in range(repeats + 1):
        sync(stored.device)
        started = time.perf_counter()
        layer(stored).square().sum().backward()
        sync(stored.device)
        if i:
            times.append(time.perf_counter() - started)
    return times


def measure_pooling(label: str, size: int, batch: int, repeats: int, device: torch.device) -> dict:
    stored = torch.randn(batch, size, 256, generator=torch.Generator().manual_seed(1)).to(device)
    stored.requires_grad_(True)
    folded, projected = build_pooling(label, device), build_pooling(label, device)
    projected.folds = lambda: False  # the baseline: project every stored row
    with torch.no_grad():
        difference = float((folded(stored) - projected(stored)).abs().max())
    fold_times = step_seconds(folded, stored, repeats)
    project_times = step_seconds(projected, stored, repeats)
    fold_ms, project_ms = (
        1e3 * statistics.median(fold_times),
        1e3 * statistics.median(project_times),
    )
    return {
        "rule": label,
        "M": size,
        "folded_ms": fold_ms,
        "projected_ms": project_ms,
        "ratio": fold_ms / project_ms,
        "max_abs_difference": difference,
    }


def layer_rows(sizes: list[int], repeats: int, device: torch.device) -> list[dict]:
    """The efficiency experiment: FLOPs and forward time of every rule's `NPH` layer."""
    rows = []
    for size in sizes:
        for label in RULES:
            rows.append(row := measure(label, size, repeats, device))
            print(
                f"{label:>15} M={size:>5}  {row['flops'] / 1e6:10.1f} MFLOP  "
                f"{row['median_ms']:9.2f} ms",
                file=sys.stderr,
            )
    return rows


def pooling_rows(sizes: list[int], batch: int, repeats: int, device: torch.device) -> list[dict]:
    """`NPHPooling`'s folded path against projecting every stored row."""
    rows = []
    for size in sizes:
        for label in POOLING_RULES:
            rows.append(row := measure_pooling(label, size, batch, repeats, device))
            print(
                f"{label:>15} M={size:>5}  folded {row['folded_ms']:8.1f} ms  "
                f"projected {row['projected_ms']:8.1f} ms  ratio {row['ratio']:.2f}",
                file=sys.stderr,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pooling", action="store_true", help="NPHPooling folded vs projected")
    parser.add_argument("--sizes", default=None, help="default 128,...,2048 (20,50,100 pooling)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="default 1 (2 with --pooling)")
    parser.add_argument("--batch", type=int, default=128, help="sets per step, with --pooling")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    threads = args.threads or (2 if args.pooling else 1)
    torch.set_num_threads(threads)
    device = device_or_exit(args.device)
    default_sizes = "20,50,100" if args.pooling else "128,256,512,1024,2048"
    sizes = [int(s) for s in (args.sizes or default_sizes).split(",")]
    result = {
        "machine": platform.machine(),
        "device": str(device),
        "threads": threads,
        "torch": torch.__version__,
    }
    if args.pooling:
        result |= {
            "batch": args.batch,
            "rows": pooling_rows(sizes, args.batch, args.repeats, device),
        }
    else:
        result |= {
            "batch": BATCH,
            "hidden": HIDDEN,
            "rows": layer_rows(sizes, args.repeats, device),
        }
    emit(result, args.out)


if __name__ == "__main__":
    main()
