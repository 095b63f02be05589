"""What the trained experiments' grids share: a named preset, overridden from the command line's
comma lists (the models by label, whole numbers such as bag sizes or horizons, the epochs and
runs). Torch-free."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from nphcli.core.errors import NphError

T = TypeVar("T")


def preset(presets: Mapping[str, T], name: str, what: str) -> T:
    """The preset `name` of `what` (e.g. "MIL preset"), or one error listing the others."""
    if name not in presets:
        raise NphError(f"unknown {what} {name!r}; choose {', '.join(presets)}")
    return presets[name]


def chosen(variants: Sequence[Any], labels: Sequence[str], what: str) -> list[Any]:
    """The variants (each with a `label`) that `labels` name, in their order."""
    known = {v.label: v for v in variants}
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise NphError(f"unknown {what} {unknown[0]!r}; choose from {', '.join(known)}")
    return [known[label] for label in labels]


def run_seed(base: int, run: int, size: int) -> int:
    """The seed of one training run: the user's seed, the run's number and the cell's size
    (bag size, horizon), spread so that no two cells of a grid share one."""
    return base * 1_000_003 + run * 1_009 + size


def labels(text: str) -> tuple[str, ...]:
    """A comma list of labels, each stripped."""
    return tuple(part.strip() for part in text.split(","))


def whole_numbers(text: str, flag: str) -> tuple[int, ...]:
    """A comma list of whole numbers ≥ 1, e.g. "96,192"."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise NphError(f"{flag} must be whole numbers, got {text!r}") from None
    if any(value < 1 for value in values):
        raise NphError(f"{flag} must be ≥ 1")
    return values


def with_counts(config: T, *, epochs: int | None, runs: int | None, seeds: int | None = None) -> T:
    """`config` with its epochs, runs per cell or seeds replaced where given (each ≥ 1)."""
    for name, value in (("epochs", epochs), ("runs", runs), ("seeds", seeds)):
        if value is not None:
            if value < 1:
                raise NphError(f"--{name} must be ≥ 1, got {value}")
            config = replace(config, **{name: value})
    return config
