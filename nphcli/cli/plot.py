"""`nph plot`: draw a metric of results files (every results format nph writes).

Parsing and rendering only; `nphcli.presentation.plot` and `nphcli.presentation.plot_data` do
the work.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from nphcli.cli.app import app, quiet
from nphcli.cli.field_options import own_values, with_fields
from nphcli.cli.options import FACET, Where
from nphcli.cli.render import stderr_console
from nphcli.schema.fields import get_field
from nphcli.schema.option import options_of, output_field_setting, setting


@dataclass(frozen=True)
class PlotOptions:
    out: Path = output_field_setting("Plot file to write: .png, .svg or .pdf.", Path("sweep.png"))
    metric: str | None = setting(
        None,
        "sse, mse, success, cosine, nearest_distance, support, steps, us_per_query, or the "
        "attractor shares and sizes at_pattern, at_metastable, at_global, attractor_size, "
        "energy [default: sse; success with --y].",
    )
    x: str = setting(
        "auto",
        "x axis: size (M), noise (σ), variance (σ²), mask, beta, any numeric setting of the rows "
        "(k, alpha, ...), or auto (the first of size, noise, mask, beta, then the other "
        "settings, that varies).",
    )
    y: str | None = setting(
        None,
        "Draw a phase diagram: a heatmap of the metric over --x and this setting (e.g. --x beta "
        "--y noise), one panel per model, the success = 0.5 boundary outlined.",
    )
    size: str = setting("800x500", "Image size WIDTHxHEIGHT in pixels.")
    title: str | None = setting(None, "Plot title [default: from the results].")


_OWN = options_of(PlotOptions, "output")
PLOT_FIELDS = (*_OWN[:4], FACET, *_OWN[4:], get_field("force"))


@app.command("plot")
@with_fields((), params=False, own=PLOT_FIELDS)
def plot_command(
    results: Annotated[
        list[Path],
        typer.Argument(
            help="Results files of nph sweep (.jsonl, .csv) or nph retrieve --csv, and JSON "
            "Lines of nph retrieve --json or nph batch; several are read as one."
        ),
    ],
    where: Where = None,
    *,
    given: dict[str, Any],
) -> None:
    """Plot a metric of results: mean over trials against a setting, one line per combination
    of the other settings that vary, shaded ±1 std; or, with --y, a phase diagram over two
    settings. Needs matplotlib (pip install matplotlib)."""
    from nphcli.core.atomic import check_writable
    from nphcli.core.errors import NphError
    from nphcli.presentation.plot import check_plot_output, parse_pixels, plot_results
    from nphcli.sweeps.reading import read_inputs

    o = own_values(given, PLOT_FIELDS)
    out, y, force = o["out"], o["y"], o["force"]
    pixels = parse_pixels(o["size"])
    check_plot_output(out)
    if any(out.resolve() == path.resolve() for path in results):
        raise NphError("--out would replace a results file; choose another name")
    check_writable(out, force=force)
    rows, _ = read_inputs(results)
    metric = o["metric"] or ("sse" if y is None else "success")
    shared = {name: o[name] for name in ("x", "facet", "title")}
    plot_results(rows, out, metric=metric, where=where, y=y, size=pixels, force=force, **shared)
    if not quiet():
        stderr_console().print(f"wrote {out}", highlight=False)
