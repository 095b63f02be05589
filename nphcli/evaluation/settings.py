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
from nphcli.evaluation.corruption import Corruption
from nphcli.schema.catalog import get_card, model_cards
from nphcli.schema.fields import default, fields, get_field

# Fields held by `Corruption` and `IndexSettings` rather than by `RetrieveSettings` itself.
CORRUPTION_FIELDS = ("mask", "mask_mode", "fill", "noise", "noise_clip")
INDEX_FIELDS = ("nprobe", "ef", "candidates", "check_exact")
_FLAT = ("seed", "queries", "device", "dtype", "batch_size", "repeat", "memory_budget", "tf32")


@dataclass
class RetrieveSettings:
    """Everything that decides a retrieval run, apart from the memory and own queries. Each
    field is described (help, type, range) in `nphcli.schema.fields`."""

    model: str = default("model")  # a registered model name (`nph models`)
    params: dict[str, Any] = field(default_factory=dict)  # model parameters; None = its default
    corruption: Corruption = field(default_factory=Corruption)  # applied to every query
    queries: int | None = default("queries")  # queries drawn with the seed; None: all of them
    seed: int = default("seed")  # query choice, corruption, and the model's `seed` if it takes one
    device: str = default("device")  # cpu, cuda, cuda:N, mps or auto
    dtype: str = default("dtype")  # dtype of memories and queries during retrieval
    batch_size: int | None = default("batch_size")  # queries per model call; None: all
    repeat: int = default("repeat")  # times the timed retrieval runs (min and median reported)
    memory_budget: int | None = default("memory_budget")  # bytes of working memory; None: default
    index: IndexSettings | None = None  # retrieve over an approximate index (`nph index`)
    tf32: bool = default("tf32")  # float32 products on TF32 tensor cores (CUDA); changes results

    def __post_init__(self) -> None:
        for name in _FLAT:
            get_field(name).check(getattr(self, name))


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
    corruption = Corruption(**{name: chosen.get(name, default(name)) for name in CORRUPTION_FIELDS})
    index = None
    if chosen.get("index") is not None:
        check = {} if chosen.get("check_exact") is None else {"check_exact": chosen["check_exact"]}
        index = IndexSettings(
            path=str(chosen["index"]),
            **{name: chosen.get(name) for name in INDEX_FIELDS if name != "check_exact"},
            **check,
        )
    elif any(chosen.get(name) is not None for name in INDEX_FIELDS):
        raise NphError("--nprobe, --ef, --candidates and --check-exact go with --index")
    return RetrieveSettings(
        model=model,
        params=params,
        corruption=corruption,
        index=index,
        **{name: chosen.get(name, default(name)) for name in _FLAT},
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
        names = ", ".join(card.name for card in model_cards())
        raise NphError(f"unknown model {name!r}; choose one of: {names} (see `nph models`)")
    return card
