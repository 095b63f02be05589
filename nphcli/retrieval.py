"""Evaluate retrieval: choose and corrupt queries, retrieve them with a model, measure, time.

This is the library behind `nph retrieve` (and `nph sweep`, which calls `evaluate` on memory
subsets it draws itself). Two kinds of query:
- self-evaluation (default): all stored patterns, or `queries` of them drawn with the seed, are
  corrupted and retrieved; the target is the uncorrupted pattern (its value row for a
  hetero-associative memory) and its stored index is known;
- own queries: rows given by the caller, optionally with target vectors or target indices.

Positions: in self-evaluation each query is passed the index of its own stored pattern as its
position; own queries get their row number. Only position-aware models (window) use it, and for
`window` it means the window is centred on the query's own stored pattern, which therefore is
always among the memories it can retrieve.

Timing (seconds, `time.perf_counter`): `load` reads the files; `corrupt` builds the queries;
`transfer` copies memories and queries to the device (with the dtype cast) and the results back;
`warmup` is one retrieval of the first batch (at most WARMUP_QUERIES queries), run before timing
so that one-off costs (lazy initialisation, kernel loading, allocation) stay out of `retrieve`;
`retrieve` is the model alone over all batches, with the device synchronised before and after,
measured `repeat` times (min and median reported; throughput uses the median); `metrics`
computes the metrics; `total` is the wall time of everything, repeats included.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from nphcli import __version__
from nphcli import metrics as metric_fns
from nphcli.atomic import atomic_write, check_not_input, check_writable
from nphcli.corruption import Corruption, corrupt, image_shape
from nphcli.devices import dtype_name, resolve_device, resolve_dtype, synchronize
from nphcli.errors import NphError, NphRuntimeError
from nphcli.memory_file import FORMAT_NAME, Memory, check_format_version, load_memory
from nphcli.models import Retrieval, create_model, get_model_info, list_models
from nphcli.models.base import DEFAULT_MEMORY_BUDGET
from nphcli.models.blocks import MemoryBank, TensorBank
from nphcli.normalize import normalize
from nphcli.notices import notice
from nphcli.streaming import StreamedBank

# Queries in the untimed warm-up call: enough to trigger lazy initialisation, kernel loading
# and allocator growth, without doubling the run time of large evaluations.
WARMUP_QUERIES = 1024
# β when none is given, for every model that takes one (the models' own default is 1.0).
# Measured on the bundled MNIST digits stored in [0, 1] (mean ‖ξ‖² ≈ 88): β = 0.3 gives the
# lowest or near-lowest SSE for dense, topk, sparse and entmax clean, at --mask 0.5 and at
# --noise 0.5 (README, "Retrieving"). Scores are β⟨x, ξ⟩, so the right β scales as 1/‖ξ‖².
DEFAULT_BETA = 0.3
DEFAULT_BETA_NORM2 = 88.0  # the mean ‖ξ‖² DEFAULT_BETA was measured at
METRICS = (
    "success",
    "sse",
    "mse",
    "cosine",
    "nearest_distance",
    "support",
    "steps",
    "pixel_success",
)
STATS = ("mean", "std", "median")
TIMINGS = (
    "load_s",
    "corrupt_s",
    "transfer_s",
    "warmup_s",
    "retrieve_min_s",
    "retrieve_median_s",
    "metrics_s",
    "total_s",
    "queries_per_s",
    "us_per_query",
)
PER_QUERY = (
    "query_row",
    "target_index",
    "nearest",
    "nearest_distance",
    "success",
    "sse",
    "mse",
    "cosine",
    "support",
    "steps",
    "pixel_success",
)


@dataclass
class RetrieveSettings:
    """Everything that decides a retrieval run, apart from the memory and own queries."""

    model: str = "dense"  # a registered model name (`nph models`)
    params: dict[str, Any] = field(default_factory=dict)  # model parameters; None = its default
    corruption: Corruption = field(default_factory=Corruption)  # applied to every query
    queries: int | None = None  # how many queries to draw with the seed; None: all of them
    seed: int = 0  # query choice, corruption, and the model's `seed` if it takes one
    device: str = "cpu"  # cpu, cuda, cuda:N, mps or auto
    dtype: str = "float32"  # dtype of memories and queries during retrieval
    batch_size: int | None = None  # queries per model call; None: all (the model bounds memory)
    repeat: int = 1  # how many times the timed retrieval runs (min and median are reported)
    memory_budget: int | None = None  # bytes of model working memory; None: the engine default

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise NphError(f"--seed must be a whole number ≥ 0, got {self.seed!r}")
        budget = self.memory_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)):
            raise NphError(f"--memory-budget must be a whole number of bytes, got {budget!r}")
        if budget is not None and budget < 1:
            raise NphError(f"--memory-budget must be positive, got {budget!r}")
        for flag, value in (
            ("--queries", self.queries),
            ("--batch-size", self.batch_size),
            ("--repeat", self.repeat),
        ):
            if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
                raise NphError(f"{flag} must be a whole number ≥ 1, got {value!r}")


@dataclass
class RetrievalReport:
    """What one run measured. Tensors are on the CPU; per-query tensors have shape (Q,)."""

    config: dict[str, Any]  # model, params, seed, device, dtype, memory, queries, corruption
    metrics: dict[str, dict[str, float] | None]  # metric → {mean, std, median}, None if n/a
    timing: dict[str, float]  # see TIMINGS and the module docstring
    per_query: dict[str, Tensor]  # see PER_QUERY; only the metrics that apply
    retrieved: Tensor  # (Q, d_v) T(x), in the retrieval dtype
    queries: Tensor  # (Q, d) the corrupted queries, float32 (float64 for float64 memories)
    targets: Tensor | None  # (Q, d_v) uncorrupted targets, when known

    def to_json(self, *, per_query: bool = False) -> dict[str, Any]:
        """The JSON object `nph retrieve --json` prints."""
        out: dict[str, Any] = {
            "config": self.config,
            "metrics": self.metrics,
            "timing": self.timing,
        }
        if per_query:
            out["per_query"] = {key: value.tolist() for key, value in self.per_query.items()}
        return out

    def to_row(self) -> dict[str, Any]:
        """One flat CSV row. The columns are the same for every model (parameters a model does
        not take are empty), so rows of different runs can be appended to one file."""
        config = self.config
        row: dict[str, Any] = {"model": config["model"]}
        for name in param_columns():
            row[name] = config["params"].get(name, "")
        row.update(
            {
                "run_seed": config["seed"],
                "device": config["device"],
                "dtype": config["dtype"],
                "memory": config["memory"]["file"] or "",
                "M": config["memory"]["M"],
                "d": config["memory"]["d"],
                "Q": config["queries"]["Q"],
                "queries": config["queries"]["source"],
                **config["corruption"],  # mask, mask_mode, fill, noise
                "noise_clip": config["corruption"].get("noise_clip", False),
                "batch_size": config["batch_size"],
                "repeat": config["repeat"],
            }
        )
        for metric in METRICS:
            stats = self.metrics.get(metric) or {}
            for stat in STATS:
                row[f"{metric}_{stat}"] = _csv_value(stats.get(stat))
        for key in TIMINGS:
            row[key] = _csv_value(self.timing.get(key))
        return row

    def per_query_rows(self) -> list[dict[str, Any]]:
        """One flat row per query (for `--per-query --csv`); empty cells where n/a."""
        lists = {key: self.per_query[key].tolist() for key in PER_QUERY if key in self.per_query}
        count = len(lists["query_row"])
        return [
            {"query": i, **{key: (lists[key][i] if key in lists else "") for key in PER_QUERY}}
            for i in range(count)
        ]


def param_columns() -> list[str]:
    """Every parameter name any registered model takes, in registry order (the CSV columns)."""
    names: list[str] = []
    for info in list_models():
        for p in info.params:
            if p.name not in names:
                names.append(p.name)
    return names


def build_model(settings: RetrieveSettings):
    """The model of `settings`, with β = DEFAULT_BETA unless given, and the run's seed passed to
    models that take a `seed`."""
    params = dict(settings.params)
    takes = {p.name for p in get_model_info(settings.model).params}
    if "beta" in takes and params.get("beta") is None:
        params["beta"] = DEFAULT_BETA
    if "seed" in takes and params.get("seed") is None:
        params["seed"] = settings.seed
    return create_model(settings.model, **params)


def parse_size(text: str, flag: str = "--memory-budget") -> int:
    """Bytes from a size such as 1048576, 64K, 256M, 1.5G or 512MiB (K, KB and KiB alike are
    powers of 1024, any letter case); NphError naming `flag` unless it is ≥ 1 byte."""
    match = re.fullmatch(
        r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmg])(?:i?b)?|b)?\s*", text, re.IGNORECASE
    )
    if match is None:
        raise NphError(
            f"{flag} must be a size in bytes such as 1048576, 64K, 256M or 2GiB, got {text!r}"
        )
    number, unit = match.groups()
    scale = 1024 ** (" kmg".index(unit.lower()) if unit else 0)
    size = float(number) * scale
    if size < 1 or size != int(size):
        raise NphError(f"{flag} must be a whole number of bytes ≥ 1, got {text!r}")
    return int(size)


@dataclass
class _Scale:
    """Magnitudes of a memory's entries, from one pass over its blocks (in float64)."""

    key_abs: float  # max |K_μi|
    key_norm: float  # max ‖K_μ‖₂
    mean_norm2: float  # mean ‖K_μ‖₂²
    value_abs: float  # max |V_μi| (the keys' for auto-association)


def _memory_scale(bank: MemoryBank, hetero: bool, rows: int = 1 << 13) -> _Scale:
    key_abs = key_norm = value_abs = total = 0.0
    for _, keys, values in bank.blocks(rows):
        key_abs = max(key_abs, float(keys.abs().max()))
        norm2 = keys.to(metric_fns.metric_dtype(keys)).square().sum(dim=1)  # (b,)
        if not bool(torch.isfinite(norm2).all()):  # beyond float32: exact in float64
            norm2 = keys.to(torch.float64).square().sum(dim=1)
        key_norm = max(key_norm, math.sqrt(float(norm2.max())))
        total += float(norm2.to(torch.float64).sum())
        if hetero:
            value_abs = max(value_abs, float(values.abs().max()))
    return _Scale(key_abs, key_norm, total / bank.num_memories, value_abs if hetero else key_abs)


def _check_default_beta(settings: RetrieveSettings, norm2: float) -> None:
    """A notice when the default β meets patterns of a very different scale than it was
    chosen for (e.g. unit-norm or z-scored memories), with the β that would match. `norm2`:
    the patterns' mean ‖ξ‖²."""
    if settings.params.get("beta") is not None:
        return
    if "beta" not in {p.name for p in get_model_info(settings.model).params}:
        return
    if norm2 > 0 and not 0.1 <= norm2 / DEFAULT_BETA_NORM2 <= 10:
        suggested = DEFAULT_BETA * DEFAULT_BETA_NORM2 / norm2
        notice(
            f"the default β = {DEFAULT_BETA} suits patterns with mean ‖ξ‖² ≈ "
            f"{DEFAULT_BETA_NORM2:g} (MNIST in [0, 1]); these have {norm2:.3g}, so consider "
            f"--beta {suggested:.2g}"
        )


def _check_range(scale: _Scale, queries: Tensor, beta: float, dtype: torch.dtype) -> None:
    """Refuse, before any model runs, numbers the retrieval cannot represent.

    Memories and queries must be finite once cast to `dtype`. The scores β⟨x, ξ⟩, and the inner
    products ⟨x, ξ⟩ they are made from, are bounded by max(1, β)·max‖x‖·max‖ξ‖ (Cauchy–Schwarz)
    and must fit the dtype models accumulate in: float32 for half precision, else `dtype`.
    """
    name, most = dtype_name(dtype), torch.finfo(dtype).max
    rows = queries.to(torch.float64)  # (Q, d)
    for what, largest in (
        ("the memory's patterns", scale.key_abs),
        ("the memory's values", scale.value_abs),
        ("the queries", float(rows.abs().max())),
    ):
        if torch.isinf(torch.tensor(largest, dtype=torch.float64).to(dtype)):
            raise NphError(
                f"{what} reach {largest:.4g}, beyond the largest {name} ({most:.4g}); use "
                "--dtype float32 or bfloat16, or store the patterns rescaled "
                "(nph store --normalize)"
            )
    accumulate = dtype if dtype == torch.float64 else torch.float32
    bound = max(1.0, beta) * float(rows.square().sum(dim=1).max().sqrt()) * scale.key_norm
    if not bound <= torch.finfo(accumulate).max:
        raise NphError(
            f"scores β⟨x, ξ⟩ of these patterns may reach {bound:.3g} and overflow "
            f"{dtype_name(accumulate)} (largest {torch.finfo(accumulate).max:.3g}); store the "
            "patterns rescaled (nph store --normalize l2 or zscore) or use --dtype float64"
        )


def _check_finite(model: str, dtype: torch.dtype, result: Tensor, per_query: dict) -> None:
    """What the inputs allowed but a model or a metric still could not represent is an error,
    never a NaN or a null in the report."""
    bad = ~torch.isfinite(result).all(dim=1)  # (Q,)
    if bool(bad.any()):
        raise NphRuntimeError(
            f"model {model!r} produced non-finite values (NaN or infinity) for "
            f"{int(bad.sum())} of {bad.shape[0]} queries at --dtype {dtype_name(dtype)}; try "
            "--dtype float64, a smaller --beta, or patterns stored rescaled (nph store --normalize)"
        )
    for metric, values in per_query.items():
        if values.is_floating_point() and not bool(torch.isfinite(values).all()):
            raise NphRuntimeError(
                f"the {metric} metric overflows {dtype_name(values.dtype)} for patterns of this "
                "magnitude; store them rescaled (nph store --normalize) or use --dtype float64"
            )


def evaluate(
    memory: Memory | StreamedBank,
    settings: RetrieveSettings,
    *,
    queries: Tensor | None = None,
    targets: Tensor | None = None,
    target_indices: Tensor | None = None,
    sources: dict[str, str | None] | None = None,
) -> RetrievalReport:
    """Corrupt, retrieve, measure and time one run on `memory` (see the module docstring).

    `memory` is loaded (a `Memory`) or streamed from its file (a `StreamedBank`, as
    `load_inputs(..., stream=True)` opens it): then memories are read block by block during
    retrieval and metrics, and only the query and target rows are read whole; results are the
    same up to float rounding. Without `queries`, self-evaluation on the stored patterns. With
    `queries` (Q, d), optional `targets` (Q, d_v) or `target_indices` (Q,) give error metrics.
    `sources` names the files the memory and queries came from, for the report's config.
    """
    start = time.perf_counter()
    sources = sources or {}
    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device)
    model = build_model(settings)
    streamed = isinstance(memory, StreamedBank)
    if streamed:
        bank: MemoryBank = memory  # read in the file's dtype on the CPU until the transfer
        item_shape = _streamed_item_shape(memory)
        hetero = memory.value_name is not None
    else:
        bank = TensorBank(memory.patterns, memory.values)  # keys (M, d), values (M, d_v)
        item_shape = memory.item_shape
        hetero = memory.values is not None
    num_memories, dim = bank.num_memories, bank.dim
    model.check_memory(num_memories, dim)
    scale = _memory_scale(bank, hetero)
    shape = image_shape(item_shape, dim)
    generator = torch.Generator().manual_seed(settings.seed)

    chosen = _select(settings, generator, bank, queries, targets, target_indices)
    targets, target_indices, rows = chosen.targets, chosen.target_indices, chosen.rows
    num_queries = rows.shape[0]

    t0 = time.perf_counter()
    corrupted = corrupt(chosen.clean, settings.corruption, generator=generator, item_shape=shape)
    corrupt_s = time.perf_counter() - t0
    _check_range(scale, corrupted.queries, float(getattr(model, "beta", 1.0)), dtype)
    _check_default_beta(settings, scale.mean_norm2)

    t0 = time.perf_counter()
    if streamed:  # blocks are moved and cast as they are read
        bank_d = memory.to(dtype, device=device)
    else:
        keys_d = bank.keys.to(device=device, dtype=dtype)  # (M, d)
        values_d = None if not hetero else bank.values.to(device=device, dtype=dtype)  # (M, d_v)
        bank_d = TensorBank(keys_d, values_d)
    queries_d = corrupted.queries.to(device=device, dtype=dtype)  # (Q, d)
    targets_d = None if targets is None else targets.to(device=device)  # (Q, d_v)
    synchronize(device)
    transfer_s = time.perf_counter() - t0

    batch = settings.batch_size or num_queries
    positions_d = rows.to(device)  # (Q,)
    result, warmup_s, times = _timed_retrieve(
        model, queries_d, bank_d, positions_d, batch, settings.repeat, device, settings
    )

    t0 = time.perf_counter()
    per_query_d = metric_fns.per_query(
        result.patterns,
        bank_d,  # its values: the memories in the output space, as retrieval saw them
        targets=targets_d,
        target_indices=None if target_indices is None else target_indices.to(device),
        steps=result.steps,
        support=result.support,
        block_rows=_metric_block_rows(bank_d) if streamed else None,
    )
    synchronize(device)
    metrics_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    retrieved = result.patterns.cpu()
    per_query = {"query_row": rows.clone(), **{k: v.cpu() for k, v in per_query_d.items()}}
    transfer_s += time.perf_counter() - t0
    _check_finite(settings.model, dtype, retrieved, per_query)

    median = metric_fns.summarize(torch.tensor(times, dtype=torch.float64))["median"]
    timing = {
        "load_s": 0.0,
        "corrupt_s": corrupt_s,
        "transfer_s": transfer_s,
        "warmup_s": warmup_s,
        "retrieve_min_s": min(times),
        "retrieve_median_s": median,
        "metrics_s": metrics_s,
        "total_s": time.perf_counter() - start,
        "queries_per_s": num_queries / median if median > 0 else math.inf,
        "us_per_query": median / num_queries * 1e6,
    }
    config = {
        "model": settings.model,
        "params": {p.name: getattr(model, p.name) for p in get_model_info(settings.model).params},
        "seed": settings.seed,
        "device": str(device),
        "dtype": dtype_name(dtype),
        "memory": {
            "file": sources.get("memory"),
            "M": num_memories,
            "d": dim,
            "d_v": bank.value_dim,
            "hetero": hetero,
            "item_shape": list(item_shape) if item_shape else None,
            "stream": streamed,
        },
        "queries": {
            "source": chosen.query_source,
            "file": sources.get("queries"),
            "Q": num_queries,
            "targets": chosen.target_source,
            "targets_file": sources.get("targets"),
        },
        "corruption": _corruption_config(settings.corruption, corrupted.mask_mode),
        "batch_size": batch,
        "repeat": settings.repeat,
        "memory_budget": settings.memory_budget or DEFAULT_MEMORY_BUDGET,
        "nph_version": __version__,
    }
    return RetrievalReport(
        config=config,
        metrics={
            name: metric_fns.summarize(per_query[name]) if name in per_query else None
            for name in METRICS
        },
        timing=timing,
        per_query=per_query,
        retrieved=retrieved,
        queries=corrupted.queries,
        targets=None if targets is None else targets.cpu(),
    )


def _corruption_config(corruption: Corruption, mask_mode: str) -> dict[str, Any]:
    """The report's corruption record; `noise_clip` appears only when set, so runs without it
    report exactly what they did before the option existed."""
    out = {**dataclasses.asdict(corruption), "mask_mode": mask_mode}
    if not out["noise_clip"]:
        del out["noise_clip"]
    return out


def _streamed_item_shape(bank: StreamedBank) -> tuple[int, ...] | None:
    """The item shape an nph memory file records (a foreign file has none)."""
    if bank.meta.get("format") != FORMAT_NAME:
        return None
    shape = bank.meta.get("item_shape")
    return tuple(shape) if shape else None


def _metric_block_rows(bank: MemoryBank) -> int:
    """Stored rows per block of the nearest-pattern search over a streamed bank: at most
    `metrics.BLOCK_ELEMENTS` entries of keys and of values each."""
    return max(1, metric_fns.BLOCK_ELEMENTS // max(bank.dim, bank.value_dim))


@dataclass
class _Selection:
    clean: Tensor  # (Q, d) uncorrupted queries
    targets: Tensor | None  # (Q, d_v)
    target_indices: Tensor | None  # (Q,) stored rows of the targets
    rows: Tensor  # (Q,) rows the queries came from (stored or own); also their positions
    query_source: str  # "stored" or "file"
    target_source: str | None  # "stored", "file", "indices" or None


def _select(
    settings: RetrieveSettings,
    generator: torch.Generator,
    bank: MemoryBank,
    queries: Tensor | None,
    targets: Tensor | None,
    target_indices: Tensor | None,
) -> _Selection:
    """The queries of a run, their targets and positions (see the module docstring). Only the
    rows needed are read from `bank`."""
    num_memories, dim = bank.num_memories, bank.dim
    if queries is None:
        if targets is not None or target_indices is not None:
            raise NphError("targets go with own queries: add --queries-file")
        rows = _choose_rows(num_memories, settings.queries, generator, "stored patterns")
        clean, stored_targets = bank.gather(rows)  # (Q, d), (Q, d_v)
        return _Selection(
            clean=clean,
            targets=stored_targets,
            target_indices=rows,
            rows=rows,
            query_source="stored",
            target_source="stored",
        )
    queries, targets, target_indices = _check_own(
        queries, targets, target_indices, num_memories, dim, bank.value_dim
    )
    rows = _choose_rows(queries.shape[0], settings.queries, generator, "query rows")
    if target_indices is not None:
        target_indices = target_indices[rows]
        _, targets = bank.gather(target_indices)
    elif targets is not None:
        targets = targets[rows]
    source = "indices" if target_indices is not None else "file" if targets is not None else None
    return _Selection(queries[rows], targets, target_indices, rows, "file", source)


def _timed_retrieve(
    model,
    queries: Tensor,
    bank: MemoryBank,
    positions: Tensor,
    batch: int,
    repeat: int,
    device: torch.device,
    settings: RetrieveSettings,
):
    """Warm up on the first batch (≤ WARMUP_QUERIES queries), then time `repeat` full
    retrievals in batches of `batch`, each within `settings.memory_budget`.

    Returns the last retrieval (batches concatenated), the warm-up seconds and each repeat's
    seconds; the device is synchronised before and after every timed span.
    """
    t0 = time.perf_counter()
    first = min(batch, WARMUP_QUERIES)
    budget = settings.memory_budget
    model.retrieve(queries[:first], bank, positions=positions[:first], memory_budget=budget)
    synchronize(device)
    warmup_s = time.perf_counter() - t0
    times = []
    for _ in range(repeat):
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


@dataclass
class Inputs:
    """A run's inputs as read from files, and how long reading took."""

    memory: Memory  # with --stream: its patterns and values read rows from `bank` on demand
    queries: Tensor | None = None  # (Q, d) own queries
    targets: Tensor | None = None  # (Q, d_v)
    target_indices: Tensor | None = None  # (Q,) int64
    sources: dict[str, str | None] = field(default_factory=dict)  # file names, for the config
    load_s: float = 0.0
    bank: StreamedBank | None = None  # the memory file, streamed (`load_inputs(stream=True)`)


def load_inputs(
    memory_path: str | os.PathLike,
    *,
    queries_file: str | os.PathLike | None = None,
    targets_file: str | os.PathLike | None = None,
    target_indices: list[int] | None = None,
    stream: bool = False,
) -> Inputs:
    """Read the memory file and optional own queries and targets, timing it.

    With `stream`, the memory file is opened, not read: `Inputs.bank` streams it, and
    `Inputs.memory` reads only the rows it is indexed with (for images of a few of them).
    """
    if targets_file is not None and target_indices is not None:
        raise NphError("give targets either as a file or as indices, not both")
    if (targets_file is not None or target_indices is not None) and queries_file is None:
        raise NphError("targets go with own queries: add --queries-file")
    t0 = time.perf_counter()
    bank = open_stream(memory_path) if stream else None
    memory = load_memory(memory_path) if bank is None else _streamed_memory(bank)
    queries = None if queries_file is None else read_rows(queries_file, "queries", memory)
    targets = None if targets_file is None else read_rows(targets_file, "targets", memory)
    load_s = time.perf_counter() - t0
    return Inputs(
        memory=memory,
        queries=queries,
        targets=targets,
        target_indices=None
        if target_indices is None
        else torch.tensor(target_indices, dtype=torch.int64),
        sources={
            "memory": str(memory_path),
            "queries": None if queries_file is None else str(queries_file),
            "targets": None if targets_file is None else str(targets_file),
        },
        load_s=load_s,
        bank=bank,
    )


def open_stream(path: str | os.PathLike) -> StreamedBank:
    """A memory file opened for streaming (its header read, no rows), checked like
    `load_memory` checks it; rows are checked for NaN and infinity as they are read."""
    path = Path(path)
    bank = StreamedBank(path)
    if bank.meta.get("format") == FORMAT_NAME:  # a foreign file: StreamedBank gave its notice
        check_format_version(path, bank.meta)
    return bank


class _BankRows:
    """The keys or values of a bank as an (M, dim) table whose rows are read when indexed."""

    def __init__(self, bank: MemoryBank, part: int):
        self.bank, self.part = bank, part  # part: 0 keys, 1 values
        self.shape = (bank.num_memories, (bank.dim, bank.value_dim)[part])

    def __getitem__(self, index: Tensor | slice | int) -> Tensor:
        if isinstance(index, slice):
            rows = torch.arange(*index.indices(self.shape[0]))
        else:
            rows = torch.as_tensor(index, dtype=torch.int64)
            rows = torch.where(rows < 0, rows + self.shape[0], rows)
        return self.bank.gather(rows.cpu())[self.part]


def _streamed_memory(bank: StreamedBank) -> Memory:
    """A `Memory` over a streamed file for what needs only its metadata and a few rows (own
    queries' normalisation, --save-grid): indexing its patterns or values reads those rows."""
    foreign = bank.meta.get("format") != FORMAT_NAME
    return Memory(
        patterns=_BankRows(bank, 0),  # type: ignore[arg-type]
        labels=None if foreign else bank.labels(),
        values=_BankRows(bank, 1) if bank.value_name is not None else None,  # type: ignore[arg-type]
        meta={"source": f"file:{bank.path.name}"} if foreign else bank.meta,
        path=bank.path,
    )


def evaluate_inputs(inputs: Inputs, settings: RetrieveSettings) -> RetrievalReport:
    """`evaluate` on inputs read by `load_inputs`; their load time joins the report's timing."""
    report = evaluate(
        inputs.memory if inputs.bank is None else inputs.bank,
        settings,
        queries=inputs.queries,
        targets=inputs.targets,
        target_indices=inputs.target_indices,
        sources=inputs.sources,
    )
    report.timing["load_s"] = inputs.load_s
    report.timing["total_s"] += inputs.load_s
    return report


def save_results(path: str | os.PathLike, report: RetrievalReport, *, force: bool = False) -> Path:
    """Write `retrieved` (Q, d_v), `nearest` (Q,), `queries` (Q, d), `query_row` (Q,) and, when
    known, `target_index` (Q,) to a safetensors file, atomically; the config goes in the
    file's metadata as JSON under "config"."""

    tensors = {
        "retrieved": report.retrieved,
        "nearest": report.per_query["nearest"],
        "queries": report.queries,
        "query_row": report.per_query["query_row"],
    }
    if "target_index" in report.per_query:
        tensors["target_index"] = report.per_query["target_index"]
    tensors = {key: value.contiguous() for key, value in tensors.items()}
    meta = {"format": "nph-retrieval", "config": json.dumps(report.config)}
    with atomic_write(path, force=force) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
    return Path(path)


def check_output_path(
    path: str | os.PathLike, *, force: bool, protect: list[str | os.PathLike]
) -> Path:
    """Refuse before any work: an output that exists without `force`, or is one of `protect`."""
    check_not_input(path, protect)
    return check_writable(path, force=force)


def read_rows(path: str | os.PathLike, what: str, memory: Memory) -> Tensor:
    """Own queries or targets (rows, dim) from any file `nph store` reads: .npy, .npz,
    .safetensors, .pt, .csv or a folder of PNG/JPEG images (`nphcli.sources`).

    Rows must be in the memory's stored space. Pixel data (uint8 arrays, image files) holds
    raw intensities 0..255, so it is normalised the way the memory's patterns were (its
    `normalize` record); numbers are taken as they are.
    """
    from nphcli.sources import IMAGE, load_source

    path = Path(path)
    if not path.exists():
        raise NphError(f"{what} file {path} not found")
    loaded = load_source(str(path.resolve()))  # absolute: never mistaken for a dataset name
    if loaded.meta.get("kind") != IMAGE:
        return loaded.patterns
    record = memory.meta.get("normalize")
    if not record:
        notice(
            f"{path} holds pixel values 0..255 and the memory records no normalisation: "
            "using them as they are"
        )
        return loaded.patterns
    if record.get("method") == "zscore":
        return (loaded.patterns - record["mean"]) / record["std"]
    lo_hi = (record.get("lo", 0.0), record.get("hi", 255.0))
    rows, _ = normalize(loaded.patterns, record.get("method", "none"), pixel_range=lo_hi)
    return rows


def _choose_rows(
    available: int, wanted: int | None, generator: torch.Generator, what: str
) -> Tensor:
    """All row indices in order, or `wanted` of them drawn without replacement (sorted)."""
    if wanted is None or wanted == available:
        return torch.arange(available)
    if wanted > available:
        raise NphError(f"--queries {wanted} exceeds the {available} {what}")
    return torch.randperm(available, generator=generator)[:wanted].sort().values


def _check_own(
    queries: Tensor,
    targets: Tensor | None,
    target_indices: Tensor | None,
    num_memories: int,
    dim: int,
    value_dim: int,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    if queries.ndim != 2 or queries.shape[1] != dim:
        raise NphError(
            f"queries have shape {tuple(queries.shape)}, but the memory's patterns have "
            f"dimension d = {dim}: give (Q, {dim}) queries"
        )
    if not queries.is_floating_point() or not torch.isfinite(queries).all():
        raise NphError("queries must be finite floating-point numbers")
    num_queries = queries.shape[0]
    if targets is not None:
        if targets.ndim != 2 or targets.shape[1] != value_dim:
            raise NphError(
                f"targets have shape {tuple(targets.shape)}, but retrieved patterns have "
                f"dimension {value_dim}"
            )
        if targets.shape[0] != num_queries:
            raise NphError(f"{targets.shape[0]} targets for {num_queries} queries; give one each")
        if not torch.isfinite(targets).all():
            raise NphError("targets must be finite numbers")
    if target_indices is not None:
        target_indices = torch.as_tensor(target_indices, dtype=torch.int64).flatten()
        if target_indices.shape[0] != num_queries:
            raise NphError(
                f"{target_indices.shape[0]} target indices for {num_queries} queries; give one each"
            )
        bad = (target_indices < 0) | (target_indices >= num_memories)
        if bool(bad.any()):
            raise NphError(
                f"target index {int(target_indices[bad][0])} is outside the memory's rows "
                f"0…{num_memories - 1}"
            )
    return queries, targets, target_indices


def _csv_value(value: Any) -> Any:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return value
