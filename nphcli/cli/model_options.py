"""Model parameters as command-line options, generated from the model catalog.

A command decorated with `with_model_options` gets one `--NAME` option per parameter any model
takes (unless the command declares that option itself), so a newly registered model's
parameters work in `nph retrieve` and `nph analyze` with no edit here. The options are
rebuilt from `nphcli.catalog` each time the CLI is built, which reads no torch.

Values are text, parsed and type-checked against the catalog: a number, or a comma list of
numbers where the command accepts lists (`parse_values`). The command receives them as one
dict, `model_params` (name → text, only the options given).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from nphcli.catalog import ParamCard, model_cards, param_cards
from nphcli.errors import NphError

_PARSERS: dict[str, Callable[[str], Any]] = {"float": float, "int": int, "str": str}
_METAVARS = {"float": "NUMBER", "int": "INTEGER", "bool": "BOOLEAN"}


def parse_values(card: ParamCard, text: str) -> list[Any]:
    """The values of `--NAME TEXT`: one, or several separated by commas, each of the card's
    type (a whole number for int parameters)."""
    parts = [part.strip() for part in text.split(",")]
    if card.type == "bool":
        return [_parse_bool(card, part) for part in parts]
    parse = _PARSERS.get(card.type, str)
    values = []
    for part in parts:
        try:
            values.append(parse(part))
        except ValueError:
            kind = "a whole number" if card.type == "int" else "a number"
            raise NphError(
                f"--{card.name} takes {kind} (or a comma list of them), got {text!r}"
            ) from None
    return values


def parse_single(name: str, text: str) -> Any:
    """The one value of `--NAME TEXT`; a list is an error."""
    card = _card(name)
    values = parse_values(card, text)
    if len(values) != 1:
        raise NphError(f"--{name} takes one value here, got {text!r}")
    return values[0]


def parse_lists(model_params: dict[str, str]) -> dict[str, list[Any]]:
    """Every given `--NAME TEXT` as its list of values (one or more)."""
    return {name: parse_values(_card(name), text) for name, text in model_params.items()}


def with_model_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command` with the catalog's model parameters added as options (see the module
    docstring); it must take a `model_params: dict[str, str]` keyword argument."""
    return _WithModelOptions(command)


class _WithModelOptions:
    """A callable whose signature is the command's own plus the model options of the moment
    (typer reads `__signature__` and `__annotations__` when it builds the CLI)."""

    def __init__(self, command: Callable[..., Any]):
        self._command = command
        self.__name__ = command.__name__
        self.__qualname__ = command.__qualname__
        self.__module__ = command.__module__
        self.__doc__ = command.__doc__

    def _own(self) -> inspect.Signature:
        signature = inspect.signature(self._command, eval_str=True)
        return signature.replace(
            parameters=[p for p in signature.parameters.values() if p.name != "model_params"]
        )

    def _extra(self) -> list[inspect.Parameter]:
        own = set(self._own().parameters)
        total = len(model_cards())
        return [
            inspect.Parameter(
                card.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[
                    str | None,
                    typer.Option(
                        f"--{card.name}",
                        help=_help(card, models, total),
                        metavar=_METAVARS.get(card.type, "TEXT"),
                    ),
                ],
            )
            for card, models in param_cards()
            if card.name not in own
        ]

    @property
    def __signature__(self) -> inspect.Signature:
        own = self._own()
        return own.replace(parameters=[*own.parameters.values(), *self._extra()])

    @property
    def __annotations__(self) -> dict[str, Any]:
        return {p.name: p.annotation for p in self.__signature__.parameters.values()}

    def __call__(self, **kwargs: Any) -> Any:
        own = set(self._own().parameters)
        model_params = {name: kwargs.pop(name) for name in list(kwargs) if name not in own}
        given = {name: text for name, text in model_params.items() if text is not None}
        return self._command(**kwargs, model_params=given)


def _help(card: ParamCard, models: list[str], total: int) -> str:
    text = card.help[:1].upper() + card.help[1:]
    takers = "every model" if len(models) == total else ", ".join(models)
    return f"{text} [model default: {card.default}; taken by {takers}]."


def _card(name: str) -> ParamCard:
    for card, _ in param_cards():
        if card.name == name:
            return card
    raise NphError(f"no model takes --{name}")


def _parse_bool(card: ParamCard, text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise NphError(f"--{card.name} takes true or false, got {text!r}")
