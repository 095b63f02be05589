"""α-entmax retrieval from one block of all M scores: one product, a threshold (`thresholds.py`),
one weighted sum. On a GPU one Triton launch (`triton_entmax.py`); wide supports weigh the whole
block in place, a cache-sized chunk at a time, and take one product with the values; narrow ones
solve on the scores above the start alone, check the level, and gather the support's rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nphcli.core.errors import score_overflow
from nphcli.engine import blocks, host_buffers
from nphcli.engine.blocks import triton_or_none, weighted_rows
from nphcli.engine.precision import accumulation_dtype, matmul, scale_queries, widened_row_bytes
from nphcli.engine.thresholds import _sample_stride, _starts, solve
from nphcli.memory.bank import MemoryBank

DENSE_SHARE = 0.15  # above this share of scores over the start: weights over the whole block
# Or a row's support over this share: the narrow path pads rows to the widest (digits, α = 1.1,
# Q = 200: widest 21 %, 58 ms narrow against 48 ms wide).
WIDEST_SHARE = 0.25
CHUNK_BYTES = 2**22  # scores solved together, by every thread: the chunk stays in cache

CHUNK_COPIES = 4  # scratch copies of a chunk the wide path's solve takes at most
# Scratch per slot of a narrow chunk's compacted candidates: score items and other bytes.
SLOT_ITEMS, SLOT_BYTES = 5, 32
SAMPLE_COPIES, ROW_VECTORS = 10, 16  # copies of the (Q, n) sample alive at once; (Q, 1) vectors


def one_block_bytes(bank: MemoryBank, item: int) -> tuple[int, int]:
    """The one-block path's bytes per query and fixed bytes, for scores of `item` bytes: the
    scratch is fixed on the CPU (chunks), per query elsewhere (one chunk, the worst case)."""
    num_memories = bank.num_memories
    sample = -(-num_memories // _sample_stride(num_memories))  # scores in a row's sample
    per_query = item * (
        bank.dim + 3 * bank.value_dim + num_memories + SAMPLE_COPIES * (sample + 1) + ROW_VECTORS
    )
    if bank.resident()[0].device.type != "cpu":
        scratch = max(CHUNK_COPIES * item, 2 * item + 1 + _slot_bytes(item))
        return per_query + num_memories * scratch, 0
    wide = CHUNK_COPIES * _chunk_rows(num_memories, item) * num_memories * item
    narrow = _chunk_rows(num_memories, item) * num_memories * (2 * item + 1) + _slot_limit(
        num_memories, item
    )
    return per_query, max(wide, narrow) + num_memories * widened_row_bytes(bank)


def _chunk_rows(num_memories: int, item: int) -> int:
    """Rows of scores in one chunk on the CPU: `CHUNK_BYTES`, ≥ 1."""
    return max(1, CHUNK_BYTES // (num_memories * item))


def _single_chunk(z: Tensor) -> bool:
    """Whether z is solved as one chunk: off the CPU, where chunks cost launches and syncs."""
    return z.device.type != "cpu"


def _rows_for(z: Tensor) -> int:
    """Rows per chunk of the scores z (Q, M): `_chunk_rows`, or all Q as one chunk."""
    single = _single_chunk(z)
    return max(1, z.shape[0]) if single else _chunk_rows(z.shape[1], z.element_size())


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
    fused = _fused_weights(z, alpha)  # the weights written over z, their sums and counts
    if fused is not None:
        return matmul(z, values.to(dtype)) / fused[0], fused[1].squeeze(1).long()
    guess, start, safe, share, widest = _starts(z, alpha)  # (Q, 1) each, float, float
    if share > DENSE_SHARE or widest > WIDEST_SHARE:
        mass, count = _weigh_in_place(z, alpha, guess)  # z now holds the weights; (Q, 1) each
        return matmul(z, values.to(dtype)) / mass, count.squeeze(1).long()
    patterns = z.new_empty(z.shape[0], bank.value_dim)  # (Q, d_v)
    support = torch.empty(z.shape[0], dtype=torch.int64, device=z.device)  # (Q,)
    for rows, keep in _narrow_chunks(z, start):
        weights, index = _solve_candidates(z[rows], alpha, keep, start[rows], safe[rows])
        patterns[rows] = weighted_rows(bank, index, weights, block_rows=bank.num_memories)
        support[rows] = (weights > 0).sum(dim=1)
    return patterns, support


FUSED_MIN_ROWS = 16  # the fused solve's program per query would leave a GPU idle below (unmeasured)
_FUSED: dict[str, str | None] = {"failed": None}


def _fused_weights(z: Tensor, alpha: float) -> tuple[Tensor, Tensor] | None:
    """`triton_entmax.weigh_rows` on z where it applies, else None (z intact: a kernel that
    cannot compile fails before it writes)."""
    on_device = z.device.type in blocks.KERNEL_DEVICES and z.shape[0] >= FUSED_MIN_ROWS
    if not on_device or _FUSED["failed"]:
        return None

    def weigh(kernels):
        return kernels.weigh_rows(z, alpha, _sample_stride(z.shape[1]))

    return triton_or_none(_FUSED, "the fused entmax threshold", weigh, module="triton_entmax")


def _scores(scaled: Tensor, keys: Tensor, rest: float, dtype: torch.dtype) -> Tensor:
    """β K x as `dtype` (Q, M); a float32 or float64 one into a huge-page buffer."""
    if scaled.dtype != dtype or keys.dtype != dtype:
        return matmul(scaled, keys.T, scale=rest).to(dtype)
    out = host_buffers.empty((scaled.shape[0], keys.shape[0]), dtype, scaled.device)
    return torch.matmul(scaled, keys.T, out=out)


def _narrow_chunks(z: Tensor, start: Tensor):
    """(rows, keep) for chunks of z (Q, M), keep (R, M) the scores above the start."""
    step = _rows_for(z)
    for first in range(0, z.shape[0], step):
        rows = slice(first, min(first + step, z.shape[0]))
        yield from _pieces(rows, z[rows] > start[rows], z.element_size())


def _pieces(rows: slice, keep: Tensor, item: int):
    """(rows, keep) cut so each piece's compacted candidates fit `_slot_limit`."""
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
    """Overwrite z (Q, M) with its unnormalised weights a cache-sized chunk at a time (every
    thread on each chunk: 17.8 ms against a pool's 32); their sums and counts (Q, 1) each."""
    rows = _rows_for(z)
    sums, counts = [], []
    for first in range(0, z.shape[0], rows):
        part = z[first : first + rows]  # (R, M), a view: written in place
        _, mass, count, _ = solve(part, alpha, start=start[first : first + rows], out=part)
        sums.append(mass)
        counts.append(count.to(mass.dtype))
    return torch.cat(sums), torch.cat(counts)


def _solve_candidates(
    z: Tensor, alpha: float, keep: Tensor, start: Tensor, safe: Tensor
) -> tuple[Tensor, Tensor]:
    """Normalised weights and indices (Q, s) of each row's support (padding 0), solved above
    the start and redone above the safe bound where the level falls below the start."""
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
    """Weights and indices (Q, s) of each row's support and its level (Q, 1), where keep."""
    scores, columns = _compact(keep, z, -torch.inf)  # (Q, c) each, padding −inf
    weights, total, count, t = solve(scores, alpha)  # (Q, c), (Q, 1), (Q, 1), (Q, 1)
    weights, slot = _compact(weights > 0, weights / total, 0.0)  # (Q, s) each
    return weights, columns.gather(1, slot), t


def _compact(keep: Tensor, values: Tensor, fill: float) -> tuple[Tensor, Tensor]:
    """values where keep, moved left in each row (Q, c) (padding fill), and their columns."""
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
