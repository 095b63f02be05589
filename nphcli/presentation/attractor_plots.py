"""Pictures of what iterated retrieval converged to (`nph attractors`): the sizes of the states
reached against β, the energy along the iterations, and the basins of a plane of queries.

Given the numbers (`nphcli.app.attractors`), never computing them. Each picture is a PNG,
written atomically.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from nphcli.core.atomic import atomic_write
from nphcli.presentation.plot import DPI, _matplotlib

KIND_COLOURS = {"metastable": "#808080", "global": "#000000"}
DOTS = {"cmap": "viridis", "edgecolors": "none"}
CELLS = {"origin": "lower", "interpolation": "nearest"}


COLUMNS = 4  # panels a row of energy.png and basins.png


def _figure(width: float, height: float, panels: int = 1):
    """A figure of one panel per setting, at most COLUMNS a row, `width` × `height` inches
    each row; the axes in reading order, those past `panels` hidden."""
    figure_cls, canvas_cls = _matplotlib()
    columns = min(panels, COLUMNS)
    lines = -(-panels // columns)
    figure = figure_cls(figsize=(width, height * lines), dpi=DPI, layout="constrained")
    canvas_cls(figure)
    grid = figure.subplots(lines, columns, squeeze=False).ravel()
    for axes in grid[panels:]:
        axes.set_visible(False)
    return figure, grid[:panels]


def _models(rows: list[dict[str, Any]]) -> str:
    """The models the rows ran, each once, in order: what every picture's title names."""
    return ", ".join(dict.fromkeys(row["model"] for row in rows))


def _save(figure: Any, out: str | os.PathLike) -> None:
    with atomic_write(out, force=True) as tmp:
        figure.savefig(tmp, format="png", dpi=DPI)


def plot_sizes(rows: list[dict[str, Any]], out: str | os.PathLike) -> None:
    """For each setting (a column), the share of queries whose final state had size s (the
    fewest memories holding 90 % of the weight), s on a log axis: a 2-D histogram over β."""
    figure, (axes,) = _figure(7.5, 4.5)
    largest = max(max(row["sizes"]) for row in rows)
    for column, row in enumerate(rows):
        counts = Counter(row["sizes"])
        total = len(row["sizes"])
        sizes = sorted(counts)
        shares = [counts[s] / total for s in sizes]
        area = [400 * share for share in shares]
        axes.scatter([column] * len(sizes), sizes, s=area, c=shares, vmin=0, vmax=1, **DOTS)
        axes.text(column, largest * 1.6, f"{row['at_pattern']:.0%}", ha="center", fontsize=7)
    axes.set_yscale("log")
    axes.set_ylim(0.7, largest * 2.5)
    axes.set_xticks(range(len(rows)), [row["short"] for row in rows], rotation=30, fontsize=7)
    axes.set_ylabel("state size s (memories holding 90 % of the weight)")
    axes.set_title(
        f"{_models(rows)}: sizes of the states reached (dot area: share of queries; "
        "top: share at one pattern)",
        fontsize=8,
        wrap=True,
    )
    _save(figure, out)


def plot_energy(rows: list[dict[str, Any]], out: str | os.PathLike) -> None:
    """E(x_t) against the step t, one panel per setting: every traced query thin, the mean bold."""
    figure, panels = _figure(3.0 * min(len(rows), COLUMNS), 3.2, len(rows))
    figure.suptitle(f"{_models(rows)}: energy along the iterations (bold: mean)", fontsize=9)
    for axes, row in zip(panels, rows, strict=True):
        traces = row["energy_trace"]  # (T + 1) lists of per-query energies
        if traces is None:
            axes.text(0.5, 0.5, "no energy", ha="center", transform=axes.transAxes)
            continue
        steps = list(range(len(traces)))
        for q in range(len(traces[0])):
            axes.plot(steps, [t[q] for t in traces], color="#9ecae1", linewidth=0.6)
        axes.plot(steps, [sum(t) / len(t) for t in traces], color="#08519c", linewidth=2)
        axes.set_xlabel("step t")
        axes.set_title(row["short"], fontsize=8)
    for axes in panels[::COLUMNS]:
        axes.set_ylabel("energy E(x_t)")
    _save(figure, out)


def plot_basins(rows: list[dict[str, Any]], out: str | os.PathLike) -> None:
    """Per setting, the plane x(u, v) = ξ_a + u(ξ_b − ξ_a) + v(ξ_c − ξ_a): each cell coloured by
    the stored pattern its query converged to (a colour per pattern), grey for a metastable
    state, black for the global average; a, b, c marked."""
    from matplotlib.colors import ListedColormap

    figure, panels = _figure(3.0 * min(len(rows), COLUMNS), 3.3, len(rows))
    figure.suptitle(
        f"{_models(rows)}: the stored pattern each query of the plane reached", fontsize=9
    )
    for axes, row in zip(panels, rows, strict=True):
        basin = row["basin"]
        labels = basin["labels"]  # (n, n) rows: v, columns: u; ≥ 0 a pattern, −1, −2
        patterns = sorted({cell for line in labels for cell in line if cell >= 0})
        palette = ["#e41a1c", "#377eb8", "#4daf4a", "#984ea3", "#ff7f00", "#a65628", "#f781bf"]
        colours = [KIND_COLOURS["global"], KIND_COLOURS["metastable"]]
        colours += [palette[i % len(palette)] for i in range(len(patterns))]
        code = {-2: 0, -1: 1, **{p: 2 + i for i, p in enumerate(patterns)}}
        image = [[code[cell] for cell in line] for line in labels]
        low, high = basin["range"]
        cmap, top = ListedColormap(colours), len(colours) - 0.5
        axes.imshow(image, extent=(low, high, low, high), cmap=cmap, vmin=-0.5, vmax=top, **CELLS)
        for (u, v), name in zip(((0, 0), (1, 0), (0, 1)), basin["corners"], strict=True):
            axes.plot(u, v, "w+", markersize=8)
            at = {"xytext": (3, 3), "textcoords": "offset points"}
            axes.annotate(f"ξ{name}", (u, v), color="white", fontsize=7, **at)
        from matplotlib.patches import Patch

        names = ["global", "metastable", *(f"ξ{p}" for p in patterns)]
        used = sorted({c for line in image for c in line})
        handles = [Patch(color=colours[c], label=names[c]) for c in used]
        axes.legend(handles=handles, fontsize=6, loc="upper right", framealpha=0.7)
        axes.set_title(row["short"], fontsize=8)
        corner = basin["corners"]
        axes.set_xlabel(f"u (from ξ{corner[0]} towards ξ{corner[1]})")
    for axes, row in zip(panels[::COLUMNS], rows[::COLUMNS], strict=True):
        axes.set_ylabel(
            f"v (from ξ{row['basin']['corners'][0]} towards ξ{row['basin']['corners'][2]})"
        )
    _save(figure, out)
