"""Exact sparse retrieval (sparsemax, entmax) from a candidate set of each query's best scores.

Sparsemax and α-entmax (α > 1) give weight p_i = [(α−1)·s_i − τ]_+^{1/(α−1)}, exactly 0 for every
score at or below a per-query threshold τ/(α−1), and τ depends only on the scores above it. So
they need not see all M scores: keep each query's c largest (a running top-c over memory blocks)
and solve on those. If the solution leaves the c-th candidate at weight 0, the threshold is at
or above the c-th score, and every excluded score, being ≤ the c-th, is at or below it too: the
excluded memories get weight 0 in the full problem as well, and τ solves the full problem. The
result is exact. If all c candidates get weight (the support fills the set, c < M), the set may
be too small: those queries are redone with 8c candidates, until the support is smaller than the
set or the set holds all M memories. (Each round re-reads the memories, but only for the queries
left; growing 8-fold keeps rounds to two or three for supports up to thousands.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from nphcli.core.errors import score_overflow
from nphcli.engine.blocks import running_topk, weighted_rows
from nphcli.engine.planning import Plan, itemsize
from nphcli.engine.precision import accumulation_dtype, scale_queries
from nphcli.engine.selection import running_topk_plan
from nphcli.memory.bank import MemoryBank

# Candidates per query in the first round. Sparse Hopfield supports are typically a handful of
# memories; a query needing more pays one extra pass over the memories per doubling.
INITIAL_CANDIDATES = 64
GROWTH = 8  # candidate sets grow by this factor while a query's support fills its set


def candidate_update(
    queries: Tensor,
    bank: MemoryBank,
    *,
    beta: float,
    simplex_map: Callable[[Tensor], Tensor],
    block_rows: int,
) -> tuple[Tensor, Tensor]:
    """T(x) = Vᵀ p, p = simplex_map(β K x), computed on candidate sets (see the module docstring):
    the patterns (Q, d_v) and each query's support size (Q,).

    `simplex_map` maps scores (Q, c) to weights on the simplex that are 0 below a threshold.
    The first round takes every query and asks the host nothing until its work is queued: one
    check then says whether any query needs more candidates (rarely). While candidate sets
    grow, queries are taken in groups small enough that a group's candidates take no more
    memory than one block of scores (Q × max(block_rows, c₀)).
    """
    num_queries, num_memories = queries.shape[0], bank.num_memories
    scaled, rest = scale_queries(queries, beta)  # (Q, d)
    scores_dtype = accumulation_dtype(queries.dtype)
    count = min(num_memories, INITIAL_CANDIDATES)
    patterns, support, solved, finite = _round(scaled, rest, bank, count, simplex_map, block_rows)
    if bool(solved.all()):  # the common case's one host sync, after all its work is queued
        return patterns, support
    pending = _unsolved(solved, finite, scores_dtype)  # (P,) rows still to solve
    while pending.numel():
        count = min(num_memories, GROWTH * count)
        group = max(1, num_queries * max(block_rows, INITIAL_CANDIDATES) // count)
        unsolved = []
        for rows in pending.split(group):
            found, kept, solved, finite = _round(
                scaled[rows], rest, bank, count, simplex_map, block_rows
            )
            done = solved.nonzero().squeeze(1)  # (S,) positions within the group
            patterns.index_copy_(0, rows[done], found[done])
            support.index_copy_(0, rows[done], kept[done])
            unsolved.append(rows[_unsolved(solved, finite, scores_dtype)])
        pending = torch.cat(unsolved)
    return patterns, support


def _round(
    scaled: Tensor,
    rest: float,
    bank: MemoryBank,
    count: int,
    simplex_map: Callable[[Tensor], Tensor],
    block_rows: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One round on `count` candidates for queries (G, d) (times `rest`: `scale_queries`): the
    patterns (G, d_v), support sizes (G,), and (G,) bool whether each row is solved (finite,
    with a support smaller than its set or the set all M memories; else its pattern is not
    T(x)) and whether its candidate scores are finite (else no threshold exists among ±inf,
    and it was mapped as if its scores were 0). The host is asked nothing here."""
    top = running_topk(scaled, bank, count, block_rows=block_rows, scale=rest)  # global top c
    # Sorted scores: a NaN or +inf comes first, a −inf last; the largest magnitude sees them all.
    finite = top.scores.abs().amax(dim=1, keepdim=True) < torch.inf  # (G, 1)
    weights = simplex_map(torch.where(finite, top.scores, 0.0))  # (G, c)
    kept = (weights > 0).sum(dim=1)  # (G,)
    finite = finite.squeeze(1)  # (G,)
    solved = finite & (kept < count) if count < bank.num_memories else finite
    patterns = weighted_rows(bank, top.index, weights, block_rows=block_rows)  # (G, d_v)
    return patterns, kept, solved, finite


def _unsolved(solved: Tensor, finite: Tensor, scores_dtype: torch.dtype) -> Tensor:
    """The rows (U,) that `_round` left unsolved; the overflow error if any was not finite."""
    if not bool(finite.all()):
        raise score_overflow(scores_dtype)
    return (~solved).nonzero().squeeze(1)


def candidate_working_set(bank: MemoryBank) -> tuple[int, int]:
    """Per query: input, output and the first round's running top-c (scores, int64 indices,
    merge buffers); per (query, memory) pair of a block: its score and top-k temporaries."""
    size = itemsize(bank.dtype)
    return (bank.dim + 2 * bank.value_dim) * size + 6 * INITIAL_CANDIDATES * (size + 8), 3 * size


def candidate_plan(num_queries: int, bank: MemoryBank, budget: int) -> Plan:
    """Query batches and memory blocks for `candidate_update` within `budget`: those of the
    first round's running top-c₀ (`selection.running_topk_plan`)."""
    row_bytes, cell_bytes = candidate_working_set(bank)
    first = min(INITIAL_CANDIDATES, bank.num_memories)
    return running_topk_plan(
        num_queries, bank, budget, first, row_bytes=row_bytes, cell_bytes=cell_bytes
    )
