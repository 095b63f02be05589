"""The memory-file format, read in one place: what a file holds and which tensors nph uses.

A memory file is a safetensors file (an 8-byte little-endian header length, a JSON header, the
tensors' bytes) holding `patterns` (M, d) float, optional `labels` (M,) int64 and `values`
(M, d_v) float, and metadata with `"format": "nph-memory"` and each field a JSON value. A shard
set is a JSON manifest (`.json`) beside its shard files (`shards.py`).

`read_layout` reads a file's header and decides what loading (`file.load_memory`) and streaming
(`streamed.StreamedBank`) then read, so both give the same tensors, labels and metadata. The
rules for a foreign file (a safetensors file another tool wrote):
- its patterns are the tensor `patterns`, else its only 2-D tensor;
- `labels` and `values` are used only beside a tensor named `patterns` (beside a guessed tensor
  the names mean nothing);
- its own metadata is kept aside, undecoded, under `foreign_metadata`, so none of its keys is
  mistaken for one of nph's (e.g. an unrelated "item_shape").
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nphcli.core.dtypes import COMPUTE_DTYPES, torch_dtype
from nphcli.core.errors import NphError
from nphcli.core.jsontext import parse_json
from nphcli.core.notices import notice
from nphcli.memory.reader import SafetensorsFile

FORMAT_NAME = "nph-memory"
FORMAT_VERSION = 1
MANIFEST_SUFFIX = ".json"
FLOAT_DTYPES = {torch_dtype(name) for name in COMPUTE_DTYPES}  # what nph computes and stores in
# safetensors codes of the integer dtypes labels may have (read as int64).
_INTEGER_CODES = {"I8", "I16", "I32", "I64", "U8", "U16", "U32"}


def is_manifest(path: str | os.PathLike) -> bool:
    """Whether `path` names a shard manifest (a .json file) rather than a memory file."""
    return Path(path).suffix.lower() == MANIFEST_SUFFIX


@dataclass(frozen=True)
class Layout:
    """What a memory file holds, as nph reads it (see the module docstring)."""

    path: Path
    meta: dict[str, Any]  # nph's metadata, or {"source", "foreign_metadata"} for a foreign file
    foreign: bool
    keys: str  # name of the patterns tensor (M, d)
    values: str | None  # name of the values tensor (M, d_v), None: auto-association
    labels: str | None  # name of the labels tensor (M,)
    num_memories: int
    dim: int
    value_dim: int
    dtype: torch.dtype  # the patterns' dtype in the file

    def announce(self) -> None:
        """Say once, after the file proved usable, what a foreign file is taken to hold."""
        if not self.foreign:
            return
        extras = [
            f"'{self.labels}' as labels" if self.labels else "no labels",
            f"'{self.values}' as values" if self.values else None,
            "no image shape",
        ]
        notice(
            f"{self.path} has no nph metadata: using tensor '{self.keys}' as the patterns (one "
            f"row per memory), {', '.join(e for e in extras if e)}"
        )


def read_layout(path: str | os.PathLike) -> Layout:
    """Read and check a memory file's header (no rows): NphError for anything a later command
    could trip on, a newer format version included."""
    with open_safetensors(path) as handle:
        return layout_of(Path(path), handle)


def layout_of(path: Path, handle) -> Layout:
    """`read_layout` on a handle already open (`open_safetensors`)."""
    raw = handle.metadata() or {}
    names = list(handle.keys())
    meta = decode_meta(raw)
    foreign = meta.get("format") != FORMAT_NAME
    if foreign:
        keys = _guess_patterns(path, handle, names)
        meta = {"source": f"file:{path.name}", "foreign_metadata": dict(raw)}
    else:
        check_format_version(path, meta)
        if "patterns" not in names:
            raise NphError(f"{path} has no 'patterns' tensor (it has: {', '.join(names)})")
        keys = "patterns"
    paired = keys == "patterns"
    values = "values" if paired and "values" in names else None
    labels = "labels" if paired and "labels" in names else None
    rows, dim = _matrix(path, handle, keys)
    value_dim = dim
    if values is not None:
        value_rows, value_dim = _matrix(path, handle, values)
        if value_rows != rows:
            raise NphError(f"{path}: {value_rows} values for {rows} patterns")
    if labels is not None:
        entry = handle.get_slice(labels)
        shape, code = entry.get_shape(), entry.get_dtype()
        if shape != [rows]:
            raise NphError(f"{path}: 'labels' has shape {tuple(shape)}, expected ({rows},)")
        if code not in _INTEGER_CODES:
            raise NphError(f"{path}: 'labels' must hold integers, got {code}")
    dtype = handle.get_slice(keys).dtype
    return Layout(path, meta, foreign, keys, values, labels, rows, dim, value_dim, dtype)


def _matrix(path: Path, handle, name: str) -> tuple[int, int]:
    """(rows, width) of a float matrix in the file, from its header entry."""
    entry = handle.get_slice(name)
    shape, code = entry.get_shape(), entry.get_dtype()
    if len(shape) != 2:
        raise NphError(f"{path}: '{name}' must be a 2-D (M, d) tensor, got shape {tuple(shape)}")
    if entry.dtype not in FLOAT_DTYPES:
        raise NphError(
            f"{path}: '{name}' must be floating point ({', '.join(COMPUTE_DTYPES)}), got {code}"
        )
    if 0 in shape:
        raise NphError(f"{path}: '{name}' is empty (shape {tuple(shape)})")
    return shape[0], shape[1]


def _guess_patterns(path: Path, handle, names: list[str]) -> str:
    """A foreign file's patterns: 'patterns', else its only 2-D tensor."""
    if "patterns" in names:
        return "patterns"
    matrices = [k for k in names if len(handle.get_slice(k).get_shape()) == 2]
    if len(matrices) != 1:
        raise NphError(
            f"{path} has no nph metadata and {len(matrices)} 2-D tensors "
            f"({', '.join(names) or 'none'}); save the patterns under the key 'patterns'"
        )
    return matrices[0]


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The decoded metadata of a safetensors file, without reading its tensors."""
    with open_safetensors(path) as handle:
        return decode_meta(handle.metadata() or {})


def decode_meta(raw: dict[str, str]) -> dict[str, Any]:
    """Each metadata value parsed as JSON (nph writes JSON), kept as text when it is not."""
    meta = {}
    for key, text in raw.items():
        try:
            meta[key] = parse_json(text, what=f"metadata {key!r}")
        except NphError:  # not JSON, or JSON too large or deep to read: kept as it is
            meta[key] = text
    return meta


def check_format_version(path: str | os.PathLike, meta: dict[str, Any]) -> None:
    """Refuse an nph memory file written in a newer format than this nph reads (`meta`: its
    decoded metadata)."""
    version = meta.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version > FORMAT_VERSION:
        raise NphError(
            f"{path} uses memory-file format version {version}, newer than this nph "
            f"understands ({FORMAT_VERSION}); upgrade nph"
        )


def tensors_sha256(path: str | os.PathLike) -> str:
    """sha256 of a safetensors file's tensors: each one's name, dtype code, shape and bytes, in
    name order. The metadata is left out (it holds a creation time), so the digest says whether
    the rows, labels and values are the ones written, whatever the header claims."""
    digest = hashlib.sha256()
    with open_safetensors(path) as tensors:
        entries = [tensors.get_slice(name) for name in tensors.keys()]  # in name order
    with open(path, "rb") as handle:
        for entry in entries:
            digest.update(json.dumps([entry.name, entry.code, entry.shape]).encode())
            handle.seek(entry.offset)
            remaining = math.prod(entry.shape) * entry.dtype.itemsize
            while remaining:
                chunk = handle.read(min(remaining, 1 << 24))
                if not chunk:
                    raise NphError(f"{path} is truncated: tensor '{entry.name}' ends past its end")
                digest.update(chunk)
                remaining -= len(chunk)
    return digest.hexdigest()


def check_matrix(tensor: Tensor, what: str) -> Tensor:
    """Refuse a tensor that cannot be patterns or values: not 2-D (M, d), not floating point,
    empty, or holding NaN or infinity."""
    if tensor.ndim != 2:
        raise NphError(f"{what} must be a 2-D (M, d) tensor, got shape {tuple(tensor.shape)}")
    if tensor.dtype not in FLOAT_DTYPES:
        raise NphError(
            f"{what} must be floating point, got {str(tensor.dtype).removeprefix('torch.')}"
        )
    if 0 in tensor.shape:
        raise NphError(f"{what} is empty (shape {tuple(tensor.shape)})")
    check_finite(tensor, what)
    return tensor


def all_finite(tensor: Tensor) -> bool:
    """No entry is NaN or ±inf. One sum (~30× faster than isfinite on CPU) decides unless it
    overflowed; then x·0 == 0 checks each entry (x·0 is NaN for ±inf and NaN)."""
    return bool(torch.isfinite(tensor.sum())) or bool((tensor * 0 == 0).all())


def check_finite(tensor: Tensor, what: str) -> None:
    """Refuse NaN or infinite entries (a later model would spread them silently)."""
    if not all_finite(tensor):
        raise NphError(f"{what} contains NaN or infinite values")


@contextmanager
def open_safetensors(path: str | os.PathLike) -> Iterator[SafetensorsFile]:
    """Open a safetensors file for positioned reads (`reader.SafetensorsFile`: nothing is
    memory-mapped, so a file larger than memory opens), turning every way it can be unreadable
    into an NphError."""
    path = Path(path)
    if not path.exists():
        raise NphError(f"memory file {path} not found; create one with `nph store`")
    if path.is_dir():
        raise NphError(f"{path} is a directory, not a memory file")
    if path.stat().st_size == 0:
        raise NphError(f"{path} is empty, not a safetensors memory file")
    try:
        handle = SafetensorsFile(path)
    except OSError as error:
        raise NphError(f"{path} is not a readable file ({error.strerror or error})") from None
    with handle:
        yield handle
