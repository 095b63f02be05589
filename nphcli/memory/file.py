"""Memory files (their layout: `format.py`) written and loaded. Each field of `Memory.meta` is
kept as a JSON value, so other tools can read it and nph can map patterns back to images.

Writes are atomic (`core/atomic.py`). Loading checks all a later command relies on, so a damaged
or foreign file fails here in one line, not deep inside a model.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nphcli.core.atomic import atomic_write
from nphcli.core.dtypes import dtype_name
from nphcli.core.errors import NphError
from nphcli.memory.bank import Memory
from nphcli.memory.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    check_finite,
    check_matrix,
    is_manifest,
    layout_of,
    open_safetensors,
)
from nphcli.memory.provenance import META_KEY, dtype_code, stamp, tensors_digest
from nphcli.version import __version__


def save_memory(
    path: str | os.PathLike,
    patterns: Tensor,
    *,
    labels: Tensor | None = None,
    values: Tensor | None = None,
    meta: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
    force: bool = False,
    before_switch: Callable[[], None] | None = None,
) -> Path:
    """Write a memory file atomically; refuses to replace an existing file unless `force`.
    `before_switch` runs once the file is written, right before it replaces `path`."""
    patterns = check_matrix(patterns, "patterns")
    tensors = {"patterns": [patterns.detach().to("cpu", dtype)]}
    if labels is not None:
        if labels.shape != (patterns.shape[0],):
            raise NphError(f"{labels.shape[0]} labels for {patterns.shape[0]} patterns")
        tensors["labels"] = [labels.detach().to("cpu", torch.int64)]
    if values is not None:
        values = check_matrix(values, "values")
        if values.shape[0] != patterns.shape[0]:
            raise NphError(f"{values.shape[0]} values for {patterns.shape[0]} patterns")
        tensors["values"] = [values.detach().to("cpu", dtype)]
    shapes = {name: (t[0].dtype, tuple(t[0].shape)) for name, t in tensors.items()}
    write_memory(path, shapes, tensors, meta=meta, force=force, before_switch=before_switch)
    return Path(path)


def write_memory(
    path: str | os.PathLike,
    shapes: dict[str, tuple[torch.dtype, tuple[int, ...]]],
    blocks: dict[str, Iterable[Tensor]],
    *,
    meta: dict[str, Any] | None = None,
    force: bool = False,
    before_switch: Callable[[], None] | None = None,
) -> str:
    """Write a memory file atomically from its tensors (`shapes`: name → dtype and shape), each
    given as consecutive row blocks (`blocks`), so one block at a time is in RAM; the content
    hash (`provenance.py`) is computed as the bytes go out, written into the header last, and
    returned."""
    rows, dim = shapes["patterns"][1]
    full_meta = {
        META_KEY: "0" * 64,  # first in the header: overwritten in place once known
        **{key: value for key, value in (meta or {}).items() if key != META_KEY},
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "nph_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "M": rows,
        "d": dim,
        "dtype": dtype_name(shapes["patterns"][0]),
    }
    header, offset = {"__metadata__": {k: json.dumps(v) for k, v in full_meta.items()}}, 0
    for name in sorted(shapes):
        dtype, shape = shapes[name]
        size = math.prod(shape) * dtype.itemsize
        entry = {"dtype": dtype_code(dtype), "shape": list(shape), "data_offsets": [offset, size]}
        header[name], offset = entry, offset + size
        entry["data_offsets"][1] = offset
    text = json.dumps(header, separators=(",", ":")).encode()  # ASCII: bytes are characters
    text += b" " * (-len(text) % 8)
    digest = hashlib.sha256()
    with atomic_write(path, force=force, before_switch=before_switch) as tmp:
        with open(tmp, "wb") as handle:
            handle.write(len(text).to_bytes(8, "little") + text)
            for name in sorted(shapes):
                dtype, shape = shapes[name]
                digest.update(json.dumps([name, dtype_code(dtype), list(shape)]).encode())
                written = 0
                for block in blocks[name]:
                    data = block.detach().to("cpu", dtype).contiguous().reshape(-1)
                    data = data.view(torch.uint8).numpy()  # its bytes, not a copy
                    handle.write(data)
                    digest.update(data)
                    written += data.nbytes
                    del block, data  # before the next block is read
                if written != math.prod(shape) * dtype.itemsize:
                    raise ValueError(f"'{name}': {written} bytes written for shape {shape}")
            handle.seek(8 + text.index(b"0" * 64))
            handle.write(digest.hexdigest().encode())
    return digest.hexdigest()


def check_identity(path: Path, meta: dict[str, Any], tensors: dict[str, Tensor]) -> None:
    """Refuse a file whose tensors, all read, are not the ones its recorded content hash names
    (edited after nph wrote it, the metadata kept): results would name the memory wrongly."""
    recorded = meta[META_KEY]
    if tensors_digest(tensors) != recorded:
        raise NphError(
            f"{path}: its tensors are not the ones its content hash ({str(recorded)[:16]}…) "
            "records; the file was changed after nph wrote it: store it again"
        )


def load_memory(path: str | os.PathLike) -> Memory:
    """Read and check a memory file (nph's own, or a foreign safetensors file: `format.py`) into
    RAM; `nphcli.memory.open_memory` opens any memory and calls this for a loaded file."""
    path = Path(path)
    if is_manifest(path):
        raise NphError(f"{path} is a shard manifest; open it with nphcli.memory.open_memory")
    with open_safetensors(path) as handle:
        layout = layout_of(path, handle)
        patterns = handle.get_tensor(layout.keys)  # (M, d)
        values = None if layout.values is None else handle.get_tensor(layout.values)  # (M, d_v)
        labels = None if layout.labels is None else handle.get_tensor(layout.labels)  # (M,)
    check_finite(patterns, f"{path}: '{layout.keys}'")
    if values is not None:
        check_finite(values, f"{path}: 'values'")
    if not layout.foreign and layout.meta.get(META_KEY) is not None:
        read = {"patterns": patterns, "values": values, "labels": labels}
        check_identity(path, layout.meta, {k: v for k, v in read.items() if v is not None})
    layout.announce()  # only once the file proved usable: a failing command prints one line
    labels = None if labels is None else labels.to(torch.int64)
    memory = Memory(patterns, values, labels=labels, meta=layout.meta, path=path)
    if not layout.foreign and layout.meta.get(META_KEY) is not None:
        stamp(memory, layout.meta[META_KEY])  # checked above: edits in place are seen
    return memory
