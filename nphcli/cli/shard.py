"""`nph shard MEMORY --parts N --out-dir DIR`: split a memory file into N shards and a manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nphcli.cli.app import app
from nphcli.cli.options import Force, JsonOutput
from nphcli.cli.render import print_json, print_table


@app.command("shard")
def shard_command(
    memory: Annotated[Path, typer.Argument(help="Memory file to split (written by `nph store`).")],
    parts: Annotated[
        int, typer.Option("--parts", help="Number of shards; rows are split as evenly as possible.")
    ] = 2,
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out-dir", help="Folder for the shard files and the manifest (created if missing)."
        ),
    ] = Path("."),
    force: Force = False,
    as_json: JsonOutput = False,
) -> None:
    """Split a memory file by rows into shard files (each a valid memory file recording its
    global row offset, the total M and the shard set's id) plus a JSON manifest
    (DIR/NAME.shards.json). Every command's --memory accepts the manifest; `nph retrieve
    --workers N` and torchrun runs read one shard set per rank (docs/distributed.md)."""
    from nphcli.memory.shards import read_manifest, write_shards

    written = write_shards(memory, out_dir, parts=parts, force=force)
    manifest = read_manifest(written, verify=False)  # just written: the headers suffice
    rows = [
        {"file": str(part.path), "offset": part.offset, "rows": part.rows}
        for part in manifest.parts
    ]
    if as_json:
        print_json({"manifest": str(manifest.path), "set_id": manifest.set_id, "parts": rows})
        return
    print_table(
        f"Wrote {manifest.path} (M={manifest.num_memories}, set {manifest.set_id[:12]})",
        ["file", "first row", "rows"],
        [(row["file"], row["offset"], row["rows"]) for row in rows],
    )
