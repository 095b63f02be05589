"""Batch jobs: retrieval requests as JSON objects, evaluated one after another in one process.

Start-up (importing torch) is paid once, and a memory file once per run of jobs on it (the
`MemoryCache.KEEP` memories used last are kept). A job's keys are the retrieval fields and model
parameters; each setting gives exactly the object `nph retrieve --json` prints. A job that cannot
run gives an error object on its own line and the others go on.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from nphcli.app.request import check_request, evaluate_request, request_from
from nphcli.core.errors import NphError
from nphcli.core.jsontext import parse_json
from nphcli.evaluation.inputs import Inputs, read_inputs
from nphcli.memory import open_memory
from nphcli.memory.bank import MemoryBank
from nphcli.schema.fields import check_keys, get_field
from nphcli.schema.settings import InputSpec

# Bytes of one job line: a job is a few hundred bytes; a longer line is refused, not parsed.
MAX_JOB_BYTES = 1 << 20


class MemoryCache:
    """The memories used last, keyed by (resolved path, stream); at most `keep` of them, the
    least recently used dropped first. Each entry also remembers the file's size and
    modification time, so a file replaced between jobs is read again rather than served stale."""

    KEEP = 2  # memories kept: enough for jobs alternating between two, bounded for many files

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._banks: OrderedDict[tuple[str, bool], tuple[tuple[int, int], MemoryBank]] = (
            OrderedDict()
        )

    def get(self, path: str, *, stream: bool) -> tuple[MemoryBank, float]:
        """The memory at `path` and the seconds spent reading it now (0 when cached)."""
        resolved = Path(path).resolve()
        try:
            stat = resolved.stat()
            stamp = (stat.st_size, stat.st_mtime_ns)
        except OSError:
            stamp = (-1, -1)  # let the loader say what is wrong with the path
        key = (str(resolved), stream)
        cached = self._banks.pop(key, None)
        if cached is not None and cached[0] == stamp:
            self._banks[key] = cached  # now the most recently used
            return cached[1], 0.0
        while len(self._banks) >= self.keep:  # make room before reading: peak ≤ keep memories
            self._banks.popitem(last=False)
        t0 = time.perf_counter()
        bank = open_memory(path, stream=stream)
        self._banks[key] = (stamp, bank)
        return bank, time.perf_counter() - t0

    def __len__(self) -> int:
        return len(self._banks)


def run_job(job: Any, cache: MemoryCache) -> list[dict[str, Any]]:
    """The `nph retrieve --json` object of each setting of one job (a JSON object, see the
    module docstring); NphError if the job cannot run."""
    if not isinstance(job, dict):
        raise NphError(f"a job is a JSON object, got {type(job).__name__}")
    check_keys(job, "batch", "a batch job")
    values = {
        key: get_field(key).from_json(value, f"job key {key!r}") for key, value in job.items()
    }
    values["json"] = [True]  # a job's answer is JSON: several settings may report per query
    request = request_from(values)
    models = check_request(request)
    reports = evaluate_request(request, _inputs(request.inputs, cache), models)
    return [report.to_json(per_query=request.output.per_query) for report in reports]


def run_jobs(lines: Iterable[str], cache: MemoryCache | None = None) -> Iterator[dict[str, Any]]:
    """One result per non-blank line of JSON Lines `lines`, in order: the job's
    `nph retrieve --json` object, or `{"job": N, "error": message}` (N: the line number, from
    1) for a line that is not valid JSON or a job that cannot run."""
    cache = cache or MemoryCache()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            job = parse_json(line, what="the line", max_bytes=MAX_JOB_BYTES)
            yield from run_job(job, cache)
        except NphError as error:
            yield {"job": number, "error": " ".join(str(error).split())}


def _inputs(spec: InputSpec, cache: MemoryCache) -> Inputs:
    """The job's inputs: its memory from the cache, its own queries and targets read for this
    job; the load time is the memory's (0 when cached) plus the own inputs'."""
    memory, load_s = cache.get(spec.memory, stream=spec.stream)
    inputs = read_inputs(spec, memory)
    inputs.load_s += load_s
    return inputs
