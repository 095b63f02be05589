"""Fixed-point convergence of iterated retrieval (Hu et al. 2025, Corollary 4.3), checked.

Corollary 4.3 says iterating a sparse-structured model x ← T(x) converges to a fixed point whose
retrieval error is no larger than dense retrieval's. For queries x_0 (Q, d) with targets μ, this
runs `steps` iterations of the model and of dense retrieval with the same β (both in float64,
`energy.trace`) and counts, over the queries:

- `converged`: ‖T(x_T) − x_T‖ ≤ tol at the last step (x_T a fixed point to `tol`);
- `energy_monotone`: E(x_t) never rose by more than 1e-12·max|E| (models with an energy);
- `at_target`: the stored pattern nearest to x_T is the target;
- `error_le_dense`: ‖x_T − ξ_μ‖ ≤ ‖x_T^dense − ξ_μ‖ (to 1e-9 relative), the corollary's
  comparison, which leans on Corollary 4.1 (a per-query counterexample to it is
  `tests/theory/counterexamples.py`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from nphcli.models import create_model
from nphcli.theory.energy import trace

MONOTONE_SLACK = 1e-12
ERROR_SLACK = 1e-9


def fixed_point_check(
    model: str,
    params: dict[str, Any],
    patterns: Tensor,
    queries: Tensor,
    targets: Tensor,
    positions: Tensor,
    *,
    steps: int,
    tol: float = 1e-6,
) -> dict[str, Any]:
    """The counts of the module docstring for `model` with `params` (β, k, ...), patterns (M, d),
    queries (Q, d), targets (Q,) and positions (Q,)."""
    X = patterns.to(torch.float64)
    x = queries.to(torch.float64)
    targets = targets.to(torch.int64)
    instance = create_model(model, **{**params, "steps": 1, "tol": 0.0})
    models = {"model": instance, "dense": create_model("dense", beta=instance.beta)}
    # One step beyond `steps` gives the residual at x_T.
    runs = {name: trace(m, x, X, steps + 1, positions=positions) for name, m in models.items()}
    out: dict[str, Any] = {"steps": steps, "tol": tol, "queries": int(x.shape[0])}
    errors = {}
    for name, run in runs.items():
        # x_T itself (the trace keeps only its last state, after steps + 1)
        one = dataclasses.replace(models[name], steps=steps, tol=0.0)
        x_T = one.retrieve(x, X, positions=positions).patterns  # (Q, d)
        errors[name] = torch.linalg.vector_norm(x_T - X[targets], dim=1)  # (Q,)
        nearest = torch.cdist(x_T, X).argmin(dim=1)  # (Q,)
        prefix = "" if name == "model" else "dense_"
        out[f"{prefix}converged"] = int((run.residual[steps] <= tol).sum())
        out[f"{prefix}at_target"] = int((nearest == targets).sum())
        if run.energy is None:
            out[f"{prefix}energy_monotone"] = None
        else:
            energies = run.energy[: steps + 1]
            slack = MONOTONE_SLACK * float(energies.abs().max())
            rises = (energies[1:] - energies[:-1]).amax(dim=0)  # (Q,)
            out[f"{prefix}energy_monotone"] = int((rises <= slack).sum())
        out[f"{prefix}error_mean"] = float(errors[name].mean())
    out["error_le_dense"] = int((errors["model"] <= errors["dense"] * (1 + ERROR_SLACK)).sum())
    return out
