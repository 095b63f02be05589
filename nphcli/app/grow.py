"""Adding to, forgetting from and compacting a memory without rewriting it (`nph add`, `nph
forget`, `nph compact`; the files are `nphcli.memory.segments`).

One writer at a time (`core.lock`). A change writes new files only, then switches the segments
manifest atomically: a process killed at any point leaves the memory before or after the change.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import nphcli.sources as sources
from nphcli.core.dtypes import torch_dtype
from nphcli.core.errors import NphError
from nphcli.core.lock import WriterLock
from nphcli.memory.file import save_memory
from nphcli.memory.format import FORMAT_NAME, is_manifest, read_metadata, tensors_sha256
from nphcli.memory.items import open_items, write_items
from nphcli.memory.segments import (
    Segment,
    Segments,
    as_single,
    load_segments,
    manifest_path,
    read_segments,
    segment_items,
    write_segments,
)
from nphcli.sources.tables import TEXT_SUFFIXES, holds_embeddings

_RETRY = "run the command again once it is done"  # what a second writer is told
# Normalisations of single rows: an added row is stored as the memory's rows were.
_ROWWISE = ("none", "l2")


@dataclass(frozen=True)
class Change:
    """What one change did."""

    memory: Path
    added: int  # rows written
    forgotten: int  # rows no longer recalled (forgotten, or replaced with --upsert)
    items: int  # live rows after the change
    segments: int  # files the memory is read from (1 after `compact`)


def add_items(
    memory: str | os.PathLike,
    source: str | os.PathLike,
    *,
    upsert: bool = False,
    ids: str | os.PathLike | None = None,
) -> Change:
    """Append the rows of `source` (a .jsonl, .txt or Parquet table, or a .npy with `ids`; texts
    are embedded with the memory's own embedder) to `memory` as a new segment. An id stored
    already is refused, or with `upsert` the stored item is forgotten and the new one kept."""
    memory = _checked(memory)
    with WriterLock(memory, advice=_RETRY):
        current = read_segments(memory) or as_single(memory)
        meta = read_metadata(memory)
        items, where = segment_items(current)
        prepared = _prepared(Path(source), meta, ids, items)
        located = {key: place for key, place in zip(items.ids(), where, strict=True)}
        stored = [str(item["id"]) for item in prepared.items if str(item["id"]) in located]
        if stored and not upsert:
            raise NphError(
                f"id {stored[0]!r} is stored in {memory.name} already ({len(stored)} of the "
                "added ids are); forget it first, or pass --upsert to replace it"
            )
        generation = current.generation + 1
        segment = memory.with_name(f"{memory.stem}.seg-{current.id[:8]}-{generation}.safetensors")
        own = {key: meta[key] for key in ("source", "kind", "normalize", "embedder") if key in meta}
        own["items"] = write_items(segment, prepared.items)
        save_memory(
            segment, prepared.patterns, meta=own, dtype=torch_dtype(prepared.dtype), force=True
        )
        rows = prepared.patterns.shape[0]
        forgotten = _forget(current.forgotten, [located[key] for key in stored])
        written = Segment(segment.name, rows, tensors_sha256(segment))
        after = Segments(memory, current.id, generation, (*current.segments, written), forgotten)
        write_segments(after)
    return Change(memory, rows, len(stored), after.live_rows, len(after.segments))


def forget_items(memory: str | os.PathLike, ids: list[str]) -> Change:
    """Forget the items `ids` of `memory`: its rows stay on disk until `compact_memory`, but no
    reader sees them. An id that no live item has is refused (nothing is forgotten)."""
    memory = _checked(memory)
    wanted = [str(key) for key in dict.fromkeys(ids)]
    if not wanted:
        raise NphError("give the ids to forget: --ids a,b,c")
    with WriterLock(memory, advice=_RETRY):
        current = read_segments(memory) or as_single(memory)
        items, where = segment_items(current)
        located = {key: place for key, place in zip(items.ids(), where, strict=True)}
        missing = [key for key in wanted if key not in located]
        if missing:
            raise NphError(
                f"{memory.name} holds no item with id {missing[0]!r}"
                + (f" (nor {len(missing) - 1} other of the ids)" if len(missing) > 1 else "")
            )
        if len(wanted) >= current.live_rows:
            raise NphError(
                f"cannot forget every item of {memory.name}; a memory holds one at least"
            )
        forgotten = _forget(current.forgotten, [located[key] for key in wanted])
        after = replace(current, generation=current.generation + 1, forgotten=forgotten)
        write_segments(after)
    return Change(memory, 0, len(wanted), after.live_rows, len(after.segments))


def compact_memory(memory: str | os.PathLike) -> Change:
    """Write the live rows of a memory that grew as one memory file over `memory` (atomically),
    then remove its manifest, segments, sidecars and forgotten list. A memory that is one file
    already is left as it is."""
    memory = _checked(memory)
    with WriterLock(memory, advice=_RETRY):
        current = read_segments(memory)
        if current is None:  # one file, or compacted by a run stopped before its cleanup
            manifest_path(memory).unlink(missing_ok=True)
            _remove_leftovers(memory, keep=set())
            return Change(memory, 0, 0, int(read_metadata(memory)["M"]), 1)
        joined = load_segments(current)
        items = open_items(memory, joined.meta)
        meta = {k: v for k, v in joined.meta.items() if k not in ("segments", "items")}
        meta["compacted"] = {"id": current.id, "generation": current.generation}
        kept: set[str] = set()
        if items is not None:
            # a new sidecar name: the old one stays valid until the memory file is replaced
            sidecar = memory.with_name(f"{memory.stem}.{current.id[:8]}-{current.generation}.x")
            rows = [
                {k: v for k, v in i.items() if k != "row"} for i in items.get(range(len(items)))
            ]
            meta["items"] = write_items(sidecar, rows)
            kept.add(meta["items"]["file"])
        save_memory(
            memory,
            joined.patterns,
            labels=joined.labels,
            values=joined.values if joined.hetero else None,
            meta=meta,
            dtype=joined.dtype,
            force=True,
        )
        manifest_path(memory).unlink()
        _remove_leftovers(memory, keep=kept)
    before = sum(s.rows for s in current.segments)
    return Change(memory, 0, before - joined.num_memories, joined.num_memories, 1)


def _checked(memory: str | os.PathLike) -> Path:
    memory = Path(memory)
    if is_manifest(memory):
        raise NphError(f"{memory} is a shard manifest; add to and forget from the memory file")
    if not memory.is_file():
        raise NphError(f"memory file {memory} not found; create one with `nph store`")
    return memory


def _prepared(source: Path, meta: dict[str, Any], ids, items) -> sources.Prepared:
    """The rows of `source`, embedded, normalised and typed as the memory's rows were."""
    if meta.get("format") != FORMAT_NAME or meta.get("values_file") or meta.get("labels_file"):
        raise NphError(
            "only memories of vectors or texts without values or labels grow; store the whole "
            "set again instead"
        )
    method = (meta.get("normalize") or {}).get("method", "none")
    if method not in _ROWWISE:
        raise NphError(
            f"the memory's rows were normalised with {method} over the whole set, which an "
            "added row cannot share; store the whole set again"
        )
    embedder = (meta.get("embedder") or {}).get("name")
    texts = source.suffix.lower() in TEXT_SUFFIXES and source.is_file()
    embed = embedder if texts and not holds_embeddings(source) else None
    options = sources.SourceOptions(ids=None if ids is None else Path(ids), embed=embed)
    prepared = sources.prepare_memory(str(source), options, normalize=method, dtype=meta["dtype"])
    if prepared.items is None:
        raise NphError(f"{source} gives its rows no ids; a memory that grows needs them (--ids)")
    if prepared.patterns.shape[1] != meta["d"]:
        raise NphError(
            f"{source} holds vectors of {prepared.patterns.shape[1]} numbers, the memory "
            f"{meta['d']}"
        )
    if source.suffix.lower() == ".txt":  # lines numbered on after the largest number id
        numbers = [int(key) for key in items.ids() if key.lstrip("-").isdigit()]
        start = max(numbers, default=0)
        for line, item in enumerate(prepared.items, start=start + 1):
            item["id"] = line
    return prepared


def _forget(forgotten: dict[str, list[int]], places: list[tuple[str, int]]) -> dict:
    out = {name: set(rows) for name, rows in forgotten.items()}
    for name, row in places:
        out.setdefault(name, set()).add(row)
    return {name: sorted(rows) for name, rows in out.items()}


def _remove_leftovers(memory: Path, keep: set[str]) -> None:
    """Delete the segments, their sidecars and forgotten lists a compaction made unused (only
    names this module makes, so another memory's files in the folder are never touched)."""
    sidecar = r"\.items(\.[0-9a-f]{16})?\.jsonl"  # content-named, or as older stores named it
    made = re.compile(
        re.escape(memory.stem)
        + rf"(\.seg-[0-9a-f]{{8}}-\d+(\.safetensors|{sidecar})|\.forgotten-\d+\.json"
        + rf"|\.[0-9a-f]{{8}}-\d+{sidecar}|{sidecar})"
    )
    record = read_metadata(memory).get("items")
    if isinstance(record, dict) and isinstance(record.get("file"), str):
        keep = keep | {record["file"]}
    for path in memory.parent.iterdir():
        if made.fullmatch(path.name) and path.name not in keep:
            path.unlink(missing_ok=True)
