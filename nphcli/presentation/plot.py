"""Plots of results: a metric's mean (±1 std over trials) against a setting, or with `--y` a
phase diagram (a heatmap over two settings, the success = 0.5 boundary outlined in white).

`nphcli.presentation.plot_data` decides what is drawn. matplotlib is optional and imported only
here, through its object-oriented API on the Agg canvas: no global backend, no display. The
file's extension picks the format; a PNG has exactly the requested size in pixels. A figure's
texts are kept apart: its title is wrapped until the renderer measures it clear of the legend and
inside the figure (`heading`), and `overlapping_texts` checks that no two texts overlap.
"""

from __future__ import annotations

import math
import os
import textwrap
from functools import partial
from pathlib import Path
from typing import Any

from nphcli.core.atomic import atomic_write
from nphcli.core.errors import NphError
from nphcli.presentation.plot_data import METRIC_LABELS, Curves, Surfaces, curves, surfaces
from nphcli.schema.catalog import param_cards

FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}  # extension → matplotlib format
DEFAULT_SIZE = (800, 500)
DPI = 100
MAX_LINES = 80  # beyond this a figure is unreadable: filter (--where) or split (--facet)
MAX_PANELS = 24  # phase diagrams: more panels are unreadable
# settings worth naming in the title when they are the same for every line, beside every model
# parameter (so a fixed k is always said)
TITLE_SETTINGS = ("model", "dataset", "memory", "memory_normalize", "memory_sha256", "M", "d")
TITLE_SETTINGS += ("mask", "noise")
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")
STYLES = ("-", "--", ":", "-.")
FRACTIONS = ("success", "pixel_success", "cosine", "at_pattern", "at_metastable", "at_global")


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
    y: str | None = None,
    force: bool = False,
    **options: Any,
) -> Path:
    """Draw `results_figure(rows, **options)`, or with `y` the phase diagram
    `phase_figure(rows, y=y, **options)`, and save it as `out`'s extension says."""
    file_format = check_plot_output(out)
    figure = results_figure(rows, **options) if y is None else phase_figure(rows, y=y, **options)
    return _save(figure, out, file_format, force)


def results_figure(
    rows: list[dict[str, Any]],
    *,
    metric: str = "sse",
    x: str = "auto",
    where: list[str] | None = None,
    facet: str | None = None,
    size: tuple[int, int] = DEFAULT_SIZE,
    title: str | None = None,
) -> Any:
    """`metric` against `x` for result rows (filtered by `where`, one panel per value of
    `facet`) at `size` pixels."""
    data = curves(rows, metric=metric, x=x, where=where, facet=facet)
    names = list(dict.fromkeys(name for panel in data.panels.values() for name in panel))
    if len(names) > MAX_LINES:
        raise NphError(
            f"{len(names)} lines are too many for one plot: choose some with --where (e.g. "
            "--where model=topk) or split them into panels with --facet COLUMN"
        )
    width, height = size
    figure, grid = _figure(size, len(data.panels))
    looks = {name: _look(i, len(names)) for i, name in enumerate(names)}
    handles = {}
    for axes, (panel, lines) in zip(grid.flat, data.panels.items(), strict=False):
        for name, series in lines.items():
            xs = [p[0] for p in series]
            colour, marker, style = looks[name]
            ys = [p[1] for p in series]
            (handles[name],) = axes.plot(
                xs, ys, color=colour, marker=marker, linestyle=style, markersize=4, label=name
            )
            low = [p[1] - p[2] for p in series]
            high = [p[1] + p[2] for p in series]
            axes.fill_between(xs, low, high, color=colour, alpha=0.12, linewidth=0)
        axes.grid(True, alpha=0.3)
        if panel:
            _panel_title(axes, panel, width, grid.shape[1])
    metric_name = data.column.removesuffix("_mean")
    figure.supxlabel(data.x_label, fontsize=9)
    figure.supylabel(METRIC_LABELS.get(metric_name, metric_name), fontsize=9)
    per_column = max(1, int((height - 40) / 13))  # legend entries that fit the height
    columns = math.ceil(len(names) / per_column)
    corner = "outside right upper"
    figure.legend(
        [handles[n] for n in names], names, loc=corner, fontsize=7, frameon=False, ncols=columns
    )
    heading(figure, title or partial(_title, data, metric_name))
    return figure


def phase_figure(
    rows: list[dict[str, Any]],
    *,
    metric: str = "success",
    x: str = "auto",
    y: str,
    where: list[str] | None = None,
    facet: str | None = None,
    size: tuple[int, int] = DEFAULT_SIZE,
    title: str | None = None,
) -> Any:
    """`metric` as a heatmap over `x` and `y` (one panel per model, or per other varying
    setting and `facet` value), the success = 0.5 boundary outlined."""
    import numpy as np

    data = surfaces(rows, metric=metric, x=x, y=y, where=where, facet=facet)
    if len(data.panels) > MAX_PANELS:
        raise NphError(
            f"{len(data.panels)} panels are too many for one phase diagram: choose some with "
            "--where (e.g. --where model=topk)"
        )
    width, height = size
    figure, grid = _figure(size, len(data.panels))
    metric_name = data.column.removesuffix("_mean")
    values = [cell[0] for panel in data.panels.values() for cell in panel.values()]
    low, high = (
        (0.0, 1.0) if metric_name in FRACTIONS and min(values) >= 0 else (min(values), max(values))
    )
    spread = max(data.trials()) > 1
    font = _cell_font(size, grid.shape, (len(data.xs), len(data.ys)))
    image = None
    boundary = False
    for axes, (name, cells) in zip(grid.flat, data.panels.items(), strict=False):
        mean = np.full((len(data.ys), len(data.xs)), np.nan)  # (y, x)
        for (at_x, at_y), (value, std, count) in cells.items():
            i, j = data.ys.index(at_y), data.xs.index(at_x)
            mean[i, j] = value
            text = f"{value:.2g}" + (f"\n±{std:.1g}" if spread and count > 1 else "")
            colour = "white" if value < (low + high) / 2 else "black"
            axes.text(j, i, text, ha="center", va="center", fontsize=font, color=colour)
        image = axes.imshow(
            np.ma.masked_invalid(mean), origin="lower", aspect="auto", cmap="viridis",
            vmin=low, vmax=high, interpolation="nearest",
        )  # fmt: skip
        won = data.success.get(name, {})
        if won:
            wins = np.full(mean.shape, np.nan)
            for (at_x, at_y), value in won.items():
                wins[data.ys.index(at_y), data.xs.index(at_x)] = value
            edges = boundary_edges(wins)
            if edges:
                from matplotlib.collections import LineCollection

                axes.add_collection(LineCollection(edges, colors="white", linewidths=2))
                boundary = True
        axes.set_xticks(range(len(data.xs)), [f"{v:.3g}" for v in data.xs], fontsize=7)
        axes.set_yticks(range(len(data.ys)), [f"{v:.3g}" for v in data.ys], fontsize=7)
        if name:
            _panel_title(axes, name, width, grid.shape[1])
    figure.supxlabel(data.x_label, fontsize=9)
    figure.supylabel(data.y_label, fontsize=9)
    bar = figure.colorbar(image, ax=grid.ravel().tolist(), shrink=0.9)
    bar.set_label(METRIC_LABELS.get(metric_name, metric_name), fontsize=8)
    bar.ax.tick_params(labelsize=7)
    heading(figure, title or partial(_phase_title, data, metric_name, boundary=boundary))
    return figure


def boundary_edges(wins: Any) -> list[list[tuple[float, float]]]:
    """The cell edges between a cell whose success is at least 0.5 and a neighbour where it is
    below (an empty cell, NaN, borders nothing): the retrieval boundary drawn along the grid,
    in the coordinates of `imshow`'s cells (cell (i, j) spans j ± ½, i ± ½)."""
    rows, columns = wins.shape  # (y, x)
    edges = []
    for i in range(rows):
        for j in range(columns):
            if j + 1 < columns and _crosses(wins[i, j], wins[i, j + 1]):
                edges.append([(j + 0.5, i - 0.5), (j + 0.5, i + 0.5)])
            if i + 1 < rows and _crosses(wins[i, j], wins[i + 1, j]):
                edges.append([(j - 0.5, i + 0.5), (j + 0.5, i + 0.5)])
    return edges


def _crosses(a: float, b: float) -> bool:
    return not (math.isnan(a) or math.isnan(b)) and (a >= 0.5) != (b >= 0.5)


def _save(figure: Any, out: str | os.PathLike, file_format: str, force: bool) -> Path:
    """Write `figure` atomically, every text of it `plain`."""
    plain(figure)
    with atomic_write(out, force=force) as tmp:
        figure.savefig(tmp, format=file_format, dpi=DPI)
    return Path(out)


def _panel_title(axes: Any, name: str, width: int, columns: int) -> None:
    """A panel's title wrapped to the panel's width, so neighbouring titles never overlap."""
    chars = max(12, int(width * 0.8 / columns / 5.5))  # about 5.5 px per character at 8 pt
    axes.set_title("\n".join(textwrap.wrap(name, chars)), fontsize=8)


def _cell_font(size: tuple[int, int], grid: tuple[int, int], cells: tuple[int, int]) -> float:
    """A font size (points) at which a cell's value (two lines) fits its cell."""
    (width, height), (rows, columns), (across, up) = size, grid, cells
    cell_w = width * 0.8 / columns / across  # pixels
    cell_h = height * 0.75 / rows / up
    return max(4.0, min(8.0, cell_w / 3.2, cell_h / 3.0))


def _phase_title(data: Surfaces, metric: str, width: int, *, boundary: bool) -> str:
    what = f"{_named(metric)} over {data.x_label} and {data.y_label}"
    line = "; white line: success = 0.5" if boundary else ""
    one, several = "one run per cell, its value written in it", "mean over {} trials in each cell"
    return _heading(what, data, width, one, several + ", ±1 std below it", line)


def _title(data: Curves, metric: str, width: int) -> str:
    several = "mean ± 1 std over {} trials"
    return _heading(
        f"{_named(metric)} vs {data.x_label}", data, width, "one run per point", several
    )


def _named(metric: str) -> str:
    return metric.upper() if metric in ("sse", "mse") else metric


def _heading(
    what: str, data: Curves | Surfaces, width: int, one: str, several: str, line: str = ""
) -> str:
    """What is plotted, then the settings every line shares and what a point averages (`one`
    run, or `several` trials), wrapped at `width` characters."""
    trials = data.trials()
    counts = f"{trials[0]}" if len(trials) == 1 else f"{trials[0]}–{trials[-1]}"
    spread = one if trials == [1] else several.format(counts)
    fixed = ", ".join(title_settings(data.fixed))
    detail = "; ".join(part for part in (fixed, spread) if part) + line
    return what + "\n" + "\n".join(textwrap.wrap(detail, width))


def title_settings(fixed: list[str]) -> list[str]:
    """Of the "name value" settings every line shares, those a title names: the model, its
    parameters, the memory and the corruption (not run-wide details such as the device)."""
    named = {*TITLE_SETTINGS, *(card.name for card, _ in param_cards())}
    return [f for f in fixed if f.split(" ")[0] in named and not f.endswith(" none")]


def _look(i: int, count: int) -> tuple[Any, str, str]:
    """Colour, marker and line style of line i of `count`: distinct for up to 20 × 8 lines."""
    from matplotlib import colormaps

    colours = 10 if count <= 10 else 20
    return (
        colormaps["tab10" if count <= 10 else "tab20"](i % colours),
        MARKERS[(i // colours) % len(MARKERS)],
        STYLES[(i // (colours * len(MARKERS))) % len(STYLES)],
    )


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise NphError(
            "plots need matplotlib, an optional dependency: pip install matplotlib "
            '(or pip install -e ".[plot]" in a checkout of nph)'
        ) from None
    return Figure, FigureCanvasAgg


def _figure(size: tuple[int, int], panels: int):
    """A figure of `size` pixels with a near-square grid of `panels` axes sharing x and y (the
    grid's cells past `panels` hidden)."""
    figure_cls, canvas_cls = _matplotlib()
    width, height = size
    figure = figure_cls(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    canvas_cls(figure)
    columns = math.ceil(math.sqrt(panels))
    grid = figure.subplots(
        math.ceil(panels / columns), columns, squeeze=False, sharex=True, sharey=True
    )
    for axes in grid.flat[panels:]:
        axes.set_visible(False)
    return figure, grid


def plain(figure: Any) -> None:
    """Every text of `figure` drawn as it is written: each is data (a label, a file name), so a
    `$` in it is a dollar sign, never the start of TeX that matplotlib would fail to parse."""
    from matplotlib.text import Text

    for text in figure.findobj(Text):
        text.set_parse_math(False)


def overlapping_texts(figure: Any) -> list[tuple[str, str]]:
    """Pairs of the figure's texts whose drawn boxes overlap: its title, axis labels, panel
    titles and legends, measured by the renderer (after a layout), named by their text."""
    plain(figure)
    figure.draw_without_rendering()
    renderer = figure.canvas.get_renderer()
    boxes = []
    texts = [getattr(figure, name, None) for name in ("_suptitle", "_supxlabel", "_supylabel")]
    texts += [axes.title for axes in figure.axes if axes.get_visible()]
    for text in texts:
        if text is not None and text.get_visible() and text.get_text().strip():
            boxes.append((text.get_text(), text.get_window_extent(renderer)))
    for legend in _legends(figure):
        boxes.append(("legend", legend.get_window_extent(renderer)))
    return [
        (name, other)
        for n, (name, box) in enumerate(boxes)
        for other, second in boxes[n + 1 :]
        if box.overlaps(second)
    ]


def _legends(figure: Any) -> list[Any]:
    """The figure's legends and its panels'."""
    return figure.legends + [a.get_legend() for a in figure.axes if a.get_legend()]


def heading(figure: Any, title: str | Any) -> None:
    """Set the figure's title at the top left: a given text as it is, or `title(chars)` wrapped
    to fewer characters a line until its box stays inside the figure and clear of the legend.
    The y axis label, centred on the figure, is then centred below the title if it reached it.
    One layout places the texts: the title's corner and the legend do not move with the title's
    length, so each wrapping is measured by the renderer without laying out again."""
    chars = int(figure.bbox.width) // 6
    text = title if isinstance(title, str) else title(chars)
    heading = figure.suptitle(text, fontsize=9, x=0.01, ha="left")
    plain(figure)
    figure.get_layout_engine().execute(figure)
    renderer = figure.canvas.get_renderer()
    legends = [legend.get_window_extent(renderer) for legend in _legends(figure)]
    for _ in range(0 if isinstance(title, str) else 11):  # 12 wrappings at most
        box = heading.get_window_extent(renderer)
        inside = box.x1 <= 0.99 * figure.bbox.x1  # as far as x=0.01
        if chars <= 20 or (inside and not any(box.overlaps(legend) for legend in legends)):
            break
        chars = max(20, int(chars * 0.85))
        heading.set_text(title(chars))
    box = heading.get_window_extent(renderer)
    label = figure._supylabel
    if label is not None and box.overlaps(label.get_window_extent(renderer)):
        label.set_y(box.y0 / 2 / figure.bbox.height)
