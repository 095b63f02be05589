"""Energies of the Hopfield models, and traces of iterated retrieval (energy and ‖T(x) − x‖).

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
energy as `HopfieldModel.energy`; models without one (linear, random-feature) return None.
Everything here is float64.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import Tensor

from nphcli.engine.functional import entmax_bisect, sparsemax
from nphcli.errors import NphError


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
    p = sparsemax(z) if alpha == 2.0 else entmax_bisect(z, alpha)  # (Q, M)
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


def support_energy(model: Any, queries: Tensor, memories: Tensor, positions: Tensor) -> Tensor:
    """The restricted log-sum-exp energy of a sparse-structured model (one with a
    `support_mask`): S(x) from the model, at each query's own x."""
    x = queries.to(torch.float64)
    X = memories.to(torch.float64)
    support = model.support_mask(x @ X.T, positions)  # (Q, M)
    return energy(x, X, model.beta, support=support)


@dataclasses.dataclass
class Trace:
    """Iterated retrieval x_{t+1} = T(x_t), t = 0 … T − 1, recomputed in float64."""

    energy: Tensor | None  # (T + 1, Q) E(x_t); None for models without an energy
    residual: Tensor  # (T, Q) ‖T(x_t) − x_t‖
    final: Tensor  # (Q, d) x_T

    def to_json(self, *, per_query: bool = False) -> list[dict[str, Any]]:
        """One object per t: mean and max of E(x_t) and of ‖T(x_t) − x_t‖ (null after the
        last step), and the largest rise E(x_t) − E(x_{t−1}) over queries (null at t = 0)."""
        steps = []
        for t in range(self.residual.shape[0] + 1):
            item: dict[str, Any] = {"step": t}
            if self.energy is not None:
                e = self.energy[t]
                item["energy_mean"] = float(e.mean())
                item["energy_max"] = float(e.max())
                rise = None if t == 0 else float((e - self.energy[t - 1]).max())
                item["energy_rise_max"] = rise
            else:
                item["energy_mean"] = item["energy_max"] = item["energy_rise_max"] = None
            last = t == self.residual.shape[0]
            r = None if last else self.residual[t]
            item["residual_mean"] = None if r is None else float(r.mean())
            item["residual_max"] = None if r is None else float(r.max())
            if per_query:
                item["energy"] = None if self.energy is None else self.energy[t].tolist()
                item["residual"] = None if r is None else r.tolist()
            steps.append(item)
        return steps


def trace(
    model: Any, queries: Tensor, memories: Tensor, steps: int, positions: Tensor | None = None
) -> Trace:
    """Apply one step of `model` `steps` times to queries (Q, d) over memories (M, d) in float64,
    recording E(x_t) (when the model has an energy) and ‖T(x_t) − x_t‖ at every step."""
    if steps < 1:
        raise NphError(f"--steps must be ≥ 1 for a trace, got {steps}")
    one = dataclasses.replace(model, steps=1, tol=0.0)
    X = memories.to(torch.float64)  # (M, d)
    x = queries.to(torch.float64)  # (Q, d)
    if positions is None:
        positions = torch.arange(x.shape[0])
    energies = []
    residuals = []
    for _ in range(steps):
        e = one.energy(x, X, positions)
        if e is not None:
            energies.append(e)
        y = one.retrieve(x, X, positions=positions).patterns  # (Q, d)
        residuals.append(torch.linalg.vector_norm(y - x, dim=1))
        x = y
    e = one.energy(x, X, positions)
    if e is not None:
        energies.append(e)
    return Trace(
        energy=torch.stack(energies) if energies else None,
        residual=torch.stack(residuals),
        final=x,
    )


def trace_report(memory: Any, report: Any) -> Trace:
    """The `trace` of a `RetrievalReport`'s run on a loaded, auto-associative `memory`: the same
    model and parameters, its corrupted queries and positions, `steps` iterations."""
    from nphcli.models import create_model

    if memory.hetero:
        raise NphError("--trace needs an auto-associative memory (no separate values)")
    config = report.config
    model = create_model(config["model"], **config["params"])
    return trace(
        model,
        report.queries,
        memory.patterns,
        int(config["params"]["steps"]),
        positions=report.per_query["query_row"],
    )
