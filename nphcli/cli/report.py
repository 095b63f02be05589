"""`nph report`: one self-contained HTML page of results, plots and comparison pictures.

Parsing and rendering only; `nphcli.presentation.report_html` does the work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from nphcli.cli.app import app, quiet
from nphcli.cli.field_options import own_values, with_fields
from nphcli.cli.options import FACET, Grids, Where
from nphcli.cli.render import stderr_console
from nphcli.schema.fields import get_field
from nphcli.schema.option import Field, output_field

REPORT_FIELDS = (
    output_field("HTML file to write.", "report.html"),
    Field("title", "str", "nph report", "The page's title.", group="output"),
    FACET,
    get_field("force"),
)


@app.command("report")
@with_fields((), params=False, own=REPORT_FIELDS)
def report_command(
    results: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Results files of nph sweep or nph retrieve --csv, and JSON Lines of nph "
            "retrieve --json or nph batch; each is its own section (split by memory)."
        ),
    ] = None,
    grid: Grids = None,
    where: Where = None,
    *,
    given: dict[str, Any],
) -> None:
    """Write one self-contained HTML report (no network, figures inline): one section per input
    file and memory, figures first, the settings every row shares stated once, a table of what
    varies with the best marked, provenance; then comparison pictures. Needs matplotlib."""
    from nphcli.core.atomic import check_writable
    from nphcli.core.errors import NphError
    from nphcli.presentation.report_html import write_report
    from nphcli.sweeps.reading import MAX_REPORT_SETTINGS, read_inputs

    o = own_values(given, REPORT_FIELDS)
    out, force = o["out"], o["force"]
    results, grids = results or [], grid or []
    if out.suffix.lower() not in (".html", ".htm"):
        raise NphError(f"--out {out}: name the report .html")
    if any(out.resolve() == path.resolve() for path in [*results, *grids]):
        raise NphError("--out would replace an input; choose another name")
    check_writable(out, force=force)
    rows, sources = read_inputs(results, max_settings=MAX_REPORT_SETTINGS, where=where)
    write_report(out, rows, sources, grids=grids, title=o["title"], where=where,
                 facet=o["facet"], force=force)  # fmt: skip
    if not quiet():
        stderr_console().print(
            f"wrote {out} (open it in a browser)", highlight=False, soft_wrap=True
        )
