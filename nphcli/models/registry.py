"""The model registry: each model registers itself by name; everything else looks it up here, so a
new model is one new module plus one import line in `models/__init__.py`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nphcli.core.errors import NphError
from nphcli.core.suggest import did_you_mean
from nphcli.schema.catalog import ParamCard
from nphcli.schema.fields import FIELDS

if TYPE_CHECKING:  # base.py imports this module's decorator users, not this module
    from nphcli.models.base import Retriever


@dataclass(frozen=True)
class ModelInfo:
    """A registered model: its class plus the text users read about it."""

    name: str
    cls: type
    summary: str  # one line
    formula: str  # the update rule T(x), in the README's notation
    cost: str  # time and extra memory of one update for Q queries and M memories

    @property
    def params(self) -> tuple[ParamCard, ...]:
        """Its keyword parameters, as `nph models` and `--help` show them."""
        return tuple(
            ParamCard(f.name, _type_name(f.type), f.default, f.metadata.get("help", ""))
            for f in dataclasses.fields(self.cls)
            if f.init
        )


_MODELS: dict[str, ModelInfo] = {}


def _type_name(annotation: Any) -> str:
    # With `from __future__ import annotations` the annotation is a string such as "float".
    return annotation if isinstance(annotation, str) else annotation.__name__


def register_model(name: str, *, summary: str, formula: str, cost: str):
    """Class decorator: add a `HopfieldModel` subclass to the registry under `name`."""

    def decorator(cls: type) -> type:
        if name in _MODELS:
            raise ValueError(f"model {name!r} is registered twice")
        info = ModelInfo(name, cls, summary, formula, cost)
        _refuse_field_names(info)
        cls.name = name
        _MODELS[name] = info
        return cls

    return decorator


# Parameters that may share a run field's name: the run's --seed also seeds a model taking one.
SHARED_WITH_RUN = ("seed",)


def _refuse_field_names(info: ModelInfo) -> None:
    """Refuse a parameter named like a run option (one flag, two meanings)."""
    taken = {f.name for f in FIELDS} - set(SHARED_WITH_RUN)
    clash = [p.name for p in info.params if p.name in taken]
    if clash:
        raise ValueError(
            f"model {info.name!r}: parameter(s) {', '.join(clash)} are named like run options "
            f"(--{clash[0].replace('_', '-')}); rename them"
        )


def list_models() -> list[ModelInfo]:
    """All registered models in registration order, the baselines last."""
    return sorted(_MODELS.values(), key=lambda info: (info.cls.baseline, info.cls.binary))


def model_names() -> list[str]:
    return [info.name for info in list_models()]


def layer_model_names() -> list[str]:
    """The models that are also layers (every model but the baselines)."""
    return [info.name for info in list_models() if not info.cls.baseline]


def get_model_info(name: str) -> ModelInfo:
    try:
        return _MODELS[name]
    except KeyError:
        raise NphError(
            f"unknown model {name!r}{did_you_mean(name, _MODELS)}; choose one of: "
            f"{', '.join(_MODELS)} (see `nph models`)"
        ) from None


def create_model(name: str, **params: Any) -> Retriever:
    """Build the retrieval rule `name` with its keyword parameters.

    Args:
        name: a registered model (`list_models()`, `nph models`), e.g. "topk".
        **params: its parameters by name (`nph models` lists each model's), e.g. k=10,
            beta=0.5; None counts as not given, so the CLI can pass every flag. A parameter
            the model does not take is an `NphError`.

    Returns:
        The rule, to apply as often as needed: `model.retrieve(queries, memory)`.

    Example:
        >>> import nphcli as nph
        >>> rule = nph.create_model("topk", k=10, beta=0.5)
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
