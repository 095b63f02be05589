"""Geometry of stored patterns: norms and the separation statistics of the paper.

For patterns ξ_1 … ξ_M, the rows of X (M, d):

    m   = max_μ ‖ξ_μ‖₂                              (largest norm)
    R   = ½ min_{μ≠ν} ‖ξ_μ − ξ_ν‖₂                  (half the smallest pairwise distance)
    Δ_μ = ⟨ξ_μ, ξ_μ⟩ − max_{ν≠μ} ⟨ξ_μ, ξ_ν⟩          (separation of pattern μ)

The pairwise quantities need the Gram matrix X Xᵀ (M, M); it is never built whole. Rows are
processed in blocks of at most `block_elements` scores. Each row's best competitor ν is found
with a matrix product (float32, or float64 for float64 input), and its inner product and
distance are then recomputed directly in float64, so duplicates give exactly R = 0 and Δ_μ = 0.

When M is large, `separation` uses a seeded sample of rows μ, each still compared with all M
patterns: Δ_μ is exact for every sampled μ, and R is the minimum over pairs that include a
sampled row, an upper bound on the exact R.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nphcli.memory.bank import MemoryBank, as_bank

DEFAULT_BLOCK_ELEMENTS = 1 << 22  # scores per block: 32 MiB in float64
DEFAULT_MAX_ROWS = 2000


@dataclass
class Separation:
    """Separation statistics of a set of patterns (over `rows` when sampled)."""

    m: float  # max_μ ‖ξ_μ‖ over all M patterns
    R: float | None  # ½ min_{μ≠ν} ‖ξ_μ − ξ_ν‖ over pairs with μ in rows; None when M < 2
    delta: Tensor  # (S,) float64: Δ_μ for each μ in rows (empty when M < 2)
    rows: Tensor  # (S,) int64: the rows μ used, increasing
    num_memories: int  # M
    sampled: bool  # True when rows is a random sample of fewer than M rows
    seed: int | None  # seed of the sample, when sampled

    def delta_summary(self) -> dict[str, float] | None:
        """min / mean / median / max of Δ_μ, or None when there is no Δ."""
        if self.delta.numel() == 0:
            return None
        return {
            "min": float(self.delta.min()),
            "mean": float(self.delta.mean()),
            "median": float(self.delta.median()),
            "max": float(self.delta.max()),
        }


# Every function below takes the patterns (M, d) as a tensor or as a `MemoryBank` (e.g. a memory
# file streamed from disk, so `nph info` describes a file larger than RAM): rows are read in the
# same blocks either way, so both give the same numbers.
Patterns = Tensor | MemoryBank


def max_norm(patterns: Patterns, *, block_rows: int = 4096) -> float:
    """m = max_μ ‖ξ_μ‖₂ for patterns (M, d)."""
    return float(row_norms(patterns, block_rows=block_rows).max())


def row_norms(patterns: Patterns, *, block_rows: int = 4096) -> Tensor:
    """‖ξ_μ‖₂ for each row of patterns (M, d), as float64 (M,), computed in row blocks."""
    bank = as_bank(patterns)
    # Written into one tensor rather than joined from a list: a thousand small results kept
    # between large freed blocks fragmented the heap (a 1 GB file read in blocks grew the
    # process by 1.2 GB).
    norms = torch.empty(bank.num_memories, dtype=torch.float64, device=bank.device)  # (M,)
    for start, block in bank.key_blocks(block_rows):
        norms[start : start + block.shape[0]] = torch.linalg.vector_norm(
            block, dim=1, dtype=torch.float64
        )
    return norms


def nearest_competitors(
    patterns: Patterns, rows: Tensor | None = None, *, block_elements: int = DEFAULT_BLOCK_ELEMENTS
) -> tuple[Tensor, Tensor]:
    """For each row μ in `rows` (default all): argmax_{ν≠μ} ⟨ξ_μ, ξ_ν⟩, argmin_{ν≠μ} ‖ξ_μ − ξ_ν‖.

    Scans X in (b, c) blocks of at most `block_elements` scores; needs M ≥ 2.
    Returns two (S,) int64 index tensors: the most similar and the closest other pattern.
    """
    bank = as_bank(patterns)
    M = bank.num_memories
    if M < 2:
        raise ValueError("competitors need at least two patterns")
    device = bank.device
    rows = torch.arange(M, device=device) if rows is None else rows.to(device)
    S = rows.shape[0]
    work = torch.float64 if bank.dtype == torch.float64 else torch.float32
    b = max(1, min(S, math.isqrt(block_elements)))
    # A block of c rows holds c·d values besides its c·b scores: bounded too, so that a small
    # sample of a memory read from disk does not read a large part of it at once.
    c = max(1, min(M, block_elements // b, block_elements // bank.dim))
    # ‖ξ_μ − ξ_ν‖² = ‖ξ_μ‖² + ‖ξ_ν‖² − 2⟨ξ_μ, ξ_ν⟩; the first term is the same for every ν,
    # so the closest ν minimises ‖ξ_ν‖² − 2⟨ξ_μ, ξ_ν⟩ (one fused pass over the block).
    sq_all = row_norms(bank).to(device, work).square()  # (M,)
    best_ip = torch.full((S,), -math.inf, dtype=work, device=device)
    best_ip_at = torch.zeros(S, dtype=torch.int64, device=device)
    best_d2 = torch.full((S,), math.inf, dtype=work, device=device)
    best_d2_at = torch.zeros(S, dtype=torch.int64, device=device)
    for r0 in range(0, S, b):
        block_rows = rows[r0 : r0 + b]  # (b,)
        queries = bank.gather(block_rows)[0].to(work)  # (b, d)
        for c0, block in bank.key_blocks(c):
            keys = block.to(work)  # (c, d)
            gram = queries @ keys.T  # (b, c)
            d2 = torch.add(
                sq_all[c0 : c0 + keys.shape[0]][None, :], gram, alpha=-2
            )  # (b, c), shifted
            own = block_rows - c0  # (b,) column of μ itself in this block, if inside it
            inside = (own >= 0) & (own < keys.shape[0])
            if inside.any():
                at = torch.nonzero(inside).squeeze(1)
                gram[at, own[at]] = -math.inf
                d2[at, own[at]] = math.inf
            ip_val, ip_idx = gram.max(dim=1)  # (b,)
            d2_val, d2_idx = d2.min(dim=1)  # (b,)
            sl = slice(r0, r0 + block_rows.shape[0])
            better = ip_val > best_ip[sl]
            best_ip[sl] = torch.where(better, ip_val, best_ip[sl])
            best_ip_at[sl] = torch.where(better, ip_idx + c0, best_ip_at[sl])
            closer = d2_val < best_d2[sl]
            best_d2[sl] = torch.where(closer, d2_val, best_d2[sl])
            best_d2_at[sl] = torch.where(closer, d2_idx + c0, best_d2_at[sl])
    return best_ip_at, best_d2_at


def separation(
    patterns: Patterns,
    *,
    max_rows: int | None = DEFAULT_MAX_ROWS,
    seed: int = 0,
    block_elements: int = DEFAULT_BLOCK_ELEMENTS,
) -> Separation:
    """m, R and Δ_μ (module docstring) for patterns (M, d).

    When M > `max_rows` (and max_rows is not None), R and Δ use a sample of `max_rows` rows
    drawn without replacement with a generator seeded by `seed`; m always uses every row.
    """
    bank = as_bank(patterns)
    M = bank.num_memories
    m = max_norm(bank)
    sampled = max_rows is not None and M > max_rows
    if sampled:
        generator = torch.Generator().manual_seed(seed)
        rows = torch.randperm(M, generator=generator)[:max_rows].sort().values  # (S,)
    else:
        rows = torch.arange(M)
    if M < 2:
        empty = torch.empty(0, dtype=torch.float64)
        return Separation(m, None, empty, rows, M, False, None)
    rows = rows.to(bank.device)
    similar, closest = nearest_competitors(bank, rows, block_elements=block_elements)
    own = bank.gather(rows)[0].double()  # (S, d)
    delta = (own * own).sum(1) - (own * bank.gather(similar)[0].double()).sum(1)  # (S,)
    distance = torch.linalg.vector_norm(own - bank.gather(closest)[0].double(), dim=1)  # (S,)
    R = 0.5 * float(distance.min())
    return Separation(m, R, delta.cpu(), rows.cpu(), M, sampled, seed if sampled else None)


def reference_separation(patterns: Tensor) -> tuple[float, float | None, Tensor]:
    """Slow, obvious (m, R, Δ) over all rows, with the whole Gram matrix; for tests."""
    x = patterns.double()
    M = x.shape[0]
    m = max(float(x[i].norm()) for i in range(M))
    if M < 2:
        return m, None, torch.empty(0, dtype=torch.float64)
    gram = x @ x.T  # (M, M)
    distances = [float((x[i] - x[j]).norm()) for i in range(M) for j in range(M) if i != j]
    delta = torch.tensor(
        [float(gram[i, i]) - max(float(gram[i, j]) for j in range(M) if j != i) for i in range(M)],
        dtype=torch.float64,
    )
    return m, 0.5 * min(distances), delta


def pattern_summary(patterns: Patterns, *, block_rows: int = 4096) -> dict[str, Any]:
    """Value range and norm statistics of patterns (M, d), computed in row blocks."""
    low, high = math.inf, -math.inf
    for _, block in as_bank(patterns).key_blocks(block_rows):
        block = block.float()
        low, high = min(low, float(block.min())), max(high, float(block.max()))
    norms = row_norms(patterns, block_rows=block_rows)
    return {
        "value_range": [low, high],
        "norms": {
            "min": float(norms.min()),
            "mean": float(norms.mean()),
            "max": float(norms.max()),
        },
    }


def describe(memory: Any, *, max_rows: int | None = DEFAULT_MAX_ROWS, seed: int = 0) -> dict:
    """Everything `nph info` shows about a memory (a `MemoryBank`: loaded or streamed), as a
    JSON-ready dict."""
    sep = separation(memory, max_rows=max_rows, seed=seed)
    labels = None
    if memory.labels is not None:
        values = memory.labels.unique()
        labels = {"count": int(memory.labels.numel()), "distinct": int(values.numel())}
    return {
        "path": str(memory.path) if memory.path else None,
        "M": memory.num_memories,
        "d": memory.dim,
        "dtype": str(memory.dtype).removeprefix("torch."),
        "item_shape": list(memory.item_shape) if memory.item_shape else None,
        "labels": labels,
        "values_shape": [memory.num_memories, memory.value_dim] if memory.hetero else None,
        **pattern_summary(memory),
        "separation": {
            "m": sep.m,
            "R": sep.R,
            "delta": sep.delta_summary(),
            "rows_used": int(sep.rows.numel()) if sep.R is not None else 0,
            "sampled": sep.sampled,
            "seed": sep.seed,
        },
        "meta": memory.meta,
    }
