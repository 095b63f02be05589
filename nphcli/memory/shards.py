"""Sharded memories: one memory split into N memory files by rows, plus a JSON manifest, so each
process of a distributed run reads only its shard (docs/distributed.md). Each shard is a valid
memory file whose metadata records `shard` (set id, index, offset, rows, total M); the manifest
lists the shards in row order, each with its tensors' sha256 (`format.tensors_sha256`):

    {"format": "nph-shards", "format_version": 2, "set_id": "…", "M": 1000, "d": 784,
     "d_v": 784, "dtype": "float32", "hetero": false,
     "parts": [{"file": "memory.part-0-of-2.5f0c91d2e4a7b3c8.safetensors", "offset": 0,
                "rows": 500, "sha256": "…"}, …]}

Writing a set is one switch: the shards under names of their own, then the manifest renamed over
the old one, then the old set's files deleted. A kill leaves the old set or the new one whole;
the next `nph shard` deletes what it left (`remove_unnamed_shards`). `read_manifest` refuses,
before any compute, a set that is not whole, consistent and (unless `verify=False`) unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nphcli.core.atomic import atomic_write, check_folder, remove_stale_temporaries
from nphcli.core.errors import NphError
from nphcli.core.jsontext import read_json_file
from nphcli.core.lock import WriterLock
from nphcli.core.notices import notice
from nphcli.memory.file import write_memory
from nphcli.memory.format import (
    FORMAT_NAME,
    is_manifest,
    open_safetensors,
    read_metadata,
    tensors_sha256,
)
from nphcli.memory.items import copy_items, remove_unnamed
from nphcli.memory.provenance import META_KEY as PROVENANCE_KEY
from nphcli.memory.provenance import content_sha256
from nphcli.memory.streamed import StreamedBank

MANIFEST_FORMAT = "nph-shards"
MANIFEST_VERSION = 2  # 2: each part records its tensors' sha256
# A manifest lists about 200 bytes per shard: 16 MiB holds 80,000 shards; read no more.
MAX_MANIFEST_BYTES = 16 << 20
BLOCK_BYTES = 16 << 20  # rows `nph shard` holds in RAM at a time
# Metadata keys `save_memory` writes itself; a shard's other metadata is the source's.
_OWN_KEYS = {"format", "format_version", "nph_version", "created", "M", "d", "dtype", "shard"}
_OWN_KEYS |= {"content_sha256"}  # each shard records its own; the manifest, the source's


def new_manifest_path(memory: Path, out_dir: Path, *, force: bool) -> Path:
    """Where `write_shards` puts `memory`'s manifest; refused if one is there and not `force`
    (checked by `nph store --parts` too, before it writes the memory)."""
    path = out_dir / f"{memory.stem}.shards.json"
    check_folder(path)
    if path.exists() and not force:
        raise NphError(f"{path} already exists; pass --force to replace it")
    return path


def split_rows(num_memories: int, parts: int) -> list[int]:
    """Rows per shard for `parts` shards as even as possible (sizes differ by at most 1)."""
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise NphError(f"--parts must be a whole number ≥ 1, got {parts!r}")
    if parts > num_memories:
        raise NphError(f"--parts {parts} exceeds the memory's {num_memories} patterns")
    base, extra = divmod(num_memories, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


@dataclass(frozen=True)
class ShardPart:
    """One shard as the manifest lists it."""

    path: Path
    offset: int  # global row of its first pattern
    rows: int
    sha256: str  # of its tensors (`format.tensors_sha256`), recorded by `nph shard`


@dataclass(frozen=True)
class Manifest:
    """A validated shard set."""

    path: Path
    set_id: str
    num_memories: int
    dim: int
    value_dim: int
    dtype: str
    hetero: bool
    parts: list[ShardPart]
    content_sha256: str | None = None  # the source's (`provenance.py`); None in older manifests


def write_shards(
    memory_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    parts: int | None = None,
    sizes: list[int] | None = None,
    force: bool = False,
) -> Path:
    """Split a memory file into shards (`parts` even ones, or rows per shard `sizes`) and a
    manifest in `out_dir` (created if missing); returns the manifest's path. Reads one shard's
    rows at a time."""
    source = Path(memory_path)
    if is_manifest(source):
        raise NphError(f"{source} is already a shard manifest; shard the memory file itself")
    bank = StreamedBank(source)  # the header checked; rows read one shard at a time
    total = bank.num_memories
    if sizes is None:
        sizes = split_rows(total, 1 if parts is None else parts)
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise NphError(f"every shard needs at least one row, got sizes {sizes}")
    if sum(sizes) != total:
        raise NphError(f"shard sizes {sizes} add up to {sum(sizes)}, not M = {total}")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NphError(f"--out-dir {out_dir} is a file, not a folder; choose a folder")
    try:  # a new folder holds nothing the checks below could refuse
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise NphError(f"cannot create --out-dir {out_dir}: {error.strerror}") from None
    stem = source.stem
    manifest_path = new_manifest_path(source, out_dir, force=force)
    # The set id hashes the source's bytes and the split: the same split of one file, the same id.
    digest = hashlib.sha256(json.dumps(sizes).encode())
    with open(source, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 24), b""):
            digest.update(chunk)
    set_id = digest.hexdigest()[:32]
    # Named after the set: a new set never replaces the files the old manifest names.
    count = len(sizes)
    names = [f"{stem}.part-{i}-of-{count}.{set_id[:16]}.safetensors" for i in range(count)]
    content = content_sha256(bank)  # the source file's record, or its tensors hashed once
    meta = {key: value for key, value in bank.meta.items() if key not in _OWN_KEYS}
    with WriterLock(manifest_path, wait=True):  # `nph index` rewrites the manifest too
        for left in remove_unnamed_shards(out_dir, stem, keep=[source]):
            notice(f"removed {left}, which no shard manifest names (left by an interrupted nph)")
        try:  # the manifest's rename is the switch; then the replaced set's files go
            copy_items(bank.meta, source, out_dir, force=True)  # ids and texts travel along
            listed = _write_parts(bank, out_dir, names, sizes, meta, set_id)
            manifest = {
                "format": MANIFEST_FORMAT,
                "format_version": MANIFEST_VERSION,
                "set_id": set_id,
                "source": source.name,
                "M": sum(part["rows"] for part in listed),
                "d": bank.dim,
                "d_v": bank.value_dim,
                "dtype": str(bank.dtype).removeprefix("torch."),
                "hetero": bank.hetero,
                "content_sha256": content,
                "parts": listed,
            }
            with atomic_write(manifest_path, force=True) as tmp:  # refused above without --force
                Path(tmp).write_text(json.dumps(manifest, indent=2) + "\n")
        finally:
            remove_unnamed_shards(out_dir, stem, keep=[source])
    return manifest_path


def remove_unnamed_shards(
    out_dir: Path, stem: str, keep: Sequence[str | os.PathLike] = ()
) -> list[Path]:
    """Delete the files of `stem`'s shard sets in `out_dir` that no manifest there names (shards,
    their indexes, the items sidecar, killed writers' temporaries), never one of `keep`, nothing
    while a manifest there cannot be read. Returns what was deleted."""
    head = re.escape(stem) + r"\.part-\d+-of-\d+(\.[0-9a-f]{16})?"
    pattern = re.compile(rf"{head}\.(safetensors|[a-z0-9_-]+\.[0-9a-f]{{16}}\.index)\Z")
    removed = remove_stale_temporaries(
        out_dir / stem, rf"{head}\.safetensors|{re.escape(stem)}\.items\.[0-9a-f]{{16}}\.jsonl"
    )
    named: set[str] = set()
    for manifest in out_dir.glob("*.shards.json"):
        try:
            raw = read_json_file(manifest, what="shard manifest", max_bytes=MAX_MANIFEST_BYTES)
            records = [raw, *raw.get("indexes", {}).values()]
            named |= {Path(e["file"]).name for record in records for e in record["parts"]}
        except (NphError, AttributeError, KeyError, TypeError):
            return removed
    kept = {Path(path).resolve() for path in keep}
    for path in sorted(out_dir.iterdir()):
        if pattern.match(path.name) and path.name not in named and path.resolve() not in kept:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed + remove_unnamed(out_dir / f"{stem}.safetensors", keep=list(keep))


def _write_parts(bank, out_dir, names, sizes, meta, set_id) -> list[dict]:
    """Write each shard file, one block of rows in RAM at a time; the manifest's part records."""
    total, labels = sum(sizes), bank.labels
    offset = 0
    listed = []
    for index, (name, rows) in enumerate(zip(names, sizes, strict=True)):
        shard = {"set_id": set_id, "index": index, "parts": len(sizes), "offset": offset}
        shard_meta = {**meta, "shard": {**shard, "rows": rows, "total_M": total}}
        shapes = {"patterns": (bank.dtype, (rows, bank.dim))}
        blocks = {"patterns": _blocks(bank, offset, rows, values=False)}
        if bank.hetero:
            shapes["values"] = (bank.dtype, (rows, bank.value_dim))
            blocks["values"] = _blocks(bank, offset, rows, values=True)
        if labels is not None:
            shapes["labels"] = (torch.int64, (rows,))
            blocks["labels"] = [labels[offset : offset + rows]]
        digest = write_memory(out_dir / name, shapes, blocks, meta=shard_meta, force=True)
        listed.append({"file": name, "offset": offset, "rows": rows, "sha256": digest})
        offset += rows
    return listed


def _blocks(bank: StreamedBank, start: int, rows: int, *, values: bool):
    """Rows start…start+rows-1 of the keys (or values), BLOCK_BYTES at a time."""
    width = bank.value_dim if values else bank.dim
    step = max(1, BLOCK_BYTES // (width * bank.dtype.itemsize))
    for first in range(start, start + rows, step):
        yield bank.rows(first, min(start + rows, first + step), values=values)


def read_manifest(
    path: str | os.PathLike, check: Iterable[int] | None = None, *, verify: bool = True
) -> Manifest:
    """Read a manifest and check shards `check` (default: all) against it: their headers, and
    with `verify` their tensors' checksums (see the module docstring). A rank on one of several
    machines checks only its own shards, which may be the only ones its machine holds."""
    path = Path(path)
    if not path.is_file():
        raise NphError(f"shard manifest {path} not found; create one with `nph shard`")
    raw = read_json_file(path, what="shard manifest", max_bytes=MAX_MANIFEST_BYTES)
    if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT:
        raise NphError(f"{path} is not an nph shard manifest (written by `nph shard`)")
    version = raw.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version > MANIFEST_VERSION:
        raise NphError(f"{path} uses manifest format {version!r}; upgrade nph")
    if version < MANIFEST_VERSION:
        raise NphError(
            f"{path} was written by an older nph (manifest format {version}, without checksums); "
            "shard the memory again with `nph shard`"
        )
    try:
        set_id = str(raw["set_id"])
        total, dim, value_dim = (_whole(raw[key], key) for key in ("M", "d", "d_v"))
        dtype, hetero = str(raw["dtype"]), bool(raw["hetero"])
        entries = raw["parts"]
        parts = [
            ShardPart(
                _inside(path, e["file"]),
                _whole(e["offset"], "offset"),
                _whole(e["rows"], "rows"),
                str(e["sha256"]),
            )
            for e in entries
        ]
    except (KeyError, TypeError, ValueError) as error:
        raise NphError(f"{path}: malformed shard manifest ({error})") from None
    if not parts:
        raise NphError(f"{path} lists no shards")
    seen: dict[Path, int] = {}
    expected = 0
    for index, part in enumerate(parts):
        resolved = part.path.resolve()
        if resolved in seen:
            twice = f"is listed twice (parts {seen[resolved]} and {index})"
            raise NphError(f"{path}: shard {part.path.name} {twice}")
        seen[resolved] = index
        if part.offset < expected:
            raise NphError(
                f"{path}: shard {index} ({part.path.name}) overlaps rows "
                f"{part.offset}…{expected - 1} of the shard before it"
            )
        if part.offset > expected:
            raise NphError(f"{path}: rows {expected}…{part.offset - 1} are in no shard")
        expected = part.offset + part.rows
    if expected != total:
        raise NphError(f"{path}: the shards hold {expected} rows, the manifest says M = {total}")
    content = raw.get("content_sha256")
    if not isinstance(content, str):  # an older manifest: its shards' checksums stand for it
        joined = json.dumps([part.sha256 for part in parts]).encode()
        content = "shards:" + hashlib.sha256(joined).hexdigest()
    manifest = Manifest(path, set_id, total, dim, value_dim, dtype, hetero, parts, content)
    for index in range(len(parts)) if check is None else check:
        _check_part(manifest, index, parts[index], verify=verify)
    return manifest


def _inside(manifest: Path, name: Any) -> Path:
    """A shard's path: a file name relative to the manifest's folder, never outside it."""
    text = str(name)
    relative = Path(text)
    if "\0" in text or relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise NphError(f"{manifest}: shard file {text!r} is not inside the manifest's folder")
    path = manifest.parent / relative
    # A symlink in the folder may point anywhere: the shard must be inside it once resolved too.
    if not path.resolve().is_relative_to(manifest.parent.resolve()):
        raise NphError(
            f"{manifest}: shard file {text!r} links outside the manifest's folder; copy the "
            "shard into the folder instead of linking it"
        )
    return path


def _whole(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    return value


def _check_part(manifest: Manifest, index: int, part: ShardPart, *, verify: bool) -> None:
    """Refuse a shard file that is missing, foreign, disagrees with the manifest, or (with
    `verify`) holds other tensors than `nph shard` wrote."""
    where = f"{manifest.path}: shard {index} ({part.path})"
    if not part.path.is_file():
        raise NphError(f"{where} is missing")
    meta = read_metadata(part.path)
    shard = meta.get("shard")
    if meta.get("format") != FORMAT_NAME or not isinstance(shard, dict):
        raise NphError(f"{where} is not a shard written by `nph shard`")
    if shard.get("set_id") != manifest.set_id:
        raise NphError(f"{where} belongs to another shard set (id {shard.get('set_id')})")
    claimed = (shard.get("index"), shard.get("offset"), shard.get("rows"))
    if claimed != (index, part.offset, part.rows):
        raise NphError(
            f"{where} holds shard {claimed[0]} (rows from {claimed[1]}, {claimed[2]} rows), "
            f"not shard {index} (rows from {part.offset}, {part.rows} rows)"
        )
    with open_safetensors(part.path) as handle:
        names = list(handle.keys())
        keys = handle.get_slice("patterns")
        rows, dim = keys.get_shape()
        value_dim = handle.get_slice("values").get_shape()[1] if "values" in names else dim
    dtype = meta.get("dtype")
    found = (rows, dim, value_dim, dtype, "values" in names)
    wanted = (part.rows, manifest.dim, manifest.value_dim, manifest.dtype, manifest.hetero)
    if found != wanted:
        labels = ("rows", "d", "d_v", "dtype", "hetero")
        pairs = zip(labels, found, wanted, strict=True)
        diffs = ", ".join(f"{label} {a} ≠ {b}" for label, a, b in pairs if a != b)
        raise NphError(f"{where} does not match the manifest: {diffs}")
    if verify and tensors_sha256(part.path) != part.sha256:
        raise NphError(
            f"{where} holds other rows than `nph shard` wrote (its checksum differs from the "
            "manifest's); shard the memory again"
        )


def set_meta(manifest: Manifest, first: dict[str, Any]) -> dict[str, Any]:
    """The metadata of the whole set: shard 0's, with M the total and the shard record removed."""
    meta = {key: value for key, value in first.items() if key != "shard"}
    meta["M"] = manifest.num_memories
    meta["shard_set"] = {"set_id": manifest.set_id, "parts": len(manifest.parts)}
    meta[PROVENANCE_KEY] = manifest.content_sha256
    return meta
