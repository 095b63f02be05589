"""A safetensors file read with positioned reads, never memory-mapped whole.

The `safetensors` package maps the whole file first, which fails ("Cannot allocate memory") for
a file larger than the address space a process may have (RAM without swap, a `ulimit -v`) and
defeats `--stream`. This module parses the header itself (layout: `format.py`) and reads exactly
the byte ranges asked for, so opening a file costs its header and reading rows costs those rows.

The header is checked as the safetensors package checks it (dtype codes, shapes, byte offsets
inside the file and matching each tensor's size), so a damaged file fails here with an NphError.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.core.jsontext import parse_json

# The safetensors format's own limit on the JSON header.
MAX_HEADER_BYTES = 100_000_000
# safetensors dtype code → torch dtype, for every code nph may meet in a memory file.
_CODES = "F64 F32 F16 BF16 I64 I32 I16 I8 U8 U16 U32 U64 BOOL".split()
_TYPES = "float64 float32 float16 bfloat16 int64 int32 int16 int8 uint8 uint16 uint32 uint64 bool"
DTYPES = {c: getattr(torch, t) for c, t in zip(_CODES, _TYPES.split(), strict=True)}
_CHUNK = 1 << 28  # bytes per read call (one pread is capped near 2 GiB on Linux)


class TensorEntry:
    """One tensor's header entry; `entry[a:b]` reads rows a..b (along the first dimension)."""

    def __init__(self, source: SafetensorsFile, name: str, code: str, shape: list[int], at: int):
        self._source, self.name, self.code, self.shape = source, name, code, shape
        self.offset = at  # byte of its first element, from the start of the file
        self.dtype = DTYPES[code]
        self.row_bytes = math.prod(shape[1:]) * self.dtype.itemsize  # bytes per row

    def get_shape(self) -> list[int]:
        return list(self.shape)

    def get_dtype(self) -> str:
        return self.code

    def __getitem__(self, rows: slice) -> Tensor:
        if not self.shape:
            raise NphError(f"{self._source.path}: '{self.name}' is a scalar, not rows")
        start, stop, step = rows.indices(self.shape[0])
        if step != 1:
            raise ValueError("rows are read as one contiguous range")
        count = max(0, stop - start)
        out = torch.empty([count, *self.shape[1:]], dtype=self.dtype)
        self._source.read_into(out, self.offset + start * self.row_bytes)
        return out


class SafetensorsFile:
    """A safetensors file opened for positioned reads: `metadata()`, `keys()`,
    `get_slice(name)` (a `TensorEntry`) and `get_tensor(name)`, as the safetensors package's
    handle offers them. Close it (or use it in a `with`) to release the file descriptor."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDONLY)
        try:
            self._entries, self._metadata = self._parse_header()
        except BaseException:
            os.close(self._fd)
            raise

    def _parse_header(self) -> tuple[dict[str, TensorEntry], dict[str, str]]:
        size = os.fstat(self._fd).st_size
        prefix = os.pread(self._fd, 8, 0)
        if len(prefix) < 8:
            raise self._unreadable("too short")
        length = int.from_bytes(prefix, "little")
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise self._unreadable(f"a header of {length:,} bytes in a file of {size:,}")
        header = parse_json(
            os.pread(self._fd, length, 8), what=f"the header of {self.path}", max_bytes=length
        )
        if not isinstance(header, dict):
            raise NphError(f"{self.path} is not a readable safetensors file (header not a map)")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise NphError(f"{self.path}: its metadata must map names to strings")
        base, data_size = 8 + length, size - 8 - length
        entries = {name: self._entry(name, e, base, data_size) for name, e in header.items()}
        return entries, metadata

    def _unreadable(self, why: str) -> NphError:
        """The error for a file that is no safetensors file at all: a `.safetensors` file says
        why; another (a `.npy`, `.png` or `.csv` given as a memory) is one to store first."""
        if self.path.suffix.lower() == ".safetensors":
            return NphError(f"{self.path} is not a readable safetensors file ({why})")
        return NphError(
            f"{self.path} is not a memory file (safetensors); store it first: "
            f"`nph store {self.path}`"
        )

    def _entry(self, name: str, entry: Any, base: int, data_size: int) -> TensorEntry:
        bad = f"{self.path} is not a readable safetensors file (tensor {name!r}"
        if not isinstance(entry, dict) or entry.get("dtype") not in DTYPES:
            code = entry.get("dtype") if isinstance(entry, dict) else None
            raise NphError(f"{bad} has an unknown dtype {code!r})")
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not isinstance(shape, list) or not all(_whole(s) for s in shape):
            raise NphError(f"{bad} has an invalid shape {shape!r})")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_whole, offsets)):
            raise NphError(f"{bad} has invalid data offsets {offsets!r})")
        start, end = offsets
        if end > data_size or end - start != math.prod(shape) * DTYPES[entry["dtype"]].itemsize:
            raise NphError(
                f"{bad}: bytes {start}..{end} do not hold shape {shape} or lie past the end)"
            )
        return TensorEntry(self, name, entry["dtype"], shape, base + start)

    def read_into(self, out: Tensor, offset: int) -> None:
        """Fill tensor `out` (contiguous, on the CPU) with the file's bytes from `offset`."""
        if out.numel() == 0:
            return
        buffer = memoryview(out.view(-1).view(torch.uint8).numpy())
        done = 0
        while done < len(buffer):
            got = os.preadv(self._fd, [buffer[done : done + _CHUNK]], offset + done)
            if got == 0:
                raise NphError(f"{self.path} is truncated: it ends inside its tensors")
            done += got

    def metadata(self) -> dict[str, str]:
        return dict(self._metadata)

    def keys(self) -> list[str]:
        return sorted(self._entries)

    def get_slice(self, name: str) -> TensorEntry:
        return self._entries[name]

    def get_tensor(self, name: str) -> Tensor:
        entry = self._entries[name]
        if not entry.shape:
            out = torch.empty([], dtype=entry.dtype)
            self.read_into(out.reshape(1), entry.offset)
            return out
        return entry[:]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
