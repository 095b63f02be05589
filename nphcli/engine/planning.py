"""How many queries and memories one step takes at once to fit `--memory-budget`. Blocks change
speed, never results (`nphcli.engine.blocks`).
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
    """Rows so that (other_rows, rows) cells of `bytes_per_cell` fit; within [1, total]."""
    rows = budget_bytes // max(1, other_rows * bytes_per_cell)
    return int(max(1, min(total, rows)))


# Queries are split before memory blocks go below this: each block costs a fixed merge.
MIN_BLOCK_ROWS = 4096
# Blocks shorter than M are a multiple of this, for cuBLAS's fastest kernels (H100, bfloat16,
# Q = 1024, d = 784: 354 µs for 42,830 memories, 238 µs for 65,536).
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

    with `row_bytes` per query, `cell_bytes` per (query, memory) pair and `bank_block_row_bytes`
    per memory row. Query batches come first (each reads every memory once), then memory blocks
    take the rest, at least `min_block_rows` (top-k: k). Both are at least 1; a plan over the
    budget says so in a notice.
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
    """A notice, once, when a plan raised to `smallest` uses more than the budget."""
    if used > budget_bytes:
        _notice_once(
            f"a working-memory budget of {human_bytes(budget_bytes)} is too small for "
            f"{smallest}; using about {human_bytes(used)} (raise --memory-budget to silence "
            "this)"
        )


def bank_block_row_bytes(bank: MemoryBank) -> int:
    """Bytes per memory row of a block: 2 · (d + d_v) · itemsize where the bank copies blocks
    (streamed: the next is read while the last is referenced), 0 for views of resident memories,
    plus the float32 copy of half blocks off CUDA (`widened_row_bytes`)."""
    widened = widened_row_bytes(bank)
    if bank.resident() is not None:
        return widened
    return 2 * (bank.dim + bank.value_dim) * itemsize(bank.dtype) + widened


@lru_cache(maxsize=64)
def _notice_once(message: str) -> None:
    """`notice`, once per distinct message (a sweep plans the same retrieval many times)."""
    notice(message)
