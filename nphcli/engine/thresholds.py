"""α-entmax retrieval from one block of all M scores: one matrix product, a threshold, one
weighted sum.

α-entmax gives p_i = [(α−1)·z_i − τ]_+^{1/(α−1)} on scores z shifted to row max 0. Here the
threshold is kept in units of z, t = τ/(α−1): p_i ∝ [z_i − t]_+^k, k = 1/(α−1), and t is the
level at which Σ_i [z_i − t]_+^k = (α−1)^{−k}. Every score at or below t weighs exactly 0.

- For α = 1.5 (k = 2) and α = 2 (k = 1, sparsemax) t is solved by an active-set iteration with
  no exp, log or pow: at a trial t, the memories above it give c, Σd and Σd² (d = z − t), and
  the level where those c memories alone carry the mass is a root of a quadratic (k = 2) or
  linear (k = 1) equation. Wrong memories in the set (a trial below t) or missing ones (above)
  change that root only by the cube of the trial's error, so from a sampled start two or three
  passes pin t to rounding; a bracket of trials known to lie below and above t catches any
  stray step. For other α the monotone Newton iteration of `functional.entmax_threshold`.
- The start: t solved on a strided sample of n scores per row, each standing for M/n of them
  (the row's top only for itself), for weights summing to `SAFETY` > 1 lies a little below the
  threshold (more mass needs a lower level); the sample's own threshold (a subset's is never
  above the whole's) is a bound that cannot fail.
- Wide supports (the sample puts more than `DENSE_SHARE` of the scores above the start): the
  weights are computed over the whole (Q, M) block in place, `CHUNK_BYTES` of rows at a time
  (the few evaluations of a chunk's level then read it from cache, not memory), and multiplied
  with the values in one matrix product, as dense retrieval does. Narrow ones: the threshold is
  solved on each query's scores above the start only (compacted), checked (a solved level at
  or above the start means no score below it could weigh; rows that fail are solved again
  above the safe bound), and the weighted sum gathers the support's rows.

Memory (`one_block_bytes`): per query its scores and sample, beside a fixed scratch: batches as
large as the budget allows (1000 queries took a third less time each than 200s: M = 60,000).
`models.entmax` uses this while the memories fit one block, else `candidates.py`'s exact rounds.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from nphcli.engine import host_buffers
from nphcli.engine.blocks import weighted_rows
from nphcli.engine.functional import entmax_threshold, entmax_unnormalised
from nphcli.engine.precision import accumulation_dtype, matmul, scale_queries
from nphcli.errors import score_overflow
from nphcli.memory.bank import MemoryBank

SAMPLE, SAMPLE_MIN, SAMPLE_SHARE = 1024, 64, 64  # the start's sample: M/64 scores, 64 to 1024
SAFETY = 2.0  # the start asks the whole row for this much mass (> 1: below the threshold)
DENSE_SHARE = 0.15  # above this share of scores over the start: weights over the whole block
CHUNK_BYTES = 2**22  # scores solved together by all workers: each worker's chunk stays in cache
_STEPS = 60  # bound on the active-set iterations; they take 2–4 from the sampled start

# Scratch, in rows of a chunk, that solving one chunk of the wide path takes at most: two for
# the active-set iteration; the Newton iteration's scaled scores, weights and their u.
CHUNK_COPIES = 4
# Scratch bytes per slot of a narrow chunk's compacted candidates (its rows × their widest
# count), in score items and bytes: scores, weights and solver scratch; nonzero's positions,
# ranks and int64 indices, for the candidates and again for the support.
SLOT_ITEMS, SLOT_BYTES = 5, 32
# Copies of the (Q, n) sample finding the start keeps alive at once; (Q, 1) levels and sums.
SAMPLE_COPIES, ROW_VECTORS = 10, 16


def one_block_bytes(bank: MemoryBank, item: int, *, threads: int | None = None) -> tuple[int, int]:
    """The one-block path's working memory for scores of `item` bytes: bytes per query (its
    input, outputs, scores, sample and their scratch) and fixed bytes. On the CPU the scratch is
    fixed, whatever Q is: the larger of the wide path's chunks and the narrow path's. Elsewhere a
    batch is one chunk (`_single_chunk`), so its scratch is counted per query, at the worst case."""
    num_memories = bank.num_memories
    sample = -(-num_memories // _sample_stride(num_memories))  # scores in a row's sample
    per_query = item * (
        bank.dim + 3 * bank.value_dim + num_memories + SAMPLE_COPIES * (sample + 1) + ROW_VECTORS
    )
    if bank.resident()[0].device.type != "cpu":
        scratch = max(CHUNK_COPIES * item, 2 * item + 1 + _slot_bytes(item))
        return per_query + num_memories * scratch, 0
    workers = max(1, threads or torch.get_num_threads())
    wide = workers * CHUNK_COPIES * _chunk_rows(num_memories, item, workers) * num_memories * item
    narrow = _chunk_rows(num_memories, item) * num_memories * (2 * item + 1) + _slot_limit(
        num_memories, item
    )
    return per_query, max(wide, narrow)


def _sample_stride(num_memories: int) -> int:
    """Every this-many-th score goes in a row's sample (all below M = 128). Q = 1000, 1 thread: at
    M = 5,000 (MNIST) 1,024 scores made entmax 1.45× dense, 78 0.89×; at 60,000 256–1,024 tied."""
    return max(1, num_memories // min(SAMPLE, max(SAMPLE_MIN, num_memories // SAMPLE_SHARE)))


def _chunk_rows(num_memories: int, item: int, workers: int = 1) -> int:
    """Rows of scores in one worker's chunk on the CPU: `CHUNK_BYTES` shared among the workers,
    ≥ 1. (A GPU has no such cache to keep them in: there a batch is one chunk, `_rows_for`.)"""
    return max(1, CHUNK_BYTES // (workers * num_memories * item))


def _single_chunk(z: Tensor) -> bool:
    """Whether the scores z are solved as one chunk: off the CPU, where each chunk costs kernel
    launches and host syncs and no cache would keep a chunk's scores between its passes."""
    return z.device.type != "cpu"


def _rows_for(z: Tensor, workers: int = 1) -> int:
    """Rows per chunk of the scores z (Q, M): `_chunk_rows`, or all Q as one chunk."""
    single = _single_chunk(z)
    return max(1, z.shape[0]) if single else _chunk_rows(z.shape[1], z.element_size(), workers)


def _slot_limit(num_memories: int, item: int) -> int:
    """Bytes a narrow chunk's compacted candidates may take; always enough for one whole row."""
    return max(CHUNK_COPIES * CHUNK_BYTES, num_memories * _slot_bytes(item))


def _slot_bytes(item: int) -> int:
    """Scratch bytes per slot of compacted candidates, for scores of `item` bytes."""
    return SLOT_ITEMS * item + SLOT_BYTES


def entmax_block_update(
    queries: Tensor, bank: MemoryBank, *, beta: float, alpha: float
) -> tuple[Tensor, Tensor]:
    """T(x) = Vᵀ α-entmax(β K x) with all M memories in one block, 1 < α ≤ 2: the patterns
    (Q, d_v) and each query's support size (Q,)."""
    keys, values = bank.resident()
    dtype = accumulation_dtype(queries.dtype)
    scaled, rest = scale_queries(queries, beta)  # (Q, d)
    scores = _scores(scaled, keys, rest, dtype)  # (Q, M)
    top = scores.amax(dim=1, keepdim=True)  # (Q, 1)
    if not bool(torch.isfinite(top).all()):
        raise score_overflow(dtype)
    z = scores.sub_(top)  # (Q, M) row max 0: the top is exact and always in the support
    guess, start, safe, share = _starts(z, alpha)  # (Q, 1) each, float
    if share > DENSE_SHARE:
        mass, count = _weigh_in_place(z, alpha, guess)  # z now holds the weights; (Q, 1) each
        return matmul(z, values.to(dtype)) / mass, count.squeeze(1).long()
    patterns = z.new_empty(z.shape[0], bank.value_dim)  # (Q, d_v)
    support = torch.empty(z.shape[0], dtype=torch.int64, device=z.device)  # (Q,)
    for rows, keep in _narrow_chunks(z, start):
        weights, index = _solve_candidates(z[rows], alpha, keep, start[rows], safe[rows])
        patterns[rows] = weighted_rows(bank, index, weights, block_rows=bank.num_memories)
        support[rows] = (weights > 0).sum(dim=1)
    return patterns, support


def _scores(scaled: Tensor, keys: Tensor, rest: float, dtype: torch.dtype) -> Tensor:
    """β K x as `dtype` (Q, M): a half product is `precision.matmul`'s float32; a float32 or
    float64 one (where `scale_queries` put all of β into the queries: rest = 1) is written
    into a buffer on huge pages (`host_buffers`)."""
    if scaled.dtype != dtype or keys.dtype != dtype:
        return matmul(scaled, keys.T, scale=rest).to(dtype)
    out = host_buffers.empty((scaled.shape[0], keys.shape[0]), dtype, scaled.device)
    return torch.matmul(scaled, keys.T, out=out)


def _narrow_chunks(z: Tensor, start: Tensor):
    """(rows, keep) for row slices of z (Q, M), keep (R, M) marking their candidates (scores
    above the start): chunks of `_rows_for`, each cut by `_pieces`."""
    step = _rows_for(z)
    for first in range(0, z.shape[0], step):
        rows = slice(first, min(first + step, z.shape[0]))
        yield from _pieces(rows, z[rows] > start[rows], z.element_size())


def _pieces(rows: slice, keep: Tensor, item: int):
    """(rows, keep) cut so that each piece's candidates, compacted to its widest row, fit
    `_slot_limit` for scores of `item` bytes. One chunk (`_single_chunk`) stays whole: the plan
    counted its worst case."""
    if _single_chunk(keep):
        yield rows, keep
        return
    slots = _slot_limit(keep.shape[1], item) // _slot_bytes(item)
    counts = keep.view(torch.uint8).sum(dim=1, dtype=torch.int32)  # (R,) 2x a bool sum's speed
    yield from _halved(rows, keep, counts, slots)


def _halved(rows: slice, keep: Tensor, counts: Tensor, slots: int):
    """(rows, keep) halved until rows × the widest count ≤ slots, or a single row."""
    size = rows.stop - rows.start
    if size == 1 or size * int(counts.max()) <= slots:
        yield rows, keep
        return
    half = size // 2
    yield from _halved(slice(rows.start, rows.start + half), keep[:half], counts[:half], slots)
    yield from _halved(slice(rows.start + half, rows.stop), keep[half:], counts[half:], slots)


def _weigh_in_place(z: Tensor, alpha: float, start: Tensor) -> tuple[Tensor, Tensor]:
    """Overwrite the shifted scores z (Q, M) with their unnormalised weights, solving a few
    rows at a time so that each chunk's scores stay in cache through every evaluation of its
    threshold (the whole block would be read from memory again by each); the weights' sums and
    counts (Q, 1) each. With several intra-op threads, chunks go to as many workers, each
    single-threaded: the chunks' many small operations would otherwise each wait for every
    thread, and for any core another process holds."""
    threads = 1 if _single_chunk(z) else torch.get_num_threads()
    rows = _rows_for(z, threads)
    firsts = range(0, z.shape[0], rows)

    def weigh(first: int, threads: int = 1) -> tuple[Tensor, Tensor]:
        torch.set_num_threads(threads)  # per thread: the caller's own setting is untouched
        part = z[first : first + rows]  # (R, M), a view: written in place
        _, mass, count, _ = solve(part, alpha, start=start[first : first + rows], out=part)
        return mass, count.to(mass.dtype)

    workers = min(threads, len(firsts))
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(weigh, firsts))
    else:
        parts = [weigh(first, threads) for first in firsts]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def solve(
    z: Tensor,
    alpha: float,
    *,
    start: Tensor | None = None,
    mass: float = 1.0,
    weight: Tensor | None = None,
    out: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """α-entmax of the shifted scores z (Q, n) (row max 0, −inf entries weigh nothing) with
    weights summing to `mass`: the unnormalised weights (Q, n) (written to `out` when given,
    which may be z itself), their sums, counts of weights > 0 and the level t in units of z
    (Q, 1) each. `start` (Q, 1) is a first trial level. `weight` (Q, n), for α = 1.5 and 2
    only, counts each score that many times (a sample standing for a whole row)."""
    eps = alpha - 1
    if _closed_form(alpha):
        power = round(1 / eps)
        return _active_set(z, power, mass * eps**-power, start, weight, out)
    # Levels in units of z lose ε·|t| ≈ 1 of their digits as ε → 0: they are converted to and
    # from λ (τ = −e^{−ελ}) in float64, and serve only as starts and checks.
    lam = None if start is None else (-torch.log(-eps * start.double()) / eps).to(z.dtype)
    scaled = z * eps  # (Q, n)
    lam = entmax_threshold(scaled, eps, start=lam, log_target=math.log(mass))  # (Q, 1)
    weights = entmax_unnormalised(scaled, lam, eps)  # (Q, n)
    count = (weights > 0).sum(dim=1, keepdim=True)  # (Q, 1)
    t = -torch.exp(-eps * lam.double()) / eps  # (Q, 1) float64
    if out is not None:
        weights = out.copy_(weights)
    return weights, weights.sum(dim=1, keepdim=True), count, t


def _closed_form(alpha: float) -> bool:
    """Whether α's threshold is solved by the active-set iteration: α = 1.5 or 2."""
    power = round(1 / (alpha - 1))
    return power in (1, 2) and power * (alpha - 1) == 1


def _active_set(
    z: Tensor,
    power: int,
    mass: float,
    start: Tensor | None,
    weight: Tensor | None,
    out: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Σ_i w_i·[z_i − t]_+^power = mass (w = `weight`, else 1) solved for t by the active-set
    iteration (module docstring): [z − t]_+^power (Q, n) at the final t (in `out` if given),
    its row sums, counts and t (Q, 1) each. Each evaluation is one subtraction, one clamp and
    three row reductions over z, so a chunk of z that fits the cache stays there."""
    rows = z.shape[0]
    lo = z.new_full((rows, 1), -(mass ** (1 / power)))  # the top alone carries `mass` here
    hi = z.new_zeros(rows, 1)  # nothing weighs at the top's level
    t = lo if start is None else torch.minimum(torch.maximum(start, lo), hi)  # (Q, 1)
    tolerance = 8 * torch.finfo(z.dtype).eps * mass ** (1 / power)
    weights, spare = torch.empty_like(z), torch.empty_like(z)  # (Q, n) scratch
    for _ in range(_STEPS):
        trial = t
        d = torch.sub(z, trial, out=weights).clamp_(min=0)  # (Q, n)
        count, s1, total = _moments(d, power, weight, spare)  # (Q, 1) each
        if power == 2:
            # c·a² − 2·Σd·a + Σd² − mass = 0: its smaller root, written without cancellation;
            # with no real root (a trial far below t) a Newton step, which stays below t.
            disc = s1 * s1 - count * (total - mass)  # (Q, 1)
            root = (total - mass) / (s1 + disc.clamp(min=0).sqrt())
            step = torch.where(disc >= 0, root, (total - mass) / (2 * s1))  # (Q, 1)
        else:
            step = (total - mass) / count  # (Q, 1)
        if not bool(step.abs().amax() > tolerance):
            break
        below = total >= mass  # (Q, 1) the trial lies at or below t
        lo = torch.where(below, torch.maximum(lo, t), lo)
        hi = torch.where(below, hi, torch.minimum(hi, t))
        t = t + step
        stray = ((t < lo) | (t > hi)) & (step.abs() > tolerance)  # (Q, 1) left the bracket
        t = torch.where(stray, (lo + hi) / 2, t)
    if out is None:
        out = d
    if power == 2:
        torch.mul(d, d, out=out)
    elif out is not d:
        out.copy_(d)
    return out, total, count, trial


def _moments(
    d: Tensor, power: int, weight: Tensor | None, spare: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Σw·1[d > 0], Σw·d and Σw·d^power over each row of d = [z − t]_+ (Q, n): (Q, 1) each."""
    if weight is not None:
        ones = torch.sign(d, out=spare).mul_(weight)  # (Q, n)
        count = ones.sum(dim=1, keepdim=True)
        wd = torch.mul(d, weight, out=spare)  # (Q, n)
        s1 = wd.sum(dim=1, keepdim=True)
        total = (wd * d).sum(dim=1, keepdim=True) if power == 2 else s1
        return count, s1, total
    count = torch.sign(d, out=spare).sum(dim=1, keepdim=True)  # ≥ 1: t < 0
    s1 = d.sum(dim=1, keepdim=True)
    if power == 1:
        return count, s1, s1
    return count, s1, torch.linalg.vector_norm(d, dim=1, keepdim=True).square_()


def _starts(z: Tensor, alpha: float) -> tuple[Tensor, Tensor, Tensor, float]:
    """From a strided sample of z's columns, in units of z (Q, 1) each: the threshold's
    estimate (either side of it), a start a little below it, a bound that cannot be above it;
    and the share of the sample above the start."""
    num_memories = z.shape[1]
    sample = z[:, :: _sample_stride(num_memories)].contiguous()  # (Q, n): one strided read
    top = sample.amax(dim=1, keepdim=True)  # (Q, 1)
    safe = solve(sample - top, alpha)[3] + top  # (Q, 1): a subset's level is never higher
    levels = [safe]
    for mass in (SAFETY, 1.0):  # more mass, lower level: the start lies below the estimate
        level = _sample_level(sample, top, num_memories, alpha, mass, start=levels[-1])
        levels.append(torch.maximum(level, levels[-1]))  # (Q, 1)
    _, start, guess = levels
    share = float((sample > start).sum()) / sample.numel()
    return guess, start, safe, share


def _sample_level(
    sample: Tensor, top: Tensor, num_memories: int, alpha: float, mass: float, start: Tensor
) -> Tensor:
    """The level (Q, 1) at which the whole rows would carry `mass`, estimated from the sample
    (Q, n) of z (row max 0; the sample's own top (Q, 1)); `start` a level below it."""
    if _closed_form(alpha):
        # Each sampled score stands for M/n scores, except the row's top, which stands for
        # itself (counted M/n times, a top far above the rest pulls the estimate up): it is
        # appended with weight 1 and its sampled copies weigh 0.
        weight = torch.where(sample == 0, 0.0, num_memories / sample.shape[1])  # (Q, n)
        weight = torch.cat([weight, weight.new_ones(len(sample), 1)], dim=1).to(sample.dtype)
        rows = torch.cat([sample, sample.new_zeros(len(sample), 1)], dim=1)  # (Q, n + 1)
        return solve(rows, alpha, start=start, mass=mass, weight=weight)[3]
    share = mass * sample.shape[1] / num_memories  # the sample alone, for its share of the mass
    if share >= 1:  # the sample is the row: its own level
        return start
    return solve(sample - top, alpha, start=start - top, mass=share)[3] + top


def _solve_candidates(
    z: Tensor, alpha: float, keep: Tensor, start: Tensor, safe: Tensor
) -> tuple[Tensor, Tensor]:
    """Normalised weights and memory indices (Q, s) of each row's support (padding: weight 0,
    index 0), solved on the scores above the start (keep: z > start), checked, and redone above
    the safe bound where the check fails (cut by `_pieces`, as the chunks are)."""
    weights, index, t = _solve_above(z, alpha, keep)
    failed = (t < start).squeeze(1)  # (Q,) a score at or below the start may weigh
    if not bool(failed.any()):
        return weights, index
    rows = failed.nonzero().squeeze(1)  # (F,)
    part = z[rows]  # (F, M)
    above = part > safe[rows]  # (F, M): more candidates than above the start
    for piece, kept in _pieces(slice(0, len(rows)), above, z.element_size()):
        w, i, _ = _solve_above(part[piece], alpha, kept)
        width = max(weights.shape[1], w.shape[1])
        weights, index = _widen(weights, width), _widen(index, width)
        weights[rows[piece]], index[rows[piece]] = _widen(w, width), _widen(i, width)
    return weights, index


def _solve_above(z: Tensor, alpha: float, keep: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Normalised weights (Q, s) and memory indices (Q, s) of each row's support, and the
    solved level (Q, 1), from the shifted scores z (Q, M) where keep holds."""
    scores, columns = _compact(keep, z, -torch.inf)  # (Q, c) each, padding −inf
    weights, total, count, t = solve(scores, alpha)  # (Q, c), (Q, 1), (Q, 1), (Q, 1)
    weights, slot = _compact(weights > 0, weights / total, 0.0)  # (Q, s) each
    return weights, columns.gather(1, slot), t


def _compact(keep: Tensor, values: Tensor, fill: float) -> tuple[Tensor, Tensor]:
    """values (Q, n) where keep holds, moved to the left of each row (Q, c), c the widest
    row's count (padding: fill), and their columns (Q, c) (padding 0)."""
    rows, columns = keep.nonzero(as_tuple=True)  # (K,) each, row-major
    counts = torch.bincount(rows, minlength=keep.shape[0])  # (Q,) ≥ 1: the top is kept
    starts = counts.cumsum(0) - counts  # (Q,)
    slot = torch.arange(rows.numel(), device=rows.device) - starts[rows]  # (K,) rank in its row
    width = int(counts.max())
    out = values.new_full((keep.shape[0], width), fill)  # (Q, c)
    out[rows, slot] = values[rows, columns]
    index = torch.zeros(keep.shape[0], width, dtype=torch.int64, device=keep.device)
    index[rows, slot] = columns
    return out, index


def _widen(rows: Tensor, width: int) -> Tensor:
    """Pad (Q, c) with zeros to (Q, width)."""
    return torch.nn.functional.pad(rows, (0, width - rows.shape[1]))
