"""The files of a paper-table comparison (`paper_table.Cell`s): its JSON and CSV, and its
picture, nph's means and spreads beside the paper's values, one panel per column, with a
caption that counts the seeds."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from nphcli.core.atomic import atomic_write
from nphcli.experiments.paper_table import (
    MODEL_NAMES,
    Cell,
    PaperTable,
    seeds_text,
    write_csv,
    write_json,
)

COLOURS = {  # a cell's verdict -> its dot's colour
    "within": "tab:green",
    "outside": "tab:orange",
    "not comparable": "tab:purple",
    "baseline": "tab:grey",
    None: "tab:grey",
}


def draw(
    path: str | os.PathLike, table: PaperTable, cells: Sequence[Cell], *, title: str | None = None
) -> None:
    """A PNG of the comparison (`comparison_figure`), written atomically."""
    figure = comparison_figure(table, cells, title=title)
    with atomic_write(path, force=True) as tmp:
        figure.savefig(tmp, format="png", dpi=100)


def comparison_figure(table: PaperTable, cells: Sequence[Cell], *, title: str | None = None):
    """One panel per column; per model nph's mean as a dot with its spread over seeds as an
    error bar, coloured by the cell's verdict (`COLOURS`), the paper's value as a black
    diamond beside it (hollow where not comparable); the caption says how many seeds the means
    are over and what the colours mean."""
    from nphcli.presentation.plot import _matplotlib  # optional: imported where needed

    columns = list(dict.fromkeys(c.column for c in cells))
    rows = list(dict.fromkeys(c.row for c in cells))
    by_key = {(c.row, c.column): c for c in cells}
    used = seeds_text(cells)
    dot = "nph (1 seed)" if used == "1 seed" else "nph ± spread"
    figure_cls, canvas_cls = _matplotlib()
    per_line = min(len(columns), 4)
    lines = math.ceil(len(columns) / per_line)
    width = max(6.5, 0.45 * len(rows) * per_line + 1.5)
    figure = figure_cls(figsize=(width, 3.4 * lines + 0.9), layout="constrained")
    canvas_cls(figure)
    grid = figure.subplots(lines, per_line, squeeze=False)
    for index, column in enumerate(columns):
        axes = grid[index // per_line][index % per_line]
        for x, row in enumerate(rows):
            cell = by_key[row, column]
            if cell.mean is not None:
                colour = COLOURS[cell.verdict]
                axes.errorbar(x - 0.12, cell.mean, yerr=cell.std or None, fmt="o", color=colour,
                              capsize=3, label=dot if x == 0 else None)  # fmt: skip
            if cell.paper is not None:
                fill = "none" if cell.verdict == "not comparable" else "black"
                axes.plot(x + 0.12, cell.paper, "D", color="black", markersize=5,
                          markerfacecolor=fill, label="paper" if x == 0 else None)  # fmt: skip
        axes.set_xticks(range(len(rows)), [MODEL_NAMES.get(r, r) for r in rows], rotation=45,
                        ha="right", fontsize=8)  # fmt: skip
        axes.set_xlim(-0.6, len(rows) - 0.4)
        axes.set_title(column, fontsize=10)
        axes.set_ylabel(table.metric if table.metric != "MSE / MAE" else column.rsplit("/", 1)[-1])
        axes.grid(axis="y", alpha=0.3)
    for index in range(len(columns), lines * per_line):
        grid[index // per_line][index % per_line].set_visible(False)
    grid[0][0].legend(fontsize=7)
    spread = "no spread" if used == "1 seed" else "± spread over seeds"
    figure.suptitle(
        f"{title or table.title}\npaper (◆) vs nph (● mean of {used}, {spread}); green: within, "
        "orange: outside, purple: not comparable (◇), grey: baseline or one seed",
        fontsize=9,
    )
    return figure


def write_comparison(
    folder: str | os.PathLike,
    table: PaperTable,
    cells: Sequence[Cell],
    meta: Mapping[str, Any],
    *,
    picture: bool = True,
    title: str | None = None,
) -> list[str]:
    """`{table}.json`, `{table}.csv` and (with `picture`) `{table}.png` in `folder`; their paths."""
    stem = os.path.join(os.fspath(folder), table.name)
    paths = [stem + ".json", stem + ".csv"]
    write_json(paths[0], table, cells, meta)
    write_csv(paths[1], cells)
    if picture:
        draw(stem + ".png", table, cells, title=title)
        paths.append(stem + ".png")
    return paths
