"""Building blocks for bounded-memory retrieval: memories read in blocks, results merged exactly.

A `MemoryBank` hands out memories block by block, from RAM (`TensorBank`) or from a file on disk
(`nphcli.streaming.StreamedBank`), so no model ever needs all of them at once. The accumulators
merge per-block partial results into exactly what a one-shot computation gives (up to float
rounding): `SoftmaxAccumulator` (online softmax: running max, normaliser and weighted sum) and
`TopKAccumulator` (running k best scores with deterministic tie-breaking).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor


class MemoryBank:
    """Memories (keys (M, d), values (M, d_v)) that can be read one block of rows at a time."""

    num_memories: int
    dim: int
    value_dim: int
    device: torch.device
    dtype: torch.dtype

    def blocks(self, rows: int) -> Iterator[tuple[int, Tensor, Tensor]]:
        """Yield (start, keys[start:start+rows], values[start:start+rows]) in memory order."""
        raise NotImplementedError

    def gather(self, index: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values at `index` (any shape of int64): shapes index.shape + (d,) / (d_v,)."""
        raise NotImplementedError


class TensorBank(MemoryBank):
    """Memories already in RAM or on the device."""

    def __init__(self, keys: Tensor, values: Tensor | None = None):
        self.keys = keys  # (M, d)
        self.values = keys if values is None else values  # (M, d_v)
        self.num_memories, self.dim = keys.shape
        self.value_dim = self.values.shape[1]
        self.device = keys.device
        self.dtype = keys.dtype

    def blocks(self, rows: int) -> Iterator[tuple[int, Tensor, Tensor]]:
        for start in range(0, self.num_memories, rows):
            yield start, self.keys[start : start + rows], self.values[start : start + rows]

    def gather(self, index: Tensor) -> tuple[Tensor, Tensor]:
        return self.keys[index], self.values[index]

    def to(self, dtype: torch.dtype) -> TensorBank:
        return TensorBank(self.keys.to(dtype), self.values.to(dtype))


class SoftmaxAccumulator:
    """Online softmax over memory blocks: Σ_μ exp(s_μ − m) v_μ / Σ_μ exp(s_μ − m).

    After each block the running max m is raised and earlier sums are rescaled by exp(m_old −
    m_new), which makes the merged result equal to the one-shot softmax. Excluded memories carry
    a score of −inf and get weight exactly 0; a row whose memories are all excluded so far keeps
    m = −inf and contributes nothing until a finite score arrives.
    """

    def __init__(self, num_queries: int, value_dim: int, *, device, dtype: torch.dtype):
        self.max = torch.full((num_queries,), -torch.inf, device=device, dtype=dtype)  # (Q,)
        self.norm = torch.zeros(num_queries, device=device, dtype=dtype)  # (Q,)
        self.total = torch.zeros(num_queries, value_dim, device=device, dtype=dtype)  # (Q, d_v)
        self.support = torch.zeros(num_queries, dtype=torch.int64, device=device)  # (Q,)

    def add(self, scores: Tensor, values: Tensor) -> None:
        """Merge one block: scores (Q, B) (−inf = excluded), values (B, d_v)."""
        new_max = torch.maximum(self.max, scores.amax(dim=1))  # (Q,)
        shift = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
        rescale = torch.exp(self.max - shift)  # (Q,) exp(−inf) = 0 for empty rows
        weights = torch.exp(scores - shift[:, None])  # (Q, B)
        self.norm = self.norm * rescale + weights.sum(dim=1)
        self.total = self.total * rescale[:, None] + weights @ values
        self.support += torch.isfinite(scores).sum(dim=1)
        self.max = new_max

    def result(self) -> Tensor:
        """The weighted average (Q, d_v); rows with no admitted memory are an error upstream."""
        return self.total / self.norm[:, None]


class TopKAccumulator:
    """The k largest scores per query over memory blocks, ties going to the lower memory index.

    Blocks arrive in memory order, so every kept index is smaller than any index in a new block;
    a stable descending sort of [kept, block] therefore breaks ties towards the lower index,
    exactly as one stable sort over all M scores would.
    """

    def __init__(self, num_queries: int, k: int, *, device, dtype: torch.dtype):
        self.k = k
        self.scores = torch.empty(num_queries, 0, device=device, dtype=dtype)  # (Q, ≤k)
        self.index = torch.empty(num_queries, 0, device=device, dtype=torch.int64)  # (Q, ≤k)

    def add(self, scores: Tensor, start: int) -> None:
        """Merge one block of scores (Q, B) for memories start .. start + B − 1."""
        block_index = torch.arange(start, start + scores.shape[1], device=scores.device)
        block_index = block_index.expand(scores.shape[0], -1)  # (Q, B)
        merged_scores = torch.cat([self.scores, scores], dim=1)  # (Q, ≤k + B)
        merged_index = torch.cat([self.index, block_index], dim=1)  # (Q, ≤k + B)
        order = torch.sort(merged_scores, dim=1, descending=True, stable=True).indices
        order = order[:, : self.k]  # (Q, ≤k)
        self.scores = merged_scores.gather(1, order)
        self.index = merged_index.gather(1, order)


def plan_rows(budget_bytes: int, other_rows: int, bytes_per_cell: int, *, total: int) -> int:
    """Rows per block so that an (other_rows, rows) working set of `bytes_per_cell` per entry fits
    the budget; at least 1 and at most `total`."""
    rows = budget_bytes // max(1, other_rows * bytes_per_cell)
    return int(max(1, min(total, rows)))
