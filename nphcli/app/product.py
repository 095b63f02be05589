"""Many retrieval settings in one process (`nphcli.evaluation.settings.expand_settings`),
evaluated on inputs read once.

Start-up (importing torch) costs seconds, the retrieval of a small memory milliseconds, so a
script that compares settings should pay for start-up and for reading the memory once. Each
setting is an ordinary `RetrieveSettings`, so its report is exactly what a single run gives;
with one seed every setting draws the same queries and (for equal mask and noise) the same
corruption. Not to be confused with `nphcli.sweeps.grid`, the sweep's grid over memory sizes and
trials.
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
