"""The paper's well-separation condition (Hu et al. 2025, §4) per stored pattern, in two readings.

Pattern μ is well separated when Δ_μ ≥ (1/β)·ln((M + k − 2)·m/R) + 2mR, with m, R and Δ_μ from
`nphcli.theory.separation`; the Theorem 4.1 checks on queries (`nphcli.theory.checks`) use the
same threshold per query's support size. The readings differ in R:

- **all pairs** (`well_separation`): R = ½ min over every pair of stored patterns. Then
  the two closest patterns a, b (‖ξ_a − ξ_b‖ = 2R) are never both well separated, and neither is
  when (M + k − 2)·m/R ≥ 1: Δ_a ≤ ⟨ξ_a, ξ_a − ξ_b⟩ ≤ ‖ξ_a‖·2R ≤ 2mR, below the threshold. So
  "every pattern well separated", which Proposition 4.1 assumes, cannot hold as written.
- **support** (`support_reading`; the reading of the paper's Lemma): R_μ = ½ min over pairs
  inside the support S_μ that retrieving ξ_μ itself uses, the k memories with the largest
  ⟨ξ_μ, ξ_ν⟩ (and μ), so only the patterns that compete for ξ_μ's query constrain it. With
  k = M it is the all-pairs reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nphcli.engine.masks import check_k, resolve_k
from nphcli.theory.separation import Separation, separation

# Largest rows · k² distances the support reading computes; beyond it, fewer rows are checked.
MAX_PAIRS = 1 << 24


def well_separation_threshold(beta: float, num_memories: int, k: int, m: float, R: float) -> float:
    """(1/β)·ln((M + k − 2)·m / R) + 2mR: the Δ_μ a pattern needs to be well separated.

    inf when R = 0 (duplicate patterns); −inf when M + k − 2 = 0 (a single pattern).
    """
    factor = num_memories + k - 2
    if R <= 0 or m <= 0:
        return math.inf
    if factor <= 0:
        return -math.inf
    return math.log(factor * m / R) / beta + 2 * m * R


@dataclass
class WellSeparation:
    """Which stored patterns satisfy the well-separation condition for given β and k."""

    beta: float
    k: int  # support size in the condition
    threshold: float  # (1/β) ln((M + k − 2) m / R) + 2mR
    separation: Separation  # m, R, Δ_μ (over `separation.rows`)
    well_separated: Tensor  # (S,) bool, for separation.rows

    def to_json(self, *, per_pattern: bool = False) -> dict[str, Any]:
        sep = self.separation
        count = int(self.well_separated.sum())
        out: dict[str, Any] = {
            "beta": self.beta,
            "k": self.k,
            "M": sep.num_memories,
            "m": sep.m,
            "R": sep.R,
            "threshold": self.threshold if math.isfinite(self.threshold) else None,
            "condition": "Δ_μ ≥ (1/β)·ln((M + k − 2)·m/R) + 2mR",
            "delta": sep.delta_summary(),
            "patterns_checked": int(sep.delta.numel()),
            "well_separated": count,
            "fraction": count / sep.delta.numel() if sep.delta.numel() else None,
            "sampled": sep.sampled,
        }
        if per_pattern:
            out["per_pattern"] = {
                "row": sep.rows.tolist(),
                "delta": sep.delta.tolist(),
                "well_separated": self.well_separated.tolist(),
            }
        return out


def well_separation(
    patterns: Tensor, beta: float, k: float | None = None, *, max_rows: int | None = None, seed=0
) -> WellSeparation:
    """Separation statistics of patterns (M, d) and the well-separation check per pattern for β
    and k (a count, a fraction of M as `--k` takes it, or None for k = M: dense retrieval)."""
    if k is not None:
        check_k(k)  # before resolve_k, which would quietly round k ≤ 0 up to one memory
    sep = separation(patterns, max_rows=max_rows, seed=seed)
    M = sep.num_memories
    count = M if k is None else resolve_k(k, M)
    R = sep.R
    threshold = math.inf if R is None else well_separation_threshold(beta, M, count, sep.m, R)
    return WellSeparation(beta, count, threshold, sep, sep.delta >= threshold)


@dataclass
class SupportReading:
    """Well separation with R over each pattern's own support (the module docstring's support
    reading)."""

    k: int
    rows: Tensor  # (S,) int64 patterns checked
    sampled: bool  # True when rows is a seeded sample of fewer than M patterns
    R: Tensor  # (S,) float64 R_μ
    threshold: Tensor  # (S,) float64
    delta: Tensor  # (S,) float64 Δ_μ
    well_separated: Tensor  # (S,) bool

    def to_json(self) -> dict[str, Any]:
        count = int(self.well_separated.sum())
        return {
            "reading": "R over the support of ξ_μ's own query (the Lemma's reading)",
            "k": self.k,
            "R_min": float(self.R.min()) if self.R.numel() else None,
            "R_median": float(self.R.median()) if self.R.numel() else None,
            "patterns_checked": int(self.rows.numel()),
            "sampled": self.sampled,
            "well_separated": count,
            "fraction": count / self.rows.numel() if self.rows.numel() else None,
        }


def support_reading(
    patterns: Tensor,
    beta: float,
    k: float | None = None,
    *,
    max_rows: int | None = None,
    seed: int = 0,
) -> SupportReading:
    """The support reading for patterns (M, d), β and k (a count, a fraction of M, or None for
    k = M), over every pattern or a seeded sample of `max_rows`, as `separation` samples; when
    that would need more than `MAX_PAIRS` distances, over a seeded sample of the rows small
    enough to stay within it."""
    if k is not None:
        check_k(k)
    X = patterns.to(torch.float64)  # (M, d)
    M = X.shape[0]
    count = M if k is None else resolve_k(k, M)
    sep = separation(X, max_rows=max_rows, seed=seed)
    rows, delta, sampled = sep.rows, sep.delta, sep.sampled
    if sep.R is None:
        empty = torch.empty(0, dtype=torch.float64)
        none = torch.zeros(0, dtype=torch.bool)
        return SupportReading(count, rows, False, empty, empty, empty, none)
    if count >= M:
        R = torch.full((rows.numel(),), sep.R, dtype=torch.float64)
    else:
        limit = max(1, MAX_PAIRS // (count + 1) ** 2)
        if rows.numel() > limit:
            generator = torch.Generator().manual_seed(seed)
            keep = torch.randperm(rows.numel(), generator=generator)[:limit].sort().values
            rows, delta, sampled = rows[keep], delta[keep], True
        R = _support_R(X, rows, count)
    factor = M + count - 2
    with torch.no_grad():
        safe = R.clamp(min=torch.finfo(torch.float64).tiny)
        threshold = torch.log(factor * sep.m / safe) / beta + 2 * sep.m * R
        threshold = torch.where(R > 0, threshold, torch.full_like(R, math.inf))
    return SupportReading(count, rows, sampled, R, threshold, delta, delta >= threshold)


def _support_R(X: Tensor, rows: Tensor, k: int) -> Tensor:
    """R_μ (S,) for each μ in rows: ½ the smallest distance between two patterns of
    top-k(⟨ξ_μ, ·⟩) ∪ {μ}. The pairs with μ are its distances to the top k (itself masked), so
    the set never holds μ twice. inf when the set is μ alone (k = 1, μ its own top score)."""
    out = torch.empty(rows.numel(), dtype=torch.float64)
    block = max(1, (1 << 22) // (k * k + k))
    for start in range(0, rows.numel(), block):
        mu = rows[start : start + block]  # (B,)
        top = (X[mu] @ X.T).topk(k, dim=1).indices  # (B, k)
        members = X[top]  # (B, k, d)
        within = torch.cdist(members, members)  # (B, k, k)
        within.diagonal(dim1=1, dim2=2).fill_(math.inf)
        to_mu = torch.linalg.vector_norm(members - X[mu][:, None, :], dim=2)  # (B, k)
        to_mu = to_mu.masked_fill(top == mu[:, None], math.inf)
        closest = torch.minimum(within.amin(dim=(1, 2)), to_mu.amin(dim=1))  # (B,)
        out[start : start + mu.numel()] = 0.5 * closest
    return out
