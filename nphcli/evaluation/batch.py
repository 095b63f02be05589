"""Batch jobs: retrieval settings as JSON objects, evaluated one after another in one process.

A script that runs many evaluations pays for start-up (importing torch) once and for each
memory file once: memories are kept between jobs, keyed by file and `stream`. A job that cannot
run gives an error object on its own line and the others go on, so one bad line in a long job
file costs only itself.

A job is one JSON object whose keys mirror `nph retrieve`'s options with `_` for `-` (see
JOB_KEYS); model parameters go by their own names (`k`, `beta`, `alpha`, ...). Its result is
exactly the object `nph retrieve --json` prints for that setting.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from nphcli.catalog import param_cards
from nphcli.errors import NphError
from nphcli.evaluation.corruption import Corruption
from nphcli.evaluation.evaluate import evaluate_inputs
from nphcli.evaluation.grid import settings_product
from nphcli.evaluation.inputs import Inputs, read_rows
from nphcli.evaluation.settings import RetrieveSettings
from nphcli.memory import open_memory
from nphcli.memory.bank import MemoryBank

# key → (JSON type(s) accepted, what the error says it takes); model parameters come on top
JOB_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "memory": ((str,), "a file name"),
    "model": ((str,), "a model name"),
    "seed": ((int,), "a whole number"),
    "queries": ((int,), "a whole number"),
    "queries_file": ((str,), "a file name"),
    "targets_file": ((str,), "a file name"),
    "target_indices": ((list,), "a list of whole numbers"),
    "mask": ((int, float), "a number"),
    "mask_mode": ((str,), "a mask mode"),
    "fill": ((int, float), "a number"),
    "noise": ((int, float), "a number"),
    "device": ((str,), "a device name"),
    "dtype": ((str,), "a dtype name"),
    "batch_size": ((int,), "a whole number"),
    "repeat": ((int,), "a whole number"),
    "memory_budget": ((int,), "a whole number of bytes"),
    "stream": ((bool,), "true or false"),
    "per_query": ((bool,), "true or false"),
}
DEFAULT_MEMORY = "memory.safetensors"


class MemoryCache:
    """Memory files read once and kept, keyed by (resolved path, stream). Each entry also
    remembers the file's size and modification time, so a file replaced between jobs is read
    again rather than served stale."""

    def __init__(self) -> None:
        self._banks: dict[tuple[str, bool], tuple[tuple[int, int], MemoryBank]] = {}

    def get(self, path: str, *, stream: bool) -> tuple[MemoryBank, float]:
        """The memory at `path` and the seconds spent reading it now (0 when cached)."""
        resolved = Path(path).resolve()
        try:
            stat = resolved.stat()
            stamp = (stat.st_size, stat.st_mtime_ns)
        except OSError:
            stamp = (-1, -1)  # let the loader say what is wrong with the path
        key = (str(resolved), stream)
        cached = self._banks.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1], 0.0
        t0 = time.perf_counter()
        bank = open_memory(path, stream=stream)
        self._banks[key] = (stamp, bank)
        return bank, time.perf_counter() - t0


def run_job(job: Any, cache: MemoryCache) -> dict[str, Any]:
    """The `nph retrieve --json` object of one job (a dict, see JOB_KEYS); NphError if the job
    cannot run."""
    if not isinstance(job, dict):
        raise NphError(f"a job is a JSON object, got {type(job).__name__}")
    params = {card.name: card for card, _ in param_cards() if card.name not in JOB_KEYS}
    unknown = sorted(set(job) - set(JOB_KEYS) - set(params))
    if unknown:
        raise NphError(
            f"unknown job key(s) {', '.join(map(repr, unknown))}; keys are {', '.join(JOB_KEYS)}"
            " and model parameters by name"
        )
    for key, value in job.items():
        if key in JOB_KEYS:
            _check_type(key, value)
    options = {key: value for key, value in job.items() if key in JOB_KEYS}
    corruption = Corruption(
        mask=float(options.get("mask", 0.0)),
        mask_mode=options.get("mask_mode"),
        fill=float(options.get("fill", 0.0)),
        noise=float(options.get("noise", 0.0)),
    )
    base = RetrieveSettings(
        corruption=corruption,
        queries=options.get("queries"),
        seed=options.get("seed", 0),
        device=options.get("device", "cpu"),
        dtype=options.get("dtype", "float32"),
        batch_size=options.get("batch_size"),
        repeat=options.get("repeat", 1),
        memory_budget=options.get("memory_budget"),
    )
    model_params = {
        name: [float(value) if type(value) is int and params[name].type == "float" else value]
        for name, value in job.items()
        if name in params
    }  # JSON's 5 for a float parameter is 5.0, as `nph retrieve --k 5` gives
    (settings,) = settings_product(
        base, models=[options.get("model", "dense")], params=model_params
    )
    inputs = _inputs(options, cache)
    report = evaluate_inputs(inputs, settings)
    return report.to_json(per_query=options.get("per_query", False))


def run_jobs(lines: Iterable[str], cache: MemoryCache | None = None) -> Iterator[dict[str, Any]]:
    """One result per non-blank line of JSON Lines `lines`, in order: the job's
    `nph retrieve --json` object, or `{"job": N, "error": message}` (N: the line number, from
    1) for a line that is not valid JSON or a job that cannot run."""
    cache = cache or MemoryCache()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            try:
                job = json.loads(line)
            except json.JSONDecodeError as error:
                raise NphError(f"not a JSON object: {error}") from None
            yield run_job(job, cache)
        except NphError as error:
            yield {"job": number, "error": " ".join(str(error).split())}


def _check_type(key: str, value: Any) -> None:
    types, takes = JOB_KEYS[key]
    ok = isinstance(value, types) and (bool in types or not isinstance(value, bool))
    if ok and isinstance(value, float):
        ok = math.isfinite(value)
    if ok and key == "target_indices":
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if not ok:
        raise NphError(f"job key {key!r} takes {takes}, got {value!r}")


def _inputs(options: dict[str, Any], cache: MemoryCache) -> Inputs:
    """The job's memory (from the cache) and own queries and targets (read for each job)."""
    queries_file, targets_file = options.get("queries_file"), options.get("targets_file")
    indices = options.get("target_indices")
    if targets_file is not None and indices is not None:
        raise NphError("give targets either as a file or as indices, not both")
    if (targets_file is not None or indices is not None) and queries_file is None:
        raise NphError("targets go with own queries: add queries_file")
    memory_path = options.get("memory", DEFAULT_MEMORY)
    memory, load_s = cache.get(memory_path, stream=options.get("stream", False))
    queries = targets = None
    if queries_file is not None:  # own queries are read for each job (they are small)
        t0 = time.perf_counter()
        queries = read_rows(queries_file, "queries", memory)
        targets = None if targets_file is None else read_rows(targets_file, "targets", memory)
        load_s += time.perf_counter() - t0
    return Inputs(
        memory=memory,
        queries=queries,
        targets=targets,
        target_indices=None if indices is None else torch.tensor(indices, dtype=torch.int64),
        sources={"memory": memory_path, "queries": queries_file, "targets": targets_file},
        load_s=load_s,
    )
