"""The paper's well-separation condition (§4) per stored pattern: Δ_μ ≥ (1/β)·ln((M + k − 2)·m/R)
+ 2mR, with m, R and Δ_μ from `nphcli.theory.separation`. The Theorem 4.1 checks on queries
(`nphcli.theory.checks`) use the same threshold per query's support size."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from nphcli.engine.masks import check_k, resolve_k
from nphcli.theory.separation import Separation, separation


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
