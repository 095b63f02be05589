"""The objects that hold field values (`RetrieveSettings`, `Corruption`, `IndexSettings`,
`InputSpec`, `OutputSpec`, `AnalysisRequest`), made to agree with the fields by construction.

`@holds("corruption")` on a dataclass (below `@dataclass`) gives it one attribute per field of
that holder (`Field.holder`): an attribute the class declares keeps its type and comment and
takes the field's default (a default of its own is refused unless it is the field's), and a
field the class does not declare is added, so a new field is never silently dropped. Every
instance checks each of those values with its field (type, range, choices) before the class's
own `__post_init__` checks how they combine. `route(holder, values)` picks a holder's keyword
arguments out of field values by name, so no caller keeps a list of which field goes where.

Torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from nphcli.core.errors import NphError
from nphcli.schema.fields import Field, holder_fields

T = TypeVar("T")
_MISSING = object()


def holds(holder: str, *, also: tuple[str, ...] = ()) -> Callable[[type[T]], type[T]]:
    """Class decorator (apply it below `@dataclass`): the class holds every field of `holder`
    (and the declared fields named in `also`, e.g. the retrieval fields `nph analyze` shares)."""
    from nphcli.schema.fields import get_field

    def decorate(cls: type[T]) -> type[T]:
        held = [*holder_fields(holder), *(get_field(name) for name in also)]
        if "__annotations__" not in cls.__dict__:
            cls.__annotations__ = {}
        annotations = cls.__dict__["__annotations__"]
        for f in held:
            own = cls.__dict__.get(f.key, _MISSING)
            if own is not _MISSING and own != f.default:
                raise TypeError(
                    f"{cls.__name__}.{f.key} defaults to {own!r}, but its field {f.name!r} "
                    f"says {f.default!r}: take the default from the field"
                )
            annotations.setdefault(f.key, "Any")
            setattr(cls, f.key, f.default)
        cls.__held_fields__ = tuple(held)
        own_check = cls.__dict__.get("__post_init__")

        def __post_init__(self) -> None:  # noqa: N807  (the dataclass hook)
            for f in held:
                f.check(getattr(self, f.key), f.flag)
            if own_check is not None:
                own_check(self)

        def __new__(klass, *args: Any, **kwargs: Any):  # noqa: N807
            # An unknown keyword would be a TypeError from the generated __init__: say it once,
            # with the names the class takes.
            takes = {f.name for f in dataclasses.fields(klass) if f.init}
            unknown = [key for key in kwargs if key not in takes]
            if unknown:
                raise NphError(
                    f"{klass.__name__} takes no {unknown[0]!r}; it takes {', '.join(sorted(takes))}"
                )
            return object.__new__(klass)

        cls.__post_init__ = __post_init__
        cls.__new__ = staticmethod(__new__)
        return cls

    return decorate


def held(cls: type) -> tuple[Field, ...]:
    """The fields a `@holds` class holds."""
    return cls.__held_fields__


def route(holder: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `holder` among single field values (name → value): each field of
    the holder that `values` names, under its attribute name."""
    return {f.key: values[f.name] for f in holder_fields(holder) if f.name in values}


def record(obj: Any) -> dict[str, Any]:
    """Every held value of a `@holds` instance, by field name (what a report records)."""
    return {f.name: getattr(obj, f.key) for f in held(type(obj))}


def complete(recorded: dict[str, Any], obj: Any, *, aliases: Mapping[str, str] = ()) -> dict:
    """`recorded` (a report's record of `obj`, some values resolved, e.g. a default budget) with
    every held value it lacks added by field name, so a new field is recorded without an edit
    here. `aliases`: field name → the key the record already keeps it under."""
    aliases = dict(aliases)
    for f in held(type(obj)):
        recorded.setdefault(aliases.get(f.name, f.name), getattr(obj, f.key))
    return recorded


def check_complete(cls: type) -> None:
    """Refuse a holder dataclass whose attributes miss one of its fields (a sanity check for
    tests: `@holds` adds them, so this fails only if the decorator was left out)."""
    names = {f.name for f in dataclasses.fields(cls)}
    missing = [f.key for f in held(cls) if f.key not in names]
    if missing:
        raise TypeError(f"{cls.__name__} lacks the fields {missing}")
