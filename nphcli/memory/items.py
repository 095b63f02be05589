"""What each stored row *is*: an id, and optionally a text and a small metadata object.

Embedding tables and texts (`nph store table.jsonl`, `nph store texts.txt --embed ...`) keep
their items in a sidecar beside the memory file, `NAME.items.HASH.jsonl`, one JSON object per
stored row in row order: `{"id": "...", "text": "...", "meta": {...}}`. The memory's metadata
names the sidecar with its sha256 and row count (`items`); HASH, the start of that sha256, gives
every new sidecar a name of its own, so replacing a memory switches the pair with one rename
(`staged_items`), and a changed or swapped sidecar is refused. A sidecar, not tensors: texts
are variable-length, and a reader seeks to the few rows it shows (8 bytes of offset a row).
Shards carry the source's record, and `nph shard` copies the sidecar beside their manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from nphcli.core.atomic import atomic_write, check_output, staged
from nphcli.core.errors import NphError

SUFFIX = ".items.jsonl"
ITEM_KEYS = ("id", "text", "meta", "value")  # value: a hetero memory's value item


def sidecar_path(memory_path: str | os.PathLike) -> Path:
    """`memory.safetensors` → `memory.items.jsonl`, what the sidecar's temporaries are named
    after."""
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


def items_name(memory_path: str | os.PathLike, sha256: str) -> str:
    """The sidecar's file name: `NAME.items.<first 16 hex digits of its sha256>.jsonl`."""
    return f"{Path(memory_path).stem}.items.{sha256[:16]}{SUFFIX.removeprefix('.items')}"


@contextlib.contextmanager
def staged_items(
    memory_path: str | os.PathLike, items: Iterable[dict[str, Any]]
) -> Iterator[tuple[dict[str, Any], Callable[[], None]]]:
    """Write the sidecar of `memory_path` to a fsynced temporary; yield the memory's `items`
    record and `place`, which renames it to its content-named file: call it right before the
    memory switches (`save_memory(before_switch=place)`). A kill leaves the old pair or the new
    one whole, plus at most an unnamed sidecar (`remove_unnamed`); a sidecar placed for a
    memory that then failed to switch is removed on the way out."""
    memory_path = Path(memory_path)
    with staged(sidecar_path(memory_path), force=True) as stage:
        digest, count = hashlib.sha256(), 0
        with open(stage.tmp, "wb") as handle:
            for item in items:
                kept = {key: item[key] for key in ITEM_KEYS if item.get(key) is not None}
                line = (json.dumps(kept, ensure_ascii=False) + "\n").encode("utf-8")
                handle.write(line)
                digest.update(line)
                count += 1
        sha256 = digest.hexdigest()
        target = memory_path.with_name(items_name(memory_path, sha256))
        new = not target.exists()  # an existing one holds these very bytes
        placed = []

        def place() -> None:
            placed.append(stage.commit(target))

        try:
            yield {"file": target.name, "sha256": sha256, "count": count}, place
        except BaseException:
            if placed and new:
                target.unlink(missing_ok=True)
            raise


def write_items(memory_path: str | os.PathLike, items: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Write the sidecar of `memory_path` and return its record, for a memory file written
    after it whose own atomic switch makes it count (`app.grow`)."""
    with staged_items(memory_path, items) as (record, place):
        place()
    return record


def remove_unnamed(
    memory_path: str | os.PathLike, *, also: Sequence[str] = (), keep: Sequence[Path] = ()
) -> list[Path]:
    """Delete the sidecars of `memory_path` (`NAME.items.<hash>.jsonl`, and the files `also`)
    that no memory file in its folder names, never one of `keep` (a command's inputs): left by
    a store killed before its memory switched, or replaced. Returns what was deleted."""
    memory_path = Path(memory_path)
    folder = memory_path.parent
    pattern = re.compile(re.escape(memory_path.stem) + r"\.items\.[0-9a-f]{16}\.jsonl\Z")
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = {folder / name for name in names if pattern.match(name) or name in also}
    kept = [Path(k).resolve() for k in keep]
    found = {path for path in found if path.is_file() and path.resolve() not in kept}
    if not found:
        return []
    from nphcli.memory.format import read_metadata  # torch: `nph store --help` must not load it

    for memory in folder.glob("*.safetensors"):
        try:
            record = read_metadata(memory).get("items")
        except (NphError, OSError, ValueError):
            continue
        found.discard(folder / (record_file(record) or "."))
    for path in sorted(found):
        path.unlink(missing_ok=True)
    return sorted(found)


def record_file(record: Any) -> str | None:
    """The sidecar file name an `items` record gives, as a name in the memory's own folder
    (never a path outside it), or None for a record that names none."""
    file = record.get("file") if isinstance(record, dict) else None
    name = Path(file).name if isinstance(file, str) and "\0" not in file else ""
    return name if name not in ("", ".", "..") else None


def copy_items(meta: dict[str, Any], source: Path, out_dir: Path, *, force: bool) -> None:
    """Copy the sidecar of the memory file `source` into `out_dir` (beside its shards and their
    manifest, which keep the same record), if it has one and it is not there already."""
    name = record_file(meta.get("items"))
    if name is None:
        return
    found = source.with_name(name)
    if not found.is_file():
        raise NphError(
            f"{source} keeps its ids and texts in {name}, which is missing; store the memory "
            "again or copy that file beside it"
        )
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
        name = record_file(part)
        if name is None:
            raise NphError(
                f"{memory_path}: its items record is not an object naming a file; store the "
                "memory again"
            )
        path = Path(memory_path).with_name(name)  # never outside its folder
        dropped = set(part.get("drop", ()))
        offsets = _offsets(memory_path, path, part)
        rows = [row for row in range(len(offsets) - 1) if row not in dropped]
        spans += [(len(paths), offsets[row], offsets[row + 1]) for row in rows]
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
