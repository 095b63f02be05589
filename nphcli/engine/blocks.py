"""Building blocks for bounded-memory retrieval: memories read in blocks, results merged exactly.

A `MemoryBank` hands out memories block by block, from RAM (`TensorBank`) or from a file on disk
(`nphcli.memory.streamed.StreamedBank`), so no model ever needs all of them at once. The accumulators
merge per-block partial results into exactly what a one-shot computation gives (up to float
rounding): `SoftmaxAccumulator` (online softmax: running max, normaliser and weighted sum) and
`TopKAccumulator` (running k best scores with deterministic tie-breaking). `plan_blocks` sizes
query batches and memory blocks so that a model's working set fits a byte budget.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own convention)
from torch import Tensor


class MemoryBank:
    """Memories (keys (M, d), values (M, d_v)) that can be read one block of rows at a time.

    Blocks and gathered rows come in the bank's `dtype` on its `device`.
    """

    num_memories: int
    dim: int
    value_dim: int
    device: torch.device
    dtype: torch.dtype

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

    def to(self, dtype: torch.dtype) -> MemoryBank:
        """The same memories, handed out in `dtype`."""
        raise NotImplementedError

    def weighted_sum(self, index: Tensor, weights: Tensor) -> Tensor:
        """Σ_j weights[q, j] · values[index[q, j]] for index, weights (Q, c): shape (Q, d_v).

        Reads each distinct row once, then sums without forming a (Q, c, d_v) tensor.
        """
        rows, inverse = torch.unique(index, return_inverse=True)  # (U,), (Q, c)
        _, values = self.gather(rows)  # (U, d_v)
        return F.embedding_bag(inverse, values, per_sample_weights=weights, mode="sum")


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
        keys = self.keys.to(dtype)
        values = keys if self.values is self.keys else self.values.to(dtype)
        return TensorBank(keys, values)

    def weighted_sum(self, index: Tensor, weights: Tensor) -> Tensor:
        return F.embedding_bag(index, self.values, per_sample_weights=weights, mode="sum")


class SoftmaxAccumulator:
    """Online softmax over memory blocks: Σ_μ exp(s_μ − m) v_μ / Σ_μ exp(s_μ − m).

    After each block the running max m is raised and earlier sums are rescaled by exp(m_old −
    m_new), which makes the merged result equal to the one-shot softmax. Excluded memories carry
    a score of −inf and get weight exactly 0; a row whose memories are all excluded so far keeps
    m = −inf and contributes nothing until a finite score arrives.

    `batch` are leading dimensions (e.g. heads): scores (*batch, Q, B), values (*batch, B, d_v).
    """

    def __init__(
        self,
        num_queries: int,
        value_dim: int,
        *,
        device,
        dtype: torch.dtype,
        batch: tuple[int, ...] = (),
    ):
        rows = (*batch, num_queries)
        self.max = torch.full(rows, -torch.inf, device=device, dtype=dtype)  # (*batch, Q)
        self.norm = torch.zeros(rows, device=device, dtype=dtype)  # (*batch, Q)
        self.total = torch.zeros(*rows, value_dim, device=device, dtype=dtype)  # (*batch, Q, d_v)
        self.support = torch.zeros(rows, dtype=torch.int64, device=device)  # (*batch, Q)

    def add(self, scores: Tensor, values: Tensor) -> None:
        """Merge one block: scores (*batch, Q, B) (−inf = excluded), values (*batch, B, d_v)."""
        new_max = torch.maximum(self.max, scores.amax(dim=-1))  # (*batch, Q)
        shift = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
        rescale = torch.exp(self.max - shift)  # (*batch, Q); exp(−inf) = 0 for empty rows
        weights = torch.exp(scores - shift.unsqueeze(-1))  # (*batch, Q, B)
        self.norm = self.norm * rescale + weights.sum(dim=-1)
        self.total = self.total * rescale.unsqueeze(-1) + weights @ values
        self.support += torch.isfinite(scores).sum(dim=-1)
        self.max = new_max

    def result(self) -> Tensor:
        """The weighted average (*batch, Q, d_v); rows with no admitted memory are an error
        upstream."""
        return self.total / self.norm.unsqueeze(-1)


class TopKAccumulator:
    """The k largest scores per query over memory blocks, ties going to the lower memory index.

    Invariant: the kept entries are sorted by (score descending, index ascending). A new block is
    first cut to its own best k, with the same tie rule, and then merged by a stable descending
    sort of [kept, block]: every kept index is smaller than any index in the block, and the
    block's entries are laid out in index order, so equal scores stay in index order, exactly as
    one stable sort over all M scores would leave them.

    The cut uses `torch.topk(k + 1)`, which is fast but breaks ties arbitrarily. If the k-th and
    (k+1)-th largest differ, the k best are one well-defined set and the arbitrary order does not
    matter; only rows where they are equal (a tie across the cut) are redone by a stable sort.
    """

    def __init__(self, num_queries: int, k: int, *, device, dtype: torch.dtype):
        self.k = k
        self.scores = torch.empty(num_queries, 0, device=device, dtype=dtype)  # (Q, ≤k)
        self.index = torch.empty(num_queries, 0, device=device, dtype=torch.int64)  # (Q, ≤k)

    def add(self, scores: Tensor, start: int) -> None:
        """Merge one block of scores (Q, B) for memories start .. start + B − 1."""
        num_queries, block = scores.shape
        if block > self.k:
            local = _block_topk(scores, self.k)  # (Q, k) block-local indices, ascending
        else:
            local = torch.arange(block, device=scores.device).expand(num_queries, -1)  # (Q, B)
        merged_scores = torch.cat([self.scores, scores.gather(1, local)], dim=1)  # (Q, ≤2k)
        merged_index = torch.cat([self.index, local + start], dim=1)  # (Q, ≤2k)
        order = torch.sort(merged_scores, dim=1, descending=True, stable=True).indices
        order = order[:, : self.k]  # (Q, ≤k)
        self.scores = merged_scores.gather(1, order)
        self.index = merged_index.gather(1, order)


def _block_topk(scores: Tensor, k: int) -> Tensor:
    """Indices (Q, k), ascending, of each row's k largest scores; ties go to the lower index."""
    values, index = torch.topk(scores.detach(), k + 1, dim=1)  # (Q, k + 1), descending
    tied = values[:, k - 1] == values[:, k]  # (Q,) a tie straddles the cut
    index = index[:, :k]  # (Q, k)
    if bool(tied.any()):
        rows = tied.nonzero().squeeze(1)  # (T,)
        stable = torch.sort(scores[rows].detach(), dim=1, descending=True, stable=True).indices
        index = index.index_copy(0, rows, stable[:, :k])
    return torch.sort(index, dim=1).values  # (Q, k)


def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of `dtype`."""
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class Plan:
    """How one retrieval is cut: queries in batches of `query_rows`, memories in blocks of
    `memory_rows` (≥ M means all memories in one block: the one-shot computation)."""

    query_rows: int
    memory_rows: int


def plan_rows(budget_bytes: int, other_rows: int, bytes_per_cell: int, *, total: int) -> int:
    """Rows per block so that an (other_rows, rows) working set of `bytes_per_cell` per entry fits
    the budget; at least 1 and at most `total`."""
    rows = budget_bytes // max(1, other_rows * bytes_per_cell)
    return int(max(1, min(total, rows)))


# Memory blocks are never planned below this many rows while queries can still be split instead:
# each block costs a fixed merge (running top-k, rescaled sums) that must stay small beside it.
MIN_BLOCK_ROWS = 4096


def plan_blocks(
    num_queries: int, bank: MemoryBank, budget_bytes: int, *, row_bytes: int, cell_bytes: int
) -> Plan:
    """Batch and block sizes so that a query batch's working set fits the budget:

        query_rows · row_bytes + memory_rows · (block_row_bytes + query_rows · cell_bytes) ≤ budget

    `row_bytes` is what a model keeps per query whatever the block size (outputs, running top-k),
    `cell_bytes` what it needs per (query, memory) pair of a block (scores and temporaries), and
    block_row_bytes = 2 · (d + d_v) · itemsize the memory block itself: a streamed bank reads it
    into RAM, and the next block is read while the last is still referenced.
    Query batches are made as large as possible first: each batch reads every memory once, which
    matters most when memories stream from disk. Memory blocks then take the rest of the budget.
    Both are at least 1, so a budget too small for even one pair still makes progress.
    """
    num_memories = bank.num_memories
    block_row_bytes = 2 * (bank.dim + bank.value_dim) * itemsize(bank.dtype)
    smallest_block = min(num_memories, MIN_BLOCK_ROWS)
    query_rows = plan_rows(
        budget_bytes - smallest_block * block_row_bytes,
        1,
        row_bytes + smallest_block * cell_bytes,
        total=num_queries,
    )
    left = budget_bytes - query_rows * row_bytes
    memory_rows = plan_rows(left, 1, block_row_bytes + query_rows * cell_bytes, total=num_memories)
    return Plan(query_rows=query_rows, memory_rows=memory_rows)


# `weighted_rows` gathers rows while each query keeps fewer than 1/this of the memories; above
# that, one blockwise matrix product with mostly-zero weights is faster than scattered reads.
GATHER_LIMIT = 8


def weighted_rows(bank: MemoryBank, index: Tensor, weights: Tensor, *, block_rows: int) -> Tensor:
    """Σ_j weights[q, j] · values[index[q, j]] for index, weights (Q, c): shape (Q, d_v).

    Few rows per query: gathered (`MemoryBank.weighted_sum`), Q·c·d_v reads at memory speed.
    Many: each memory block's weights are scattered into a (Q, B) matrix and multiplied with the
    block's values, Q·M·d_v multiply-adds at matrix-product speed. Indices within a row must be
    distinct (they are: a row's kept memories).
    """
    num_queries, kept = index.shape
    if kept * GATHER_LIMIT <= bank.num_memories:
        return bank.weighted_sum(index, weights)
    total = weights.new_zeros(num_queries, bank.value_dim)  # (Q, d_v)
    for start, _, values in bank.blocks(block_rows):
        rows = values.shape[0]
        inside = (index >= start) & (index < start + rows)  # (Q, c)
        column = torch.where(inside, index - start, rows)  # (Q, c); outside → spare column
        block = weights.new_zeros(num_queries, rows + 1)  # (Q, B + 1)
        block = block.scatter(1, column, torch.where(inside, weights, 0))
        total = total + block[:, :rows] @ values
    return total
