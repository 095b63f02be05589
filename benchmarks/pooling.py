"""NPHPooling's folded path against projecting every stored row, on the MIL network's shapes.

    python benchmarks/pooling.py [--sizes 20,50,100] [--batch 128] [--repeats 5] [--threads 2]
                                 [--out FILE]

`NPHPooling` (d = 256, 2 prototypes, 4 heads × 64, β = 0.1, as in the MIL experiment) pools a
batch of sets of M rows; forward and backward are timed together, as training runs them. The
baseline is the same layer with `folds()` forced off (W_K and W_V applied to every stored row),
timed in the same run, so the ratio folded / projected is what to read; the outputs of the two
paths are compared too. Prints one JSON object (and writes it to --out).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch

from nphcli.layers import NPHPooling

RULES = {
    "dense": {},
    "sparse": {},
    "topk-20%": {"model": "topk", "k": 0.2},
    "random-masked": {"model": "random", "k": 0.2},
}


def build(label: str) -> NPHPooling:
    params = dict(RULES[label])
    model = params.pop("model", label)
    torch.manual_seed(0)
    return NPHPooling(256, prototypes=2, model=model, heads=4, head_dim=64, beta=0.1, **params)


def step_seconds(layer: NPHPooling, stored: torch.Tensor, repeats: int) -> list[float]:
    """Forward and backward times of `layer` on `stored`, after one warm-up step."""
    times = []
    for i in range(repeats + 1):
        started = time.perf_counter()
        layer(stored).square().sum().backward()
        if i:
            times.append(time.perf_counter() - started)
    return times


def measure(label: str, size: int, batch: int, repeats: int) -> dict:
    stored = torch.randn(batch, size, 256, generator=torch.Generator().manual_seed(1))
    stored.requires_grad_(True)
    folded, projected = build(label), build(label)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20,50,100")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        for label in RULES:
            rows.append(measure(label, size, args.batch, args.repeats))
            row = rows[-1]
            print(
                f"{label:>14} M={size:>4}  folded {row['folded_ms']:8.1f} ms  "
                f"projected {row['projected_ms']:8.1f} ms  ratio {row['ratio']:.2f}",
                file=sys.stderr,
            )
    result = {
        "machine": platform.machine(),
        "threads": args.threads,
        "torch": torch.__version__,
        "batch": args.batch,
        "rows": rows,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
