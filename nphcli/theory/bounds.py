"""Retrieval-error bounds for softmax over a support set, and how tight they are.

Notation as in `theory.checks`: patterns ξ_1 … ξ_M, m = max_μ ‖ξ_μ‖, a query x with target μ in
its support S(x) of k memories, p the softmax of β⟨x, ξ_ν⟩ over S(x), Δ_μ the pattern gap and
Δ̃_μ(x) = ⟨x, ξ_μ⟩ − max_{ν≠μ} ⟨x, ξ_ν⟩ the query's own gap. With μ ∈ S(x),

    T(x) − ξ_μ = Σ_{ν∈S, ν≠μ} p_ν (ξ_ν − ξ_μ)                                  (Σ p = 1)

so, every ‖ξ_ν − ξ_μ‖ being at most 2m and every p_ν/p_μ at most exp(−β Δ̃_μ(x)):

    weight:  ‖T(x) − ξ_μ‖ ≤ 2m(1 − p_μ)
    tight:                ≤ 2m(k − 1)·exp(−β Δ̃_μ(x))          (1 − p_μ ≤ Σ_{ν≠μ} p_ν/p_μ)
    query:                ≤ m(M + k − 2)·exp(−β Δ̃_μ(x))        (2(k − 1) ≤ M + k − 2, k ≤ M)
    lemma:                ≤ m(M + k − 2)·exp(−β(Δ_μ − 2m‖x − ξ_μ‖))
                                    (Δ̃_μ(x) ≥ Δ_μ − 2m‖x − ξ_μ‖ by Cauchy–Schwarz)

Each holds for every x whose target is in its support; no sphere or separation premise is
needed. The tightness of a bound on a query is bound / error (≥ 1 when it holds; the stated
Theorem 4.1 bound, which is not valid, can fall below 1).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

# The per-query bound fields of `theory.QueryCheck` whose tightness is summarised.
TIGHTNESS_BOUNDS = (
    "stated_bound",
    "stated_self_bound",
    "query_bound",
    "lemma_bound",
    "tight_bound",
    "weight_bound",
)
# The valid bounds (beyond `query_bound`, counted by theory) whose "holds" counts are reported.
VALID_BOUNDS = ("lemma_bound", "tight_bound", "weight_bound")


def tight_bound(beta: float, k: Tensor, m: float, gap: Tensor) -> Tensor:
    """2m(k − 1)·exp(−β·gap), elementwise over k and gap (float64)."""
    factor = (k.to(torch.float64) - 1).clamp(min=0)
    return 2 * m * factor * torch.exp(-beta * gap.to(torch.float64))


def bound_summary(check: Any) -> dict[str, Any]:
    """Counts of the valid bounds holding on in-support queries, the stated bound with ν = μ
    in its max on queries meeting Theorem 4.1's premises, and each bound's tightness
    (min and median of bound / error over in-support queries with a non-zero error)."""
    support = check.in_support
    out: dict[str, Any] = {}
    for name in VALID_BOUNDS:
        out[f"{name.removesuffix('_bound')}_holds"] = int((check.holds(name) & support).sum())
    self_holds = check.holds("stated_self_bound") & check.premises
    out["stated_self_holds_premises"] = int(self_holds.sum())
    error = check.error[support]
    for name in TIGHTNESS_BOUNDS:  # bound / error where the error is not 0
        ratio = (getattr(check, name)[support][error > 0] / error[error > 0]).to(torch.float64)
        short = name.removesuffix("_bound")
        out[f"{short}_tightness_min"] = float(ratio.min()) if ratio.numel() else None
        out[f"{short}_tightness_median"] = float(ratio.median()) if ratio.numel() else None
    return out
