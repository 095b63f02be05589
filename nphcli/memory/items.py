"""What each stored row *is*: an id, and optionally a text and a small metadata object.

Embedding tables and texts (`nph store table.jsonl`, `nph store texts.txt --embed ...`) keep
their items in a sidecar beside the memory file, `NAME.items.jsonl`, one JSON object per stored
row in row order: `{"id": "...", "text": "...", "meta": {...}}`. The memory's metadata names the
sidecar with its sha256 and row count (`items`), so a changed or swapped sidecar is refused
instead of labelling rows with another memory's texts. A sidecar rather than tensors inside the
safetensors file: texts are variable-length, and a reader needs only the few rows it shows, which
`Items` reads by seeking to them (an index of line offsets, 8 bytes a row), never the whole table.

Shards carry the record in their metadata (it is the source's), so a shard set finds the same
sidecar beside its manifest (`nph shard` copies it there).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from nphcli.core.atomic import atomic_write, check_output
from nphcli.core.errors import NphError

SUFFIX = ".items.jsonl"
ITEM_KEYS = ("id", "text", "meta", "value")  # value: a hetero memory's value item


def sidecar_path(memory_path: str | os.PathLike) -> Path:
    """`memory.safetensors` → `memory.items.jsonl` (a manifest `set.json` → `set.items.jsonl`)."""
    path = Path(memory_path)
    return path.with_name(path.stem + SUFFIX)


def check_items(items: Sequence[dict[str, Any]], rows: int, what: str) -> None:
    """Refuse items that cannot label `rows` stored rows: a count that differs, an item without
    an id, an id that is not a string or whole number, or an id given twice."""
    if len(items) != rows:
        raise NphError(f"{what}: {len(items)} ids for {rows} stored rows")
    seen: dict[str, int] = {}
    for row, item in enumerate(items):
        key = item.get("id")
        if isinstance(key, bool) or not isinstance(key, (str, int)) or key == "":
            raise NphError(f"{what}: row {row + 1} has no id (a string or whole number)")
        text = item.get("text")
        if text is not None and not isinstance(text, str):
            raise NphError(f"{what}: row {row + 1} (id {key!r}) has a text that is not a string")
        if str(key) in seen:
            raise NphError(
                f"{what}: id {key!r} is given twice (rows {seen[str(key)] + 1} and {row + 1}); "
                "ids must be unique"
            )
        seen[str(key)] = row


def write_items(
    memory_path: str | os.PathLike, items: Iterable[dict[str, Any]], *, force: bool
) -> dict[str, Any]:
    """Write the sidecar of `memory_path` atomically; returns the record its metadata keeps."""
    path = check_output(sidecar_path(memory_path), force=force)
    digest, count = hashlib.sha256(), 0
    with atomic_write(path, force=force) as tmp, open(tmp, "wb") as handle:
        for item in items:
            kept = {key: item[key] for key in ITEM_KEYS if item.get(key) is not None}
            line = (json.dumps(kept, ensure_ascii=False) + "\n").encode("utf-8")
            handle.write(line)
            digest.update(line)
            count += 1
    return {"file": path.name, "sha256": digest.hexdigest(), "count": count}


def copy_items(meta: dict[str, Any], source: Path, out_dir: Path, *, force: bool) -> None:
    """Copy the sidecar of the memory file `source` into `out_dir` (beside its shards and their
    manifest, which keep the same record), if it has one and it is not there already."""
    record = meta.get("items")
    if not isinstance(record, dict) or not isinstance(record.get("file"), str):
        return
    found = source.with_name(Path(record["file"]).name)
    wanted = out_dir / found.name
    if wanted.exists() and wanted.resolve() == found.resolve():
        return
    check_output(wanted, force=force, protect=[source])
    with atomic_write(wanted, force=force) as tmp:
        shutil.copyfile(found, tmp)


class Items:
    """The items of one memory, read row by row on demand from its verified sidecars (one, or
    one per segment of a growing memory: `segments.py`)."""

    def __init__(self, paths: list[Path], spans: list[tuple[int, int, int]]):
        self.paths = paths
        self._spans = spans  # per row: (sidecar, first byte of its line, end byte)

    def __len__(self) -> int:
        return len(self._spans)

    def get(self, rows: Sequence[int]) -> list[dict[str, Any]]:
        """The items of `rows` (stored row numbers), each with its row number."""
        found = []
        handles: dict[int, Any] = {}
        try:
            for row in rows:
                which, start, end = self._spans[row]
                if which not in handles:
                    handles[which] = open(self.paths[which], "rb")
                handles[which].seek(start)
                found.append({"row": int(row), **json.loads(handles[which].read(end - start))})
        finally:
            for handle in handles.values():
                handle.close()
        return found

    def ids(self) -> list[str]:
        """Every row's id, as text, in row order (each sidecar parsed once per process)."""
        by_file = [_ids_of(path) for path in self.paths]
        return [by_file[which][start] for which, start, _ in self._spans]


# sidecar (path, size, mtime) → {byte offset of a line: its id as text}. A sidecar is never
# edited in place (a change writes a new file), so `nph serve` parses each one once.
_IDS: dict[tuple[str, int, int], dict[int, str]] = {}


def _ids_of(path: Path) -> dict[int, str]:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _IDS:
        found, offset = {}, 0
        with open(path, "rb") as handle:
            for line in handle:
                found[offset] = str(json.loads(line)["id"])
                offset += len(line)
        _IDS[key] = found
    return _IDS[key]


def open_items(memory_path: str | os.PathLike, meta: dict[str, Any]) -> Items | None:
    """The items of the memory at `memory_path` (a file or a manifest) whose metadata is `meta`,
    or None when it has none. Each sidecar must be the one the metadata names: same sha256 and
    row count."""
    record = meta.get("items")
    if record is None:
        return None
    records = record.get("parts") if isinstance(record, dict) else None
    records = [record] if records is None else records
    paths, spans = [], []
    for part in records:
        if not isinstance(part, dict) or not isinstance(part.get("file"), str):
            raise NphError(f"{memory_path}: its items record is not an object naming a file")
        path = Path(memory_path).with_name(Path(part["file"]).name)  # never outside its folder
        dropped = set(part.get("drop", ()))
        offsets = _offsets(memory_path, path, part)
        spans += [
            (len(paths), offsets[row], offsets[row + 1])
            for row in range(len(offsets) - 1)
            if row not in dropped
        ]
        paths.append(path)
    if len(spans) != meta.get("M", len(spans)):
        raise NphError(f"{memory_path}: {len(spans)} items for {meta.get('M')} stored rows")
    return Items(paths, spans)


def _offsets(memory_path, path: Path, record: dict[str, Any]) -> list[int]:
    """Byte offsets of each line of the sidecar `path`, then its size, once it proved to be
    the one `record` names."""
    if not path.is_file():
        raise NphError(
            f"{memory_path} keeps its ids and texts in {path.name}, which is missing; store "
            "the memory again or copy that file beside it"
        )
    digest, offsets = hashlib.sha256(), [0]
    with open(path, "rb") as handle:
        for line in handle:
            digest.update(line)
            offsets.append(offsets[-1] + len(line))
    if digest.hexdigest() != record.get("sha256") or len(offsets) - 1 != record.get("count"):
        raise NphError(
            f"{path} is not the items file {memory_path} was stored with (its sha256 or row "
            "count differs); store the memory again"
        )
    return offsets
