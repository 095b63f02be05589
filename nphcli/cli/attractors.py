"""`nph attractors`: the kinds of states iterated retrieval reaches, with pictures.

Parsing and rendering only; `nphcli.app.attractors` does the work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from nphcli.cli.app import app
from nphcli.cli.field_options import field_values, with_fields
from nphcli.cli.options import JsonOutput
from nphcli.cli.render import print_json, print_table

STUDY_FIELDS = (
    "memory",
    "model",
    "seed",
    "queries",
    "mask",
    "mask_mode",
    "fill",
    "noise",
    "noise_clip",
    "occlude",
    "salt_pepper",
    "flip",
    "dtype",
    "memory_budget",
)


@app.command("attractors")
@with_fields(STUDY_FIELDS)
def attractors_command(
    pictures: Annotated[
        Path,
        typer.Option(
            "--pictures",
            help="Existing folder for sizes.png, energy.png, basins.png and attractors.json.",
        ),
    ] = Path("."),
    basin: Annotated[
        str, typer.Option("--basin", help="Three stored rows a,b,c spanning the basin plane.")
    ] = "0,1,2",
    resolution: Annotated[
        int, typer.Option("--resolution", help="Cells per side of the basin picture.")
    ] = 41,
    traced: Annotated[
        int, typer.Option("--traced", help="Queries whose energy is traced per step.")
    ] = 20,
    as_json: JsonOutput = False,
    *,
    given: dict[str, Any],
) -> None:
    """What iterated retrieval converged to (--steps > 1): per setting, the share of queries at
    one stored pattern, at a metastable state and at the global average (docs/retrieving.md,
    "Attractors"), the sizes of the states reached, energy traces and a basin picture.
    Any setting option takes a comma list (e.g. --beta 0.01,0.1,1)."""
    from nphcli.app.attractors import attractor_study
    from nphcli.core.errors import NphError

    try:
        corners = [int(part) for part in basin.split(",")]
    except ValueError:
        raise NphError(f"--basin takes three row numbers such as 0,1,2, got {basin!r}") from None
    result = attractor_study(
        field_values(given), pictures, corners=corners, resolution=resolution, traced=traced
    )
    rows = result["settings"]
    if as_json:
        print_json(
            {**result, "settings": [{k: v for k, v in row.items() if k != "basin"} for row in rows]}
        )
        return
    print_table(
        f"attractors of {result['memory']} (M = {result['M']}); pictures in {pictures}",
        ["setting", "success", "pattern", "metastable", "global", "median s"],
        [
            [
                row["short"],
                row["success"],
                row["at_pattern"],
                row["at_metastable"],
                row["at_global"],
                sorted(row["sizes"])[len(row["sizes"]) // 2],
            ]
            for row in rows
        ],
    )
