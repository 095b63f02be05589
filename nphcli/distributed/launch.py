"""Local worker processes for one machine: `run_workers` starts N processes, joins them into a
gloo process group on a free localhost port, runs `work(collective)` on each, and returns rank
0's result. No torchrun needed.

Processes start from a fork server ("forkserver"): one fresh interpreter that imports torch
and nph once, then forks each worker cheaply. Not a plain fork of this process: a forked child
of a process whose OpenMP pool already runs can hang in its first parallel region (seen here),
and CUDA cannot be used in a forked child. Not spawn by default: a fresh interpreter per worker
pays torch's import every time. `work` must be picklable (a module-level function, or a
functools.partial of one).

Faults: a worker that raises reports its error; one that dies (killed, out of memory) is seen by
its exit code; one that hangs makes the others fail once their collective times out (the
group's `timeout`), and is then named as the rank that stopped answering. Any of these stops
every worker and raises one error naming the rank; nothing is returned, so nothing is written.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from nphcli.distributed.group import DEFAULT_TIMEOUT, join_group, leave_group
from nphcli.errors import NphError, NphRuntimeError
from nphcli.memory.collective import GroupCollective

# After the first failure, how long to wait for the other workers' own reports before stopping
# them: enough for a peer's broken connection to surface, short beside the timeout.
GRACE_S = 2.0


def free_port() -> int:
    """A TCP port on localhost that is free now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_workers(
    workers: int,
    work: Callable[[GroupCollective], Any],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    threads: int | None = None,
    method: str | None = None,
) -> Any:
    """Run `work(collective)` on `workers` local ranks and return rank 0's result.

    `timeout` (seconds) bounds each collective wait; `threads` is each worker's torch thread
    count (default: this machine's cores shared evenly); `method` "forkserver" (default), "spawn"
    or "fork" (see the module docstring).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise NphError(f"--workers must be a whole number ≥ 1, got {workers!r}")
    if not (timeout > 0):
        raise NphError(f"the worker timeout must be > 0 seconds, got {timeout}")
    threads = threads or max(1, (os.cpu_count() or 1) // workers)
    context = torch.multiprocessing.get_context(method or "forkserver")
    if context.get_start_method() == "forkserver":
        context.set_forkserver_preload(["nphcli.distributed.retrieve"])
    address = f"tcp://127.0.0.1:{free_port()}"
    messages = context.SimpleQueue()
    received = context.Event()  # rank 0 stays alive until its result has been read
    processes = [
        context.Process(
            target=_worker,
            args=(rank, workers, address, timeout, threads, work, messages, received),
            daemon=True,
        )
        for rank in range(workers)
    ]
    for process in processes:
        process.start()
    try:
        return _collect(processes, messages, received, timeout)
    finally:
        _stop(processes)


def _worker(rank, world_size, address, timeout, threads, work, messages, received) -> None:
    torch.set_num_threads(threads)
    code = 0
    try:
        collective = join_group(rank=rank, world_size=world_size, address=address, timeout=timeout)
        result = work(collective)
        # Tensors travel through shared memory that this process serves until the parent has
        # read them, so rank 0 waits for the parent before it exits.
        messages.put(("done", rank, result if rank == 0 else None, 0))
        if rank == 0:
            received.wait(timeout)
        leave_group()
    except NphError as error:
        code = error.exit_code
        messages.put(("error", rank, str(error), code))
    except BaseException as error:  # noqa: BLE001  (reported to the parent, which re-raises)
        code = 1
        messages.put(("error", rank, f"{type(error).__name__}: {error}", code))
    sys.exit(code)


def _collect(processes, messages, received, timeout: float) -> Any:
    """Rank 0's result once every worker finished cleanly; else one error naming a rank."""
    done: dict[int, Any] = {}
    errors: dict[int, tuple[str, int]] = {}
    failed_at = None
    while True:
        while not messages.empty():
            kind, rank, payload, code = messages.get()
            if kind == "done":
                done[rank] = payload
                if rank == 0:
                    received.set()
            else:
                errors[rank] = (payload, code)
        codes = [process.exitcode for process in processes]
        if len(done) == len(processes) and all(code is not None for code in codes):
            return done[0]
        broken = errors or any(code not in (None, 0) for code in codes)
        if broken and failed_at is None:
            failed_at = time.monotonic()
        if failed_at is not None:
            finished = all(code is not None for code in codes)
            if finished or time.monotonic() - failed_at > GRACE_S:
                raise _failure(processes, codes, done, errors, timeout)
        time.sleep(0.01)


def _failure(processes, codes, done, errors, timeout: float) -> NphError:
    """The one error to report: a user error every rank agrees on, else the rank that died,
    else the rank that stopped answering, else the first rank's own error."""
    texts = {text for text, _ in errors.values()}
    user = [r for r, (_, code) in sorted(errors.items()) if code == NphError.exit_code]
    user.sort(key=lambda r: errors[r][0].startswith("rank "))  # a rank's own error first
    if user and len(texts) == 1 and len(errors) == len(processes):
        text, code = errors[user[0]]
        return NphError(text)
    for rank, code in enumerate(codes):
        if code not in (None, 0) and rank not in errors and rank not in done:
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            return NphRuntimeError(f"worker rank {rank} died ({how}); every rank was stopped")
    if user:
        rank = user[0]
        return NphError(f"rank {rank}: {errors[rank][0]}")
    silent = [r for r, code in enumerate(codes) if code is None and r not in errors]
    if silent and errors:
        return NphRuntimeError(
            f"worker rank {silent[0]} stopped answering: the other ranks gave up after the "
            f"{timeout:g} s timeout; every rank was stopped"
        )
    rank = min(errors) if errors else 0
    text = errors[rank][0] if errors else "failed"
    return NphRuntimeError(text if text.startswith("rank ") else f"rank {rank}: {text}")


def _stop(processes) -> None:
    """Terminate and reap every worker still running (the caller already has its answer)."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(1.0)
        if process.is_alive():
            process.kill()
            process.join()
