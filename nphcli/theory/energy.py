"""Iterated retrieval x ← T(x), traced and checked. Everything here is float64.

Traces: the energy E(x_t) and the step ‖T(x_t) − x_t‖ along the iterations. The energies
themselves are the models' (`HopfieldModel.energy`, built from the formulas in
`nphcli.engine.energy`); models without one (linear, random-feature) give None, and a trace then
records the steps alone.

Checked: fixed-point convergence (Hu et al. 2025, Corollary 4.3), which says iterating a
sparse-structured model x ← T(x) converges to a fixed point whose retrieval error is no larger
than dense retrieval's. For queries x_0 (Q, d) with targets μ, `fixed_point_check` runs `steps`
iterations of the model and of dense retrieval with the same β (`trace`) and counts, over the
queries:

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

from nphcli.core.errors import NphError
from nphcli.models import create_model

MONOTONE_SLACK = 1e-12
ERROR_SLACK = 1e-9


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
                item["energy_rise_max"] = None if t == 0 else float((e - self.energy[t - 1]).max())
            else:
                item["energy_mean"] = item["energy_max"] = item["energy_rise_max"] = None
            r = None if t == self.residual.shape[0] else self.residual[t]  # none after the last
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
        energy=torch.stack(energies) if energies else None, residual=torch.stack(residuals), final=x
    )


def trace_report(memory: Any, report: Any) -> Trace:
    """The `trace` of a `RetrievalReport`'s run on a loaded, auto-associative `memory`: the same
    model and parameters, its corrupted queries and positions, `steps` iterations."""
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
