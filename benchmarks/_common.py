"""Shared by the benchmark scripts: a `--device` that is not present ends the script in one
line (exit 2), as `nph retrieve --device cuda` does, instead of a traceback mid-run; the
median time of a call, synchronised on CUDA; the half-masked queries of a memory file; the
GPU benchmarks' unit-norm inputs; the provenance that every result file records, the device's
name, and the JSON result printed and written."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from nphcli.core.devices import resolve_device
from nphcli.core.errors import NphError


def provenance(machine: str | None = None) -> dict:
    """What a result file needs to say where it came from, so that numbers from different code
    or machines are never mixed unseen: the machine's name, the commit (with "+dirty" when the
    tree had changes), the intra-op threads and the torch version. `NPH_BENCH_COMMIT` overrides
    the commit where the checkout's history is not this code's: a working tree copied to a GPU
    machine kept the session's first commit and reported every later change as "+dirty"."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        except OSError:
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = os.environ.get("NPH_BENCH_COMMIT") or git("rev-parse", "HEAD") or "unknown"
    if "NPH_BENCH_COMMIT" not in os.environ and git(
        "status", "--porcelain", "--untracked-files=no"
    ):
        commit += "+dirty"
    return {
        "machine": machine or f"{platform.node()}-{platform.machine()}",
        "commit": commit,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def device_or_exit(name: str) -> torch.device:
    """The torch device `name` names, or `Error: ...` on stderr and exit status 2."""
    try:
        return resolve_device(name)
    except NphError as error:
        sys.stderr.write(f"Error: {error}\n")
        raise SystemExit(2) from None


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously; a timer must not stop
    before the kernels do)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(run, device: torch.device, repeats: int) -> float:
    """Median milliseconds of `run()` over `repeats` calls after one warm-up (kernels,
    allocator, caches), each call waited for on CUDA."""
    run()
    times = []
    for _ in range(repeats):
        sync(device)
        begin = time.perf_counter()
        run()
        sync(device)
        times.append((time.perf_counter() - begin) * 1000)
    return statistics.median(times)


def half_masked_queries(keys: torch.Tensor, count: int) -> torch.Tensor:
    """`count` stored patterns (seed 0) with their second half set to 0: the paper's masked
    retrieval task on a memory's own rows, (Q, d)."""
    generator = torch.Generator().manual_seed(0)
    chosen = torch.randperm(keys.shape[0], generator=generator)[:count]
    queries = keys[chosen].clone()  # (Q, d)
    queries[:, keys.shape[1] // 2 :] = 0.0
    return queries


def device_name(device: torch.device) -> str:
    """The card's name on CUDA (results are named by it), else the device type."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def unit_inputs(
    memories: int, dim: int, num_queries: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit-norm Gaussian memories (M, d) and queries (Q, d) that are stored rows plus noise of
    0.05 per entry, drawn on `device`; every case of a run takes a prefix of the queries."""
    generator = torch.Generator(device=device).manual_seed(0)
    keys = torch.randn(memories, dim, generator=generator, device=device)
    keys = torch.nn.functional.normalize(keys, dim=1)  # (M, d) unit norm
    rows = torch.randint(0, memories, (num_queries,), generator=generator, device=device)
    noise = torch.randn(num_queries, dim, generator=generator, device=device)
    return keys, keys[rows] + 0.05 * noise  # (M, d), (Q, d)


def emit(result: dict, out: Path | str | None, *, indent: int = 1) -> None:
    """Print the result as JSON, and write it to `out` when given (one result file per run)."""
    text = json.dumps(result, indent=indent)
    print(text)
    if out:
        Path(out).write_text(text + "\n")
