"""`nph attractors`: the kinds of states iterated retrieval reaches, with pictures.

Parsing and rendering only; `nphcli.app.attractors` does the work.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nphcli.cli.app import app
from nphcli.cli.field_options import field_values, own_values, with_fields
from nphcli.cli.render import print_json, print_table
from nphcli.schema.fields import get_field
from nphcli.schema.option import options_of, setting

STUDY_FIELDS = (
    *("memory", "model", "seed", "queries", "mask", "mask_mode", "fill", "noise", "noise_clip"),
    *("occlude", "salt_pepper", "flip", "dtype", "memory_budget"),
)


@dataclass(frozen=True)
class AttractorOptions:
    pictures: Path = setting(
        Path("."), "Existing folder for sizes.png, energy.png, basins.png and attractors.json."
    )
    basin: str = setting("0,1,2", "Three stored rows a,b,c spanning the basin plane.")
    resolution: int = setting(41, "Cells per side of the basin picture.", minimum=2)
    traced: int = setting(20, "Queries whose energy is traced per step.", minimum=1)


ATTRACTOR_FIELDS = (*options_of(AttractorOptions, "output"), get_field("json"))


@app.command("attractors")
@with_fields(STUDY_FIELDS, own=ATTRACTOR_FIELDS)
def attractors_command(*, given: dict[str, Any]) -> None:
    """What iterated retrieval converged to (--steps > 1): per setting, the share of queries at
    one stored pattern, at a metastable state and at the global average (docs/retrieving.md,
    "Attractors"), the sizes of the states reached, energy traces and a basin picture.
    Any setting option takes a comma list (e.g. --beta 0.01,0.1,1)."""
    from nphcli.app.attractors import attractor_study
    from nphcli.core.errors import NphError

    own = own_values(given, ATTRACTOR_FIELDS)
    try:
        corners = [int(part) for part in own["basin"].split(",")]
    except ValueError:
        raise NphError(
            f"--basin takes three row numbers such as 0,1,2, got {own['basin']!r}"
        ) from None
    result = attractor_study(
        field_values(given, among=ATTRACTOR_FIELDS),
        own["pictures"],
        corners=corners,
        resolution=own["resolution"],
        traced=own["traced"],
    )
    rows = result["settings"]
    if own["json"]:
        print_json(
            {**result, "settings": [{k: v for k, v in r.items() if k != "basin"} for r in rows]}
        )
        return
    shown = ("short", "success", "at_pattern", "at_metastable", "at_global")
    print_table(
        f"attractors of {result['memory']} (M = {result['M']}); pictures in {own['pictures']}",
        ["setting", "success", "pattern", "metastable", "global", "median s"],
        [[r[c] for c in shown] + [sorted(r["sizes"])[len(r["sizes"]) // 2]] for r in rows],
    )
