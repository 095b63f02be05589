"""Memory files: one safetensors file holding the stored patterns and what they are.

Tensors: `patterns` (M, d) float; optional `labels` (M,) int64; optional `values` (M, d_v) for
hetero-association. Metadata (safetensors' string→string map) holds each field of `Memory.meta`
as a JSON value, so other tools can read it and nph can map patterns back to images.

Writes are atomic (see `atomic.py`). Loading validates everything a later command relies on, so
a damaged or foreign file fails here with one clear message instead of deep inside a model.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from nphcli.atomic import atomic_write
from nphcli.dtypes import COMPUTE_DTYPES, torch_dtype
from nphcli.errors import NphError
from nphcli.memory.bank import Memory
from nphcli.notices import notice
from nphcli.version import __version__

FORMAT_NAME = "nph-memory"
FORMAT_VERSION = 1
_FLOATS = {torch_dtype(name) for name in COMPUTE_DTYPES}


def save_memory(
    path: str | os.PathLike,
    patterns: Tensor,
    *,
    labels: Tensor | None = None,
    values: Tensor | None = None,
    meta: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
    force: bool = False,
) -> Path:
    """Write a memory file atomically; refuses to replace an existing file unless `force`."""
    patterns = _check_patterns(patterns, "patterns")
    tensors = {"patterns": patterns.detach().to("cpu", dtype).contiguous()}
    if labels is not None:
        if labels.shape != (patterns.shape[0],):
            raise NphError(f"{labels.shape[0]} labels for {patterns.shape[0]} patterns")
        tensors["labels"] = labels.detach().to("cpu", torch.int64).contiguous()
    if values is not None:
        values = _check_patterns(values, "values")
        if values.shape[0] != patterns.shape[0]:
            raise NphError(f"{values.shape[0]} values for {patterns.shape[0]} patterns")
        tensors["values"] = values.detach().to("cpu", dtype).contiguous()
    full_meta = {
        **(meta or {}),
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "nph_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "M": patterns.shape[0],
        "d": patterns.shape[1],
        "dtype": str(dtype).removeprefix("torch."),
    }
    encoded = {key: json.dumps(value) for key, value in full_meta.items()}
    with atomic_write(path, force=force) as tmp:
        save_file(tensors, str(tmp), metadata=encoded)
    return Path(path)


def load_memory(path: str | os.PathLike) -> Memory:
    """Read and validate a memory file (nph's own, or a foreign single-matrix safetensors file),
    or a shard manifest (`nph shard`), whose shards are read and joined in row order."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        from nphcli.memory.shards import load_sharded

        return load_sharded(path)
    with open_safetensors(path) as handle:
        raw_meta = handle.metadata() or {}
        keys = list(handle.keys())
        meta = _decode_meta(raw_meta)
        foreign = meta.get("format") != FORMAT_NAME
        if not foreign:
            check_format_version(path, meta)
            pattern_key = "patterns"
            if pattern_key not in keys:
                raise NphError(f"{path} has no 'patterns' tensor (it has: {', '.join(keys)})")
        else:
            pattern_key = _guess_pattern_key(path, handle, keys, announce=False)
            meta = {"source": f"file:{path.name}", "foreign_metadata": raw_meta}
        patterns = _check_patterns(handle.get_tensor(pattern_key), f"{path}: '{pattern_key}'")
        if foreign:  # only once the guess proved usable: a failing command prints one line
            _announce_foreign(path, pattern_key)
        labels = (
            handle.get_tensor("labels") if "labels" in keys and pattern_key == "patterns" else None
        )
        values = (
            handle.get_tensor("values") if "values" in keys and pattern_key == "patterns" else None
        )
    if labels is not None and labels.shape != (patterns.shape[0],):
        raise NphError(
            f"{path}: 'labels' has shape {tuple(labels.shape)}, expected ({patterns.shape[0]},)"
        )
    if values is not None:
        values = _check_patterns(values, f"{path}: 'values'")
        if values.shape[0] != patterns.shape[0]:
            raise NphError(f"{path}: {values.shape[0]} values for {patterns.shape[0]} patterns")
    return Memory(patterns=patterns, labels=labels, values=values, meta=meta, path=path)


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The decoded metadata of a safetensors file, without reading its tensors."""
    with open_safetensors(path) as handle:
        return _decode_meta(handle.metadata() or {})


def check_format_version(path: str | os.PathLike, meta: dict[str, Any]) -> None:
    """Refuse an nph memory file written in a newer format than this nph reads (`meta`: its
    decoded metadata)."""
    version = meta.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version > FORMAT_VERSION:
        raise NphError(
            f"{path} uses memory-file format version {version}, newer than this nph "
            f"understands ({FORMAT_VERSION}); upgrade nph"
        )


class open_safetensors:  # noqa: N801  (used like the function `open`)
    """Memory-map a safetensors file, turning every way it can be unreadable into an NphError.

    Used by `load_memory` and by streaming readers that take blocks with `get_slice`.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __enter__(self):
        path = self.path
        if not path.exists():
            raise NphError(f"memory file {path} not found; create one with `nph store`")
        if path.is_dir():
            raise NphError(f"{path} is a directory, not a memory file")
        if path.stat().st_size == 0:
            raise NphError(f"{path} is empty, not a safetensors memory file")
        try:
            self._context = safe_open(str(path), framework="pt")
            return self._context.__enter__()
        except (SafetensorError, OSError, ValueError) as error:
            raise NphError(f"{path} is not a readable safetensors file ({error})") from None

    def __exit__(self, *exc: object) -> None:
        self._context.__exit__(*exc)


def _decode_meta(raw: dict[str, str]) -> dict[str, Any]:
    meta = {}
    for key, text in raw.items():
        try:
            meta[key] = json.loads(text)
        except json.JSONDecodeError:
            meta[key] = text
    return meta


def _guess_pattern_key(path: Path, handle, keys: list[str], *, announce: bool = True) -> str:
    """A file from another tool: take 'patterns' or its only 2-D tensor, and say so unless the
    caller will (`announce=False`: `load_memory` says so once the tensor proved usable)."""
    if "patterns" in keys:
        chosen = "patterns"
    else:
        matrices = [k for k in keys if len(handle.get_slice(k).get_shape()) == 2]
        if len(matrices) != 1:
            raise NphError(
                f"{path} has no nph metadata and {len(matrices)} 2-D tensors "
                f"({', '.join(keys) or 'none'}); save the patterns under the key 'patterns'"
            )
        chosen = matrices[0]
    if announce:
        _announce_foreign(path, chosen)
    return chosen


def _announce_foreign(path: Path, key: str) -> None:
    notice(
        f"{path} has no nph metadata: using tensor '{key}' as the patterns (one row per "
        "memory), no labels, no image shape"
    )


def _check_patterns(tensor: Tensor, what: str) -> Tensor:
    if tensor.ndim != 2:
        raise NphError(f"{what} must be a 2-D (M, d) tensor, got shape {tuple(tensor.shape)}")
    if tensor.dtype not in _FLOATS:
        raise NphError(
            f"{what} must be floating point, got {str(tensor.dtype).removeprefix('torch.')}"
        )
    if tensor.shape[0] == 0 or tensor.shape[1] == 0:
        raise NphError(f"{what} is empty (shape {tuple(tensor.shape)})")
    if not torch.isfinite(tensor).all():
        raise NphError(f"{what} contains NaN or infinite values")
    return tensor
