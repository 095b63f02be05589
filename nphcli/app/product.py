"""Many retrieval settings in one process, evaluated on inputs read once: start-up and reading the
memory cost seconds, a small retrieval milliseconds. Each setting is an ordinary
`RetrieveSettings`, so its report is exactly what a single run gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from nphcli.evaluation.evaluate import evaluate_inputs
from nphcli.evaluation.inputs import Inputs
from nphcli.evaluation.report import RetrievalReport
from nphcli.evaluation.settings import build_model
from nphcli.schema.settings import RetrieveSettings


def evaluate_settings(
    inputs: Inputs, grid: Sequence[RetrieveSettings], models: Sequence[Any] | None = None
) -> list[RetrievalReport]:
    """Evaluate every setting of `grid` on the same `inputs` (read once), in order.

    Every model is built (unless given, one per setting) before the first retrieval, so a bad
    parameter fails before any work. The inputs' load time is reported by the first setting
    only (the others reuse them), so the reports' `total_s` add up to the wall time spent.
    """
    models = [build_model(settings) for settings in grid] if models is None else models
    reuse = dataclasses.replace(inputs, load_s=0.0)  # read once: later settings cost no load
    return [
        evaluate_inputs(inputs if i == 0 else reuse, settings, model)
        for i, (settings, model) in enumerate(zip(grid, models, strict=True))
    ]
