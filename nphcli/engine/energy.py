"""Energies of the Hopfield models: the functions whose concave–convex step is each model's update.

For stored patterns ξ_1 … ξ_M (rows of X (M, d)), a query x and scores z = β·X·x (M,):

    E(x) = −(1/β)·Ψ*(β·X·x) + ½‖x‖²,     Ψ*(z) = max_{p ∈ simplex} ⟨p, z⟩ + H(p),

the conjugate of a negative entropy −H with ∇Ψ*(z) = p, so T(x) = Xᵀp(x) is the concave–convex
step on E: E(T(x)) ≤ E(x) (Ramsauer et al. 2021, Hu et al. 2023). H is Shannon's for dense
(log-sum-exp), Tsallis' H_α(p) = (1 − Σ p^α)/(α(α − 1)) for entmax (sparse: α = 2), and the
log-sum-exp over the support S(x) for top-k, random and window. Constants are dropped; float64.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from nphcli.engine.functional import entmax, sparsemax


def conjugate(scores: Tensor, alpha: float = 1.0, support: Tensor | None = None) -> Tensor:
    """Ψ*_α(z) (Q,) for scores z (Q, M): log-sum-exp for α = 1 (over `support` (Q, M) bool if
    given), else max_p ⟨p, z⟩ + (1 − Σ p^α)/(α(α − 1)) at p = α-entmax(z) (sparsemax at α = 2)."""
    z = scores.to(torch.float64)
    if alpha == 1.0:
        if support is not None:
            z = z.masked_fill(~support, -math.inf)
        return torch.logsumexp(z, dim=1)
    if support is not None:
        raise ValueError("a support restricts the log-sum-exp (α = 1) only")
    p = sparsemax(z) if alpha == 2.0 else entmax(z, alpha)  # (Q, M)
    tsallis = (1.0 - p.pow(alpha).sum(dim=1)) / (alpha * (alpha - 1.0))  # (Q,)
    return (p * z).sum(dim=1) + tsallis


def energy(
    queries: Tensor,
    memories: Tensor,
    beta: float,
    *,
    alpha: float = 1.0,
    support: Tensor | None = None,
) -> Tensor:
    """E(x) = −(1/β)·Ψ*_α(β·X·x) + ½‖x‖² (Q,) for queries (Q, d) and memories X (M, d)."""
    x = queries.to(torch.float64)  # (Q, d)
    X = memories.to(torch.float64)  # (M, d)
    scores = beta * (x @ X.T)  # (Q, M)
    return -conjugate(scores, alpha, support) / beta + 0.5 * (x * x).sum(dim=1)
