"""Plots of sweep results: a metric's mean against memory size, noise, mask or β.

One line per model setting (the rows' `label`, plus any other grid value that varies and is not
on the x axis), drawn at the mean over trials of each run's mean metric, with a band of ±1
standard deviation over trials (population). matplotlib is an optional dependency
(`pip install "nph[plot]"`); it is imported only here, and only its object-oriented API with the
Agg canvas is used, so no global backend is switched and no display is needed. The file's
extension picks its format (.png, .svg or .pdf); it is written atomically and a PNG has exactly
the requested size in pixels (SVG and PDF the same size at 100 dpi).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from nphcli.atomic import atomic_write
from nphcli.errors import NphError

# x-axis choices: name → (row column, axis label); `variance` plots the noise column squared
X_AXES: dict[str, tuple[str, str]] = {
    "size": ("M", "memory size M"),
    "noise": ("noise", "noise standard deviation σ"),
    "variance": ("noise", "noise variance σ²"),
    "mask": ("mask", "fraction of each query masked"),
    "beta": ("beta", "inverse temperature β"),
}
METRIC_LABELS = {
    "sse": "sum of squared errors ‖T(x) − ξ‖²",
    "mse": "mean squared error ‖T(x) − ξ‖² / d",
    "success": "success rate (nearest stored pattern is the target)",
    "cosine": "cosine similarity of T(x) and ξ",
    "pixel_success": "per-pixel success rate (every clamped entry within 0.1 of the target)",
    "nearest_distance": "distance from T(x) to the nearest stored pattern",
    "support": "support size (memories with non-zero weight)",
    "steps": "update steps",
    "us_per_query": "retrieval time per query (µs)",
}
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}  # extension → matplotlib format
DEFAULT_SIZE = (800, 500)
DPI = 100


def parse_pixels(text: str) -> tuple[int, int]:
    """`WxH` in pixels, e.g. 800x500."""
    width, sep, height = text.lower().partition("x")
    try:
        size = (int(width), int(height))
    except ValueError:
        size = (0, 0)
    if not sep or min(size) < 100 or max(size) > 10000:
        raise NphError(f"--size must be WIDTHxHEIGHT in pixels, each 100…10000, got {text!r}")
    return size


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


def choose_x(rows: list[dict[str, Any]], x: str) -> str:
    """`x` checked, or for "auto" the first of size, noise, mask, beta that varies."""
    if x != "auto":
        if x not in X_AXES:
            raise NphError(f"unknown --x {x!r}; choose one of: auto, {', '.join(X_AXES)}")
        return x
    for name in ("size", "noise", "mask", "beta"):
        column = X_AXES[name][0]
        if len({row.get(column) for row in rows}) > 1:
            return name
    return "size"


def curves(
    rows: list[dict[str, Any]], *, metric: str = "sse", x: str = "auto"
) -> tuple[str, str, dict[str, list[tuple[float, float, float, int]]]]:
    """(x axis name, metric column, {line label: [(x, mean, std, trials), ...] sorted by x})."""
    if not rows:
        raise NphError("the results file holds no rows to plot")
    x = choose_x(rows, x)
    column = metric_column(rows, metric)
    x_column = X_AXES[x][0]
    others = [c for c in ("dataset", "M", "mask", "noise", "beta") if c != x_column]
    varying = [c for c in others if len({row.get(c) for row in rows}) > 1]
    points: dict[str, dict[float, list[float]]] = {}
    for row in rows:
        value, at = _number(row.get(column)), _number(row.get(x_column))
        if value is None or at is None:
            continue
        if x == "variance":
            at = at * at
        name = " ".join(
            [str(row.get("label") or row.get("model")), *(f"{c}={row.get(c)}" for c in varying)]
        )
        points.setdefault(name, {}).setdefault(at, []).append(value)
    if not points:
        raise NphError(f"no rows have both {column} and {x_column} values")
    lines = {}
    for name, by_x in points.items():
        series = []
        for at in sorted(by_x):
            values = by_x[at]
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
            series.append((at, mean, std, len(values)))
        lines[name] = series
    return x, column, lines


def check_plot_output(out: str | os.PathLike) -> str:
    """The format `out`'s extension names, checked before any work: an extension matplotlib is
    not asked to write, or matplotlib missing, is an NphError now rather than after a sweep."""
    suffix = Path(out).suffix.lower()
    if suffix not in FORMATS:
        raise NphError(f"cannot tell the plot format of {out}: name it .png, .svg or .pdf")
    _matplotlib()
    return FORMATS[suffix]


def plot_results(
    rows: list[dict[str, Any]],
    out: str | os.PathLike,
    *,
    metric: str = "sse",
    x: str = "auto",
    size: tuple[int, int] = DEFAULT_SIZE,
    title: str | None = None,
    force: bool = False,
) -> Path:
    """Draw `metric` against `x` for sweep result rows and save it as the extension of `out`
    says (PNG, SVG or PDF) at `size` pixels."""
    file_format = check_plot_output(out)
    x, column, lines = curves(rows, metric=metric, x=x)
    figure_cls, canvas_cls = _matplotlib()
    width, height = size
    figure = figure_cls(figsize=(width / DPI, height / DPI), dpi=DPI)
    canvas_cls(figure)
    axes = figure.add_axes((0.09, 0.11, 0.60, 0.78))
    colours = [f"C{i}" for i in range(10)]
    styles = ["-", "--", ":", "-."]
    for i, (name, series) in enumerate(lines.items()):
        xs = [p[0] for p in series]
        means = [p[1] for p in series]
        low = [p[1] - p[2] for p in series]
        high = [p[1] + p[2] for p in series]
        colour, style = colours[i % 10], styles[(i // 10) % len(styles)]
        axes.plot(xs, means, color=colour, linestyle=style, marker="o", markersize=3, label=name)
        axes.fill_between(xs, low, high, color=colour, alpha=0.15, linewidth=0)
    axes.set_xlabel(X_AXES[x][1])
    metric_name = column.removesuffix("_mean")
    axes.set_ylabel(METRIC_LABELS.get(metric_name, metric_name), fontsize=9)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8, frameon=False)
    trials = sorted({p[3] for series in lines.values() for p in series})
    trial_text = f"{trials[0]}" if len(trials) == 1 else f"{trials[0]}–{trials[-1]}"
    axes.set_title(title or _title(rows, metric_name, x, trial_text), fontsize=10, loc="left")
    with atomic_write(out, force=force) as tmp:
        figure.savefig(tmp, format=file_format, dpi=DPI)
    return Path(out)


def _title(rows: list[dict[str, Any]], metric: str, x: str, trials: str) -> str:
    """Two lines: what is plotted, then the grid values that are the same on every line."""
    fixed = []
    for column, name in (("dataset", ""), ("M", "M "), ("mask", "mask "), ("noise", "σ ")):
        values = {row.get(column) for row in rows}
        if len(values) == 1 and X_AXES[x][0] != column:
            value = values.pop()
            if column in ("mask", "noise") and not value:
                continue
            fixed.append(f"{name}{_short(value)}")
    betas = {row.get("beta") for row in rows}
    if len(betas) == 1:
        fixed.append(f"β {_short(betas.pop())}")
    name = metric.upper() if metric in ("sse", "mse") else metric
    return f"{name} vs {X_AXES[x][1]}\n{', '.join(fixed)}; mean ± 1 std over {trials} trials"


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise NphError(
            'plots need matplotlib, an optional dependency: pip install "nph[plot]"'
        ) from None
    return Figure, FigureCanvasAgg
