"""`nph plot`: draw a metric of results files (of nph sweep or nph retrieve --csv).

Parsing and rendering only; `nphcli.presentation.plot` and `nphcli.presentation.plot_data` do
the work.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from nphcli.cli.app import app, quiet
from nphcli.cli.options import Force
from nphcli.cli.render import stderr_console


@app.command("plot")
def plot_command(
    results: Annotated[
        list[Path],
        typer.Argument(
            help="Results files of nph sweep or nph retrieve --csv (.jsonl or .csv); several "
            "are read as one."
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Plot file to write: .png, .svg or .pdf.")
    ] = Path("sweep.png"),
    metric: Annotated[
        str | None,
        typer.Option(
            "--metric",
            help="sse, mse, success, cosine, nearest_distance, support, steps or us_per_query "
            "[default: sse; success with --y].",
        ),
    ] = None,
    x: Annotated[
        str,
        typer.Option(
            "--x",
            help="x axis: size (M), noise (σ), variance (σ²), mask, beta, any numeric setting "
            "of the rows (k, alpha, ...), or auto (the first of size, noise, mask, beta, then "
            "the other settings, that varies).",
        ),
    ] = "auto",
    y: Annotated[
        str | None,
        typer.Option(
            "--y",
            help="Draw a phase diagram: a heatmap of the metric over --x and this setting (e.g. "
            "--x beta --y noise), one panel per model, the success = 0.5 boundary outlined.",
        ),
    ] = None,
    where: Annotated[
        list[str] | None,
        typer.Option(
            "--where",
            help="Keep only rows with COLUMN=VALUE[,VALUE...], e.g. model=topk or k=5,10; "
            "repeat for several conditions.",
        ),
    ] = None,
    facet: Annotated[
        str | None,
        typer.Option("--facet", help="One panel per value of this setting (e.g. model, M, noise)."),
    ] = None,
    size: Annotated[
        str, typer.Option("--size", help="Image size WIDTHxHEIGHT in pixels.")
    ] = "800x500",
    title: Annotated[
        str | None, typer.Option("--title", help="Plot title [default: from the results].")
    ] = None,
    force: Force = False,
) -> None:
    """Plot a metric of results: mean over trials against a setting, one line per combination
    of the other settings that vary, shaded ±1 std; or, with --y, a phase diagram over two
    settings. Needs matplotlib (pip install matplotlib)."""
    from nphcli.core.atomic import check_writable
    from nphcli.core.errors import NphError
    from nphcli.presentation.plot import check_plot_output, parse_pixels, plot_phase, plot_results
    from nphcli.sweeps.results import read_results

    pixels = parse_pixels(size)
    check_plot_output(out)
    if any(out.resolve() == path.resolve() for path in results):
        raise NphError("--out would replace a results file; choose another name")
    check_writable(out, force=force)
    rows = []
    for path in results:
        if not path.is_file():
            raise NphError(f"results file {path} not found")
        rows += read_results(path).rows
    draw = plot_results if y is None else partial(plot_phase, y=y)
    draw(
        rows,
        out,
        metric=metric or ("sse" if y is None else "success"),
        x=x,
        where=where,
        facet=facet,
        size=pixels,
        title=title,
        force=force,
    )
    if not quiet():
        stderr_console().print(f"wrote {out}", highlight=False)
