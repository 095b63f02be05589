"""`nph attractors`: what iterated retrieval converged to, per setting, with three pictures.

On the memory read once: the attractor diagnostics of every query (`evaluation.attractors`), the
energy along the iterations of the first `traced` queries, and a basin picture of the plane
x(u, v) = ξ_a + u(ξ_b − ξ_a) + v(ξ_c − ξ_a), u, v ∈ [−¼, 1¼]. Writes sizes.png, energy.png,
basins.png and attractors.json into a folder and returns what the JSON holds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from nphcli.core.atomic import atomic_write
from nphcli.core.errors import NphError

BASIN_RANGE = (-0.25, 1.25)


def attractor_study(
    values: Mapping[str, Sequence[Any]],
    folder: str | Path,
    *,
    corners: Sequence[int] = (0, 1, 2),
    resolution: int = 41,
    traced: int = 20,
) -> dict[str, Any]:
    """Run the study of the module docstring; `values` are retrieve's field values."""
    from nphcli.app.request import request_from
    from nphcli.evaluation.evaluate import evaluate_inputs
    from nphcli.evaluation.inputs import read_inputs
    from nphcli.evaluation.settings import build_model
    from nphcli.presentation.attractor_plots import plot_basins, plot_energy, plot_sizes

    folder = Path(folder)
    if not folder.is_dir():
        raise NphError(f"--pictures {folder} is not a folder; create it first")
    if resolution < 2 or traced < 1:
        raise NphError("--resolution must be ≥ 2 and --traced ≥ 1")
    request = request_from(values)
    inputs = read_inputs(request.inputs)
    memory = inputs.memory
    if memory.hetero:
        raise NphError("nph attractors needs an auto-associative memory (no separate values)")
    if len(set(corners)) != 3 or not all(0 <= c < memory.num_memories for c in corners):
        raise NphError(
            f"--basin takes three different stored rows in [0, {memory.num_memories}), "
            f"got {list(corners)}"
        )
    rows = []
    for settings in request.settings:
        model = build_model(settings)
        if model.steps <= 1:
            raise NphError("nph attractors needs iterated retrieval: give --steps > 1")
        report = evaluate_inputs(inputs, settings, model)
        rows.append(_row(model, settings, report, memory, corners, resolution, traced))
    plot_sizes(rows, folder / "sizes.png")
    plot_energy(rows, folder / "energy.png")
    plot_basins(rows, folder / "basins.png")
    result = {"memory": str(request.inputs.memory), "M": memory.num_memories, "settings": rows}
    with atomic_write(folder / "attractors.json", force=True) as tmp:
        tmp.write_text(json.dumps(result) + "\n")
    return result


def _row(model, settings, report, memory, corners, resolution, traced) -> dict[str, Any]:
    from nphcli.presentation.plot_data import short
    from nphcli.theory.energy import trace

    per_query = report.per_query
    given = {k: v for k, v in settings.params.items() if k != "steps" and v is not None}
    # the model first: a row of `--model dense,sparse` is never just `beta=0.1`
    name = " ".join([settings.model, *(f"{k}={short(v)}" for k, v in given.items())])
    queries, rows = report.queries[:traced], per_query["query_row"][:traced]
    shown = trace(model, queries, memory.patterns, model.steps, positions=rows)
    metrics = report.metrics
    return {
        "model": settings.model,
        "params": given,
        "short": name,
        "success": metrics["success"]["mean"] if metrics.get("success") else None,
        **{kind: metrics[kind]["mean"] for kind in ("at_pattern", "at_metastable", "at_global")},
        "sizes": per_query["attractor_size"].tolist(),
        "steps": per_query["steps"].tolist(),
        "energy_trace": None if shown.energy is None else shown.energy.tolist(),
        "basin": basin(model, memory, corners, resolution),
    }


def basin(model, memory, corners: Sequence[int], resolution: int) -> dict[str, Any]:
    """Labels (n, n) of the plane's queries (module docstring): rows v, columns u."""
    from nphcli.evaluation.attractors import diagnose
    from nphcli.evaluation.metrics import nearest

    patterns = memory.patterns
    a, b, c = (patterns[i].to(torch.float64) for i in corners)
    steps = torch.linspace(*BASIN_RANGE, resolution, dtype=torch.float64)  # (n,)
    v, u = torch.meshgrid(steps, steps, indexing="ij")  # (n, n) each
    plane = a + u.reshape(-1, 1) * (b - a) + v.reshape(-1, 1) * (c - a)  # (n², d)
    queries = plane.to(patterns.dtype)
    positions = torch.full((queries.shape[0],), int(corners[0]))
    final = model.retrieve(queries, memory, positions=positions).patterns  # (n², d)
    index, _ = nearest(final, memory)
    kinds = diagnose(model, final, memory, index, positions)["attractor"]  # (n²,)
    labels = torch.where(kinds == 0, index, torch.where(kinds == 1, -1, -2))
    return {
        "corners": [int(i) for i in corners],
        "range": list(BASIN_RANGE),
        "labels": labels.view(resolution, resolution).tolist(),
    }
