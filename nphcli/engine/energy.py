"""Energies of the Hopfield models: the functions whose concave–convex step is each model's update.

For stored patterns ξ_1 … ξ_M (rows of X (M, d)), a query x and scores z = β·X·x (M,):

    E(x) = −(1/β)·Ψ*(β·X·x) + ½‖x‖²,     Ψ*(z) = max_{p ∈ simplex} ⟨p, z⟩ + H(p),

the convex conjugate of a negative entropy −H, whose gradient ∇Ψ*(z) is the maximising p. So
−∇E(x) = Xᵀp − x and the update T(x) = Xᵀp(x) is the concave–convex step on E: E(T(x)) ≤ E(x)
(Ramsauer et al. 2021 for dense, Hu et al. 2023 for sparse). Per model:

- dense: H the Shannon entropy, Ψ*(z) = log Σ_μ exp z_μ (log-sum-exp), p = softmax(z);
- entmax (order α ∈ (1, 2]): H the Tsallis entropy H_α(p) = (1 − Σ p_μ^α)/(α(α − 1)), p =
  α-entmax(z); sparse is α = 2, H_2(p) = ½(1 − ‖p‖²), p = sparsemax(z) (Fenchel–Young form);
- top-k, random, window (softmax over a support S(x)): Ψ*(z) = log Σ_{μ∈S(x)} exp z_μ, the
  log-sum-exp restricted to the support. For top-k it is the largest log-sum-exp over k-subsets
  (convex); for random and window S depends on the query's position only (convex too).

Constants are dropped (dense: the Ramsauer energy adds β⁻¹·log M + ½m²). Models expose their
energy as `HopfieldModel.energy`, built from these functions; traces of iterated retrieval are in
`nphcli.theory.energy`, above the models. Everything here is float64.
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
