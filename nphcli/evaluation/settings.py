"""The settings that many values of the options give (`expand_settings`), and the model a
setting builds (`build_model`).

`RetrieveSettings` itself, with its defaults and ranges, is declared in
`nphcli.schema.settings`; the command line, batch jobs, sweeps and the Python API all build it
through `settings_from`, so they agree by construction.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from nphcli.core.errors import NphError
from nphcli.schema.catalog import model_card, model_cards
from nphcli.schema.fields import default, fields, get_field
from nphcli.schema.option import arguments, options_of, values_of
from nphcli.schema.settings import Corruption, IndexSettings, RetrieveSettings


def expand_settings(values: Mapping[str, Sequence[Any]]) -> list[RetrieveSettings]:
    """Every combination of the values of the setting options and model parameters in `values`
    (name → list of checked values; options not given take their defaults).

    A model gets only the parameters it takes; a parameter that no listed model takes is an
    error. Order: models as listed, then model parameters in the order given, then the other
    options in their declared order (mask before noise); the last varies fastest. With one seed,
    every setting draws the same queries and (for equal mask and noise) the same corruption.
    """
    values = {name: list(v) for name, v in values.items()}
    for name, given in values.items():
        if not given:
            raise NphError(f"{get_field(name).flag} needs at least one value")
    models = [str(name).strip() for name in values.pop("model", [default("model")])]
    cards = [model_card(name) for name in models]
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
    """One `RetrieveSettings` from single values of the setting options, by option name (the
    rest: defaults)."""
    given = {name: value for name, value in chosen.items() if value is not None}
    index = None
    if "index" in given:
        index = IndexSettings(**arguments(IndexSettings, {**given, "index": str(given["index"])}))
    elif arguments(IndexSettings, given):
        flags = [f.flag for f in options_of(IndexSettings) if f.name != "index"]
        raise NphError(f"{', '.join(flags[:-1])} and {flags[-1]} go with --index")
    return RetrieveSettings(
        model=model,
        params=params,
        corruption=Corruption(**arguments(Corruption, chosen)),
        index=index,
        **arguments(RetrieveSettings, {k: v for k, v in chosen.items() if k != "model"}),
    )


def setting_values(settings: RetrieveSettings) -> dict[str, Any]:
    """Every setting option's value in `settings`, by option name, in declared order (those of
    its `Corruption`, and of its `IndexSettings` when it has one, in their place)."""
    index = {} if settings.index is None else values_of(settings.index)
    own = {**values_of(settings), **values_of(settings.corruption), **index}
    return {option.name: own[option.name] for option in fields(setting=True) if option.name in own}


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
