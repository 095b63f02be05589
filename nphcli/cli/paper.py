"""`nph paper ...`: the paper's tables reproduced, nph's numbers printed beside the paper's.

One subcommand per table of the paper, each in its own module registering itself on `paper_app`
(`paper_mil.py`: Table "mil_benchmark"). They share the options of `paper_fields` and the
rendering below, so every table is shown, written and drawn the same way
(`nphcli.experiments.paper_table`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import typer

from nphcli.cli.app import app, quiet
from nphcli.cli.render import print_json, print_table, stderr_console
from nphcli.schema.option import Field, output_field

if TYPE_CHECKING:  # torch-free, but kept out of `nph --help`'s imports all the same
    from nphcli.experiments.paper_table import Cell, PaperTable

paper_app = typer.Typer(
    help="Reproduce the paper's tables: nph's numbers beside the paper's, with the difference "
    "and the spread over seeds.",
    no_args_is_help=True,
)
app.add_typer(paper_app, name="paper")


def paper_fields(default_out: str) -> tuple[Field, ...]:
    """The options every `nph paper` table takes: its results folder, whether to train, and
    whether to draw (`default_out`: the table's own folder name)."""
    return (
        output_field(
            "Results folder: every finished training (resumable: run again to continue) and "
            "the comparison as TABLE.json, TABLE.csv and TABLE.png.",
            default_out,
        ),
        Field(
            "no_train",
            "bool",
            False,
            "Train nothing: the table from the runs --out already holds (seeds with every "
            "part finished).",
            group="output",
        ),
        Field("no_plot", "bool", False, "Do not draw TABLE.png.", group="output"),
        Field(
            "jobs",
            "int",
            1,
            "Trainings run at once, each in its own process (--threads shared among them); "
            "the results are the same as with one.",
            group="analysis",
        ),
        Field(
            "ray",
            "str",
            None,
            "Send the trainings to the Ray cluster at this address ('auto': the one this "
            "machine has joined; 'local': a new one here). Needs pip install 'nph[cluster]'.",
            group="analysis",
        ),
    )


@paper_app.callback()
def paper_group() -> None:
    """Reproduce the paper's tables: nph's numbers beside the paper's."""


def _number(value: float | None, spec: str = ".3f") -> str:
    return "" if value is None else format(value, spec)


def render_comparison(
    table: PaperTable,
    cells: Sequence[Cell],
    meta: Mapping[str, Any],
    *,
    as_json: bool,
    title: str | None = None,
) -> None:
    """The comparison on stdout: one JSON object, or a table of paper | nph ± spread | diff |
    verdict, and under it the reason of each row that is not comparable."""
    from nphcli.experiments.paper_table import (
        MODEL_NAMES,
        NO_SPREAD,
        cells_json,
        seeds_text,
        spread_text,
        summary,
    )

    if as_json:
        print_json(cells_json(table, cells, meta))
        return
    rows = [
        (
            MODEL_NAMES.get(c.row, c.row),
            c.column,
            _number(c.paper),
            spread_text(c),
            _number(c.difference, "+.3f"),
            c.verdict or (NO_SPREAD if c.seeds == 1 and c.paper is not None else ""),
            str(c.seeds),
        )
        for c in cells
    ]
    counts = summary(cells)
    alone = f"; {counts['one_seed']} of one seed, with no spread" if counts["one_seed"] else ""
    print_table(
        f"{title or table.title}: paper vs nph over {seeds_text(cells)} ({counts['within']} of "
        f"{counts['compared']} comparable cells within nph's spread; "
        f"{counts['not_comparable']} not comparable{alone})",
        ["model", "column", "paper", "nph ± spread", "nph − paper", "verdict", "seeds"],
        rows,
    )
    reasons = {MODEL_NAMES.get(c.row, c.row): c.reason for c in cells if c.reason}
    if reasons and not quiet():
        for name, reason in reasons.items():
            stderr_console().print(f"not comparable: {name}: {reason}", highlight=False)


def wrote(paths: Sequence[str]) -> None:
    """`wrote FILE` on stderr for each file written (not with --quiet)."""
    if not quiet():
        for path in paths:
            stderr_console().print(f"wrote {path}", highlight=False)
