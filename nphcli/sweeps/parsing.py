"""Checks and conversions of sweep config values (TOML values or option text), each error naming
where the value came from; kept apart from `config` so that the grid's own rules read alone."""

from __future__ import annotations

import math
from typing import Any

from nphcli.errors import NphError


def parse_list(text: str, flag: str, kind: type) -> list:
    """A comma-separated option value such as `--sizes 10,20,50` as a list of `kind`."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise NphError(f"{flag} needs at least one value, e.g. {flag} 1,2")
    values = []
    for part in parts:
        try:
            number = float(part)
        except ValueError:
            raise NphError(f"{flag}: {part!r} is not a number") from None
        if kind is int:
            if number != int(number):
                raise NphError(f"{flag}: {part!r} is not a whole number")
            number = int(number)
        values.append(number)
    return values


def parse_number(text: str) -> Any:
    """One `--models` value: an int, a float, or the text itself (e.g. a mode name)."""
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value == int(value) and "." not in text and "e" not in text else value


def typed(value: Any, kind: type, what: str) -> Any:
    """`value` as a model parameter of type `kind` (int or float; others pass unchanged)."""
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise NphError(f"{what} must be a whole number, got {value!r}")
        return int(value)
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise NphError(f"{what} must be a number, got {value!r}")
        return float(value)
    return value


def check_keys(table: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    """Refuse keys not in `allowed`: a typo must not be silently ignored."""
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise NphError(
            f"{where}: unknown key {', '.join(repr(k) for k in unknown)}; allowed keys: "
            f"{', '.join(allowed)}"
        )


def whole(value: Any, key: str, where: str, *, minimum: int) -> int:
    """`value` as a whole number ≥ `minimum` (2.0 is fine, 2.5 and True are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise NphError(f"{where}: {key} must be a whole number, got {value!r}")
    if value < minimum:
        raise NphError(f"{where}: {key} must be ≥ {minimum}, got {value}")
    return int(value)


def int_list(value: Any, key: str, where: str, *, minimum: int) -> list[int]:
    """A value or a list of them as a non-empty list of whole numbers ≥ `minimum`."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise NphError(f"{where}: {key} needs at least one value")
    return [whole(v, key, where, minimum=minimum) for v in values]


def float_list(value: Any, key: str, where: str, *, positive: bool = False) -> list[float]:
    """A value or a list of them as a non-empty list of finite floats (> 0 if `positive`)."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise NphError(f"{where}: {key} needs at least one value")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise NphError(f"{where}: {key} values must be finite numbers, got {v!r}")
        if positive and v <= 0:
            raise NphError(f"{where}: {key} values must be > 0, got {v}")
        out.append(float(v))
    return out
