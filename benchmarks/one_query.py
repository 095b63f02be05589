"""One query against many memories (issue 22's Q = 1 targets): what one `model.retrieve(x[:1],
keys)` costs beyond the X·Kᵀ GEMV. At Q = 1 the GPU work is a GEMV and a few small kernels, so
the host's per-call work decides the time: the torch ops it queues (each a kernel launch on a
GPU) and the host syncs that stop it queueing ahead (`.item()`, `bool(tensor)`, `nonzero`,
boolean-mask indexing, `unique`).

Prints JSON: per model, the aten ops and host syncs of one call (counted with a dispatch mode,
the same on every device) and the median wall time per call, with the GEMV's in the same run.

    python benchmarks/one_query.py                          # CPU, M = 100,000, d = 64
    python benchmarks/one_query.py --device cuda --memories 1000000 --dim 784 \
        --dtype float32 bfloat16                            # issue 22's GPU case
"""

from __future__ import annotations

import argparse
import collections
import json

import torch
from _common import device_name, device_or_exit, median_ms, provenance
from gpu_probe import MODELS as PROBE_MODELS
from torch.utils._python_dispatch import TorchDispatchMode

from nphcli.core.dtypes import torch_dtype
from nphcli.models import create_model

# The GPU probe's models and parameters, without multihead (no one-query target of its own).
MODELS = {name: params for name, params in PROBE_MODELS.items() if name != "multihead"}
# aten ops that make the host wait for the device on CUDA: a value read back (`.item()`,
# `bool(t)`), or an output whose size depends on the data.
SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim", "equal"}
SYNC_OPS_WITH_BOOL_INDEX = {"index", "index_put", "index_put_"}  # t[mask], t[mask] = v


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched while active, and those among them that sync."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.syncs: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        if name in SYNC_OPS or (name in SYNC_OPS_WITH_BOOL_INDEX and _bool_index(args)):
            self.syncs[name] += 1
        return func(*args, **(kwargs or {}))


def _bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)


def count_ops(run) -> OpCounter:
    """The ops and syncs of one call of `run`."""
    counter = OpCounter()
    with counter:
        run()
    return counter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--beta", type=float, default=10.0)
    parser.add_argument("--dtype", nargs="+", default=["float32"])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    device = device_or_exit(args.device)
    generator = torch.Generator().manual_seed(0)
    keys32 = torch.randn(args.memories, args.dim, generator=generator)
    keys32 /= keys32.norm(dim=1, keepdim=True)  # unit patterns: β = 10 gives sparse supports
    query32 = keys32[:1] + 0.5 * torch.randn(1, args.dim, generator=generator) / args.dim**0.5
    rows = []
    for dtype_name in args.dtype:
        dtype = torch_dtype(dtype_name)
        keys, query = keys32.to(device, dtype), query32.to(device, dtype)
        gemv_ms = median_ms(lambda: query @ keys.T, device, args.repeats)  # noqa: B023
        for name in args.models:
            model = create_model(name, beta=args.beta, **MODELS[name])
            run = lambda: model.retrieve(query, keys)  # noqa: B023, E731
            run()  # warm-up: lazy imports and caches are not per-call work
            counted = count_ops(run)
            ms = median_ms(run, device, args.repeats)
            rows.append(
                {
                    "model": name,
                    "dtype": dtype_name,
                    "ops": sum(counted.ops.values()),
                    "syncs": sum(counted.syncs.values()),
                    "sync_ops": dict(counted.syncs),
                    "ms": ms,
                    "gemv_ms": gemv_ms,
                    "over_gemv": ms / gemv_ms,
                }
            )
    info = {
        **provenance(),
        "device": device_name(device),
        "memories": args.memories,
        "dim": args.dim,
        "beta": args.beta,
        "rows": rows,
    }
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
