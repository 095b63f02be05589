"""Many retrieval settings in one process: the product of lists of models, model parameters,
masks and noise levels, evaluated on inputs read once.

Start-up (importing torch) costs seconds, the retrieval of a small memory milliseconds, so a
script that compares settings should pay for start-up and for reading the memory once. Each
setting is an ordinary `RetrieveSettings`, so its report is exactly what a single run gives;
with one seed every setting draws the same queries and (for equal mask and noise) the same
corruption. Not to be confused with `nphcli.sweeps.grid`, the sweep's grid over memory sizes and
trials.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from nphcli.catalog import ParamCard, get_card, model_cards
from nphcli.errors import NphError
from nphcli.evaluation.evaluate import evaluate, evaluate_inputs
from nphcli.evaluation.inputs import Inputs
from nphcli.evaluation.report import RetrievalReport
from nphcli.evaluation.settings import RetrieveSettings, build_model


def settings_product(
    base: RetrieveSettings,
    *,
    models: Sequence[str],
    params: Mapping[str, Sequence[Any]] | None = None,
    masks: Sequence[float] | None = None,
    noises: Sequence[float] | None = None,
) -> list[RetrieveSettings]:
    """Every combination of `models` × the values of each parameter × `masks` × `noises`, each a
    copy of `base`. A model gets only the parameters it takes; a parameter that no listed model
    takes is an error. Order: models as listed, then parameters in the order given, then mask,
    then noise (the last varies fastest). `masks` / `noises` default to `base`'s corruption."""
    params = dict(params or {})
    if not models:
        raise NphError("--model needs at least one model name")
    cards = [_model_card(name) for name in models]
    for name, values in params.items():
        if not values:
            raise NphError(f"--{name} needs at least one value")
        if not any(card.takes(name) for card in cards):
            takers = [card.name for card in model_cards() if card.takes(name)]
            raise NphError(
                f"no listed model ({', '.join(models)}) takes --{name}; "
                + (f"it is taken by {', '.join(takers)}" if takers else "no model takes it")
            )
        for card in cards:
            for param in card.params:
                if param.name == name:
                    for value in values:
                        check_param_value(param, value)
    masks = [base.corruption.mask] if masks is None else list(masks)
    noises = [base.corruption.noise] if noises is None else list(noises)
    if not masks or not noises:
        raise NphError("--mask and --noise need at least one value")
    grid = []
    for card in cards:
        own = {name: values for name, values in params.items() if card.takes(name)}
        for combo in itertools.product(*own.values(), masks, noises):
            *values, mask, noise = combo
            grid.append(
                dataclasses.replace(
                    base,
                    model=card.name,
                    params={**base.params, **dict(zip(own, values, strict=True))},
                    corruption=dataclasses.replace(base.corruption, mask=mask, noise=noise),
                )
            )
    return grid


def evaluate_settings(inputs: Inputs, grid: Sequence[RetrieveSettings]) -> list[RetrievalReport]:
    """Evaluate every setting of `grid` on the same `inputs` (read once), in order.

    Every model is built before the first retrieval, so a bad parameter fails before any work.
    The inputs' load time is reported by the first setting only (the others reuse them), so the
    reports' `total_s` add up to the wall time spent.
    """
    for settings in grid:
        build_model(settings)
    reports = []
    for i, settings in enumerate(grid):
        if i == 0:
            reports.append(evaluate_inputs(inputs, settings))
            continue
        reports.append(
            evaluate(
                inputs.memory,
                settings,
                queries=inputs.queries,
                targets=inputs.targets,
                target_indices=inputs.target_indices,
                sources=inputs.sources,
            )
        )
    return reports


def check_param_value(card: ParamCard, value: Any) -> None:
    """Refuse a value of the wrong type for parameter `card` (e.g. from a JSON job), so that
    the model's own range checks only ever see numbers of its type."""
    if card.type == "bool":
        ok = isinstance(value, bool)
    elif card.type == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif card.type == "float":
        ok = (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(float(value))
        )
    else:
        ok = isinstance(value, str)
    if not ok:
        kind = {"int": "a whole number", "float": "a finite number", "bool": "true or false"}
        raise NphError(f"--{card.name} takes {kind.get(card.type, 'text')}, got {value!r}")


def given_params(settings: RetrieveSettings) -> str:
    """The parameters a setting sets explicitly, as `k=10 beta=0.5` (for compact tables)."""
    return " ".join(
        f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}"
        for name, value in settings.params.items()
    )


def _model_card(name: str):
    card = get_card(name)
    if card is None:
        names = ", ".join(card.name for card in model_cards())
        raise NphError(f"unknown model {name!r}; choose one of: {names} (see `nph models`)")
    return card
