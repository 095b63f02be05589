"""Local worker processes for one machine: `run_workers` starts N processes, joins them into a
process group on a free localhost port (gloo, or NCCL for ranks with a GPU each), runs
`work(collective)` on each, and returns rank 0's result; no torchrun (docs/distributed.md).

Workers start from a fork server ("forkserver"): a plain fork of a process whose OpenMP pool
runs can hang, CUDA cannot be used in a forked child, and spawn pays torch's import per worker;
`work` must be picklable. Each reports over its own pipe (a queue's named semaphores outlive a
parent killed outright). A worker that raises, dies or stops answering (its peers' collective
times out) stops every worker and raises one error naming the rank; nothing is returned, so
nothing is written. SIGTERM or SIGHUP to the parent raise `Terminated` (exit 128 + N); a parent
killed outright is seen by each worker within `PARENT_POLL_S`.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any

import torch

from nphcli.core.errors import NphError, NphRuntimeError
from nphcli.distributed.group import DEFAULT_TIMEOUT, distributed, join_group, leave_group
from nphcli.memory.collective import GroupCollective

# After a first failure, how long the others may still report (a peer's broken connection).
GRACE_S = 2.0

# How often a worker checks that its parent still runs (the portable fallback of Linux's
# parent-death signal, which with a fork server would follow the server, not the parent).
PARENT_POLL_S = 0.5

STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class Terminated(NphError):
    """The parent was asked to stop (SIGTERM, SIGHUP) while its workers ran; they were stopped.
    Exit status 128 + the signal's number, as a shell reports a process the signal ended."""

    def __init__(self, signum: int) -> None:
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name}; every worker was stopped, nothing was written")


def rendezvous_store(workers: int, timeout: float) -> Any:
    """The workers' rendezvous store, served by this process on a port the OS picks as it binds.
    A port found free and bound later by rank 0 could be taken in between (by another run's
    connections) and a rank then waited out the timeout on a stranger's socket."""
    wait = timedelta(seconds=timeout)
    return distributed().TCPStore(
        "127.0.0.1", 0, workers, is_master=True, timeout=wait, wait_for_workers=False
    )


def run_workers(
    workers: int,
    work: Callable[[GroupCollective], Any],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    threads: int | None = None,
    method: str | None = None,
    device: str = "cpu",
) -> Any:
    """Run `work(collective)` on `workers` local ranks and return rank 0's result. `timeout`
    (seconds) bounds each collective wait; `threads`: each worker's torch threads (default: the
    cores shared evenly); `method` "forkserver" (default), "spawn" or "fork"; `device` picks the
    backend and each rank's GPU (`group.join_group`)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise NphError(f"--workers must be a whole number ≥ 1, got {workers!r}")
    if not (timeout > 0):
        raise NphError(f"the worker timeout must be > 0 seconds, got {timeout}")
    threads = threads or max(1, (os.cpu_count() or 1) // workers)
    context = torch.multiprocessing.get_context(method or "forkserver")
    if context.get_start_method() == "forkserver":
        # the module that defines `work` (and what it imports) loads once, in the fork server
        defining = getattr(work, "func", work).__module__  # a functools.partial names its func
        if defining != "__main__":
            context.set_forkserver_preload([defining])
    store = rendezvous_store(workers, timeout)  # held until the workers are done
    address = f"tcp://127.0.0.1:{store.port}"
    pipes = [context.Pipe() for _ in range(workers)]  # (parent's end, worker's end) per rank
    shared = (workers, address, timeout, threads, device, work)
    processes = [
        context.Process(target=_worker, args=(rank, *shared, pipes[rank][1]), daemon=True)
        for rank in range(workers)
    ]
    started = []  # a signal may arrive while the workers start: only these are stopped
    with _stop_signals_raise():
        try:
            with _ctrl_c_held():
                for process, (_, end) in zip(processes, pipes, strict=True):
                    process.start()
                    started.append(process)
                    end.close()  # the worker has its copy; a dead worker's pipe reads as closed
            return _collect(processes, [own for own, _ in pipes], timeout)
        finally:  # terminate and reap every worker still running
            for process in started:
                if process.is_alive():
                    process.terminate()
            for process in started:
                process.join(1.0)
                if process.is_alive():
                    process.kill()
                    process.join()
            for own, _ in pipes:
                own.close()


@contextlib.contextmanager
def _ctrl_c_held():
    """Hold Ctrl-C (SIGINT) back while the workers start: a terminal sends it to the whole group,
    and the fork server, importing torch, printed a traceback. Started with it blocked, the fork
    server, resource tracker and workers keep it blocked; this process alone answers it, once
    they started. The stop signals are held too: a forked worker stopped before `_worker` resets
    them raised `Terminated` inside its copy of the caller's stack."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # started later, it would unblock SIGINT on its way
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, *STOP_SIGNALS})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)  # a pending Ctrl-C is raised now


@contextlib.contextmanager
def _stop_signals_raise():
    """While the workers run, the first SIGTERM or SIGHUP raises `Terminated` here (a second must
    not cut the cleanup short), so the caller stops the workers and the CLI prints one line. A
    signal ignored already (nohup) stays ignored; off the main thread no handler can be set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = []

    def handler(signum, frame):
        if not raised:
            raised.append(signum)
            raise Terminated(signum)

    stopping = [n for n in STOP_SIGNALS if signal.getsignal(n) is not signal.SIG_IGN]  # nohup
    previous = {number: signal.signal(number, handler) for number in stopping}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


def _worker(rank, world_size, address, timeout, threads, device, work, pipe) -> None:
    for number in STOP_SIGNALS:  # held since the start (`_ctrl_c_held`): a pending one acts now
        signal.signal(number, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    # End with the parent, however it ends: on Linux by the parent-death signal (with a fork
    # server, the server, which outlives nph only while workers run); everywhere by a thread.
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_watch, args=(parent,), name="parent-watch", daemon=True).start()
    torch.set_num_threads(threads)
    code = 0
    try:
        collective = join_group(
            rank=rank, world_size=world_size, address=address, timeout=timeout, device=device
        )
        result = work(collective)
        # Tensors travel through shared memory that this process serves until the parent has
        # read them, so rank 0 waits for the parent's word before it exits.
        pipe.send(("done", result if rank == 0 else None, 0))
        if rank == 0:
            pipe.poll(timeout)
        leave_group()
    except NphError as error:
        code = error.exit_code
        _report(pipe, ("error", str(error), code))
    except BaseException as error:  # noqa: BLE001  (reported to the parent, which re-raises)
        code = 1
        _report(pipe, ("error", f"{type(error).__name__}: {error}", code))
    sys.exit(code)


def _report(pipe, message) -> None:
    """Send `message` to the parent, if it still listens."""
    with contextlib.suppress(OSError):
        pipe.send(message)


def _watch(parent) -> None:
    while parent.is_alive():
        parent.join(PARENT_POLL_S)
    os._exit(1)  # nobody is left to report to; the peers see this rank's connections close


def _collect(processes, pipes, timeout: float) -> Any:
    """Rank 0's result once every worker finished cleanly; else one error naming a rank."""
    done: dict[int, Any] = {}
    errors: dict[int, tuple[str, int]] = {}
    listening = dict(enumerate(pipes))  # the ranks that have not reported yet
    failed_at = None
    while True:
        running = [process.sentinel for process in processes if process.exitcode is None]
        ready = wait([*listening.values(), *running], timeout=0.05)
        for rank, pipe in list(listening.items()):
            if pipe not in ready:
                continue
            del listening[rank]
            try:
                kind, payload, code = pipe.recv()
            except EOFError:  # it ended without a report: its exit code says how
                continue
            if kind == "done":
                done[rank] = payload
                if rank == 0:
                    _report(pipe, "received")
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


def _failure(processes, codes, done, errors, timeout: float) -> NphError:
    """The one error to report: a user error every rank agrees on, else the rank that died,
    else the rank that stopped answering, else the first rank's own error."""
    texts = {text for text, _ in errors.values()}
    user = [r for r, (_, code) in sorted(errors.items()) if code == NphError.exit_code]
    user.sort(key=lambda r: errors[r][0].startswith("rank "))  # a rank's own error first
    if user and len(texts) == 1 and len(errors) == len(processes):
        return NphError(errors[user[0]][0])
    for rank, code in enumerate(codes):
        if code not in (None, 0) and rank not in errors and rank not in done:
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            return NphRuntimeError(f"worker rank {rank} died ({how}); every rank was stopped")
    if user:
        return NphError(f"rank {user[0]}: {errors[user[0]][0]}")
    silent = [r for r, code in enumerate(codes) if code is None and r not in errors]
    if silent and errors:
        return NphRuntimeError(
            f"worker rank {silent[0]} stopped answering: the other ranks gave up after the "
            f"{timeout:g} s timeout; every rank was stopped"
        )
    rank = min(errors) if errors else 0
    text = errors[rank][0] if errors else "failed"
    return NphRuntimeError(text if text.startswith("rank ") else f"rank {rank}: {text}")
