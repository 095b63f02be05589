"""A command-line option (`Field`), and the declaration of a setting that gives one.

A setting is a field of an ordinary dataclass, declared with `setting(default, help, ...)` beside
the attribute that receives it; `options_of(cls)` reads those declarations back as `Field`s, from
which every surface derives: a command's `--FLAG`, an `nph batch` job's key, a sweep file's key.
A setting field takes many values (a comma list, or a JSON/TOML list): every combination is one
setting. Torch-free, so that building the command line reads no torch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from typing_extensions import Unpack

from nphcli.core.errors import NphError

# Groups of options, each with the title of its `--help` panel, in the order `--help` shows
# them. Those of SETTING_GROUPS decide a setting (what `RetrieveSettings` holds, its `Corruption`
# and `IndexSettings` included); the others say what is read, how the work is spread and what is
# written.
GROUPS = {
    "input": "Input",
    "model": "Model and its parameters",
    "corruption": "Corruption",
    "run": "Run",
    "device": "Device",
    "index": "Approximate index",
    "distributed": "Distributed",
    "output": "Output",
    "analysis": "Analysis",
}
SETTING_GROUPS = ("model", "corruption", "run", "device", "index")

_KIND_WORDS = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "str": "text",
    "path": "a file name",
    "size": "a size in bytes",
    "indices": "a list of whole numbers",
}
_OPTION = "nph.option"  # the dataclass field metadata key of a setting's declaration
_NESTED = "nph.nested"  # ... of a field holding another settings class (its options join in)


@dataclass(frozen=True)
class Field:
    """One option: its name is the key in JSON jobs and sweep files and (usually) the attribute
    of the settings class that receives it; its flag is `--` + the name with `-` for `_`."""

    name: str
    kind: str  # int, float, bool, str, path, size (bytes; text such as 64M) or indices
    default: Any  # None: unset (the help says what that means)
    help: str  # one sentence for `--help`, the CLI reference and the docs
    group: str = "run"  # one of GROUPS
    minimum: float | None = None  # numbers: smallest value allowed (inclusive)
    above: float | None = None  # numbers: values must exceed this (exclusive)
    choices: tuple[str, ...] | None = None  # text: the values allowed
    refused: dict[str, str] = field(default_factory=dict)  # surface → why it refuses the field
    metavar: str | None = None
    maximum: float | None = None  # numbers: largest value allowed (inclusive)
    meaning: str | None = None  # what a value is, for errors: "a fraction", "a standard deviation"
    hint: str = ""  # said after a range error, e.g. how to convert a variance
    short: str | None = None  # a one-letter flag beside the long one, e.g. -o

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"field {self.name!r}: unknown group {self.group!r}")

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def setting(self) -> bool:
        """Whether the field decides a setting (and so takes many values: a comma list on the
        command line, a list in a file)."""
        return self.group in SETTING_GROUPS

    def from_text(self, text: str) -> list[Any]:
        """The value(s) of `--FLAG TEXT`: a comma list for fields that take many values."""
        if self.kind == "indices":
            return [self.check(_indices(text, self.flag))]
        parts = [part.strip() for part in text.split(",")] if self.setting else [text.strip()]
        values = [self.check(self._parse(part, text)) for part in parts]
        if self.setting and len(values) > 1 and self.kind in ("path",):
            raise NphError(f"{self.flag} takes one value, got {text!r}")
        return values

    def one_from_text(self, text: str) -> Any:
        """One value of `--FLAG TEXT`, commas and all: a command's own option whose text is one
        value, even a list it reads itself (`nph mil --models dense,sparse`)."""
        if self.kind == "indices":
            return self.check(_indices(text, self.flag))
        return self.check(self._parse(text.strip(), text, listed=False))

    def from_json(self, value: Any, where: str) -> list[Any]:
        """The value(s) of a JSON or TOML value: a list means several values, for fields that
        take many (`where` names the key for the error)."""
        if self.kind == "indices":
            return [self.check(value, where)]
        if isinstance(value, list):
            if not self.setting:
                raise NphError(f"{where} takes one value, got a list {value!r}")
            if not value:
                raise NphError(f"{where} needs at least one value")
            return [self.check(self._coerce(v, where), where) for v in value]
        return [self.check(self._coerce(value, where), where)]

    def check(self, value: Any, where: str | None = None) -> Any:
        """`value` if it is of this field's type and range (None is 'unset'); NphError else."""
        where = where or self.flag
        if value is None:
            return None
        if self.kind in ("int", "size"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise NphError(f"{where} must be {_KIND_WORDS[self.kind]}, got {value!r}")
        elif self.kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise NphError(f"{where} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise NphError(f"{where} must be a finite number, got {value!r}")
            value = float(value)
        elif self.kind == "bool":
            if not isinstance(value, bool):
                raise NphError(f"{where} must be true or false, got {value!r}")
        elif self.kind == "indices":
            if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value
            ):
                raise NphError(f"{where} must be a list of whole numbers, got {value!r}")
        elif not (isinstance(value, str) or self.kind == "path" and isinstance(value, PurePath)):
            raise NphError(f"{where} must be {_KIND_WORDS[self.kind]}, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise NphError(f"{where} must be one of {', '.join(self.choices)}, got {value!r}")
        low, high = self.minimum, self.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            raise NphError(f"{where} must be {self._range()}, got {value!r}{self.hint}")
        if self.above is not None and value <= self.above:
            raise NphError(f"{where} must be > {self.above:g}, got {value!r}{self.hint}")
        return value

    def _range(self) -> str:
        """The allowed range in words: 'a fraction in [0, 1]', 'a whole number ≥ 1', '≥ 0'."""
        noun = self.meaning or ("a whole number" if self.kind in ("int", "size") else "")
        noun = f"{noun} " if noun else ""
        if self.minimum is not None and self.maximum is not None:
            return f"{noun}in [{self.minimum:g}, {self.maximum:g}]"
        if self.minimum is not None:
            return f"{noun}≥ {self.minimum:g}"
        return f"{noun}≤ {self.maximum:g}"

    def _parse(self, part: str, text: str, *, listed: bool = True) -> Any:
        """One piece of command-line text as this field's type (`listed`: the text may be a
        comma list of such pieces)."""
        try:
            if self.kind == "int":
                return int(part)
            if self.kind == "float":
                return float(part)
            if self.kind == "size":
                return parse_size(part, self.flag)
            if self.kind == "bool":
                return _boolean(part, self.flag)
        except ValueError:
            several = " (or a comma list of them)" if self.setting and listed else ""
            raise NphError(
                f"{self.flag} takes {_KIND_WORDS[self.kind]}{several}, got {text!r}"
            ) from None
        return part

    def _coerce(self, value: Any, where: str) -> Any:
        """A JSON/TOML value as this field's type: 5 for a float field is 5.0, and a size may be
        written as text ("64M")."""
        if self.kind == "float" and type(value) is int:
            return float(value)
        if self.kind == "size" and isinstance(value, str):
            return parse_size(value, where)
        return value


def parse_size(text: str, flag: str = "--memory-budget") -> int:
    """Bytes from a size such as 1048576, 64K, 256M, 1.5G or 512MiB (K, KB and KiB alike are
    powers of 1024, any letter case); NphError naming `flag` unless it is ≥ 1 byte."""
    match = re.fullmatch(
        r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmg])(?:i?b)?|b)?\s*", text, re.IGNORECASE
    )
    if match is None:
        raise NphError(
            f"{flag} must be a size in bytes such as 1048576, 64K, 256M or 2GiB, got {text!r}"
        )
    number, unit = match.groups()
    scale = 1024 ** (" kmg".index(unit.lower()) if unit else 0)
    size = float(number) * scale
    if size < 1 or size != int(size):
        raise NphError(f"{flag} must be a whole number of bytes ≥ 1, got {text!r}")
    return int(size)


INDEX_FILE_LIMIT = 64 << 20  # bytes of an @FILE of indices: about 10^7 numbers


def _indices(text: str, flag: str) -> list[int]:
    """Whole numbers separated by commas or spaces, e.g. "3,17,42"; `@FILE` reads them from a
    text file (commas, spaces or one a line)."""
    if text.startswith("@"):
        text = _index_file(text[1:], flag)
    parts = [part for part in text.replace(",", " ").split() if part]
    try:
        return [int(part) for part in parts]
    except ValueError:
        raise NphError(f"{flag} must be whole numbers separated by commas, got {text!r}") from None


def _index_file(name: str, flag: str) -> str:
    try:
        if os.path.getsize(name) > INDEX_FILE_LIMIT:
            raise NphError(f"{flag} @{name}: the file is over {INDEX_FILE_LIMIT >> 20} MiB")
        with open(name, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or "not UTF-8 text"
        raise NphError(f"{flag} @{name}: cannot read it ({reason})") from None


_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _boolean(text: str, flag: str) -> bool:
    if text.lower() not in _BOOLEANS:
        raise NphError(f"{flag} takes true or false, got {text!r}")
    return _BOOLEANS[text.lower()]


def output_field(help_text: str, default: Any = None, *, name: str = "out", **extra: Any) -> Field:
    """The file or folder a command writes, `-o, --out PATH` in every command (`name` for a
    flag of its own, e.g. shard's --out-dir); `extra` are further `Field` settings."""
    return Field(name, "path", default, help_text, group="output", short="-o", **extra)


def output_field_setting(help_text: str, default: Any = None, **extra: Unpack[Limits]) -> Any:
    """`output_field` as a setting of a settings class (`OutputSpec.out`)."""
    limits: Limits = {"short": "-o", **extra}
    return setting(default, help_text, kind="path", group="output", **limits)


class Limits(TypedDict, total=False):
    """`Field`'s checks and wording, as `setting` takes them (see `Field`)."""

    minimum: float
    maximum: float
    above: float
    choices: tuple[str, ...]
    meaning: str
    hint: str
    metavar: str
    short: str
    refused: dict[str, str]


def setting(
    default: Any,
    help: str,  # noqa: A002  (the word every option library uses)
    *,
    kind: str | None = None,
    group: str | None = None,
    name: str | None = None,
    **limits: Unpack[Limits],
) -> Any:
    """Declare a setting: a dataclass field with its default and the option it gives. `kind`
    is read from the annotation unless given (`size`: bytes, written as 64M); `group` defaults
    to the class's (`options_of`); `name` is the option's where it differs from the attribute's;
    `limits` are `Field`'s."""
    declared = {"help": help, "kind": kind, "group": group, "name": name, **limits}
    return field(default=default, metadata={_OPTION: declared})


def nested(cls: type, *, group: str, optional: bool = False) -> Any:
    """A field holding another settings class whose options join those of the holding class
    (under `group`): `Corruption` inside `RetrieveSettings`. `optional`: None unless given."""
    marker = {_NESTED: (cls, group)}
    if optional:
        return field(default=None, metadata=marker)
    return field(default_factory=cls, metadata=marker)


@functools.cache
def options_of(cls: type, group: str = "run") -> tuple[Field, ...]:
    """The options a settings class declares, in declaration order, those of nested classes
    in their place; `group` is the panel of settings that name none."""
    hints = typing.get_type_hints(cls)
    out: list[Field] = []
    for f in dataclasses.fields(cls):
        if _NESTED in f.metadata:
            inner, inner_group = f.metadata[_NESTED]
            out.extend(options_of(inner, inner_group))
        elif _OPTION in f.metadata:
            declared = dict(f.metadata[_OPTION])
            kind = declared.pop("kind") or _kind(hints[f.name], f.name)
            out.append(
                Field(
                    declared.pop("name") or f.name,
                    kind,
                    f.default,
                    declared.pop("help"),
                    group=declared.pop("group") or group,
                    **declared,
                )
            )
    return tuple(out)


def _declared(cls: Any) -> Iterator[tuple[str, str]]:
    """(attribute, option name) of each setting `cls` declares itself (not those it nests)."""
    for f in dataclasses.fields(cls):
        if _OPTION in f.metadata:
            yield f.name, f.metadata[_OPTION]["name"] or f.name


def arguments(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `cls` among option values (option name → value)."""
    return {attr: values[name] for attr, name in _declared(cls) if name in values}


def values_of(obj: Any) -> dict[str, Any]:
    """The values of the settings `obj` declares itself, by option name (`arguments`' inverse)."""
    return {name: getattr(obj, attr) for attr, name in _declared(obj)}


def check_settings(obj: Any) -> None:
    """Check every declared setting of a settings object against its option (type, range,
    choices); NphError naming the Python argument (`noise=`) else."""
    cls: type = type(obj)
    options = {option.name: option for option in options_of(cls)}
    for attr, name in _declared(obj):
        options[name].check(getattr(obj, attr), f"{attr}=")


def _kind(hint: Any, name: str) -> str:
    """An option's kind from its attribute's type: `int | None` is int."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, _UnionType) and len(args) == 1:
        hint = args[0]
    if typing.get_origin(hint) is list and typing.get_args(hint) == (int,):
        return "indices"
    kinds = {int: "int", float: "float", bool: "bool", str: "str", Path: "path"}
    if hint not in kinds:
        raise TypeError(f"setting {name!r}: no option kind for {hint!r}; pass kind=")
    return kinds[hint]


_UnionType = type(int | None)
