"""`nph index`: build an approximate inner-product index of a memory file (one FAISS index), or
of each shard of a manifest (recorded in the manifest), and say what was built."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nphcli.core.errors import NphError

Progress = Callable[[str, int, int], None]


def build_memory_index(
    memory: Path,
    *,
    kind: str,
    out: Path | None,
    lists: int | None,
    seed: int,
    force: bool,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Build and write the index of `memory` (a memory file or a shard manifest); the report
    `nph index --json` prints."""
    from nphcli.ann.index_file import (
        build_index,
        check_kind,
        check_seed,
        default_index_path,
        require_faiss,
        write_index,
    )
    from nphcli.core.atomic import check_output
    from nphcli.core.resources import fits_in_memory
    from nphcli.memory import open_memory
    from nphcli.memory.format import is_manifest
    from nphcli.memory.provenance import content_sha256

    check_seed(seed)  # before any memory is read
    if is_manifest(memory):
        if out is not None:
            raise NphError("--out names one file; a shard set's indexes go beside its shards")
        check_kind(kind)
        from nphcli.ann.shard_index import build_shard_indexes

        return build_shard_indexes(
            memory, kind=kind, seed=seed, lists=lists, force=force, progress=progress
        )
    streamed = open_memory(memory, stream=True)  # the header first: a missing file says so
    require_faiss()
    check_kind(kind)
    path = out if out is not None else default_index_path(memory, kind)
    check_output(path, force=force, protect=[memory])
    start = time.perf_counter()
    # A memory larger than RAM is read from disk block by block (docs/ann.md).
    loaded = open_memory(memory) if fits_in_memory(memory.stat().st_size) else streamed
    faiss_index, meta, extra = build_index(
        loaded, memory, kind=kind, seed=seed, lists=lists, progress=progress
    )
    build_s = time.perf_counter() - start
    write_index(path, faiss_index, meta, extra, force=force)
    return {
        "file": str(path),
        "bytes": path.stat().st_size,
        "build_s": build_s,
        **{key: meta[key] for key in ("kind", "params", "seed", "M", "d", "faiss_version")},
        "memory_sha256": content_sha256(loaded),  # as results rows name the memory
        "memory_file_sha256": meta["memory_sha256"],  # the file's bytes the index is tied to
    }
