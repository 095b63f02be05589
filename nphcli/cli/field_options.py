"""Command-line options generated from the retrieval fields and the model catalog.

`with_fields(...)` gives a command one `--FLAG` per field named and per model parameter, so a new
field or model parameter is an option with no edit here. The command receives the options given
as one dict, `given`, which `field_values` parses for `nphcli.app.request.request_from`. Reads
no torch.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from nphcli.schema.fields import FIELDS, get_field, param_fields
from nphcli.schema.option import GROUPS, Field


def with_fields(
    names: Iterable[str] | None = None,
    *,
    params: bool = True,
    help: Mapping[str, str] | None = None,  # noqa: A002  (typer's own word for it)
    own: Iterable[Field] = (),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the command gets the fields `names` (all declared fields when None; `()` for
    none), with `params` every model parameter, and its own fields `own` (a command's options
    declared as fields, e.g. from `StoreOptions` in `nphcli.cli.store`) as options; it must take a
    `given: dict` keyword. `help` replaces a field's help text (default note included) where
    one command means it otherwise, e.g. a model that analyze only runs when asked."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        names_ = None if names is None else tuple(names)
        return _WithFields(command, names_, params, dict(help or {}), tuple(own))

    return decorate


def field_values(given: dict[str, Any], among: Iterable[Field] = ()) -> dict[str, list[Any]]:
    """The options given, parsed and checked: name → list of values (one for most fields,
    several for a comma list of a setting field). `among`: the command's own fields, which
    are looked up first and left out."""
    own = {f.name for f in among}
    out = {}
    for name, raw in given.items():
        if name in own:
            continue
        field = get_field(name)
        out[name] = [raw] if isinstance(raw, bool) else field.from_text(str(raw))
    return out


def own_values(given: dict[str, Any], own: Iterable[Field]) -> dict[str, Any]:
    """One checked value per field of `own` (a command's own options): the text given, parsed
    by the field, else the field's default; a file name as a `Path`."""
    out = {}
    for field in own:
        raw = given.get(field.name)
        if raw is None or isinstance(raw, bool):
            value = field.default if raw is None else raw
        else:
            value = field.one_from_text(str(raw))
        out[field.name] = Path(value) if field.kind == "path" and value is not None else value
    return out


class _WithFields:
    """A callable whose signature is the command's own plus the generated options (typer reads
    `__signature__` and `__annotations__` when it builds the CLI)."""

    def __init__(
        self,
        command: Callable[..., Any],
        names: tuple[str, ...] | None,
        params: bool,
        help: dict[str, str],  # noqa: A002
        own: tuple[Field, ...] = (),
    ):
        self._command, self._names, self._params, self._help = command, names, params, help
        self._own_fields = own
        for name in ("__name__", "__qualname__", "__module__", "__doc__"):
            setattr(self, name, getattr(command, name))

    def _own(self) -> inspect.Signature:
        signature = inspect.signature(self._command, eval_str=True)
        return signature.replace(
            parameters=[p for p in signature.parameters.values() if p.name != "given"]
        )

    def _fields(self) -> list[Field]:
        own = set(self._own().parameters)
        chosen = [f for f in FIELDS if self._names is None or f.name in self._names]
        if self._params:
            chosen += param_fields()
        chosen += [f for f in self._own_fields if f.name not in {c.name for c in chosen}]
        unknown = set(self._help) - {f.name for f in chosen}
        if unknown:  # a typo would silently keep the generic text
            raise ValueError(f"help for fields the command does not take: {sorted(unknown)}")
        return [f for f in chosen if f.name not in own]

    @property
    def __signature__(self) -> inspect.Signature:
        own = self._own()
        extra = [
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=False if f.kind == "bool" else None,
                annotation=_option(f, self._help.get(f.name)),
            )
            for f in self._fields()
        ]
        return own.replace(parameters=[*own.parameters.values(), *extra])

    @property
    def __annotations__(self) -> dict[str, Any]:
        return {p.name: p.annotation for p in self.__signature__.parameters.values()}

    def __call__(self, **kwargs: Any) -> Any:
        generated = {f.name for f in self._fields()}
        given = {}
        for name in list(kwargs):
            if name in generated:
                value = kwargs.pop(name)
                value = value.value if isinstance(value, enum.Enum) else value
                if value is not None and value is not False:
                    given[name] = value
        return self._command(**kwargs, given=given)


def _option(field: Field, help_text: str | None = None) -> Any:
    """The typer annotation of a field's option: a switch for booleans, else text parsed by
    the field itself (so a comma list works wherever the field takes many values). `help_text`,
    when given, is shown as it is instead of the field's help and default."""
    panel = GROUPS[field.group]
    flags = (field.flag, field.short) if field.short else (field.flag,)
    if field.kind == "bool":
        text = field.help if help_text is None else help_text
        return Annotated[bool, typer.Option(*flags, help=text, rich_help_panel=panel)]
    shown = "" if field.default is None else f"  [default: {field.default}]"
    # One value from a fixed list: click checks it (a usage error, exit 2) and --help lists it.
    kind: Any = str
    if field.choices is not None and not field.setting:
        kind = enum.Enum(field.name, {choice: choice for choice in field.choices}, type=str)
    return Annotated[
        kind | None,
        typer.Option(
            *flags,
            help=field.help + shown if help_text is None else help_text,
            metavar=None if kind is not str else field.metavar or _METAVARS.get(field.kind, "TEXT"),
            show_default=False,
            rich_help_panel=panel,
        ),
    ]


_METAVARS = {
    "int": "INTEGER",
    "float": "NUMBER",
    "size": "SIZE",
    "path": "PATH",
    "indices": "LIST",
    "str": "TEXT",
}
