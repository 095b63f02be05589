"""The model registry: each model registers itself by name; everything else looks it up here.

`nph models`, the README table, the CLI's `--model` choices and the parametrized tests all read
this registry, so a new model is one new module plus one import line in `models/__init__.py`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from nphcli.core.errors import NphError


@dataclass(frozen=True)
class ParamInfo:
    """One keyword parameter of a model, as `nph models` and `--help` show it."""

    name: str
    type: type
    default: Any
    help: str


@dataclass(frozen=True)
class ModelInfo:
    """A registered model: its class plus the text users read about it."""

    name: str
    cls: type
    summary: str  # one line
    formula: str  # the update rule T(x), in the README's notation
    cost: str  # time and extra memory of one update for Q queries and M memories

    @property
    def params(self) -> tuple[ParamInfo, ...]:
        return tuple(
            ParamInfo(f.name, _field_type(f), f.default, f.metadata.get("help", ""))
            for f in dataclasses.fields(self.cls)
            if f.init
        )


_MODELS: dict[str, ModelInfo] = {}
_TYPES = {"float": float, "int": int, "bool": bool, "str": str}


def _field_type(field: dataclasses.Field) -> type:
    # With `from __future__ import annotations` the annotation is a string such as "float".
    return _TYPES.get(field.type, field.type) if isinstance(field.type, str) else field.type


def register_model(name: str, *, summary: str, formula: str, cost: str):
    """Class decorator: add a `HopfieldModel` subclass to the registry under `name`."""

    def decorator(cls: type) -> type:
        if name in _MODELS:
            raise ValueError(f"model {name!r} is registered twice")
        cls.name = name
        _MODELS[name] = ModelInfo(name, cls, summary, formula, cost)
        return cls

    return decorator


def list_models() -> list[ModelInfo]:
    """All registered models, in registration order."""
    return list(_MODELS.values())


def model_names() -> list[str]:
    return list(_MODELS)


def get_model_info(name: str) -> ModelInfo:
    try:
        return _MODELS[name]
    except KeyError:
        raise NphError(
            f"unknown model {name!r}; choose one of: {', '.join(_MODELS)} (see `nph models`)"
        ) from None


def create_model(name: str, **params: Any):
    """Build model `name` with keyword parameters; a parameter it does not take is an error.

    Parameters whose value is None are treated as not given, so the CLI can pass every flag.
    """
    info = get_model_info(name)
    accepted = {p.name for p in info.params}
    given = {key: value for key, value in params.items() if value is not None}
    unknown = sorted(set(given) - accepted)
    if unknown:
        flags = ", ".join("--" + key.replace("_", "-") for key in unknown)
        takes = ", ".join("--" + key for key in sorted(accepted))
        raise NphError(f"model {name!r} does not take {flags}; it takes {takes}")
    return info.cls(**given)
