"""`nph index MEMORY`: build an approximate inner-product index of a memory file (FAISS)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from nphcli.cli.app import app
from nphcli.cli.field_options import own_values, with_fields
from nphcli.cli.render import print_json, print_table
from nphcli.schema.fields import get_field
from nphcli.schema.option import Field, output_field

INDEX_BUILD_FIELDS = (
    Field(
        "kind",
        "str",
        "ivf",
        "flat (exact, no training), ivf (k-means lists), hnsw (graph) or "
        "ivfpq (lists of compressed codes).",
        group="index",
    ),
    output_field("Index file [default: MEMORY's name with .KIND.index]."),
    Field("lists", "int", None, "IVF lists (ivf, ivfpq) [default: about √M].", group="index"),
    dataclasses.replace(get_field("seed"), help="Seed of k-means and PQ training (ivf, ivfpq)."),
    get_field("force"),
    get_field("json"),
)


@app.command("index")
@with_fields((), params=False, own=INDEX_BUILD_FIELDS)
def index_command(
    memory: Annotated[
        Path,
        typer.Argument(
            help="Memory file written by `nph store`, or a shard manifest (`nph shard`): one "
            "index per shard, recorded in the manifest."
        ),
    ],
    *,
    given: dict[str, Any],
) -> None:
    """Build an inner-product index of the stored patterns for `nph retrieve --index`.

    Needs FAISS (pip install faiss-cpu; in a checkout, pip install -e ".[ann]"). The index
    records the memory file's SHA-256: retrieval refuses it for any other file. On a shard
    manifest, each shard gets its own index beside it (--lists counts per shard). See
    docs/ann.md and docs/ann-shards.md.
    """
    from nphcli.app.index import build_memory_index

    o = own_values(given, INDEX_BUILD_FIELDS)
    options = {name: o[name] for name in ("kind", "out", "lists", "seed", "force")}
    report = build_memory_index(memory, **options, progress=_progress)
    if o["json"]:
        print_json(report)
    elif "parts" in report:  # a shard set: one index per shard
        rows = [
            (e["file"], str(e["rows"]), str(e["params"]), str(e["bytes"]), f"{e['build_s']:.1f}")
            for e in report["parts"]
        ]
        title = f"{memory} ({o['kind']})"
        print_table(title, ["index", "rows", "params", "bytes", "build s"], rows)
    else:
        rows = [(key, str(value)) for key, value in report.items()]
        print_table(report["file"], ["field", "value"], rows)


def _progress(phase: str, done: int, total: int) -> None:
    """One updating line on stderr, only on a terminal."""
    if sys.stderr.isatty():
        end = "\n" if done == total and phase.endswith("add") else ""
        print(f"\r{phase}: {done:,}/{total:,}", end=end, file=sys.stderr, flush=True)
