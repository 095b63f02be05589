"""The figures of one report section, each kept legible however many settings vary: a figure
holds at most LINES lines (beyond that: panels by one setting, then one figure per value of the
next) and a phase diagram at most PANELS panels. Past FIGURES figures none is drawn, and the
note says which `--where` would narrow the rows.
"""

from __future__ import annotations

import itertools
import math
import tempfile
from pathlib import Path
from typing import Any

from nphcli.core.errors import NphError
from nphcli.presentation.plot_data import (
    choose_x,
    groups,
    independent,
    is_setting,
    natural,
    partition,
    short,
)
from nphcli.presentation.report_sections import metric_value

LINES = 10  # lines in one figure's legend that a reader tells apart
PANELS = 9  # panels in one figure
FIGURES = 6  # figures of one kind in one section
AXES = ("beta", "noise", "mask", "M", "k", "alpha")  # phase-diagram axes, in order of preference
WIDTH = 900


def section_figures(
    rows: list[dict[str, Any]], facet: str | None = None
) -> tuple[list[tuple[str, bytes]], list[str]]:
    """([(caption, PNG bytes)], [what was not drawn and why]) for the rows of one section."""
    settings = [c for c in dict.fromkeys(c for row in rows for c in row) if is_setting(c)]
    varying = [c for c in settings if len({short(row.get(c)) for row in rows}) > 1]
    facet = facet if facet in varying else None
    drawn: list[tuple[str, bytes]] = []
    notes: list[str] = []
    try:
        x, x_label = choose_x(rows, "auto", settings, varying)
    except NphError:
        x = None
    if x not in varying:
        notes.append("line plots: no numeric setting varies here (the table holds every value)")
    else:
        for metric in ("success", "sse"):
            if any(metric_value(row, metric) is not None for row in rows):
                _lines(rows, metric, x, x_label, varying, facet, drawn, notes)
    axes = [c for c in AXES if c in varying and _numeric(rows, c)]
    if len(axes) >= 2 and any(metric_value(row, "success") is not None for row in rows):
        _phase(rows, axes[0], axes[1], varying, facet, drawn, notes)
    return drawn, notes


def _lines(rows, metric, x, x_label, varying, facet, drawn, notes) -> None:
    by = independent([c for c in varying if c not in (x, facet)], rows, [x, facet])
    if facet is None and _worst(rows, by, []) > LINES:
        facet = _best_split(rows, by, [], most=PANELS)
    splits = _splits(rows, [c for c in by if c != facet], LINES)
    what = f"{metric} against {x_label}" + (f", one panel per {facet}" if facet else "")
    for where, subset in _figures(rows, splits, what, notes):
        panels = 1 if facet is None else len({short(r.get(facet)) for r in subset})
        size = (WIDTH, 180 + 300 * math.ceil(panels / math.ceil(math.sqrt(panels))))
        caption = what + (f" ({where})" if where else "")
        drawn += _draw(subset, caption, notes, metric=metric, x=x, facet=facet, size=size)


def _phase(rows, x, y, varying, facet, drawn, notes) -> None:
    by = independent([c for c in varying if c not in (x, y, facet)], rows, [x, y, facet])
    inner = by if facet is None else [facet, *by]
    splits = _splits(rows, inner, PANELS)
    what = f"phase diagram: success over {x} and {y}"
    for where, subset in _figures(rows, splits, what, notes):
        panels = groups(subset, [c for c in inner if c not in splits]) or 1
        columns = math.ceil(math.sqrt(panels))
        size = (WIDTH, 200 + 320 * math.ceil(panels / columns))
        caption = what + (f" ({where})" if where else "")
        drawn += _draw(subset, caption, notes, metric="success", x=x, y=y, facet=facet, size=size)


def _figures(rows, splits, what, notes):
    """(`where` words, rows) of each figure: one per combination of the `splits` values."""
    per_key = partition(rows, splits)
    if len(per_key) > FIGURES:
        notes.append(_narrow(rows, splits, what, len(per_key)))
        return []
    ordered = sorted(per_key, key=lambda k: tuple(natural(v) for v in k))
    return [
        (" ".join(f"{c}={v}" for c, v in zip(splits, key, strict=True)), per_key[key])
        for key in ordered
    ]


def _narrow(rows, splits, what, count) -> str:
    """The note for a plot that would need too many figures: which --where narrows it."""
    column = max(splits, key=lambda c: len({short(r.get(c)) for r in rows}))
    values = sorted({short(r.get(column)) for r in rows}, key=natural)
    return (
        f"{what}: {count} figures would be needed (one per {', '.join(splits)}); narrow the "
        f"rows with --where, e.g. --where {column}={','.join(values[:2])} ({column} takes "
        f"{', '.join(values)})"
    )


def _draw(rows, caption, notes, **options) -> list[tuple[str, bytes]]:
    """The figure `plot_results(rows, **options)` draws, as PNG bytes; a note where it cannot."""
    from nphcli.presentation.plot import plot_results

    with tempfile.TemporaryDirectory(prefix="nph-report-") as folder:
        try:
            path = plot_results(rows, Path(folder) / "figure.png", **options)
        except NphError as error:
            notes.append(f"{caption}: {error}")
            return []
        return [(caption, path.read_bytes())]


def _splits(rows, columns, most) -> list[str]:
    """The fewest figures: columns to draw one figure per value combination of, such that each
    figure holds at most `most` combinations of the other `columns` (its lines, or its panels);
    of several such choices the one with the fewest figures, then the fewest columns."""
    best: tuple[int, int, list[str]] | None = None
    for size in range(min(len(columns), 4) + 1):
        for chosen in itertools.combinations(columns, size):
            inner = [c for c in columns if c not in chosen]
            if _worst(rows, inner, list(chosen)) <= most:
                found = (groups(rows, list(chosen)), size, list(chosen))
                best = found if best is None or found[:2] < best[:2] else best
    if best is None:  # nothing small enough: as split as allowed, for the note to say so
        return list(columns[:4])
    return best[2]


def _best_split(rows, columns, splits, most) -> str | None:
    """The column of `columns` (at most `most` values) that leaves the fewest lines per panel."""
    fits = [c for c in columns if len({short(r.get(c)) for r in rows}) <= most]
    if not fits:
        return None
    return min(fits, key=lambda c: _worst(rows, [x for x in columns if x != c], [*splits, c]))


def _worst(rows, inner, outer) -> int:
    """The most groups of `inner` columns within one group of `outer` columns."""
    return max(groups(part, inner) for part in partition(rows, outer).values())


def _numeric(rows, column) -> bool:
    return all(
        row.get(column) is None or isinstance(row.get(column), (int, float)) for row in rows
    ) and any(isinstance(row.get(column), (int, float)) for row in rows)
