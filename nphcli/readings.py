"""Two readings of the paper's well-separation condition (Hu et al. 2025, §4).

Pattern μ is well separated when Δ_μ ≥ (1/β)·ln((M + k − 2)·m/R) + 2mR. The readings differ in R:

- **all pairs** (`theory.well_separation`): R = ½ min over every pair of stored patterns. Then
  the two closest patterns a, b (‖ξ_a − ξ_b‖ = 2R) are never both well separated, and neither is
  when (M + k − 2)·m/R ≥ 1: Δ_a ≤ ⟨ξ_a, ξ_a − ξ_b⟩ ≤ ‖ξ_a‖·2R ≤ 2mR, below the threshold. So
  "every pattern well separated", which Proposition 4.1 assumes, cannot hold as written.
- **support** (this module; the reading of the paper's Lemma): R_μ = ½ min over pairs inside the
  support S_μ that retrieving ξ_μ itself uses, the k memories with the largest ⟨ξ_μ, ξ_ν⟩ (and
  μ), so only the patterns that compete for ξ_μ's query constrain it. With k = M it is the
  all-pairs reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nphcli.errors import NphError
from nphcli.models.masks import check_k, resolve_k
from nphcli.separation import separation

# Largest rows · k² distances computed for the support reading before asking for a sample.
MAX_PAIRS = 1 << 27


@dataclass
class SupportReading:
    """Well separation with R over each pattern's own support (module docstring)."""

    k: int
    rows: Tensor  # (S,) int64 patterns checked
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
    k = M), over every pattern or a seeded sample of `max_rows`, as `separation` samples."""
    if k is not None:
        check_k(k)
    X = patterns.to(torch.float64)  # (M, d)
    M = X.shape[0]
    count = M if k is None else resolve_k(k, M)
    sep = separation(X, max_rows=max_rows, seed=seed)
    rows = sep.rows
    if sep.R is None:
        empty = torch.empty(0, dtype=torch.float64)
        return SupportReading(count, rows, empty, empty, empty, torch.zeros(0, dtype=torch.bool))
    if count >= M:
        R = torch.full((rows.numel(),), sep.R, dtype=torch.float64)
    else:
        if rows.numel() * (count + 1) ** 2 > MAX_PAIRS:
            raise NphError(
                f"the support reading needs {rows.numel()} × {count + 1}² distances; "
                "use a smaller --sample"
            )
        R = torch.empty(rows.numel(), dtype=torch.float64)
        for i, mu in enumerate(rows.tolist()):
            top = (X @ X[mu]).topk(count).indices  # (k,) the support of ξ_μ's query
            members = torch.unique(torch.cat([top, torch.tensor([mu])]))
            dist = torch.cdist(X[members], X[members])  # (s, s)
            dist.fill_diagonal_(math.inf)
            R[i] = 0.5 * dist.min()
    factor = M + count - 2
    with torch.no_grad():
        safe = R.clamp(min=torch.finfo(torch.float64).tiny)
        threshold = torch.log(factor * sep.m / safe) / beta + 2 * sep.m * R
        threshold = torch.where(R > 0, threshold, torch.full_like(R, math.inf))
    return SupportReading(count, rows, R, threshold, sep.delta, sep.delta >= threshold)


def closest_pair(patterns: Tensor) -> tuple[int, int]:
    """The indices (a, b) of the two closest stored patterns (ties: the first pair found)."""
    X = patterns.to(torch.float64)
    dist = torch.cdist(X, X)  # (M, M)
    dist.fill_diagonal_(math.inf)
    a, b = divmod(int(dist.argmin()), X.shape[0])
    return a, b
