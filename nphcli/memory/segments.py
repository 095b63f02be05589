"""A memory that grows: immutable segments and forgotten rows, named by one manifest.

`nph add memory.safetensors items.jsonl` never rewrites what is stored. The first change writes
`memory.segments.json` beside the memory file; from then on the memory is the manifest's
segments in order, minus the rows it lists as forgotten:

    {"format": "nph-segments", "format_version": 1, "id": "…", "generation": 3,
     "segments": [{"file": "memory.safetensors", "rows": 36, "sha256": "…"},
                  {"file": "memory.seg-1.safetensors", "rows": 2, "sha256": "…"}, …],
     "forgotten": {"file": "memory.forgotten-3.json", "sha256": "…"}}

Segment 0 is the memory file itself; each later one is a memory file with its items sidecar,
written by one `nph add`; each `nph forget` replaces the forgotten list (segment file → rows).
A change writes its new files first, then the manifest atomically, so a command killed at any
point leaves the previous memory whole. `nph compact` writes the live rows over the memory file,
recording the manifest's id and generation (`compacted`), then removes the now stale manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nphcli.core.atomic import atomic_write
from nphcli.core.errors import NphError
from nphcli.core.jsontext import read_json_file
from nphcli.memory.bank import Memory
from nphcli.memory.file import load_memory
from nphcli.memory.format import read_layout, read_metadata, tensors_sha256
from nphcli.memory.items import Items, open_items
from nphcli.memory.provenance import META_KEY, tensors_digest

FORMAT = "nph-segments"
VERSION = 1
SUFFIX = ".segments.json"


def manifest_path(memory_path: str | os.PathLike) -> Path:
    """`memory.safetensors` → `memory.segments.json`."""
    path = Path(memory_path)
    return path.with_name(path.stem + SUFFIX)


@dataclass(frozen=True)
class Segment:
    file: str  # name in the memory's folder
    rows: int
    sha256: str  # of its tensors (`format.tensors_sha256`)


@dataclass(frozen=True)
class Segments:
    """A validated segments manifest: the memory is `segments` minus `forgotten`."""

    memory: Path  # the memory file (segment 0)
    id: str  # random, made when the memory first grew
    generation: int  # counts the changes
    segments: tuple[Segment, ...]
    forgotten: dict[str, list[int]]  # segment file → its forgotten rows, ascending

    def path_of(self, segment: Segment) -> Path:
        return self.memory.with_name(segment.file)

    @property
    def live_rows(self) -> int:
        return sum(s.rows for s in self.segments) - sum(map(len, self.forgotten.values()))


def read_segments(memory_path: str | os.PathLike) -> Segments | None:
    """The manifest beside `memory_path`, or None when the memory is one file (no manifest, or
    one the memory file was compacted from)."""
    memory = Path(memory_path)
    path = manifest_path(memory)
    if not path.is_file():
        return None
    raw = read_json_file(path, what="segments manifest")
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise NphError(f"{path} is not an nph segments manifest (written by `nph add`)")
    if raw.get("format_version") != VERSION:
        raise NphError(f"{path} uses segments format {raw.get('format_version')!r}; upgrade nph")
    try:
        compacted = read_metadata(memory).get("compacted") if memory.is_file() else None
        if compacted == {"id": raw["id"], "generation": raw["generation"]}:
            return None  # `nph compact` replaced the memory file and was stopped before cleanup
        segments = tuple(
            Segment(_name(path, s["file"]), int(s["rows"]), str(s["sha256"]))
            for s in raw["segments"]
        )
        forgotten: dict[str, list[int]] = {}
        if (record := raw.get("forgotten")) is not None:
            listed = memory.with_name(_name(path, record["file"]))
            if not listed.is_file() or _sha256(listed) != record["sha256"]:
                raise NphError(f"{path}: its forgotten list {listed.name} is missing or changed")
            forgotten = {
                str(k): sorted(map(int, v)) for k, v in json.loads(listed.read_text()).items()
            }
        found = Segments(memory, str(raw["id"]), int(raw["generation"]), segments, forgotten)
    except (KeyError, TypeError, ValueError) as error:
        raise NphError(f"{path}: malformed segments manifest ({error})") from None
    if not segments or segments[0].file != memory.name:
        raise NphError(f"{path} does not start with {memory.name}")
    return found


def _name(manifest: Path, name: Any) -> str:
    text = str(name)
    if Path(text).name != text or text in ("", ".", ".."):
        raise NphError(f"{manifest}: {text!r} is not a file beside it")
    return text


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def as_single(memory_path: Path) -> Segments:
    """A one-file memory as generation 0 of a manifest (not written until it changes)."""
    digest = tensors_sha256(memory_path)
    rows = read_layout(memory_path).num_memories  # a foreign file too (refused later, in words)
    return Segments(
        memory_path, os.urandom(12).hex(), 0, (Segment(memory_path.name, rows, digest),), {}
    )


def write_segments(segments: Segments) -> None:
    """Switch the memory to `segments`: its forgotten list (a new file) first, then the manifest,
    each atomically. Files of the previous generation that are no longer named are removed."""
    record, stem = None, segments.memory.stem
    if any(segments.forgotten.values()):
        listed = segments.memory.with_name(f"{stem}.forgotten-{segments.generation}.json")
        with atomic_write(listed, force=True) as tmp:
            Path(tmp).write_text(json.dumps(segments.forgotten))
        record = {"file": listed.name, "sha256": _sha256(listed)}
    manifest = {
        "format": FORMAT,
        "format_version": VERSION,
        "id": segments.id,
        "generation": segments.generation,
        "segments": [s.__dict__ for s in segments.segments],
        "forgotten": record,
    }
    path = manifest_path(segments.memory)
    with atomic_write(path, force=True) as tmp:
        Path(tmp).write_text(json.dumps(manifest, indent=1) + "\n")
    for old in segments.memory.parent.glob(f"{stem}.forgotten-*.json"):
        if record is None or old.name != record["file"]:
            old.unlink(missing_ok=True)


def load_segments(segments: Segments, *, verify: bool = True) -> Memory:
    """The live rows of every segment joined in order, as one memory in RAM. Its metadata is
    segment 0's with M the live rows, `items` naming each segment's sidecar and its forgotten
    rows (`items.open_items` reads them), and the content hash of the joined tensors."""
    parts, items, labels = [], [], []
    for segment in segments.segments:
        path = segments.path_of(segment)
        if not path.is_file():
            raise NphError(f"{manifest_path(segments.memory)}: segment {segment.file} is missing")
        if verify and tensors_sha256(path) != segment.sha256:
            raise NphError(f"segment {path} holds other rows than were added (checksum differs)")
        memory = load_memory(path)
        drop = segments.forgotten.get(segment.file, [])
        keep = torch.ones(memory.num_memories, dtype=torch.bool)  # (m,)
        keep[drop] = False
        parts.append((memory, keep))
        record = memory.meta.get("items")
        if record is not None:
            items.append({**record, "drop": drop})
        labels.append(None if memory.labels is None else memory.labels[keep])
    first = parts[0][0]
    patterns = torch.cat([m.patterns[keep] for m, keep in parts])  # (M, d)
    if patterns.shape[0] == 0:
        raise NphError(f"{segments.memory}: every item is forgotten")
    values = torch.cat([m.values[keep] for m, keep in parts]) if first.hetero else None
    joined_labels = None if any(x is None for x in labels) else torch.cat(labels)  # (M,)
    named = {"patterns": patterns, "values": values, "labels": joined_labels}
    tensors = {name: tensor for name, tensor in named.items() if tensor is not None}
    meta = {key: value for key, value in first.meta.items() if key not in ("compacted", "items")}
    meta["M"] = patterns.shape[0]
    meta["segments"] = {"id": segments.id, "generation": segments.generation}
    if len(items) == len(parts):  # else some rows have no ids: the memory has none
        meta["items"] = {"parts": items}
    meta[META_KEY] = tensors_digest(tensors)
    return Memory(patterns, values, labels=joined_labels, meta=meta, path=segments.memory)


def segment_items(segments: Segments) -> tuple[Items, list[tuple[str, int]]]:
    """The live items of `segments` (read from each segment's sidecar, no rows loaded) and where
    each lies: (segment file, row in it), in the memory's row order."""
    parts, where = [], []
    for segment in segments.segments:
        record = read_metadata(segments.path_of(segment)).get("items")
        if not isinstance(record, dict):
            raise NphError(
                f"{segments.memory}: segment {segment.file} has no ids; a memory that grows "
                "needs an id on every row (store it from a table or texts)"
            )
        drop = segments.forgotten.get(segment.file, [])
        parts.append({**record, "drop": drop})
        dropped = set(drop)
        where += [(segment.file, row) for row in range(segment.rows) if row not in dropped]
    items = open_items(segments.memory, {"M": len(where), "items": {"parts": parts}})
    return items, where
