"""What a plot of results rows shows: filtered rows grouped into panels, lines and points.

A column is a measurement (`*_mean`, `*_std`, `*_median`, `*_s`, `us_per_query`, `theory_*`), a
trial column (repeats of one setting), a derived name, or a setting (everything else). A point
averages rows that agree on every setting, so values of k are never averaged as if trials.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from nphcli.core.errors import NphError
from nphcli.core.notices import notice
from nphcli.schema.metrics import LABELS

# x-axis aliases: name → (row column, axis label); `variance` plots the noise column squared
X_AXES: dict[str, tuple[str, str]] = {
    "size": ("M", "memory size M"),
    "noise": ("noise", "noise standard deviation σ"),
    "variance": ("noise", "noise variance σ²"),
    "mask": ("mask", "fraction of each query masked"),
    "beta": ("beta", "inverse temperature β"),
}
AXIS_LABELS = {column: label for name, (column, label) in X_AXES.items() if name != "variance"}
METRIC_LABELS = LABELS  # what each metric is (`nphcli.schema.metrics`)
TRIAL_COLUMNS = ("trial", "memory_seed", "run_seed", "drawn_sha256")
DERIVED_COLUMNS = ("setting", "label", "run_settings")
# Where the memory lives says nothing about what it is (`memory_sha256` does): not a setting.
DESCRIPTIVE_COLUMNS = ("memory_path",)
AUTO_X = ("M", "noise", "mask", "beta")  # tried first for --x auto, then any numeric setting

Point = tuple[float, float, float, int]  # (x, mean, std over rows, rows)


@dataclass
class Curves:
    """The lines of a plot: {panel title: {line name: [points sorted by x]}}."""

    x: str  # the x column, or "variance"
    x_label: str
    column: str  # the metric's column
    panels: dict[str, dict[str, list[Point]]]
    fixed: list[str] = field(default_factory=list)  # "name value" of settings that do not vary

    @property
    def lines(self) -> dict[str, list[Point]]:
        """All panels' lines (the one panel's when there is no facet)."""
        return {name: pts for panel in self.panels.values() for name, pts in panel.items()}

    def trials(self) -> list[int]:
        return sorted({p[3] for panel in self.panels.values() for s in panel.values() for p in s})


def is_setting(column: str) -> bool:
    """Whether `column` describes the run rather than measuring it (see the module docstring)."""
    measured = column.endswith(("_mean", "_std", "_median", "_s")) or column.startswith("theory_")
    return not (
        measured
        or column == "us_per_query"
        or column in TRIAL_COLUMNS
        or column in DERIVED_COLUMNS
        or column in DESCRIPTIVE_COLUMNS
    )


def short(value: Any) -> str:
    """A value as a line name or title shows it: integers without '.0', floats to 4 digits."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.4g}"
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]  # a content hash: 12 hex digits tell memories apart
    return "none" if value is None else str(value)


def filter_rows(rows: list[dict[str, Any]], where: list[str]) -> list[dict[str, Any]]:
    """Rows matching every `COLUMN=VALUE[,VALUE...]` of `where` (values as `short` writes them).
    A `seed` the sweep derived per trial (equal to the row's `run_seed`) is a trial column, not
    a setting: it is dropped, so the trials of `random` and `random-feature` average."""
    rows = [_without_trial_seed(row) for row in rows]
    columns = {c for row in rows for c in row}
    for condition in where:
        column, _ = parse_condition(condition)
        if column not in columns:
            raise NphError(
                f"--where {condition!r}: no column {column!r}; settings in these results: "
                + ", ".join(sorted(c for c in columns if is_setting(c)))
            )
        rows = matching(rows, [condition])
        if not rows:
            raise NphError(f"no rows match --where {condition!r}")
    return rows


def _without_trial_seed(row: dict[str, Any]) -> dict[str, Any]:
    if row.get("seed") is None or row.get("seed") != row.get("run_seed"):
        return row
    return {c: v for c, v in row.items() if c != "seed"}


def parse_condition(condition: str) -> tuple[str, set[str]]:
    """(column, the values wanted) of one `COLUMN=VALUE[,VALUE...]`."""
    column, sep, text = condition.partition("=")
    column = column.strip()
    if not sep or not column:
        raise NphError(f"--where takes COLUMN=VALUE (e.g. model=topk), got {condition!r}")
    return column, {v.strip() for v in text.split(",")}


def matching(rows: list[dict[str, Any]], where: list[str]) -> list[dict[str, Any]]:
    """Rows matching every condition of `where`; none is an answer here, not an error (a report
    keeps the sections that match)."""
    for condition in where:
        column, wanted = parse_condition(condition)
        rows = [row for row in rows if short(row.get(column)) in wanted]
    return rows


def curves(
    rows: list[dict[str, Any]],
    *,
    metric: str = "sse",
    x: str = "auto",
    where: list[str] | None = None,
    facet: str | None = None,
) -> Curves:
    """Group `rows` into panels (by `facet`), lines (by every other varying setting) and points
    (by x), each point the mean and population std over the rows of one setting."""
    if not rows:
        raise NphError("the results file holds no rows to plot")
    rows = filter_rows(rows, where or [])
    column = metric_column(rows, metric)
    settings = [c for c in dict.fromkeys(c for row in rows for c in row) if is_setting(c)]
    varying = [c for c in settings if len({short(row.get(c)) for row in rows}) > 1]
    x_column, x_label = choose_x(rows, x, settings, varying)
    if facet is not None and facet not in settings:
        raise NphError(f"--facet {facet!r}: choose a setting: {', '.join(settings)}")
    by = independent([c for c in varying if c not in (x_column, facet)], rows, [x_column, facet])
    say_split(by)
    named = by + _parameters_that_follow(varying, by, rows, [x_column, facet])
    panels: dict[str, dict[tuple, dict[float, list[float]]]] = {}
    names: dict[tuple, str] = {}
    for row in rows:
        value, at = _number(row.get(column)), _number(row.get(x_column))
        if value is None or at is None:
            continue
        panel = "" if facet is None else f"{facet}={short(row.get(facet))}"
        # one line per combination of the varying settings (nothing else is averaged), the model
        # and its parameters included even where a facet splits on them: never another's name
        key = (str(row.get("label")), str(row.get("model")), *(short(row.get(c)) for c in named))
        names.setdefault(key, _line_name(row, named))
        line = panels.setdefault(panel, {}).setdefault(key, {})
        line.setdefault(at * at if x == "variance" else at, []).append(value)
    if not panels:
        raise NphError(f"no rows have both {column} and {x_column} values")
    if len(set(names.values())) < len(names):  # names that leave out empty values collide
        names = {key: " ".join(k for k in key if k != "None") for key in names}
    return Curves(
        x=x if x == "variance" else x_column,
        x_label=x_label,
        column=column,
        panels={
            panel: {
                names[key]: [_point(at, by_x[at]) for at in sorted(by_x)]
                for key, by_x in lines.items()
            }
            for panel, lines in sorted(panels.items(), key=lambda item: natural(item[0]))
        },
        fixed=[f"{c} {short(rows[0].get(c))}" for c in settings if c not in varying],
    )


@dataclass
class Surfaces:
    """The cells of a phase diagram: {panel title: {(x, y): (mean, std over rows, rows)}}, and
    the success rate's mean per cell (for the retrieval boundary) when the rows have it."""

    x: str
    y: str
    x_label: str
    y_label: str
    column: str
    xs: list[float]
    ys: list[float]
    panels: dict[str, dict[tuple[float, float], tuple[float, float, int]]]
    success: dict[str, dict[tuple[float, float], float]]
    fixed: list[str] = field(default_factory=list)

    def trials(self) -> list[int]:
        return sorted({cell[2] for panel in self.panels.values() for cell in panel.values()})


def surfaces(
    rows: list[dict[str, Any]],
    *,
    metric: str = "success",
    x: str = "auto",
    y: str,
    where: list[str] | None = None,
    facet: str | None = None,
) -> Surfaces:
    """Group `rows` into panels (one per combination of the settings that vary other than x
    and y, e.g. one per model; or one per value of `facet` and that combination) and cells
    (x, y), each cell the mean and population std over the rows of one setting."""
    if not rows:
        raise NphError("the results file holds no rows to plot")
    rows = filter_rows(rows, where or [])
    column = metric_column(rows, metric)
    settings = [c for c in dict.fromkeys(c for row in rows for c in row) if is_setting(c)]
    varying = [c for c in settings if len({short(row.get(c)) for row in rows}) > 1]
    if y == "auto":
        raise NphError("--y names the second axis of a phase diagram (e.g. --y noise)")
    y_column, y_label = choose_x(rows, y, settings, varying)
    rest = [c for c in varying if c != y_column]
    x_column, x_label = choose_x(rows, x, settings, rest)
    if x_column == y_column:
        raise NphError(f"--x and --y are both {x_column}: choose two different settings")
    if facet is not None and facet not in settings:
        raise NphError(f"--facet {facet!r}: choose a setting: {', '.join(settings)}")
    given = [x_column, y_column, facet]
    by = independent([c for c in varying if c not in given], rows, given)
    say_split(by)
    named = by + _parameters_that_follow(varying, by, rows, given)
    numbers = ("success_mean", "success")
    found = [c for c in numbers if any(_number(r.get(c)) is not None for r in rows)]
    success_column = found[0] if found else None
    cells: dict[str, dict[tuple[float, float], list[float]]] = {}
    wins: dict[str, dict[tuple[float, float], list[float]]] = {}
    for row in rows:
        value, at_x, at_y = (_number(row.get(c)) for c in (column, x_column, y_column))
        if value is None or at_x is None or at_y is None:
            continue
        at_x = at_x * at_x if x == "variance" else at_x
        at_y = at_y * at_y if y == "variance" else at_y
        name = _line_name(row, named) if by or facet is None else ""
        if facet is not None:
            name = f"{facet}={short(row.get(facet))} {name}".strip()
        cells.setdefault(name, {}).setdefault((at_x, at_y), []).append(value)
        won = _number(row.get(success_column)) if success_column else None
        if won is not None:
            wins.setdefault(name, {}).setdefault((at_x, at_y), []).append(won)
    if not cells:
        raise NphError(f"no rows have {column}, {x_column} and {y_column} values")
    return Surfaces(
        x=x if x == "variance" else x_column,
        y=y if y == "variance" else y_column,
        x_label=x_label,
        y_label=y_label,
        column=column,
        xs=sorted({at[0] for panel in cells.values() for at in panel}),
        ys=sorted({at[1] for panel in cells.values() for at in panel}),
        panels={
            name: {at: _point(0.0, values)[1:] for at, values in panel.items()}
            for name, panel in sorted(cells.items(), key=lambda item: natural(item[0]))
        },
        success={
            name: {at: math.fsum(v) / len(v) for at, v in panel.items()}
            for name, panel in wins.items()
        },
        fixed=[f"{c} {short(rows[0].get(c))}" for c in settings if c not in varying],
    )


def choose_x(
    rows: list[dict[str, Any]], x: str, settings: list[str], varying: list[str]
) -> tuple[str, str]:
    """(x column, axis label): an alias of X_AXES, any numeric setting, or for "auto" the first
    varying one of M, noise, mask, β, then of the other numeric settings."""
    numeric = [  # a column of numbers, empty where it does not apply (k of dense)
        c
        for c in settings
        if any(_number(row.get(c)) is not None for row in rows)
        and all(row.get(c) is None or _number(row.get(c)) is not None for row in rows)
    ]
    if x == "auto":
        order = [*AUTO_X, *(c for c in numeric if c not in AUTO_X)]
        x = next((c for c in order if c in varying and c in numeric), "M")
    if x in X_AXES:
        return X_AXES[x]
    if x not in numeric:
        raise NphError(
            f"unknown --x {x!r}; choose one of: auto, {', '.join(X_AXES)}, or a numeric "
            f"setting that varies ({', '.join(c for c in numeric if c in varying) or 'none'})"
        )
    return x, AXIS_LABELS.get(x, x)


def metric_column(rows: list[dict[str, Any]], metric: str) -> str:
    """The column holding `metric`: `<metric>_mean` when rows have it, else `metric` itself."""
    for column in (f"{metric}_mean", metric):
        if any(_number(row.get(column)) is not None for row in rows):
            return column
    if rows and "model" not in rows[0] and "label" not in rows[0]:
        # a CSV appended with --no-header only: its first data row was read as the header
        raise NphError(
            "these results have no header row (their first line is data, e.g. written only "
            "with `nph retrieve --csv --no-header`): put the header first, e.g. write the first "
            "run with `nph retrieve --csv > FILE` and append the others with --no-header, or "
            "run every setting in one call (`--k 1,5,10 --csv > FILE`)"
        )
    usable = [
        name
        for name in METRIC_LABELS
        if name != metric
        and any(_number(row.get(f"{name}_mean", row.get(name))) is not None for row in rows)
    ]
    raise NphError(
        f"no values for metric {metric!r} in these results; "
        + (f"try one of: {', '.join(usable)}" if usable else "they hold no metric at all")
    )


def say_split(columns: list[str]) -> None:
    """A notice when rows are told apart by the memory they ran on: never averaged as trials."""
    memory = [c for c in columns if c.startswith("memory") or c in ("dataset", "normalize")]
    if memory:
        notice(
            f"these results come from different memories ({', '.join(memory)}): each is drawn "
            "apart, never averaged with another as trials"
        )


def _parameters_that_follow(
    varying: list[str], by: list[str], rows: list[dict[str, Any]], given: list
) -> list[str]:
    """Varying settings that split no line but apply to some rows only, such as k beside dense
    and topk k=10 (k follows the model): named on the lines they apply to, so a line is never
    called `topk` when its k is fixed."""
    left = [c for c in varying if c not in by and c not in given]
    return [c for c in left if any(row.get(c) is None for row in rows)]


def independent(columns: list[str], rows: list[dict[str, Any]], given: list) -> list[str]:
    """`columns` less those that the rest (and the `given` columns) determine, such as Q and
    batch_size, which follow M: naming them would split no line and only lengthen names."""
    kept = list(columns)
    # a memory's own columns go first: M names a line better than the drawn shape 20x16
    for column in sorted(reversed(columns), key=lambda c: not c.startswith("memory")):
        rest = [c for c in kept if c != column]
        if groups(rows, [*rest, *given]) == groups(rows, [*kept, *given]):
            kept = rest
    return kept


def partition(rows: list[dict[str, Any]], columns: list) -> dict[tuple, list[dict[str, Any]]]:
    """The rows by their (shown) values of `columns`, in order of first appearance."""
    parts: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        parts.setdefault(tuple(short(row.get(c)) for c in columns), []).append(row)
    return parts


def groups(rows: list[dict[str, Any]], columns: list) -> int:
    """How many value combinations of `columns` (a None column skipped) the rows hold."""
    return len(partition(rows, [c for c in columns if c is not None]))


def natural(name: str) -> tuple:
    """A sort key reading the numbers in `name` as numbers: `topk k=5` before `topk k=10`, and
    every panel of one model together."""
    parts = re.split(r"(-?\d+(?:\.\d*)?(?:e[-+]?\d+)?)", name)
    return tuple(
        (0, float(part), "") if i % 2 else (1, 0.0, part) for i, part in enumerate(parts) if part
    )


def _line_name(row: dict[str, Any], by: list[str]) -> str:
    """The row's model setting (`label`, else `model`) and the other settings it differs in;
    a value the label writes is shown as the row's column holds it (`k=10`, never `k=10.0`)."""
    name = " ".join(
        f"{part.partition('=')[0]}={short(row[part.partition('=')[0]])}"
        if "=" in part and part.partition("=")[0] in row
        else part
        for part in str(row.get("label") or row.get("model") or "").split()
    )
    parts = [
        f"{c}={short(row.get(c))}"
        for c in by
        if c != "model" and row.get(c) is not None and f"{c}=" not in name
    ]
    return " ".join([name, *parts]).strip() or "all rows"


def _point(at: float, values: list[float]) -> Point:
    mean = math.fsum(values) / len(values)
    spread = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    return at, mean, 0.0 if len(set(values)) == 1 else spread, len(values)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
