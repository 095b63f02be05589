"""`nph info FILE`: what a memory file holds, and how well separated its patterns are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from nphcli.cli.app import app
from nphcli.cli.field_options import own_values, with_fields
from nphcli.cli.render import format_value, print_json, print_table
from nphcli.schema.fields import ANALYSIS_FIELDS, get_field

# Shown in their own rows, so not repeated among the metadata rows.
_SHOWN = {"M", "d", "dtype", "item_shape", "value_range"}
# Metadata rows in this order first, then the rest by name.
_ORDER = ["source", "origin", "fallback", "split", "kind", "selection", "seed", "normalize"]


INFO_FIELDS = (get_field("sample", ANALYSIS_FIELDS), get_field("seed"), get_field("json"))


@app.command("info")
@with_fields((), params=False, own=INFO_FIELDS)
def info_command(
    file: Annotated[Path, typer.Argument(help="Memory file to describe.")], *, given: dict[str, Any]
) -> None:
    """Show a memory file's shape, dtype, metadata, value range, norms and separation.

    Separation statistics of the stored patterns ξ_μ (Hu et al. 2025): m = max ‖ξ_μ‖;
    R = ½ min over μ≠ν of ‖ξ_μ − ξ_ν‖; Δ_μ = ⟨ξ_μ, ξ_μ⟩ − max over ν≠μ of ⟨ξ_μ, ξ_ν⟩.
    """
    from nphcli.memory import open_memory
    from nphcli.theory.separation import describe

    o = own_values(given, INFO_FIELDS)
    memory = open_memory(file, stream=True)  # read in blocks: a file larger than RAM works
    report = describe(memory, max_rows=o["sample"] or None, seed=o["seed"])
    report["bytes"] = file.stat().st_size
    report["meta"] = dict(sorted(report["meta"].items()))
    if o["json"]:
        print_json(report)
        return
    print_table(f"{file}", ["field", "value"], _rows(report))


def _rows(report: dict) -> list[tuple[str, str]]:
    sep = report["separation"]
    shape = report["item_shape"]
    low, high = report["value_range"]
    norms = report["norms"]
    labels = report["labels"]
    rows = [
        ("patterns", f"{report['M']} × {report['d']} {report['dtype']}"),
        ("item shape", "×".join(str(s) for s in shape) if shape else "-"),
        ("labels", f"{labels['count']} ({labels['distinct']} distinct)" if labels else "none"),
        ("values", "×".join(str(s) for s in report["values_shape"] or []) or "none"),
        ("value range", f"[{format_value(low)}, {format_value(high)}]"),
        ("norms ‖ξ‖", ", ".join(f"{k} {format_value(norms[k])}" for k in ("min", "mean", "max"))),
        ("m = max ‖ξ‖", format_value(sep["m"])),
        ("R = ½ min ‖ξ_μ−ξ_ν‖", format_value(sep["R"]) if sep["R"] is not None else "- (M < 2)"),
    ]
    delta = sep["delta"]
    if delta:
        stats = ", ".join(f"{k} {format_value(delta[k])}" for k in ("min", "mean", "median", "max"))
        rows.append(("Δ_μ", stats))
    if sep["sampled"]:
        used = f"R and Δ over {sep['rows_used']} of {report['M']} patterns (seed {sep['seed']})"
        rows.append(("sampled", used + ", each against all; R is then an upper bound"))
    meta = report["meta"]
    keys = [k for k in _ORDER if k in meta] + sorted(k for k in meta if k not in _ORDER)
    for key in keys:
        if key not in _SHOWN:
            value = meta[key]
            rows.append(
                (key, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
            )
    rows.append(("size", f"{report['bytes']:,} bytes"))
    return rows
