"""The one memory interface every model, metric and command reads: `MemoryBank`.

A memory is keys (M, d) and values (M, d_v) (the keys themselves for auto-association), plus
optional labels (M,) and the metadata its file recorded. Implementations differ only in where
the rows live, so retrieval never branches on the kind of memory:
- `TensorBank`: rows in RAM or on a device (a memory file loaded: `Memory`);
- `nphcli.memory.streamed.StreamedBank`: rows read from a memory file block by block.
- `nphcli.memory.sharded_bank.ShardedBank`: rows in several shard files, or spread over processes.

Blocks and gathered rows come in the bank's `dtype` on its `device`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812  (torch's own convention)
from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.memory.collective import LOCAL, Collective
from nphcli.memory.given import as_table


class MemoryBank:
    """Keys (M, d) and values (M, d_v) that can be read one block of rows at a time."""

    num_memories: int
    dim: int
    value_dim: int
    device: torch.device
    dtype: torch.dtype
    hetero: bool = False  # values differ from keys (hetero-association)
    meta: dict[str, Any]  # what the memory file records ({} for tensors built in Python)
    path: Path | None  # the file the memory came from, if any
    # How partial results over this process's rows combine with other processes' (see
    # `collective.py`); LOCAL, the identity, unless the rows are spread over ranks.
    collective: Collective = LOCAL

    @property
    def item_shape(self) -> tuple[int, ...] | None:
        """Shape of one item (e.g. (1, 28, 28) for MNIST) when the patterns are images."""
        shape = self.meta.get("item_shape")
        return tuple(shape) if shape else None

    @property
    def labels(self) -> Tensor | None:
        """(M,) int64 labels, or None."""
        return None

    def blocks(self, rows: int) -> Iterator[tuple[int, Tensor, Tensor]]:
        """Yield (start, keys[start:start+rows], values[start:start+rows]) in memory order."""
        raise NotImplementedError

    def key_blocks(self, rows: int) -> Iterator[tuple[int, Tensor]]:
        """Yield (start, keys[start:start+rows]), without reading values where they are apart."""
        for start, keys, _ in self.blocks(rows):
            yield start, keys

    def gather(self, index: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values at `index` (any shape of int64): shapes index.shape + (d,) / (d_v,)."""
        raise NotImplementedError

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        """The same memories, handed out on `device` in `dtype` (None: unchanged)."""
        raise NotImplementedError

    def resident(self) -> tuple[Tensor, Tensor] | None:
        """All keys and values when already in RAM or on the device (one piece), else None."""
        return None

    def summary_token(self) -> tuple[Hashable, tuple[Any, ...]] | None:
        """(token, anchors) saying what these memories are, for reusing work derived from them
        (`nphcli.engine.summary_cache`): the token changes whenever the contents may have, and
        the work is forgotten once any anchor is freed. None: never reuse (the default)."""
        return None

    def weighted_sum(self, index: Tensor, weights: Tensor) -> Tensor:
        """Σ_j weights[q, j] · values[index[q, j]] for index, weights (Q, c): shape (Q, d_v),
        reading each distinct row once and never forming a (Q, c, d_v) tensor."""
        rows, inverse = torch.unique(index, return_inverse=True)  # (U,), (Q, c)
        _, values = self.gather(rows)  # (U, d_v)
        return _embedding_sum(inverse, values, weights)


class TensorBank(MemoryBank):
    """Memories already in RAM or on the device."""

    def __init__(
        self,
        keys: Tensor,
        values: Tensor | None = None,
        *,
        labels: Tensor | None = None,
        meta: dict[str, Any] | None = None,
        path: Path | None = None,
    ):
        self.keys = keys  # (M, d)
        self.values = keys if values is None else values  # (M, d_v)
        self.hetero = values is not None and values is not keys
        self.num_memories, self.dim = keys.shape
        self.value_dim = self.values.shape[1]
        self.device = keys.device
        self.dtype = keys.dtype
        self._labels = labels  # (M,) int64
        self.meta = {} if meta is None else meta
        self.path = path

    @property
    def patterns(self) -> Tensor:
        """The stored patterns (M, d): the keys, under the name memory files give them."""
        return self.keys

    @property
    def labels(self) -> Tensor | None:
        return self._labels

    def blocks(self, rows: int) -> Iterator[tuple[int, Tensor, Tensor]]:
        for start in range(0, self.num_memories, rows):
            yield start, self.keys[start : start + rows], self.values[start : start + rows]

    def gather(self, index: Tensor) -> tuple[Tensor, Tensor]:
        return self.keys[index], self.values[index]

    def to(self, device=None, dtype=None) -> TensorBank:
        keys = self.keys.to(device=device, dtype=dtype)
        values = self.values.to(device=device, dtype=dtype) if self.hetero else None
        moved = TensorBank(keys, values, labels=self._labels, meta=self.meta, path=self.path)
        if hasattr(self, "_nph_content_sha256"):  # the same memory: its hash, fresh if edited
            from nphcli.memory.provenance import content_sha256, stamp

            stamp(moved, content_sha256(self))
        return moved

    def resident(self) -> tuple[Tensor, Tensor]:
        return self.keys, self.values

    def summary_token(self) -> tuple[Hashable, tuple[Any, ...]] | None:
        """The tensors' identity and version (bumped by every in-place change); None when a
        summary would have to carry their gradient."""
        tensors = (self.keys, self.values)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return None
        if any(t.is_inference() for t in tensors):  # they keep no version counter
            return None
        token = tuple(
            (id(t), t._version, t.data_ptr(), t.shape, t.dtype, t.device) for t in tensors
        )
        return token, tensors

    def weighted_sum(self, index: Tensor, weights: Tensor) -> Tensor:
        return _embedding_sum(index, self.values, weights)


class Memory(TensorBank):
    """A memory file's contents in RAM: patterns (M, d), optional values (M, d_v) and labels
    (M,), its metadata and path; a `TensorBank` with the same arguments. Patterns and values may
    be anything `memory.given` accepts; shapes, devices and labels are checked here, once."""

    def __init__(
        self,
        patterns: Tensor,
        values: Tensor | None = None,
        *,
        labels: Tensor | None = None,
        meta: dict[str, Any] | None = None,
        path: Path | None = None,
    ):
        patterns = as_table(patterns, "patterns")  # (M, d)
        rows = patterns.shape[0]
        if values is not None:
            values = as_table(values, "values")  # (M, d_v)
            if values.shape[0] != rows:
                raise NphError(f"{values.shape[0]} values for {rows} patterns; counts must match")
        if labels is not None:
            labels = labels if isinstance(labels, Tensor) else _whole(labels)  # (M,)
            if labels.shape != (rows,) or labels.is_floating_point() or labels.is_complex():
                raise NphError(
                    f"labels must be one whole number per pattern, shape ({rows},), got "
                    f"{tuple(labels.shape)}"
                )
        if meta is not None and not isinstance(meta, dict):
            raise NphError(f"meta must be a dict, got {type(meta).__name__}")
        for label, tensor in (("values", values), ("labels", labels)):
            if tensor is not None and tensor.device != patterns.device:
                raise NphError(
                    f"{label} are on {tensor.device} but the patterns on {patterns.device}; "
                    "move them to one device"
                )
        super().__init__(patterns, values, labels=labels, meta=meta, path=path)


def _whole(labels: Any) -> Tensor:
    """Labels given as a numpy array or a list, as an int64 tensor."""
    try:
        return torch.as_tensor(np.asarray(labels), dtype=torch.int64)
    except (TypeError, ValueError, RuntimeError):
        raise NphError("labels must be one whole number per pattern") from None


def _embedding_sum(index: Tensor, values: Tensor, weights: Tensor) -> Tensor:
    """Σ_j weights[q, j] · values[index[q, j]]: (Q, d_v) in the weights' dtype (half values are
    summed in their dtype with the weights rounded to it, as the matrix products are)."""
    rounded = weights.to(values.dtype)
    return F.embedding_bag(index, values, per_sample_weights=rounded, mode="sum").to(weights.dtype)


def as_bank(memory: Tensor | MemoryBank, values: Tensor | None = None) -> MemoryBank:
    """A bank from a keys tensor (M, d) with optional values (M, d_v), or the bank itself."""
    if isinstance(memory, MemoryBank):
        if values is not None:
            raise NphError("give values inside the memory bank, not beside it")
        return memory
    return TensorBank(memory, values)
