"""Indexes of a shard set: one FAISS index per shard, recorded in the manifest, and retrieval
over them on one process or across the ranks of a process group.

`nph index MANIFEST --kind KIND` builds each shard's index beside it and records them under
`indexes[KIND]` (file, its SHA-256, the shard checksum it was built from, parameters); a missing,
tampered or stale one is refused in one line naming the shard. Retrieval takes the union of the
shards' candidates over ranks (`Collective.all_cat`), sorted by row, and the largest bound: the
result and its certification are a single file's on the same candidates.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nphcli.ann.index_file import (
    KINDS,
    AnnIndex,
    Progress,
    build_index,
    check_index_file,
    check_seed,
    file_checksum,
    open_index,
    require_faiss,
    write_index,
)
from nphcli.ann.search import Candidates, IndexedModel
from nphcli.core.atomic import atomic_write, check_output
from nphcli.core.errors import NphError
from nphcli.core.lock import WriterLock
from nphcli.core.notices import notice
from nphcli.memory.bank import MemoryBank
from nphcli.memory.file import load_memory
from nphcli.memory.sharded_bank import ShardedBank
from nphcli.memory.shards import Manifest, read_manifest

INDEXES_KEY = "indexes"  # the manifest's record of its shard indexes, by kind


def build_shard_indexes(
    manifest_path: str | os.PathLike,
    *,
    kind: str = "ivf",
    seed: int = 0,
    lists: int | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Build every shard's index (one shard in RAM at a time) and record them in the manifest;
    returns what was built. Runs take turns (`WriterLock`); new files (`NAME.KIND.TOKEN.index`)
    are written, the manifest rewritten atomically, then the replaced ones deleted, so a kill
    leaves complete indexes named and the next run deletes unnamed files, with a note."""
    require_faiss()
    check_seed(seed)
    with WriterLock(manifest_path, wait=True):
        manifest = read_manifest(manifest_path)  # every shard checked against its checksum
        raw = json.loads(manifest.path.read_text())
        indexes = _recorded(manifest.path, raw, force=force)
        for left in _remove_unnamed(manifest, indexes):
            notice(f"removed {left}, an index no record names (left by an interrupted nph index)")
        if kind in indexes and not force:
            raise NphError(
                f"{manifest.path} already records a {kind} index of its shards; pass --force to "
                "rebuild it"
            )
        token = os.urandom(8).hex()
        targets = [p.path.with_name(f"{p.path.stem}.{kind}.{token}.index") for p in manifest.parts]
        for target in targets:
            check_output(target, force=False, protect=[manifest.path])
        written: list[Path] = []
        try:  # a failure part-way leaves none of this build's files
            record = _build(manifest, targets, kind, seed, lists, progress, written)
            raw[INDEXES_KEY] = {**indexes, kind: record}
            with atomic_write(manifest.path, force=True) as tmp:
                Path(tmp).write_text(json.dumps(raw, indent=2) + "\n")
        except BaseException:
            for path in written:
                path.unlink(missing_ok=True)
            raise
        _remove_unnamed(manifest, raw[INDEXES_KEY], also=_files(indexes.get(kind)))
    return {"manifest": str(manifest.path), **record}


def _build(manifest, targets, kind, seed, lists, progress, written) -> dict[str, Any]:
    """Write each shard's index to its target (appending it to `written`); the kind's record."""
    entries = []
    for number, (part, target) in enumerate(zip(manifest.parts, targets, strict=True)):
        start = time.perf_counter()
        shard = load_memory(part.path)

        def report(phase: str, done: int, total: int, number: int = number) -> None:
            if progress:
                progress(f"shard {number + 1}/{len(targets)} {phase}", done, total)

        faiss_index, meta, extra = build_index(
            shard, part.path, kind=kind, seed=seed, lists=lists, progress=report
        )
        written.append(target)
        write_index(target, faiss_index, meta, extra)
        del shard, faiss_index, extra
        entries.append(
            {
                "file": target.name,
                "sha256": file_checksum(target),
                "shard_sha256": part.sha256,
                "shard_file_sha256": meta["memory_sha256"],
                "rows": part.rows,
                "params": meta["params"],
                "bytes": target.stat().st_size,
                "build_s": round(time.perf_counter() - start, 3),
            }
        )
    return {
        "kind": kind,
        "seed": seed,
        "nph_version": meta["nph_version"],
        "faiss_version": meta["faiss_version"],
        "parts": entries,
    }


def _recorded(path: Path, raw: Any, *, force: bool) -> dict[str, Any]:
    """The manifest's `indexes` records by kind; a malformed one refused (`force`: dropped)."""
    indexes = raw.get(INDEXES_KEY) if isinstance(raw, dict) else None
    if indexes is None:
        return {}
    if isinstance(indexes, dict) and all(isinstance(r, dict) for r in indexes.values()):
        return indexes
    if force:
        return {}
    raise NphError(
        f"{path}: its '{INDEXES_KEY}' record is malformed; rebuild every kind with --force"
    )


def _files(record: Any) -> list[str]:
    """The file names a kind's record lists (nothing from a malformed one)."""
    entries = record.get("parts") if isinstance(record, dict) else None
    if not isinstance(entries, list):
        return []
    return [
        Path(e["file"]).name
        for e in entries
        if isinstance(e, dict) and isinstance(e.get("file"), str)
    ]


def _remove_unnamed(
    manifest: Manifest, indexes: dict[str, Any], also: list[str] = ()
) -> list[Path]:
    """Delete the shards' index files (and `also`) no record of `indexes` names; returns them."""
    named = {name for record in indexes.values() for name in _files(record)}
    kinds = "|".join(map(re.escape, KINDS))
    removed = []
    for part in manifest.parts:
        pattern = re.compile(re.escape(part.path.stem) + rf"\.({kinds})\.[0-9a-f]{{16}}\.index\Z")
        try:
            names = os.listdir(part.path.parent)
        except OSError:
            continue
        for name in names:
            if name not in named and (pattern.match(name) or name in also):
                (part.path.parent / name).unlink(missing_ok=True)
                removed.append(part.path.parent / name)
    return removed


def index_record(manifest: Manifest, kind: str) -> dict[str, Any]:
    """The manifest's record of its `kind` shard indexes, checked for shape."""
    if kind not in KINDS:
        raise NphError(
            f"with a shard manifest, --index names the kind of its shard indexes (one of "
            f"{', '.join(KINDS)}, built by `nph index MANIFEST --kind KIND`), got {kind!r}"
        )
    try:
        raw = json.loads(manifest.path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise NphError(f"cannot read {manifest.path} ({error})") from None
    indexes = raw.get(INDEXES_KEY) if isinstance(raw, dict) else None
    record = indexes.get(kind) if isinstance(indexes, dict) else None
    if record is None:
        raise NphError(
            f"{manifest.path} records no {kind} index of its shards; build one: "
            f"nph index {manifest.path} --kind {kind}"
        )
    entries = record.get("parts") if isinstance(record, dict) else None
    if not isinstance(entries, list) or len(entries) != len(manifest.parts):
        raise NphError(
            f"{manifest.path}: its {kind} index record does not list one index per shard; "
            f"rebuild it: nph index {manifest.path} --kind {kind} --force"
        )
    for entry in entries:
        if not isinstance(entry, dict) or not all(
            isinstance(entry.get(key), str)
            for key in ("file", "sha256", "shard_sha256", "shard_file_sha256")
        ):
            raise NphError(f"{manifest.path}: malformed {kind} index record; rebuild it")
    return record


def verified_index_path(manifest: Manifest, record: dict[str, Any], number: int) -> Path:
    """Shard `number`'s index file, refused when missing, tampered with or stale."""
    entry, part, kind = record["parts"][number], manifest.parts[number], record["kind"]
    name = Path(entry["file"])
    if name.is_absolute() or len(name.parts) != 1:
        raise NphError(
            f"{manifest.path}: shard {number}'s index {entry['file']!r} is not a file "
            "name in the manifest's folder"
        )
    path = manifest.path.parent / name
    where = f"{manifest.path}: shard {number}'s {kind} index {path}"
    rebuild = f"rebuild: nph index {manifest.path} --kind {kind} --force"
    if not path.is_file():
        raise NphError(f"{where} is missing; {rebuild}")
    if entry["shard_sha256"] != part.sha256 or entry.get("rows") != part.rows:
        raise NphError(f"{where} is stale (built from other rows than the shard holds); {rebuild}")
    if file_checksum(path) != entry["sha256"]:
        raise NphError(f"{where} differs from the file `nph index` recorded (checksum); {rebuild}")
    try:
        check_index_file(path, part.path, memory_sha256=entry["shard_file_sha256"])
    except NphError as error:
        raise NphError(f"{where}: {error}") from None
    return path


def check_shard_indexes(manifest_path: str | os.PathLike, kind: str) -> Manifest:
    """Check the `kind` index of every shard on this machine (no FAISS data loaded) before any
    rank starts; ranks check the others' when they open them."""
    manifest = read_manifest(manifest_path, check=(), verify=False)
    record = index_record(manifest, kind)
    for number, part in enumerate(manifest.parts):
        if part.path.exists():
            verified_index_path(manifest, record, number)
    return manifest


def open_shard_index(manifest: Manifest, record: dict[str, Any], number: int) -> AnnIndex:
    """Shard `number`'s verified index, loaded."""
    path = verified_index_path(manifest, record, number)
    checksum = record["parts"][number]["shard_file_sha256"]
    try:
        return open_index(path, manifest.parts[number].path, memory_sha256=checksum)
    except NphError as error:
        where = f"{manifest.path}: shard {number}'s {record['kind']} index"
        raise NphError(f"{where}: {error}") from None


class _RowRange:
    """Rows offset…offset+rows of a bank, seen as a bank of their own (a shard of a joined set)."""

    def __init__(self, bank: MemoryBank, offset: int, rows: int) -> None:
        self.bank, self.offset, self.num_memories, self.dim = bank, offset, rows, bank.dim

    def gather(self, index: Tensor) -> tuple[Tensor, Tensor]:
        return self.bank.gather(index + self.offset)


@dataclass
class ShardedIndexedModel(IndexedModel):
    """A model retrieving over a shard set's indexes: `shards` maps each shard this process
    reads, by its first global row, to the model over its index (`index`: one of them)."""

    manifest: Manifest | None = None
    record: dict[str, Any] = field(default_factory=dict)  # the manifest's record of the indexes
    shards: dict[int, IndexedModel] = field(default_factory=dict)
    bytes_sent: int = 0  # by this rank in retrievals (not in compare_exact)
    queries_seen: int = 0

    def __post_init__(self) -> None:  # each shard's IndexedModel made the checks
        pass

    def check_memory(self, memory: MemoryBank) -> None:
        self.model.check_memory(memory)
        manifest = self.manifest
        if (memory.num_memories, memory.dim) != (manifest.num_memories, manifest.dim):
            raise NphError(f"{manifest.path} does not describe this memory; rebuild its indexes")

    def search(self, queries: Tensor, bank: MemoryBank) -> Candidates:
        """The union of the candidates over shards and ranks, sorted by row, and the largest
        bound."""
        total = bank.num_memories
        collective = bank.collective
        ids, scores, bounds = [], [], []
        for offset, part in self._views(bank):
            found = self.shards[offset].search(queries, part)
            valid = torch.isfinite(found.scores)  # (Q, c)
            ids.append(torch.where(valid, found.ids + offset, total))  # (Q, c) global rows
            scores.append(found.scores)
            bounds.append(found.bound)
        ids, scores = torch.cat(ids, dim=1), torch.cat(scores, dim=1)  # (Q, w)
        width = int(collective.all_max(torch.tensor([ids.shape[1]])).item())
        pad = width - ids.shape[1]
        ids = torch.nn.functional.pad(ids, (0, pad), value=total)  # (Q, width)
        scores = torch.nn.functional.pad(scores, (0, pad), value=-torch.inf)
        ids = collective.all_cat(ids, dim=1)  # (Q, R·width)
        scores = collective.all_cat(scores, dim=1)
        bound = collective.all_max(torch.stack(bounds).amax(dim=0))  # (Q,)
        order = torch.sort(ids, dim=1, stable=True).indices
        ids, scores = ids.gather(1, order), scores.gather(1, order)
        missing = ids >= total
        return Candidates(ids=torch.where(missing, 0, ids), scores=scores, bound=bound)

    def _views(self, bank: MemoryBank) -> list[tuple[int, Any]]:
        if isinstance(bank, ShardedBank):
            return list(bank.parts)
        return [(p.offset, _RowRange(bank, p.offset, p.rows)) for p in self.manifest.parts]

    def retrieve(self, queries: Tensor, memory: MemoryBank, **kwargs):
        collective = memory.collective
        before = collective.bytes_sent
        out = super().retrieve(queries, memory, **kwargs)
        self.bytes_sent += collective.bytes_sent - before
        self.queries_seen += queries.shape[0]
        return out


def sharded_indexed_model(model: Any, settings: Any, memory: MemoryBank) -> ShardedIndexedModel:
    """`model` over the `settings.path` (a kind) indexes of the shards `memory` reads."""
    manifest = read_manifest(memory.path, check=(), verify=False)
    record = index_record(manifest, settings.path)
    row_of = {part.offset: number for number, part in enumerate(manifest.parts)}
    offsets = [o for o, _ in memory.parts] if isinstance(memory, ShardedBank) else list(row_of)
    how = {"candidates": settings.candidates, "nprobe": settings.nprobe, "ef": settings.ef}
    shards = {
        offset: IndexedModel(model, open_shard_index(manifest, record, row_of[offset]), **how)
        for offset in offsets
    }
    first = shards[offsets[0]].index
    built = ShardedIndexedModel(
        model, first, manifest=manifest, record=record, shards=shards, **how
    )
    built.check_memory(memory)
    return built
