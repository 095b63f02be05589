"""Two Triton kernels for softmax attention on CUDA, where eager torch reads memory more often
than the arithmetic needs: `softmax_step` (`blocks.exp_step` reading each score once, where eager
takes four or five passes) and `decode_partials` (a few queries against all memories, each row
read once for its score and its share of the sum). Tests compare them with the eager forms.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

STEP_MAX_BLOCK = 16384  # widest row one program holds in registers; wider ones go in chunks
STEP_CHUNK = 4096  # scores per chunk of a wider row (its per-lane max and sums fit beside it)
# How far a block's max may exceed the running max before the weights are recomputed: exp(s − m)
# stays below e¹⁶ ≈ 9·10⁶ (float16's range is smaller: `step_lead`).
STEP_LEAD = 16.0
# A decode program's memory tile: best in bfloat16 on H100 and H200 (M = 10⁶, d = 784).
DECODE_TILE_BYTES = 65536
DECODE_WARPS = 8  # warps per decode program


@triton.jit
def _softmax_step_kernel(
    scores_ptr,
    weights_ptr,
    running_max_ptr,
    new_max_ptr,
    shift_ptr,
    sums_ptr,
    columns,
    scale,
    COMPLETE: tl.constexpr,
    SINGLE: tl.constexpr,
    BLOCK: tl.constexpr,
    LEAD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK)
    scores_row = scores_ptr + row * columns
    weights_row = weights_ptr + row * columns
    old_max = tl.load(running_max_ptr + row)
    if SINGLE:  # the whole row in registers: one read, shifted by the new max
        inside = offsets < columns
        s = tl.load(scores_row + offsets, mask=inside, other=float("-inf")) * scale
        new_max = tl.maximum(old_max, tl.max(s, axis=0))
        shift = _shift(new_max, COMPLETE)
        weights = tl.where(inside, tl.exp(s - shift), 0.0)
        tl.store(weights_row + offsets, weights.to(weights_ptr.dtype.element_ty), mask=inside)
        total = tl.sum(weights, axis=0)
        reference = new_max
    else:
        # One pass shifted by the running max, which the block's max rarely exceeds by much
        # once a block has been seen; a second pass, shifted by the new max, only for a row
        # whose block max is more than LEAD above it (or that has no finite max yet).
        no_reference = tl.abs(old_max) == float("inf")  # −inf: nothing admitted yet
        provisional = tl.where(no_reference, 0.0, old_max)  # a stand-in; redone below
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        sums = tl.zeros([BLOCK], tl.float32)
        for start in range(0, columns, BLOCK):
            inside = start + offsets < columns
            chunk = tl.load(scores_row + start + offsets, mask=inside, other=float("-inf"))
            chunk = chunk * scale
            best = tl.maximum(best, chunk)
            weights = tl.where(inside, tl.exp(chunk - provisional), 0.0)
            tl.store(
                weights_row + start + offsets,
                weights.to(weights_ptr.dtype.element_ty),
                mask=inside & (no_reference == 0),
            )
            sums += weights
        block_max = tl.max(best, axis=0)
        new_max = tl.maximum(old_max, block_max)
        shift = old_max
        reference = old_max
        total = tl.sum(sums, axis=0)
        if no_reference | (block_max > old_max + LEAD):
            shift = _shift(new_max, COMPLETE)
            reference = new_max
            sums = tl.zeros([BLOCK], tl.float32)
            for start in range(0, columns, BLOCK):
                inside = start + offsets < columns
                chunk = tl.load(scores_row + start + offsets, mask=inside, other=float("-inf"))
                weights = tl.where(inside, tl.exp(chunk * scale - shift), 0.0)
                tl.store(
                    weights_row + start + offsets,
                    weights.to(weights_ptr.dtype.element_ty),
                    mask=inside,
                )
                sums += weights
            total = tl.sum(sums, axis=0)
    tl.store(new_max_ptr + row, reference)
    tl.store(shift_ptr + row, shift)
    tl.store(sums_ptr + row, total)


@triton.jit
def _shift(new_max, COMPLETE: tl.constexpr):
    """The shift of `blocks.exp_step`: the new max, or 0 for a row with no finite score yet
    (as torch.where(isfinite(m), m, 0)) unless every score is admitted."""
    if COMPLETE:
        return new_max
    finite = (new_max == new_max) & (tl.abs(new_max) < float("inf"))
    return tl.where(finite, new_max, 0.0)


def step_lead(dtype: torch.dtype) -> float:
    """`STEP_LEAD` for weights stored in `dtype`, within its range with a factor e to spare:
    float16 (largest 65504 ≈ e^11.1) takes 10.1, so its weights stay below about 24,000."""
    return min(STEP_LEAD, math.log(torch.finfo(dtype).max) - 1)


def softmax_step(
    scores: Tensor, running_max: Tensor, dtype: torch.dtype, complete: bool, scale: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`blocks.exp_step` for float32 scores (*batch, Q, B); the reference may stay up to
    `step_lead(dtype)` below the new max for rows wider than `STEP_MAX_BLOCK`."""
    columns = scores.shape[-1]
    rows = scores.numel() // max(1, columns)
    flat = scores.reshape(rows, columns)  # a view: scores are contiguous
    weights = torch.empty(scores.shape, device=scores.device, dtype=dtype)
    new_max = torch.empty_like(running_max)
    shift = torch.empty_like(running_max)
    sums = torch.empty_like(running_max)
    single = columns <= STEP_MAX_BLOCK
    block = triton.next_power_of_2(max(columns, 1)) if single else STEP_CHUNK
    _softmax_step_kernel[(rows,)](
        flat,
        weights,
        running_max.reshape(rows),
        new_max.view(rows),
        shift.view(rows),
        sums.view(rows),
        columns,
        float(scale),
        COMPLETE=complete,
        SINGLE=single,
        BLOCK=block,
        LEAD=step_lead(dtype),
        num_warps=max(4, min(16, block // 1024)),  # 16 to 64 scores per thread
    )
    return new_max, shift, weights, sums


@triton.jit
def _decode_kernel(
    queries_ptr,
    keys_ptr,
    values_ptr,
    max_ptr,
    norm_ptr,
    total_ptr,
    num_memories,
    dim,
    value_dim,
    rows_per_program,
    scale,
    SAME: tl.constexpr,
    TILE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    query = tl.program_id(0)  # fastest axis: the queries of one slice run side by side
    part = tl.program_id(1)
    num_queries = tl.num_programs(0)
    d = tl.arange(0, BLOCK_D)
    v = tl.arange(0, BLOCK_V)
    x = tl.load(queries_ptr + query * dim + d, mask=d < dim, other=0.0).to(tl.float32)
    first = part.to(tl.int64) * rows_per_program
    end = tl.minimum(first + rows_per_program, num_memories)
    best = tl.max(tl.full([TILE], float("-inf"), tl.float32), axis=0)
    norm = tl.sum(tl.zeros([TILE], tl.float32), axis=0)
    total = tl.zeros([BLOCK_V], tl.float32)
    for start in range(first, end, TILE):
        rows = start + tl.arange(0, TILE)
        live = rows < end
        keys = tl.load(
            keys_ptr + rows[:, None] * dim + d[None, :],
            mask=live[:, None] & (d[None, :] < dim),
            other=0.0,
        ).to(tl.float32)  # (TILE, BLOCK_D)
        s = tl.where(live, tl.sum(keys * x[None, :], axis=1) * scale, float("-inf"))
        new_best = tl.maximum(best, tl.max(s, axis=0))
        rescale = tl.exp(best - new_best)
        w = tl.exp(s - new_best)  # (TILE,)
        if SAME:
            values = keys
        else:
            values = tl.load(
                values_ptr + rows[:, None] * value_dim + v[None, :],
                mask=live[:, None] & (v[None, :] < value_dim),
                other=0.0,
            ).to(tl.float32)  # (TILE, BLOCK_V)
        norm = norm * rescale + tl.sum(w, axis=0)
        total = total * rescale + tl.sum(w[:, None] * values, axis=0)
        best = new_best
    slot = part * num_queries + query
    tl.store(max_ptr + slot, best)
    tl.store(norm_ptr + slot, norm)
    tl.store(total_ptr + slot.to(tl.int64) * value_dim + v, total, mask=v < value_dim)


def decode_partials(
    queries: Tensor, keys: Tensor, values: Tensor, *, scale: float, programs: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Each of `programs` slices of the memories' max (P, Q), normaliser (P, Q) and weighted sum
    (P, Q, d_v) of the online softmax of β·⟨x, k⟩ for queries (Q, d)."""
    num_queries, dim = queries.shape
    num_memories, value_dim = values.shape
    same = keys.data_ptr() == values.data_ptr() and keys.shape == values.shape
    block_d = triton.next_power_of_2(dim)
    block_v = block_d if same else triton.next_power_of_2(value_dim)
    tile = max(1, DECODE_TILE_BYTES // (keys.element_size() * max(block_d, block_v)))
    rows_per_program = triton.cdiv(triton.cdiv(num_memories, programs), tile) * tile
    programs = triton.cdiv(num_memories, rows_per_program)
    new = queries.new_empty
    best = new(programs, num_queries, dtype=torch.float32)
    norm = new(programs, num_queries, dtype=torch.float32)
    total = new(programs, num_queries, value_dim, dtype=torch.float32)
    _decode_kernel[(num_queries, programs)](
        queries.contiguous(),
        keys,
        values,
        best,
        norm,
        total,
        num_memories,
        dim,
        value_dim,
        rows_per_program,
        float(scale),
        SAME=same,
        TILE=tile,
        BLOCK_D=block_d,
        BLOCK_V=block_v,
        num_warps=DECODE_WARPS,
    )
    return best, norm, total
