"""Evaluate retrieval: choose and corrupt queries, retrieve them with a model, measure, time.

The library behind `nph retrieve` (and `nph sweep`, which calls `evaluate` on memories it draws
itself); the memory is any `MemoryBank`, in RAM or streamed. The timings (seconds,
`time.perf_counter`, the device synchronised around each) are described in docs/retrieving.md;
an untimed warm-up retrieval keeps one-off costs out of `retrieve`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nphcli.core.devices import resolve_device, resolve_dtype, synchronize, tf32_matmuls
from nphcli.core.errors import NphError
from nphcli.evaluation import metrics as metric_fns
from nphcli.evaluation.attractors import diagnose
from nphcli.evaluation.corruption import corrupt, image_shape
from nphcli.evaluation.guards import (
    check_default_beta,
    check_finite,
    check_noise_clip,
    check_range,
    memory_scale,
)
from nphcli.evaluation.inputs import Inputs
from nphcli.evaluation.metrics import summarize
from nphcli.evaluation.queries import Selection, select
from nphcli.evaluation.report import METRICS, RetrievalReport, run_config
from nphcli.evaluation.settings import build_model
from nphcli.memory.bank import MemoryBank
from nphcli.memory.given import as_patterns
from nphcli.memory.open import as_memory
from nphcli.models import Retrieval, get_model_info
from nphcli.schema.settings import RetrieveSettings

# Queries in the untimed warm-up call: enough to trigger lazy initialisation, kernel loading
# and allocator growth, without doubling the run time of large evaluations.
WARMUP_QUERIES = 1024


@dataclass
class _Measured:
    """What the device part of a run gives back, on the CPU."""

    retrieved: Tensor  # (Q, d_v)
    per_query: dict[str, Tensor]  # metric → (Q,)
    timing: dict[str, float]  # transfer_s, warmup_s, retrieve times, metrics_s
    batch: int  # queries per model call


def evaluate(
    memory: MemoryBank,
    settings: RetrieveSettings,
    *,
    queries: Tensor | None = None,
    targets: Tensor | None = None,
    target_indices: Tensor | None = None,
    sources: dict[str, str | None] | None = None,
    model: Any = None,
) -> RetrievalReport:
    """Corrupt, retrieve, measure and time one run on `memory` (see the module docstring):
    what `nph retrieve` does for one setting.

    Args:
        memory: a `Memory` (`open_memory`, or built in Python), a `MemoryBank`, or keys (M, d).
        settings: the `RetrieveSettings` of the run (model, parameters, corruption, ...).

    Returns:
        `RetrievalReport`: `config` (everything to repeat the run), `metrics` (mean, std and
        median per query of each metric; None where it does not apply), `timing`, and the
        retrieved patterns, queries and per-query metrics as tensors.

    Example:
        >>> settings = nph.RetrieveSettings(model="topk", params={"k": 10},
        ...                                 corruption=nph.Corruption(noise=0.5))
        >>> nph.evaluate(nph.open_memory("memory.safetensors"), settings).metrics["success"]

    Without `queries`, self-evaluation on the stored patterns. With `queries` (Q, d), optional
    `targets` (Q, d_v) or `target_indices` (Q,) give error metrics. `sources` names the files
    the memory and queries came from, for the report's config; `model` is the setting's, when
    the caller built it already. A streamed memory is read block by block during retrieval and
    metrics; only the query and target rows are read whole.
    """
    start = time.perf_counter()
    memory, queries, targets = _check_given(memory, settings, queries, targets)
    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device)
    model = build_model(settings) if model is None else model
    model.check_memory(memory)
    if settings.index is not None:
        from nphcli.ann.run import check_index_run, indexed_model

        if memory.path is not None:
            check_index_run(settings.index, memory.path, model, device)
        model = indexed_model(model, settings.index, memory)
    budget = settings.budget
    scale = memory_scale(memory, _scan_rows(memory, budget))
    generator = torch.Generator().manual_seed(settings.seed)
    chosen = select(memory, settings.queries, generator, queries, targets, target_indices)

    check_noise_clip(settings.corruption, scale, memory.hetero)
    t0 = time.perf_counter()
    shape = image_shape(memory.item_shape, memory.dim)
    corrupted = corrupt(chosen.clean, settings.corruption, generator=generator, item_shape=shape)
    corrupt_s = time.perf_counter() - t0
    check_range(scale, corrupted.queries, float(getattr(model, "beta", 1.0)), dtype)
    takes_beta = "beta" in {p.name for p in get_model_info(settings.model).params}
    given = settings.params.get("beta") is not None
    check_default_beta(given, takes_beta, scale.mean_norm2, memory.meta.get("recall"))

    # The stored values' range as retrieval sees them, from the scale pass, so the metrics need no
    # second pass over the memory (rounding is monotone: the cast values' extremes are the cast
    # extremes).
    extremes = torch.tensor([scale.value_min, scale.value_max], dtype=torch.float64).to(dtype)
    stored_range = (float(extremes[0]), float(extremes[1]))
    measured = _run_on_device(
        model, memory, chosen, corrupted.queries, settings, device, dtype, stored_range
    )
    check_finite(settings.model, dtype, measured.retrieved, measured.per_query)
    timing = _timing(measured.timing, corrupt_s, start, chosen.rows.shape[0])
    config = run_config(model, settings, memory, chosen, corrupted, sources or {}, device, dtype)
    config["batch_size"] = measured.batch
    if settings.index is not None:
        from nphcli.ann.run import index_report

        config["index"] = index_report(
            model,
            settings.index,
            memory,
            corrupted.queries,
            chosen.rows,
            chosen.targets,
            seed=settings.seed,
        )
    per_query = measured.per_query
    return RetrievalReport(
        config=config,
        metrics={m: summarize(per_query[m]) if m in per_query else None for m in METRICS},
        timing=timing,
        per_query=per_query,
        retrieved=measured.retrieved,
        queries=corrupted.queries,
        targets=None if chosen.targets is None else chosen.targets.cpu(),
    )


def _check_given(memory: Any, settings: Any, queries: Any, targets: Any):
    """The memory as a bank and own queries and targets as tensors (the Python API's one rule,
    `nphcli.memory.open.as_memory`), refused in one line when no run can use them."""
    if not isinstance(settings, RetrieveSettings):
        raise NphError(
            f"settings must be a RetrieveSettings, e.g. nph.RetrieveSettings(model='dense'), got "
            f"{type(settings).__name__}"
        )
    bank = as_memory(memory)
    if bank.num_memories == 0 or bank.dim == 0:
        raise NphError(
            f"the memory holds {bank.num_memories} patterns of dimension {bank.dim}; it needs "
            "M ≥ 1 patterns of d ≥ 1 entries"
        )
    if bank.dtype.is_complex or bank.dtype == torch.bool:
        raise NphError(f"the memory's patterns are {bank.dtype}; give real numbers")
    queries = None if queries is None else as_patterns(queries, "queries")
    targets = None if targets is None else as_patterns(targets, "targets")
    return bank, queries, targets


def evaluate_inputs(
    inputs: Inputs, settings: RetrieveSettings, model: Any = None
) -> RetrievalReport:
    """`evaluate` on inputs read by `read_inputs`; their load time joins the report's timing."""
    report = evaluate(
        inputs.memory,
        settings,
        queries=inputs.queries,
        targets=inputs.targets,
        target_indices=inputs.target_indices,
        sources=inputs.sources,
        model=model,
    )
    report.timing["load_s"] = inputs.load_s
    report.timing["total_s"] += inputs.load_s
    return report


def _run_on_device(
    model,
    memory: MemoryBank,
    chosen: Selection,
    queries: Tensor,
    settings: RetrieveSettings,
    device: torch.device,
    dtype: torch.dtype,
    stored_range: tuple[float, float],
) -> _Measured:
    """Move the memory and queries to the device, retrieve (timed), measure, and bring the
    results back to the CPU."""
    t0 = time.perf_counter()
    bank = memory.to(device=device, dtype=dtype)  # a streamed bank moves blocks as it reads
    queries_d = queries.to(device=device, dtype=dtype)  # (Q, d)
    targets = chosen.targets
    targets_d = None if targets is None else targets.to(device=device)  # (Q, d_v)
    synchronize(device)
    transfer_s = time.perf_counter() - t0

    batch = settings.batch_size or chosen.rows.shape[0]
    positions = chosen.rows.to(device)  # (Q,)
    with tf32_matmuls(settings.tf32):
        result, warmup_s, times = _timed_retrieve(
            model, queries_d, bank, positions, batch, settings
        )

    t0 = time.perf_counter()
    indices = chosen.target_indices
    budget = settings.budget
    blocks = _metric_blocks(bank, budget)
    per_query_d = metric_fns.per_query(
        result.patterns,
        bank,  # its values: the memories in the output space, as retrieval saw them
        targets=targets_d,
        target_indices=None if indices is None else indices.to(device),
        steps=result.steps,
        support=result.support,
        **blocks,
        stored_range=stored_range,
        pixels=bool(bank.item_shape) and not bank.hetero,  # outputs are the stored images
    )
    # The attractors' weights: float64 scores, their softmax, its sort and sums (32 B a score).
    weighed = {"block_rows": blocks["block_rows"], "block_elements": max(1, budget // 2 // 32)}
    nearest = per_query_d["nearest"]
    per_query_d.update(diagnose(model, result.patterns, bank, nearest, positions, **weighed))
    synchronize(device)
    metrics_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    retrieved = result.patterns.cpu()
    per_query = {"query_row": chosen.rows.clone(), **{k: v.cpu() for k, v in per_query_d.items()}}
    transfer_s += time.perf_counter() - t0
    timing = {"transfer_s": transfer_s, "warmup_s": warmup_s, "metrics_s": metrics_s}
    return _Measured(retrieved, per_query, {**timing, "times": times}, batch)


def _timed_retrieve(
    model,
    queries: Tensor,
    bank: MemoryBank,
    positions: Tensor,
    batch: int,
    settings: RetrieveSettings,
) -> tuple[Retrieval, float, list[float]]:
    """Warm up on the first batch (≤ WARMUP_QUERIES queries), then time `settings.repeat` full
    retrievals in batches of `batch`: the last retrieval, the warm-up and each repeat's seconds."""
    device = queries.device
    t0 = time.perf_counter()
    first = min(batch, WARMUP_QUERIES)
    budget = settings.memory_budget
    model.retrieve(queries[:first], bank, positions=positions[:first], memory_budget=budget)
    synchronize(device)
    warmup_s = time.perf_counter() - t0
    times = []
    for _ in range(settings.repeat):
        synchronize(device)
        t0 = time.perf_counter()
        parts = [
            model.retrieve(
                queries[i : i + batch],
                bank,
                positions=positions[i : i + batch],
                memory_budget=budget,
            )
            for i in range(0, queries.shape[0], batch)
        ]
        synchronize(device)
        times.append(time.perf_counter() - t0)
    supports = [part.support for part in parts]
    result = Retrieval(
        patterns=torch.cat([part.patterns for part in parts]),  # (Q, d_v)
        steps=torch.cat([part.steps for part in parts]),  # (Q,)
        support=None if any(s is None for s in supports) else torch.cat(supports),  # (Q,)
    )
    return result, warmup_s, times


def _scan_rows(bank: MemoryBank, budget: int) -> int:
    """Rows per block of the pass over the memories before retrieval (`memory_scale`) within
    half the budget: two blocks of keys and values as read (the next is read while the last is
    referenced) and a copy of the keys (float64 at most) with its square; at most 8,192 rows."""
    row_bytes = 2 * (bank.dim + bank.value_dim) * bank.dtype.itemsize + 2 * 8 * bank.dim
    return max(1, min(1 << 13, budget // 2 // row_bytes))


def _metric_blocks(bank: MemoryBank, budget: int) -> dict[str, int]:
    """Block sizes of the nearest-pattern search (`metrics.nearest`) within the run's memory
    budget, as retrieval keeps to it: half for stored rows, half for scores. Each stored row
    of a block costs a metric-dtype copy of its values and their square; a memory not resident
    also costs two rows as read (the next block is read while the last is referenced), keys
    included where they differ from the values. A score costs two metric-dtype values and a tie
    mask byte."""
    metric_size = metric_fns.metric_dtype(bank.dtype).itemsize
    elements = max(1, min(metric_fns.BLOCK_ELEMENTS, budget // 2 // (2 * metric_size + 1)))
    row_bytes = 2 * bank.value_dim * metric_size
    if bank.resident() is None:
        read = (bank.dim if bank.hetero else 0) + bank.value_dim
        row_bytes += 2 * read * bank.dtype.itemsize
    rows = max(1, min(metric_fns.BLOCK_ELEMENTS // bank.value_dim, budget // 2 // row_bytes))
    return {"block_rows": rows, "block_elements": elements}


def _timing(device_timing: dict[str, Any], corrupt_s: float, start: float, num_queries: int):
    """The report's timing (see the module docstring), load time still 0."""
    times = device_timing["times"]
    median = metric_fns.summarize(torch.tensor(times, dtype=torch.float64))["median"]
    return {
        "load_s": 0.0,
        "corrupt_s": corrupt_s,
        "transfer_s": device_timing["transfer_s"],
        "warmup_s": device_timing["warmup_s"],
        "retrieve_min_s": min(times),
        "retrieve_median_s": median,
        "metrics_s": device_timing["metrics_s"],
        "total_s": time.perf_counter() - start,
        "queries_per_s": num_queries / median if median > 0 else math.inf,
        "us_per_query": median / num_queries * 1e6,
    }
