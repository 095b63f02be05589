"""`ShardedBank`: a manifest's shards (`nphcli.memory.shards`) read as one `MemoryBank`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.memory.bank import MemoryBank
from nphcli.memory.collective import LOCAL, Collective


class ShardedBank(MemoryBank):
    """Rows of one memory held in several banks (shards), each at its global `offset`.

    With `collective` LOCAL the shards must cover all M rows: one process reads the whole set.
    With a process group, this rank's shards are a contiguous part of the rows and the other
    ranks hold the rest; `gather` and `weighted_sum` are then collective (every rank calls them
    with the same index) and combine each row from the rank that holds it.
    """

    def __init__(
        self,
        parts: list[tuple[int, MemoryBank]],
        *,
        num_memories: int,
        meta: dict[str, Any] | None = None,
        path: Path | None = None,
        collective: Collective = LOCAL,
    ):
        if not parts:
            raise NphError("a sharded memory needs at least one shard in each process")
        self.parts = parts  # [(offset, bank)] in row order
        self.num_memories = num_memories
        self.collective = collective
        template = parts[0][1]
        self.dim, self.value_dim = template.dim, template.value_dim
        self.hetero, self.device, self.dtype = template.hetero, template.device, template.dtype
        self.meta = {} if meta is None else meta
        self.path = path

    @property
    def local_rows(self) -> int:
        """Rows held by this process."""
        return sum(bank.num_memories for _, bank in self.parts)

    @property
    def labels(self) -> Tensor | None:
        """(M,) labels when this process holds every shard and each has labels, else None."""
        if self.local_rows != self.num_memories:
            return None
        labelled = [bank.labels for _, bank in self.parts]
        return None if any(x is None for x in labelled) else torch.cat(labelled)

    def blocks(self, rows: int) -> Iterator[tuple[int, Tensor, Tensor]]:
        for offset, bank in self.parts:
            for start, keys, values in bank.blocks(rows):
                yield offset + start, keys, values

    def key_blocks(self, rows: int) -> Iterator[tuple[int, Tensor]]:
        for offset, bank in self.parts:
            for start, keys in bank.key_blocks(rows):
                yield offset + start, keys

    def gather(self, index: Tensor) -> tuple[Tensor, Tensor]:
        flat = index.reshape(-1)  # (N,)
        keys = torch.zeros(flat.numel(), self.dim, device=self.device, dtype=self.dtype)
        values = keys.new_zeros(flat.numel(), self.value_dim) if self.hetero else None
        for offset, bank in self.parts:
            inside = ((flat >= offset) & (flat < offset + bank.num_memories)).nonzero()[:, 0]
            if inside.numel() == 0:
                continue
            part_keys, part_values = bank.gather(flat[inside] - offset)  # (n, d), (n, d_v)
            keys[inside] = part_keys
            if values is not None:
                values[inside] = part_values
        # Each row is held by exactly one rank, the others add zeros: the sum is exact.
        keys = self.collective.all_sum(keys)
        values = keys if values is None else self.collective.all_sum(values)
        return keys.reshape(*index.shape, self.dim), values.reshape(*index.shape, self.value_dim)

    def weighted_sum(self, index: Tensor, weights: Tensor) -> Tensor:
        """Each shard sums its own rows' terms; the partial sums (Q, d_v) are added across
        shards and ranks, so only Q·d_v numbers per rank cross the network."""
        total = weights.new_zeros(index.shape[0], self.value_dim)  # (Q, d_v)
        for offset, bank in self.parts:
            inside = (index >= offset) & (index < offset + bank.num_memories)  # (Q, c)
            if not bool(inside.any()):
                continue
            local = torch.where(inside, index - offset, 0)  # (Q, c)
            total = total + bank.weighted_sum(local, torch.where(inside, weights, 0))
        return self.collective.all_sum(total)

    def to(self, device=None, dtype=None) -> ShardedBank:
        return ShardedBank(
            [(offset, bank.to(device=device, dtype=dtype)) for offset, bank in self.parts],
            num_memories=self.num_memories,
            meta=self.meta,
            path=self.path,
            collective=self.collective,
        )
