"""Planning: how many queries and memories one step of a model takes at once, so that its
working set fits a byte budget (`--memory-budget`). Blocks change speed, never results: every
model merges blocks exactly (`nphcli.engine.blocks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from nphcli.core.notices import notice
from nphcli.core.resources import human_bytes
from nphcli.engine.precision import widened_row_bytes
from nphcli.memory.bank import MemoryBank


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


# Memory blocks shorter than M are a multiple of this many rows: a score block whose rows are
# not a multiple of 16 bytes keeps cuBLAS from its fastest GEMM kernels (H100, bfloat16 with
# float32 scores, Q = 1024, d = 784: 354 µs for 42,830 memories, 238 µs for 65,536).
BLOCK_ALIGN = 128


def plan_blocks(
    num_queries: int,
    bank: MemoryBank,
    budget_bytes: int,
    *,
    row_bytes: int,
    cell_bytes: int,
    min_block_rows: int = 1,
) -> Plan:
    """Batch and block sizes so that a query batch's working set fits the budget:

        query_rows · row_bytes + memory_rows · (block_row_bytes + query_rows · cell_bytes) ≤ budget

    `row_bytes` is what a model keeps per query whatever the block size (outputs, running top-k),
    `cell_bytes` what it needs per (query, memory) pair of a block (scores and temporaries), and
    the memory block itself `bank_block_row_bytes` per row (0 when blocks are views).
    Query batches are made as large as possible first: each batch reads every memory once, which
    matters most when memories stream from disk. Memory blocks then take the rest of the budget.
    Both are at least 1, so a budget too small for even one pair still makes progress, and a
    notice says how much memory that takes.

    `min_block_rows` is the smallest block a model merges at a cost proportional to the block
    (top-k: k, as each block's merge sorts the k kept scores with the block's; with blocks of
    B < k rows, M/B merges of k entries each would cost k/B times the scores themselves). Query
    batches shrink to leave room for it; if one query with such a block exceeds the budget,
    blocks get `min_block_rows` anyway and a notice says how much memory that takes.
    """
    num_memories = bank.num_memories
    block_row_bytes = bank_block_row_bytes(bank)
    needed_block = min(num_memories, min_block_rows)
    smallest_block = min(num_memories, max(MIN_BLOCK_ROWS, min_block_rows))
    query_rows = plan_rows(
        budget_bytes - smallest_block * block_row_bytes,
        1,
        row_bytes + smallest_block * cell_bytes,
        total=num_queries,
    )
    left = budget_bytes - query_rows * row_bytes
    memory_rows = plan_rows(left, 1, block_row_bytes + query_rows * cell_bytes, total=num_memories)
    if BLOCK_ALIGN <= memory_rows < num_memories:
        memory_rows -= memory_rows % BLOCK_ALIGN
    smallest = "one query against one memory"
    if memory_rows < needed_block:
        memory_rows = needed_block
        smallest = f"this model's smallest efficient block ({memory_rows} memories)"
    used = query_rows * row_bytes + memory_rows * (block_row_bytes + query_rows * cell_bytes)
    note_over_budget(budget_bytes, used, smallest)
    return Plan(query_rows=query_rows, memory_rows=memory_rows)


def note_over_budget(budget_bytes: int, used: int, smallest: str) -> None:
    """Tell the user, once, when a plan uses more than the budget: a planner raises its rows to
    `smallest` (e.g. "one query against one memory") so that the work still progresses."""
    if used > budget_bytes:
        _notice_once(
            f"a working-memory budget of {human_bytes(budget_bytes)} is too small for "
            f"{smallest}; using about {human_bytes(used)} (raise --memory-budget to silence "
            "this)"
        )


def bank_block_row_bytes(bank: MemoryBank) -> int:
    """Bytes per memory row of a block: 2 · (d + d_v) · itemsize where the bank copies blocks
    (a streamed bank reads each into RAM, and the next is read while the last is still
    referenced), 0 where its blocks are views of memories already in RAM or on the device.
    Counting views would cut one query's step into M / (budget / row) blocks, each a few kernel
    launches and merges: 24 blocks at M = 10⁶, d = 784 under 512 MiB instead of one.
    Half blocks off CUDA add the float32 copy their products read (`widened_row_bytes`)."""
    widened = widened_row_bytes(bank)
    if bank.resident() is not None:
        return widened
    return 2 * (bank.dim + bank.value_dim) * itemsize(bank.dtype) + widened


@lru_cache(maxsize=64)
def _notice_once(message: str) -> None:
    """`notice`, once per distinct message (a sweep plans the same retrieval many times)."""
    notice(message)
