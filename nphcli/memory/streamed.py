"""Memories streamed from a memory file on disk, so a file larger than RAM can be searched.

`StreamedBank` is a `MemoryBank` over a safetensors memory file, read block by block. Nothing
is memory-mapped: a mapping fails for a file larger than the address space the process may have
(`ulimit -v`), and its touched pages count as the process's memory. `nphcli.memory.reader` reads
exactly each block's bytes into a fresh tensor, so the file's pages stay in the reclaimable page
cache. Each block opens the file anew (microseconds), so copies of the bank share no state.
Scattered rows (`gather`) take one positioned read per run of adjacent rows.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nphcli.core.devices import canonical_device
from nphcli.core.errors import NphError
from nphcli.memory.bank import MemoryBank
from nphcli.memory.format import all_finite, layout_of, open_safetensors


class StreamedBank(MemoryBank):
    """Keys (M, d) and values (M, d_v) of a memory file, read from disk block by block, handed
    out on `device` in `dtype` (None: the file's own). Keys, values, labels and metadata are what
    loading the file would give (`format.read_layout`); without values the keys serve, read once
    per block. Each block is checked for NaN and infinity as it is read."""

    def __init__(
        self,
        path: str | os.PathLike,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
    ):
        self.path = Path(path)
        with open_safetensors(self.path) as handle:
            layout = layout_of(self.path, handle)
            read = [handle.get_slice(name) for name in (layout.keys, layout.values) if name]
        self.key_name, self.value_name, self.labels_name = layout.keys, layout.values, layout.labels
        self.num_memories, self.dim = layout.num_memories, layout.dim
        self.value_dim = layout.value_dim
        # name → (byte offset of row 0, row width, dtype), for `_rows`
        self._layout = {entry.name: (entry.offset, entry.shape[1], entry.dtype) for entry in read}
        self.meta = layout.meta
        self.hetero = self.value_name is not None
        self.device = canonical_device(device)
        self.dtype = layout.dtype if dtype is None else dtype
        self._labels: Tensor | None = None
        layout.announce()

    def blocks(self, rows: int) -> Iterator[tuple[int, Tensor, Tensor]]:
        for start in range(0, self.num_memories, rows):
            stop = min(self.num_memories, start + rows)
            keys = self._read(self.key_name, start, stop)  # (B, d)
            values = self._read(self.value_name, start, stop) if self.value_name else keys
            yield start, keys, values

    def key_blocks(self, rows: int) -> Iterator[tuple[int, Tensor]]:
        for start in range(0, self.num_memories, rows):
            yield start, self._read(self.key_name, start, min(self.num_memories, start + rows))

    def rows(self, start: int, stop: int, *, values: bool = False) -> Tensor:
        """Rows start…stop-1 of the keys, or of the values (the keys when auto-associative)."""
        return self._read(self.value_name if values and self.hetero else self.key_name, start, stop)

    def gather(self, index: Tensor) -> tuple[Tensor, Tensor]:
        """Reads only the rows in `index` (and the pages around them), not the whole file."""
        flat = index.reshape(-1).cpu()  # (N,)
        keys = self._rows(self.key_name, flat)  # (N, d)
        values = self._rows(self.value_name, flat) if self.value_name else keys  # (N, d_v)
        return (keys.reshape(*index.shape, self.dim), values.reshape(*index.shape, self.value_dim))

    def to(self, device=None, dtype=None) -> StreamedBank:
        """The same file read onto another device or into another dtype (no file access)."""
        other = copy.copy(self)
        if dtype is not None:
            other.dtype = dtype
        if device is not None:
            other.device = canonical_device(device)
        return other

    def summary_token(self) -> tuple[Hashable, tuple[Any, ...]] | None:
        """The file as it is now (path, inode, size, modification time) and how it is read."""
        status = os.stat(self.path)
        file = (str(self.path.resolve()), status.st_ino, status.st_size, status.st_mtime_ns)
        return (*file, self.key_name, self.value_name, self.dtype, self.device), ()

    @property
    def labels(self) -> Tensor | None:
        """The file's `labels` (M,) int64, or None; small enough to read whole (once)."""
        if self.labels_name is None:
            return None
        if self._labels is None:
            with open_safetensors(self.path) as handle:
                self._labels = handle.get_tensor(self.labels_name).to(torch.int64)
        return self._labels

    def _read(self, name: str, start: int, stop: int) -> Tensor:
        with open_safetensors(self.path) as handle:
            block = handle.get_slice(name)[start:stop]  # (B, width), read into a new tensor
        return self._checked(block, name, start)

    def _rows(self, name: str, index: Tensor) -> Tensor:
        """Rows `index` (N,) of tensor `name`, one positioned read per run of adjacent rows."""
        offset, width, dtype = self._layout[name]
        row_bytes = width * dtype.itemsize
        unique, inverse = torch.unique(index, return_inverse=True)  # sorted (U,), (N,)
        rows = torch.empty(unique.numel(), width, dtype=dtype)  # (U, width)
        buffer = rows.view(torch.uint8).numpy().reshape(-1)  # rows' bytes, writable
        starts = unique.tolist()
        with open(self.path, "rb", buffering=0) as handle:
            run = 0
            while run < len(starts):
                end = run + 1
                while end < len(starts) and starts[end] == starts[end - 1] + 1:
                    end += 1
                data = os.pread(
                    handle.fileno(), (end - run) * row_bytes, offset + starts[run] * row_bytes
                )
                buffer[run * row_bytes : end * row_bytes] = memoryview(data)
                run = end
        return self._checked(rows[inverse], name, None)

    def _checked(self, block: Tensor, name: str, start: int | None) -> Tensor:
        if not all_finite(block):
            where = f" in rows from {start}" if start is not None else ""
            raise NphError(f"{self.path}: '{name}' contains NaN or infinite values{where}")
        block = block.to(dtype=self.dtype)
        if self.device.type == "cuda":
            # Pinned, the copy is asynchronous: the GPU computes on this block while the next is
            # read; torch's pinned-memory allocator keeps the host buffer alive until it has run.
            return block.pin_memory().to(self.device, non_blocking=True)
        return block.to(device=self.device)
