"""`nph shard MEMORY --parts N --out-dir DIR`: split a memory file into N shards and a manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from nphcli.cli.app import app
from nphcli.cli.field_options import own_values, with_fields
from nphcli.cli.render import print_json, print_table
from nphcli.schema.fields import get_field
from nphcli.schema.option import Field, output_field

SHARD_FIELDS = (
    Field(
        "parts",
        "int",
        2,
        "Number of shards; rows are split as evenly as possible.",
        group="output",
        minimum=1,
    ),
    output_field(
        "Folder for the shard files and the manifest (created if missing).", ".", name="out_dir"
    ),
    get_field("force"),
    get_field("json"),
)


@app.command("shard")
@with_fields((), params=False, own=SHARD_FIELDS)
def shard_command(
    memory: Annotated[Path, typer.Argument(help="Memory file to split (written by `nph store`).")],
    *,
    given: dict[str, Any],
) -> None:
    """Split a memory file by rows into shard files (each a valid memory file recording its
    global row offset, the total M and the shard set's id) plus a JSON manifest
    (DIR/NAME.shards.json). Every command's --memory accepts the manifest; `nph retrieve
    --workers N` and torchrun runs read one shard set per rank (docs/distributed.md)."""
    from nphcli.memory.shards import read_manifest, write_shards

    o = own_values(given, SHARD_FIELDS)
    written = write_shards(memory, o["out_dir"], parts=o["parts"], force=o["force"])
    manifest = read_manifest(written, verify=False)  # just written: the headers suffice
    rows = [{"file": str(p.path), "offset": p.offset, "rows": p.rows} for p in manifest.parts]
    if o["json"]:
        print_json({"manifest": str(manifest.path), "set_id": manifest.set_id, "parts": rows})
        return
    print_table(
        f"Wrote {manifest.path} (M={manifest.num_memories}, set {manifest.set_id[:12]})",
        ["file", "first row", "rows"],
        [(row["file"], row["offset"], row["rows"]) for row in rows],
    )
