"""α-entmax retrieval from one block of all M scores: one matrix product, a threshold found on a
few candidates per query, one weighted sum.

α-entmax gives p_i = [(α−1)·z_i − τ]_+^{1/(α−1)}: every score at or below the threshold
t = τ/(α−1) weighs exactly 0, and t depends only on the scores above it. So once a lower bound
b ≤ t is known, the scores above b are all the solver needs (the others would weigh 0 at t),
and a query whose support is 10 % of M is solved on about that many scores, not on all M.

The bound: t is the threshold at which the weights sum to 1. Solving instead for weights that
sum to m on a strided sample of 1/s of the scores estimates the threshold at which all scores
would carry a mass of about m·s; with m·s = `SAFETY` > 1 that estimate lies below t (more mass
needs a lower threshold) unless the sample is badly unrepresentative. It is then checked, not
trusted: if the threshold solved on the scores above the estimate is at or above it, no score
at or below the estimate can be in the support, and that threshold is the exact one (the
scores left out weigh 0 at it). Rows that fail the check are solved again above a bound that
cannot fail, the sample's own threshold (a subset's threshold is never above the whole's).

When the candidates are most of the scores (α near 1, or β small: nearly every memory in the
support) the threshold is solved on all scores at once, without compaction.

`models.entmax` uses this while the memories fit one block beside a batch of queries; with
smaller budgets it uses the candidate rounds of `candidates.py`, also exact.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from nphcli.engine.blocks import weighted_rows
from nphcli.engine.functional import entmax_threshold, entmax_weights
from nphcli.engine.precision import accumulation_dtype, matmul, scale_queries
from nphcli.errors import score_overflow
from nphcli.memory.bank import MemoryBank

SAMPLE = 1024  # scores per query in the sample that estimates the bound
SAFETY = 2.0  # the estimate asks the whole row for this much mass (> 1: below the threshold)
DENSE_SHARE = 0.5  # above this share of candidates, solve on all scores without compaction

# Bytes per (query, memory) pair of the one block: its score, the candidate mask, and at most
# one candidate per pair (two int64 positions from `nonzero`, then a score, a weight and an
# int64 index in the compacted rows).
CELL_BYTES_EXTRA = 1 + 16 + 16


def entmax_block_update(
    queries: Tensor, bank: MemoryBank, *, beta: float, alpha: float
) -> tuple[Tensor, Tensor]:
    """T(x) = Vᵀ α-entmax(β K x) with all M memories in one block, 1 < α ≤ 2: the patterns
    (Q, d_v) and each query's support size (Q,)."""
    keys, _ = bank.resident()
    dtype = accumulation_dtype(queries.dtype)
    scaled, rest = scale_queries(queries, beta)  # (Q, d)
    scores = matmul(scaled, keys.T, scale=rest).to(dtype)  # (Q, M)
    top = scores.amax(dim=1, keepdim=True)  # (Q, 1)
    if not bool(torch.isfinite(top).all()):
        raise score_overflow(dtype)
    weights, index = entmax_candidates(scores.sub_(top), alpha)  # (Q, c) each
    support = (weights > 0).sum(dim=1)  # (Q,)
    if index is None:  # every score is a candidate: weights are the (Q, M) matrix itself
        return matmul(weights, bank.resident()[1]), support
    return weighted_rows(bank, index, weights, block_rows=bank.num_memories), support


def entmax_candidates(z: Tensor, alpha: float) -> tuple[Tensor, Tensor | None]:
    """α-entmax weights of scores z (Q, M) shifted to row max 0, on each row's candidates:
    weights (Q, c) and memory indices (Q, c) (padding: weight 0, index 0), or the full (Q, M)
    weights and None when most scores are candidates. Levels are in units of ε·z."""
    eps = alpha - 1
    num_memories = z.shape[1]
    stride = max(1, num_memories // SAMPLE)
    sample = eps * z[:, ::stride]  # (Q, n) ε·z, row max ≤ 0
    sample_top = sample.amax(dim=1, keepdim=True)  # (Q, 1)
    sample = sample - sample_top  # (Q, n) row max 0
    estimate = _level(sample, eps, math.log(SAFETY * sample.shape[1] / num_memories))  # (Q, 1)
    safe = _level(sample, eps, 0.0)  # (Q, 1) the sample's threshold: never above t
    # A candidate has ε·z > level; every level is < 0, so the top (z = 0) always is one.
    estimate, safe = estimate + sample_top, safe + sample_top
    bound = torch.maximum(estimate, safe)  # (Q, 1)
    keep = z > bound / eps  # (Q, M)
    if bool(keep.sum() > DENSE_SHARE * keep.numel()):
        return _solve_all(z, eps), None
    weights, index, level = _solve_above(z, eps, keep)
    del keep
    failed = (level < bound).squeeze(1)  # (Q,) a score at or below the estimate may weigh
    if bool(failed.any()):
        rows = failed.nonzero().squeeze(1)  # (F,)
        part = z[rows]  # (F, M)
        w, i, _ = _solve_above(part, eps, part > safe[rows] / eps)
        width = max(weights.shape[1], w.shape[1])
        weights, index = _widen(weights, width), _widen(index, width)
        weights[rows], index[rows] = _widen(w, width), _widen(i, width)
    return weights, index


def _level(scaled: Tensor, eps: float, log_target: float) -> Tensor:
    """The level ε·(z − max) (Q, 1) below which scores weigh 0 when the row's weights sum to
    e^{log_target}: from λ, τ = −e^{−ελ}."""
    lam = entmax_threshold(scaled, eps, log_target=log_target)  # (Q, 1)
    return -torch.exp(-eps * lam)


def _solve_above(z: Tensor, eps: float, keep: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Weights (Q, c), indices (Q, c) and the solved level (Q, 1) on the shifted scores z
    (Q, M) where keep holds, compacted row by row (padding: −inf, weight 0, index 0)."""
    rows, columns = keep.nonzero(as_tuple=True)  # (K,) each, row-major
    counts = torch.bincount(rows, minlength=z.shape[0])  # (Q,) ≥ 1: the top is kept
    starts = counts.cumsum(0) - counts  # (Q,)
    slot = torch.arange(rows.numel(), device=rows.device) - starts[rows]  # (K,) rank in its row
    width = int(counts.max())
    scaled = z.new_full((z.shape[0], width), -torch.inf)  # (Q, c)
    scaled[rows, slot] = z[rows, columns] * eps
    index = torch.zeros(z.shape[0], width, dtype=torch.int64, device=z.device)
    index[rows, slot] = columns
    lam = entmax_threshold(scaled, eps)  # (Q, 1)
    return entmax_weights(scaled, lam, eps), index, -torch.exp(-eps * lam)


def _solve_all(z: Tensor, eps: float) -> Tensor:
    """Weights (Q, M) solved on every shifted score (z is scaled in place)."""
    scaled = z.mul_(eps)  # (Q, M)
    return entmax_weights(scaled, entmax_threshold(scaled, eps), eps)


def _widen(rows: Tensor, width: int) -> Tensor:
    """Pad (Q, c) with zeros to (Q, width)."""
    return torch.nn.functional.pad(rows, (0, width - rows.shape[1]))
