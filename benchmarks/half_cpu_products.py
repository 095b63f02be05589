"""Half precision on the CPU: what float32 products cost against the rounded half products
they replaced (issue 34). Each model retrieves in bfloat16 and float16 twice in the same run:
as now (each half operand widened to float32, so scores are never rounded to the half dtype)
and as before (the half product rounded to the half dtype, then cast to float32; reproduced by
letting `precision.matmul` take its rounding fallback). Values differ from the keys (d_v = d/2),
so dense and multihead take the blockwise products rather than torch's fused kernel.

Prints JSON (and writes it with --out): per (model, dtype) the median milliseconds of one
`retrieve` both ways and their ratio now / before.

    python benchmarks/half_cpu_products.py [--memories 20000] [--dim 64] [--queries 256]
"""

from __future__ import annotations

import argparse

import torch
from _common import emit, median_ms, provenance

from nphcli.engine import precision
from nphcli.models import create_model

MODELS = {
    "dense": {},
    "multihead": {"heads": 4},
    "sparse": {},
    "entmax": {"alpha": 1.5},
    "topk": {"k": 10},
    "window": {"window": 64},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--queries", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--machine", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cpu = torch.device("cpu")
    generator = torch.Generator().manual_seed(0)
    keys = torch.nn.functional.normalize(torch.randn(args.memories, args.dim, generator=generator))
    values = torch.randn(args.memories, args.dim // 2, generator=generator)
    queries = keys[: args.queries] + 0.05 * torch.randn(args.queries, args.dim, generator=generator)
    rows = []
    for name, params in MODELS.items():
        model = create_model(name, beta=10.0, **params)
        for dtype in (torch.bfloat16, torch.float16):
            q, k, v = (t.to(dtype) for t in (queries, keys, values))
            now = median_ms(lambda: model.retrieve(q, k, v), cpu, args.repeats)  # noqa: B023
            with _rounded_products():
                before = median_ms(lambda: model.retrieve(q, k, v), cpu, args.repeats)  # noqa: B023
            rows.append(
                {
                    "model": name,
                    "dtype": str(dtype).removeprefix("torch."),
                    "ms_float32_products": round(now, 3),
                    "ms_rounded_products": round(before, 3),
                    "ratio": round(now / before, 3),
                }
            )
    shape = {"memories": args.memories, "dim": args.dim, "queries": args.queries}
    emit({**provenance(args.machine), **shape, "rows": rows}, args.out)


class _rounded_products:  # noqa: N801  (used as a context manager, like torch's)
    """The products as before issue 34: `matmul` takes its rounding route on the CPU too (the
    float32-output kernel is CUDA's, so the CPU falls back to rounding and casting)."""

    def __enter__(self) -> None:
        self.saved = precision.FLOAT32_OUT_DEVICES
        precision.FLOAT32_OUT_DEVICES = (*self.saved, "cpu")

    def __exit__(self, *exc: object) -> None:
        precision.FLOAT32_OUT_DEVICES = self.saved


if __name__ == "__main__":
    main()
