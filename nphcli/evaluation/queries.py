"""Which queries a run retrieves, and what each should retrieve.

Two kinds of query:
- self-evaluation (default): all stored patterns, or `queries` of them drawn with the seed, are
  corrupted and retrieved; the target is the uncorrupted pattern (its value row for a
  hetero-associative memory) and its stored index is known;
- own queries: rows given by the caller, optionally with target vectors or target indices.

Positions: in self-evaluation each query is passed the index of its own stored pattern as its
position; own queries get their row number. Only position-aware models (window) use it, and for
`window` it means the window is centred on the query's own stored pattern, which therefore is
always among the memories it can retrieve.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.memory.bank import MemoryBank


@dataclass
class Selection:
    """The chosen queries, before corruption."""

    clean: Tensor  # (Q, d) uncorrupted queries
    targets: Tensor | None  # (Q, d_v)
    target_indices: Tensor | None  # (Q,) stored rows of the targets
    rows: Tensor  # (Q,) rows the queries came from (stored or own); also their positions
    query_source: str  # "stored" or "file"
    target_source: str | None  # "stored", "file", "indices" or None


def select(
    bank: MemoryBank,
    wanted: int | None,
    generator: torch.Generator,
    queries: Tensor | None = None,
    targets: Tensor | None = None,
    target_indices: Tensor | None = None,
) -> Selection:
    """The queries of a run, their targets and positions (see the module docstring): `wanted`
    of them drawn with `generator` (None: all). Only the rows needed are read from `bank`."""
    if queries is None:
        if targets is not None or target_indices is not None:
            raise NphError("targets go with own queries: add --queries-file")
        rows = choose_rows(bank.num_memories, wanted, generator, "stored patterns")
        clean, stored_targets = bank.gather(rows)  # (Q, d), (Q, d_v)
        return Selection(clean, stored_targets, rows, rows, "stored", "stored")
    queries, targets, target_indices = check_own(queries, targets, target_indices, bank)
    rows = choose_rows(queries.shape[0], wanted, generator, "query rows")
    if target_indices is not None:
        target_indices = target_indices[rows]
        _, targets = bank.gather(target_indices)
    elif targets is not None:
        targets = targets[rows]
    source = "indices" if target_indices is not None else "file" if targets is not None else None
    return Selection(queries[rows], targets, target_indices, rows, "file", source)


def choose_rows(
    available: int, wanted: int | None, generator: torch.Generator, what: str
) -> Tensor:
    """All row indices in order, or `wanted` of them drawn without replacement (sorted)."""
    if wanted is None or wanted == available:
        return torch.arange(available)
    if wanted > available:
        raise NphError(f"--queries {wanted} exceeds the {available} {what}")
    return torch.randperm(available, generator=generator)[:wanted].sort().values


def check_own(
    queries: Tensor, targets: Tensor | None, target_indices: Tensor | None, bank: MemoryBank
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Own queries (Q, d), targets (Q, d_v) and target indices (Q,), checked against the
    memory; indices come back as a flat int64 tensor."""
    dim = bank.dim
    if queries.ndim != 2 or queries.shape[1] != dim:
        raise NphError(
            f"queries have shape {tuple(queries.shape)}, but the memory's patterns have "
            f"dimension d = {dim}: give (Q, {dim}) queries"
        )
    if not queries.is_floating_point() or not torch.isfinite(queries).all():
        raise NphError("queries must be finite floating-point numbers")
    num_queries = queries.shape[0]
    if targets is not None:
        _check_targets(targets, num_queries, bank.value_dim)
    if target_indices is not None:
        target_indices = _check_indices(target_indices, num_queries, bank.num_memories)
    return queries, targets, target_indices


def _check_targets(targets: Tensor, num_queries: int, value_dim: int) -> None:
    if targets.ndim != 2 or targets.shape[1] != value_dim:
        raise NphError(
            f"targets have shape {tuple(targets.shape)}, but retrieved patterns have "
            f"dimension {value_dim}"
        )
    if targets.shape[0] != num_queries:
        raise NphError(f"{targets.shape[0]} targets for {num_queries} queries; give one each")
    if not torch.isfinite(targets).all():
        raise NphError("targets must be finite numbers")


def _check_indices(indices: Tensor, num_queries: int, num_memories: int) -> Tensor:
    indices = torch.as_tensor(indices, dtype=torch.int64).flatten()
    if indices.shape[0] != num_queries:
        raise NphError(
            f"{indices.shape[0]} target indices for {num_queries} queries; give one each"
        )
    bad = (indices < 0) | (indices >= num_memories)
    if bool(bad.any()):
        raise NphError(
            f"target index {int(indices[bad][0])} is outside the memory's rows 0…{num_memories - 1}"
        )
    return indices
