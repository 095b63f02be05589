"""Every option of a retrieval, derived from the settings classes and the model catalog: `FIELDS`
in `--help` order, `ANALYSIS_FIELDS`, and model parameters (`param_fields`). `nph retrieve`'s
options and the keys of a batch job or sweep file are these, so no surface keeps its own list.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nphcli.core.errors import NphError
from nphcli.core.suggest import did_you_mean
from nphcli.schema.option import Field, options_of
from nphcli.schema.settings import AnalysisOptions, InputSpec, OutputSpec, RetrieveSettings, Spread

FIELDS: tuple[Field, ...] = (
    *options_of(InputSpec, "input"),
    *options_of(RetrieveSettings, "run"),
    *options_of(Spread, "distributed"),
    *options_of(OutputSpec, "output"),
)
ANALYSIS_FIELDS: tuple[Field, ...] = options_of(AnalysisOptions, "analysis")
_BY_NAME = {f.name: f for f in FIELDS}


def get_field(name: str, among: Iterable[Field] = ()) -> Field | None:
    """The field called `name` (first among a command's own fields `among`, then the declared
    ones), or a model parameter's field, or None."""
    found = {f.name: f for f in among}.get(name) or _BY_NAME.get(name)
    return found if found is not None else _param_fields().get(name)


def fields(*, setting: bool | None = None, surface: str | None = None) -> list[Field]:
    """The declared fields (not model parameters): all, or only those that decide a setting
    (`setting=True`) or only the others (False); those `surface` (batch, sweep) refuses are left
    out."""
    return [
        f
        for f in FIELDS
        if (setting is None or f.setting == setting)
        and (surface is None or surface not in f.refused)
    ]


def param_fields() -> list[Field]:
    """One field per model parameter (from the model catalog), each taking many values."""
    return list(_param_fields().values())


def default(name: str) -> Any:
    """The default of a declared field (the one place defaults live)."""
    return _BY_NAME[name].default


def check_keys(keys: Iterable[str], surface: str, where: str) -> None:
    """Refuse, by name, keys that are no field or model parameter, and fields `surface` refuses
    (with the reason)."""
    params = _param_fields()
    for key in keys:
        field = _BY_NAME.get(key)
        if field is not None and surface in field.refused:
            raise NphError(f"{where} does not take {key!r}: {field.refused[surface]}")
        if key not in _BY_NAME and key not in params:
            taken = [f.name for f in fields(surface=surface)]
            hint = did_you_mean(key, [*taken, *params])
            raise NphError(
                f"{where}: unknown key {key!r}{hint}; keys are {', '.join(taken)} and model "
                "parameters by name (`nph models`)"
            )


def _param_fields() -> dict[str, Field]:
    """Model parameters as fields: their type, default and help from the catalog."""
    from nphcli.schema.catalog import model_cards, param_cards

    total = len(model_cards())
    out = {}
    for card, models in param_cards():
        if card.name in _BY_NAME:  # the run's --seed also seeds a model that takes one
            continue
        takers = "every model" if len(models) == total else ", ".join(models)
        text = card.help[:1].upper() + card.help[1:]
        out[card.name] = Field(
            card.name,
            card.type,
            None,
            f"{text} [model default: {card.default}; taken by {takers}].",
            group="model",
        )
    return out
