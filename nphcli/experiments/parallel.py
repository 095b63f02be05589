"""Independent trainings, run where the user says: in this process, in `jobs` local processes,
or on a Ray cluster (`ray`: its address, "auto", or "local" for a fresh local instance; Ray
comes with the optional `cluster` extra). Each task is a picklable function and its
arguments; results come back as they finish, each with its task's index, so the caller writes
them to its resumable log at once and a killed run loses only the trainings in flight.

A training seeds everything it draws from its own arguments (`mil_paper.train_fold`,
`timeseries_run.train_one`), so where it runs does not change its result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from nphcli.core.errors import NphError

Task = tuple[Callable[..., Any], tuple[Any, ...]]


def run_tasks(
    tasks: Sequence[Task], *, jobs: int = 1, ray: str | None = None
) -> Iterator[tuple[int, Any]]:
    """(index, fn(*args)) of every task, in the order they finish (in order with one job)."""
    if jobs < 1:
        raise NphError(f"--jobs must be ≥ 1, got {jobs}")
    if ray is not None:
        yield from _on_ray(tasks, ray)
    elif jobs == 1 or len(tasks) <= 1:
        for index, (fn, args) in enumerate(tasks):
            yield index, fn(*args)
    else:
        yield from _in_processes(tasks, jobs)


def _context(tasks: Sequence[Task]) -> Any:
    """A fork server that imported the tasks' modules once, not a fresh interpreter per job;
    never a fork of this process (a forked child of one that has run torch's thread pools can
    hang). Windows has no fork server: fresh interpreters there."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(sorted({fn.__module__ for fn, _ in tasks}))
    return context


def _in_processes(tasks: Sequence[Task], jobs: int) -> Iterator[tuple[int, Any]]:
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    threads = max(1, torch.get_num_threads() // jobs)  # this process's threads, shared out
    with ProcessPoolExecutor(
        jobs, mp_context=_context(tasks), initializer=torch.set_num_threads, initargs=(threads,)
    ) as pool:
        pending = {pool.submit(fn, *args): index for index, (fn, args) in enumerate(tasks)}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield pending.pop(future), future.result()
        finally:
            pool.shutdown(cancel_futures=True)  # waits only for the trainings already running


def _on_ray(tasks: Sequence[Task], address: str) -> Iterator[tuple[int, Any]]:
    try:
        import ray
    except ImportError:
        raise NphError("--ray needs Ray: pip install 'nph[cluster]' (or pip install ray)") from None
    if not ray.is_initialized():
        try:
            if address == "local":
                ray.init(include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error)
            raise NphError(f"cannot reach the Ray cluster at {address!r}: {first}") from None
    remote = ray.remote(num_cpus=1)(_call)  # one CPU of the cluster, one thread, per training
    pending = {remote.remote(fn, *args): index for index, (fn, args) in enumerate(tasks)}
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            yield pending.pop(done[0]), ray.get(done[0])
    finally:
        for ref in pending:
            ray.cancel(ref)


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    torch.set_num_threads(1)
    return fn(*args)
