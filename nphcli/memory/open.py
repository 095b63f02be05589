"""`open_memory`: the one way to open a memory, whatever it is on disk and however it is read.

    memory file,    loaded    → `Memory` (rows in RAM)
    memory file,    streamed  → `StreamedBank` (rows read from disk block by block)
    shard manifest, loaded    → `Memory` (the shards read and joined in row order, as the
                                unsharded file would load)
    shard manifest, streamed  → `ShardedBank` over streamed shards
    shard manifest, `owned` or a process group → `ShardedBank` over this process's shards,
                                loaded or streamed
    memory file that grew (`nph add`, `segments.py`) → `Memory`: its segments' live rows,
                                loaded (streamed too: `nph compact` makes it one file again)

Loaded and streamed, the same file gives the same labels, values, item shape and metadata
(`nphcli.memory.format.read_layout` decides both); every kind is a `MemoryBank`, so models,
metrics and commands read any of them the same way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import torch
from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.memory.bank import Memory, MemoryBank, TensorBank, as_bank
from nphcli.memory.collective import LOCAL, Collective
from nphcli.memory.file import load_memory
from nphcli.memory.format import is_manifest
from nphcli.memory.given import ACCEPTED, as_table
from nphcli.memory.segments import load_segments, read_segments
from nphcli.memory.sharded_bank import ShardedBank
from nphcli.memory.shards import read_manifest, set_meta
from nphcli.memory.streamed import StreamedBank


@overload
def open_memory(
    path: str | os.PathLike[str],
    *,
    stream: Literal[False] = False,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    verify: bool = True,
) -> Memory: ...


@overload
def open_memory(
    path: str | os.PathLike[str],
    *,
    stream: bool = False,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    owned: range | None = None,
    collective: Collective = LOCAL,
    verify: bool = True,
) -> MemoryBank: ...


def open_memory(
    path: str | os.PathLike[str],
    *,
    stream: bool = False,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    owned: range | None = None,
    collective: Collective = LOCAL,
    verify: bool = True,
) -> MemoryBank:
    """Open the memory file or shard manifest (`nph shard`) at `path`, checked before any row
    is used (see the module docstring for what comes back): a `Memory` in RAM unless streamed
    or shared between processes.

    Example: `memory = nph.open_memory("memory.safetensors"); memory.patterns  # (M, d)`

    `stream`: read rows from disk when they are needed instead of loading them. `device`,
    `dtype`: where and in what the rows are handed out (None: CPU, the file's dtype).
    `owned`, `collective`: a manifest's shards this process reads, and how its partial results
    combine with the other processes' (`nphcli.distributed`); default all shards, one process.
    `verify`: check each shard read against the checksum its manifest records, which reads it
    once more (False: trusted storage; see docs/distributed.md).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise NphError(f"open_memory takes a file's path (str or Path), got {type(path).__name__}")
    path = Path(path)
    if not is_manifest(path):
        if owned is not None or collective is not LOCAL:
            raise NphError(f"{path} is one memory file; processes share a shard manifest")
        grown = open_grown(path, verify=verify)
        if grown is not None:
            return _placed(grown, device, dtype)
        return _open_file(path, stream=stream, device=device, dtype=dtype)
    manifest = read_manifest(path, check=owned, verify=verify)
    if not stream and owned is None and collective is LOCAL:
        return _placed(_joined(manifest), device, dtype)
    owned = range(len(manifest.parts)) if owned is None else owned
    banks = [
        (manifest.parts[i].offset, _open_file(manifest.parts[i].path, stream, device, dtype))
        for i in owned
    ]
    return ShardedBank(
        banks,
        num_memories=manifest.num_memories,
        meta=set_meta(manifest, banks[0][1].meta),  # every shard records the source's metadata
        path=manifest.path,
        collective=collective,
    )


def open_grown(path: Path, *, verify: bool = True) -> Memory | None:
    """The live rows of a memory that grew (`nph add`, `segments.py`), loaded; None for a
    memory that is one file. A writer may switch the manifest while it is read: then the
    files it named are gone or replaced, and reading the new manifest once more succeeds."""
    for attempt in range(3):
        segments = read_segments(path)
        if segments is None:
            return None
        try:
            return load_segments(segments, verify=verify)
        except NphError:
            if attempt == 2 or read_segments(path) == segments:
                raise
    return None


def _open_file(path: Path, stream: bool, device, dtype) -> MemoryBank:
    if stream:
        return StreamedBank(path, device="cpu" if device is None else device, dtype=dtype)
    return _placed(load_memory(path), device, dtype)


def _placed(memory: Memory, device, dtype) -> MemoryBank:
    return memory if device is None and dtype is None else memory.to(device=device, dtype=dtype)


def _joined(manifest) -> Memory:
    """A shard set read whole into RAM: the shards' rows joined in row order."""
    memories = [load_memory(part.path) for part in manifest.parts]
    patterns = torch.cat([m.patterns for m in memories])  # (M, d)
    values = torch.cat([m.values for m in memories]) if manifest.hetero else None  # (M, d_v)
    labelled = [m.labels for m in memories]
    labels = None if any(x is None for x in labelled) else torch.cat(labelled)  # (M,)
    meta = set_meta(manifest, memories[0].meta)
    return Memory(patterns, values, labels=labels, meta=meta, path=manifest.path)


def as_memory(memory: Any, values: Any = None) -> MemoryBank:
    """The memory a Python API call is given, as a bank: a `MemoryBank` as it is; the path of a
    memory file or shard manifest opened with `open_memory(path)` (open it once yourself to
    reuse it); or keys (M, d) with optional `values` (M, d_v) as `nphcli.memory.given` turns
    tensors, numpy arrays and lists into tensors. Anything else is one `NphError`."""
    if isinstance(memory, MemoryBank):
        if as_bank(memory, values).device.type == "meta":  # (values beside a bank refused)
            raise NphError(
                "the memory is on the meta device, which holds no values; give one with data"
            )
        return memory
    if isinstance(memory, (str, os.PathLike)):
        if values is not None:
            raise NphError("a memory file holds its own values; do not give values beside it")
        return open_memory(memory)
    if memory is None or not isinstance(memory, (Tensor, np.ndarray, list, tuple)):
        raise NphError(
            f"the memory must be {ACCEPTED}, a MemoryBank (nph.open_memory, nph.Memory) or a "
            f"memory file's path, got {type(memory).__name__}"
        )
    keys = as_table(memory, "memories")
    return TensorBank(keys, None if values is None else as_table(values, "values"))
