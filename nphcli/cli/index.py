"""`nph index MEMORY`: build an approximate inner-product index of a memory file (FAISS)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from nphcli.cli.app import app
from nphcli.cli.render import print_json, print_table


@app.command("index")
def index_command(
    memory: Annotated[Path, typer.Argument(help="Memory file written by `nph store`.")],
    kind: Annotated[
        str,
        typer.Option(
            "--kind",
            help="flat (exact, no training), ivf (k-means lists), hnsw (graph) or ivfpq "
            "(lists of compressed codes).",
        ),
    ] = "ivf",
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Index file [default: MEMORY's name with .KIND.index]."),
    ] = None,
    lists: Annotated[
        int | None,
        typer.Option("--lists", help="IVF lists (ivf, ivfpq) [default: about √M]."),
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed of k-means and PQ training (ivf, ivfpq).")
    ] = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing index file.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Build an inner-product index of the stored patterns for `nph retrieve --index`.

    Needs FAISS (pip install faiss-cpu; in a checkout, pip install -e ".[ann]"). The index
    records the memory file's SHA-256: retrieval refuses it for any other file. See docs/ann.md.
    """
    from nphcli.ann.index_file import (
        build_index,
        check_kind,
        default_index_path,
        require_faiss,
        write_index,
    )
    from nphcli.core.atomic import check_output
    from nphcli.core.errors import NphError
    from nphcli.memory import open_memory

    open_memory(memory, stream=True)  # the input first (its header only): a missing file says so
    require_faiss()
    check_kind(kind)
    if seed < 0:
        raise NphError(f"--seed must be a whole number ≥ 0, got {seed}")
    path = out if out is not None else default_index_path(memory, kind)
    check_output(path, force=force, protect=[memory])
    start = time.perf_counter()
    loaded = open_memory(memory)
    faiss_index, meta, extra = build_index(
        loaded, memory, kind=kind, seed=seed, lists=lists, progress=_progress
    )
    build_s = time.perf_counter() - start
    write_index(path, faiss_index, meta, extra, force=force)
    report = {
        "file": str(path),
        "bytes": path.stat().st_size,
        "build_s": build_s,
        **{key: meta[key] for key in ("kind", "params", "seed", "M", "d", "faiss_version")},
        "memory_sha256": meta["memory_sha256"],
    }
    if as_json:
        print_json(report)
    else:
        print_table(f"{path}", ["field", "value"], [(k, str(v)) for k, v in report.items()])


def _progress(phase: str, done: int, total: int) -> None:
    """One updating line on stderr, only on a terminal."""
    if sys.stderr.isatty():
        end = "\n" if done == total and phase == "add" else ""
        print(f"\r{phase}: {done:,}/{total:,}", end=end, file=sys.stderr, flush=True)
