"""Traces of iterated retrieval: the energy E(x_t) and the step ‖T(x_t) − x_t‖ along x ← T(x).

The energies themselves are the models' (`HopfieldModel.energy`, built from the formulas in
`nphcli.engine.energy`); models without one (linear, random-feature) give None, and a trace then
records the steps alone. Everything here is float64.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.models import create_model


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
