"""`nph index MEMORY`: build an approximate inner-product index of a memory file (FAISS)."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from nphcli.cli.app import app
from nphcli.cli.field_options import own_values, with_fields
from nphcli.cli.render import print_json, print_table
from nphcli.schema.fields import Field, get_field, output_field

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
    from nphcli.ann.index_file import (
        build_index,
        check_kind,
        default_index_path,
        require_faiss,
        write_index,
    )
    from nphcli.core.atomic import check_output
    from nphcli.core.resources import fits_in_memory
    from nphcli.memory import open_memory
    from nphcli.memory.format import is_manifest
    from nphcli.memory.provenance import content_sha256

    o = own_values(given, INDEX_BUILD_FIELDS)
    if is_manifest(memory):
        return _index_shards(memory, o)
    kind, seed, force = o["kind"], o["seed"], o["force"]
    streamed = open_memory(memory, stream=True)  # the header first: a missing file says so
    require_faiss()
    check_kind(kind)
    path = o["out"] if o["out"] is not None else default_index_path(memory, kind)
    check_output(path, force=force, protect=[memory])
    start = time.perf_counter()
    # A memory larger than RAM is read from disk block by block (docs/ann.md).
    loaded = open_memory(memory) if fits_in_memory(memory.stat().st_size) else streamed
    faiss_index, meta, extra = build_index(
        loaded, memory, kind=kind, seed=seed, lists=o["lists"], progress=_progress
    )
    build_s = time.perf_counter() - start
    write_index(path, faiss_index, meta, extra, force=force)
    report = {
        "file": str(path),
        "bytes": path.stat().st_size,
        "build_s": build_s,
        **{key: meta[key] for key in ("kind", "params", "seed", "M", "d", "faiss_version")},
        "memory_sha256": content_sha256(loaded),  # as results rows name the memory
        "memory_file_sha256": meta["memory_sha256"],  # the file's bytes the index is tied to
    }
    if o["json"]:
        print_json(report)
    else:
        print_table(f"{path}", ["field", "value"], [(k, str(v)) for k, v in report.items()])


def _index_shards(manifest: Path, o: dict[str, Any]) -> None:
    """`nph index MANIFEST`: an index per shard, recorded in the manifest."""
    from nphcli.ann.index_file import check_kind
    from nphcli.ann.shard_index import build_shard_indexes
    from nphcli.core.errors import NphError

    if o["out"] is not None:
        raise NphError("--out names one file; a shard set's indexes go beside its shards")
    check_kind(o["kind"])
    report = build_shard_indexes(
        manifest,
        kind=o["kind"],
        seed=o["seed"],
        lists=o["lists"],
        force=o["force"],
        progress=_progress,
    )
    if o["json"]:
        print_json(report)
        return
    rows = [
        (e["file"], str(e["rows"]), str(e["params"]), str(e["bytes"]), f"{e['build_s']:.1f}")
        for e in report["parts"]
    ]
    title = f"{manifest} ({o['kind']})"
    print_table(title, ["index", "rows", "params", "bytes", "build s"], rows)


def _progress(phase: str, done: int, total: int) -> None:
    """One updating line on stderr, only on a terminal."""
    if sys.stderr.isatty():
        end = "\n" if done == total and phase.endswith("add") else ""
        print(f"\r{phase}: {done:,}/{total:,}", end=end, file=sys.stderr, flush=True)
