"""Random-masked Hopfield retrieval (BigBird-like): softmax over k memories drawn per query.

Each query keeps the k memories with the smallest hash h(seed, query position, memory index)
(`masks.random_mask`), a uniformly random k-subset; all others get weight exactly 0. Because the
mask is a pure function of (seed, position, index), it does not depend on how queries are
batched or memories blocked, and it does not change between iteration steps: T is one fixed
map, so its fixed points are well defined. A different `--seed` draws different subsets.
The reported support is k (the kept memories, even where a weight underflows to 0).

Blockwise: the k smallest hashes are found over blocks of memory indices without reading any
key (`masks.random_subset`); then, for small k, only those k memories are read and scored, and
for large k every memory block is scored and masked (online softmax).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from nphcli.errors import NphError
from nphcli.models.attention import gathered_attention, masked_attention
from nphcli.models.base import HopfieldModel, Update, param
from nphcli.models.blocks import GATHER_LIMIT, MemoryBank, itemsize
from nphcli.models.masks import K_HELP, block_mask, check_k, random_subset, resolve_k
from nphcli.models.registry import register_model


@register_model(
    "random",
    summary="softmax over k memories drawn per query by a seeded hash (BigBird-like random mask)",
    formula="T(x) = Vᵀ softmax(β K x) restricted to k random memories R(seed, position)",
    cost="time O(Q·M) hashes + O(Q·k·d) gathered or O(Q·M·d) masked; extra memory O(Q·k + Q·B)",
)
@dataclass(kw_only=True)
class RandomMask(HopfieldModel):
    k: float = param(0.2, K_HELP)
    seed: int = param(0, "seed of the random masks; each query's mask depends on it and its row")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_k(self.k)
        seed = self.seed
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise NphError(f"--seed must be a whole number in [0, 2^64), got {seed!r}")

    def check_memory(self, num_memories: int, dim: int) -> None:
        resolve_k(self.k, num_memories)

    def update(
        self,
        queries: Tensor,
        bank: MemoryBank,
        positions: Tensor,
        prepared: Any,
        *,
        block_rows: int,
    ) -> Update:
        k = resolve_k(self.k, bank.num_memories)
        chosen = random_subset(self.seed, positions, bank.num_memories, k, block_rows=block_rows)
        support = positions.new_full((queries.shape[0],), k)  # (Q,)
        if _gathers(k, bank.num_memories):
            patterns = gathered_attention(queries, bank, chosen, None, beta=self.beta)
        else:
            patterns, _ = masked_attention(
                queries,
                bank,
                lambda start, rows: block_mask(chosen, start, rows),
                beta=self.beta,
                block_rows=block_rows,
            )
        return Update(patterns, support=support)  # (Q, d_v)

    def working_set(self, bank: MemoryBank) -> tuple[int, int]:
        size, k = itemsize(bank.dtype), resolve_k(self.k, bank.num_memories)
        row_bytes = (bank.dim + 2 * bank.value_dim) * size + 4 * k * 8  # subset selection
        if _gathers(k, bank.num_memories):
            row_bytes += k * (bank.dim + bank.value_dim + 2) * size  # the gathered rows
        # Per pair of a block: a hash and its temporaries (int64), or a score, its softmax
        # temporaries and a mask entry.
        return row_bytes, max(5 * 8, 4 * size + 1)


def _gathers(k: int, num_memories: int) -> bool:
    """Read each query's k memories by index when they are few; else score every block (a
    matrix product reads memory far faster than per-query gathers)."""
    return k * GATHER_LIMIT <= num_memories
