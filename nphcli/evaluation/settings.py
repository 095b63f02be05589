"""What decides one retrieval run (`RetrieveSettings`), checked when it is made; the settings
that many values of the fields give (`expand_settings`); and the model a setting builds.

Defaults and checks come from the fields (`nphcli.schema.fields`), so the Python API, the
command line, batch jobs and sweeps agree by construction.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nphcli.ann.settings import IndexSettings
from nphcli.core.errors import NphError
from nphcli.core.suggest import did_you_mean
from nphcli.evaluation.corruption import Corruption
from nphcli.schema.catalog import get_card, model_cards
from nphcli.schema.fields import default, fields, get_field, holder_fields
from nphcli.schema.holders import holds, route


@dataclass
@holds("run")
class RetrieveSettings:
    """Everything that decides a retrieval run, apart from the memory and own queries: one
    attribute per run field (`nphcli.schema.fields`: help, type, default, range), the model's
    parameters, and the corruption and index fields in their own holders."""

    model: str  # a registered model name (`nph models`)
    params: dict[str, Any] = field(default_factory=dict)  # model parameters; None = its default
    corruption: Corruption = field(default_factory=Corruption)  # applied to every query
    queries: int | None  # queries drawn with the seed; None: all of them
    seed: int  # query choice, corruption, and the model's `seed` if it takes one
    device: str  # cpu, cuda, cuda:N, mps or auto
    dtype: str  # dtype of memories and queries during retrieval
    batch_size: int | None  # queries per model call; None: all
    repeat: int  # times the timed retrieval runs (min and median reported)
    memory_budget: int | None  # bytes of working memory; None: default
    index: IndexSettings | None = None  # retrieve over an approximate index (`nph index`)
    tf32: bool  # float32 products on TF32 tensor cores (CUDA); changes results

    def __post_init__(self) -> None:  # after each field's own check (`holds`)
        if not isinstance(self.model, str):
            raise NphError(f"model must be a model's name (`nph models`), got {self.model!r}")
        _model_card(self.model)
        if not isinstance(self.params, Mapping) or not all(isinstance(k, str) for k in self.params):
            raise NphError(
                f"params must be a dict of parameter names, e.g. {{'k': 10}}, got {self.params!r}"
            )
        if not isinstance(self.corruption, Corruption):
            raise NphError(
                f"corruption must be a Corruption, e.g. nph.Corruption(noise=0.5), got "
                f"{self.corruption!r}"
            )


def expand_settings(values: Mapping[str, Sequence[Any]]) -> list[RetrieveSettings]:
    """Every combination of the values of the setting fields and model parameters in `values`
    (name → list of checked values; fields not given take their defaults).

    A model gets only the parameters it takes; a parameter that no listed model takes is an
    error. Order: models as listed, then model parameters in the order given, then the other
    fields in their declared order (mask before noise); the last varies fastest. With one seed,
    every setting draws the same queries and (for equal mask and noise) the same corruption.
    """
    values = {name: list(v) for name, v in values.items()}
    for name, given in values.items():
        if not given:
            raise NphError(f"{get_field(name).flag} needs at least one value")
    models = [str(name).strip() for name in values.pop("model", [default("model")])]
    cards = [_model_card(name) for name in models]
    declared = {f.name for f in fields(setting=True)}
    params = {name: v for name, v in values.items() if name not in declared}
    for name in params:
        if not any(card.takes(name) for card in cards):
            takers = [card.name for card in model_cards() if card.takes(name)]
            raise NphError(
                f"no listed model ({', '.join(models)}) takes --{name}; "
                + (f"it is taken by {', '.join(takers)}" if takers else "no model takes it")
            )
    axes = [(f.name, values[f.name]) for f in fields(setting=True) if f.name in values]
    out = []
    for card in cards:
        own = [(name, v) for name, v in params.items() if card.takes(name)]
        names = [name for name, _ in own + axes]
        for combo in itertools.product(*(v for _, v in own + axes)):
            chosen = dict(zip(names, combo, strict=True))
            given_params = {name: chosen.pop(name) for name, _ in own}
            out.append(settings_from(card.name, given_params, chosen))
    return out


def settings_from(
    model: str, params: dict[str, Any], chosen: Mapping[str, Any]
) -> RetrieveSettings:
    """One `RetrieveSettings` from single values of the setting fields (the rest: defaults)."""
    given = {name: value for name, value in chosen.items() if value is not None}
    index = None
    if "index" in given:
        index = IndexSettings(**route("index", {**given, "index": str(given["index"])}))
    elif route("index", given):
        flags = [f.flag for f in holder_fields("index") if f.name != "index"]
        raise NphError(f"{', '.join(flags[:-1])} and {flags[-1]} go with --index")
    run = {key: value for key, value in route("run", chosen).items() if key != "model"}
    return RetrieveSettings(
        model=model,
        params=params,
        corruption=Corruption(**route("corruption", chosen)),
        index=index,
        **run,
    )


def given_params(settings: RetrieveSettings) -> str:
    """The parameters a setting sets explicitly, as `k=10 beta=0.5` (for compact tables)."""
    return " ".join(
        f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}"
        for name, value in settings.params.items()
    )


def build_model(settings: RetrieveSettings):
    """The model of `settings`: its own defaults for parameters not given, and the run's seed
    for models that take a `seed`, so one --seed reproduces the whole run."""
    from nphcli.models import create_model, get_model_info

    params = dict(settings.params)
    takes = {p.name for p in get_model_info(settings.model).params}
    if "seed" in takes and params.get("seed") is None:
        params["seed"] = settings.seed
    return create_model(settings.model, **params)


def _model_card(name: str):
    card = get_card(name)
    if card is None:
        names = [card.name for card in model_cards()]
        raise NphError(
            f"unknown model {name!r}{did_you_mean(name, names)}; choose one of: "
            f"{', '.join(names)} (see `nph models`)"
        )
    return card
