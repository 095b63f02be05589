"""Exact sparse retrieval (sparsemax, entmax) from a candidate set of each query's best scores.

The threshold τ depends only on the scores above it, so solve on each query's c largest (a
running top-c): if the c-th candidate gets weight 0, every excluded score is below τ too and the
result is exact. Queries whose support fills the set are redone with `GROWTH`·c candidates.
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

INITIAL_CANDIDATES = 64  # in the first round; sparse supports are typically a handful
GROWTH = 8  # candidate sets grow by this factor while a query's support fills its set


def candidate_update(
    queries: Tensor,
    bank: MemoryBank,
    *,
    beta: float,
    simplex_map: Callable[[Tensor], Tensor],
    block_rows: int,
) -> tuple[Tensor, Tensor]:
    """T(x) = Vᵀ p, p = simplex_map(β K x) on candidate sets: the patterns (Q, d_v) and the
    support sizes (Q,). One host sync after the first round; later rounds take queries in
    groups whose candidates fit one block of scores."""
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
    """One round on `count` candidates for queries (G, d): the patterns (G, d_v), support
    sizes (G,), and whether each row is solved and its scores finite (G,) bool each."""
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
    """Per query: input, output, the first round's top-c; per pair: score and temporaries."""
    size = itemsize(bank.dtype)
    return (bank.dim + 2 * bank.value_dim) * size + 6 * INITIAL_CANDIDATES * (size + 8), 3 * size


def candidate_plan(num_queries: int, bank: MemoryBank, budget: int) -> Plan:
    """`candidate_update`'s plan: the first round's running top-c₀'s."""
    first = min(INITIAL_CANDIDATES, bank.num_memories)
    return running_topk_plan(num_queries, bank, budget, first, candidate_working_set(bank))
