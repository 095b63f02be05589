"""One retrieval run on every rank of a process group, over the rank's shards of a manifest.

Every rank runs the same `evaluate` (same seed, so the same queries and corruption), reading only
its own rows; the engine's merges (`Collective`) make each step's result the single-process one
on every rank. Only rank 0's report is used for output: the caller prints and writes it.
"""

from __future__ import annotations

import functools
import sys
import time

import torch

from nphcli.core.errors import NphError
from nphcli.distributed.group import (
    join_group,
    leave_group,
    open_rank_memory,
    owned_parts,
    read_shard_set,
)
from nphcli.evaluation.evaluate import evaluate_inputs
from nphcli.evaluation.inputs import read_inputs
from nphcli.evaluation.report import RetrievalReport
from nphcli.memory.collective import GroupCollective
from nphcli.schema.settings import InputSpec, RetrieveSettings, Spread


def evaluate_on_rank(
    collective: GroupCollective, spec: InputSpec, settings: RetrieveSettings
) -> RetrievalReport:
    """`evaluate` on this rank's shards; the report (equal on every rank) records the number of
    ranks, the backend and the bytes this rank sent in collectives."""
    t0 = time.perf_counter()
    bank = open_rank_memory(spec.memory, stream=spec.stream, collective=collective)
    inputs = read_inputs(spec, bank)
    inputs.load_s = time.perf_counter() - t0  # opening the shards counts as loading
    report = evaluate_inputs(inputs, settings)
    report.config["memory"]["stream"] = spec.stream
    peak = torch.tensor([[_peak_rss_bytes()]], dtype=torch.int64)
    report.config["distributed"] = {
        "ranks": collective.world_size,
        "backend": collective.backend,
        "rank_rows": bank.local_rows,
        "bytes_sent": collective.bytes_sent,
        "peak_rss_bytes": collective.all_cat(peak, dim=0)[:, 0].tolist(),  # per rank
    }
    return report


def _peak_rss_bytes() -> int:
    """This process's peak resident memory (0 where the OS does not say)."""
    try:
        import resource
    except ImportError:  # not on Windows
        return 0
    kilobytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return int(kilobytes) * (1 if sys.platform == "darwin" else 1024)  # bytes on macOS


def distributed_retrieve(
    spec: InputSpec, settings: RetrieveSettings, spread: Spread
) -> RetrievalReport | None:
    """A retrieval over a shard manifest on several ranks: `spread.workers` local processes
    started here, or, under torchrun (workers = 1), the group torchrun set up. Returns the report
    on the process that outputs it (this one with local workers, rank 0 under torchrun), else
    None."""
    from nphcli.distributed.group import launched_by_torchrun
    from nphcli.distributed.launch import run_workers

    workers, timeout = spread.workers, spread.timeout
    if not (timeout > 0):
        raise NphError(f"--timeout must be a number of seconds > 0, got {timeout}")
    if workers != 1 and launched_by_torchrun():
        raise NphError("--workers starts its own processes; under torchrun leave it at 1")
    if workers == 1 and launched_by_torchrun():
        collective = join_group(timeout=timeout, device=settings.device)
        try:
            report = evaluate_on_rank(collective, spec, settings)
        except BaseException:
            leave_group(wait_for_peers=False)
            raise
        leave_group()  # every rank done: torn down before any rank exits
        return report if collective.rank == 0 else None
    manifest = read_shard_set(spec.memory)  # a bad shard set fails here, before any start
    owned_parts(len(manifest.parts), 0, workers)  # so does a shard set with too few shards
    work = functools.partial(evaluate_on_rank, spec=spec, settings=settings)
    return run_workers(workers, work, timeout=timeout, device=settings.device)
