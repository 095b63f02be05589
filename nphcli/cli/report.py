"""`nph report`: one self-contained HTML page of results, plots and comparison pictures.

Parsing and rendering only; `nphcli.presentation.report_html` does the work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nphcli.cli.app import app, quiet
from nphcli.cli.options import Force
from nphcli.cli.render import stderr_console


@app.command("report")
def report_command(
    results: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Results files of nph sweep or nph retrieve --csv, and JSON Lines of nph "
            "retrieve --json or nph batch; several are read as one.",
        ),
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")] = Path(
        "report.html"
    ),
    grid: Annotated[
        list[Path] | None,
        typer.Option("--grid", help="A --save-grid picture to show; repeat for several."),
    ] = None,
    title: Annotated[str, typer.Option("--title", help="The page's title.")] = "nph report",
    force: Force = False,
) -> None:
    """Write one self-contained HTML report (no network, figures inline): provenance, every
    setting's metrics with the best marked, line plots, phase diagrams and comparison
    pictures. Needs matplotlib for the plots."""
    from nphcli.core.atomic import check_writable
    from nphcli.core.errors import NphError
    from nphcli.presentation.report_html import write_report
    from nphcli.sweeps.reading import read_inputs

    results, grids = results or [], grid or []
    if out.suffix.lower() not in (".html", ".htm"):
        raise NphError(f"--out {out}: name the report .html")
    if any(out.resolve() == path.resolve() for path in [*results, *grids]):
        raise NphError("--out would replace an input; choose another name")
    check_writable(out, force=force)
    rows, sources = read_inputs(results)
    write_report(out, rows, sources, grids=grids, title=title, force=force)
    if not quiet():
        stderr_console().print(
            f"wrote {out} (open it in a browser)", highlight=False, soft_wrap=True
        )
