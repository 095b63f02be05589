"""Top-k selection of one score block merged into the running top-k, in two Triton kernels.

Eager `TopKAccumulator.add` is about 45 small operations per block, whose launches outlasted the
GPU's work (H200, Q = 1024, M = 10⁶: 21 ms against 9 ms of kernels). Here: `_group_maxima_kernel`
(each group's largest key), then `_select_kernel`, a program per query taking the k best groups
and the k best of their scores with the kept k (`engine.selection` says why that is exact). A key
is a float32's bits as an ordered int32 (NaN highest, −0 = +0) above the complement of the
memory index: distinct keys, so the maximum is the best score, lower index on ties.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from nphcli.engine.selection import FUSED_INDEX_LIMIT, group_size

MAX_GROUPS = 8192  # group maxima one program holds; a wider block is taken in column slices
MAXIMA_GROUPS = 16  # groups per program of the maxima kernel
GROUP_RUN = 32  # group maxima the selection re-reads after taking one of them
LOW = tl.constexpr(FUSED_INDEX_LIMIT)  # a key's low 32 bits: the complement of a memory index
NO_KEY = tl.constexpr(-(2**31))  # an int32 order key below every score's (−inf's is −2³¹ + 2²³ − 1)
TAKEN = tl.constexpr(-(2**63))  # an int64 key below every packed one: a taken or empty lane


@triton.jit
def _order_key(value):
    """int32 keys whose integer order is the numbers' order (NaN highest, −0 = +0)."""
    bits = value.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    key = tl.where(value == 0, 0, key)
    return tl.where(value != value, 0x7FFFFFFF, key)


@triton.jit
def _pack(key, index):
    """One int64 per (score key, memory index): larger score first, then lower index."""
    return (key.to(tl.int64) << 32) | (index.to(tl.int64) ^ LOW)  # ^ LOW: LOW − index


@triton.jit
def _index_of(packed):
    """The memory index (or group number) a packed key holds."""
    return (packed & LOW) ^ LOW


@triton.jit
def _group_maxima_kernel(
    scores_ptr, row_stride, width, scale, maxima_ptr, groups, G: tl.constexpr, CHUNK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)  # (CHUNK,)
    columns = group[:, None] * G + tl.arange(0, G)[None, :]  # (CHUNK, G)
    inside = columns < width
    values = tl.load(scores_ptr + row * row_stride + columns, mask=inside, other=0.0) * scale
    keys = tl.where(inside, _order_key(values), NO_KEY)
    tl.store(maxima_ptr + row * groups + group, tl.max(keys, axis=1), mask=group < groups)


@triton.jit
def _select_kernel(
    scores_ptr,
    row_stride,
    width,
    scale,
    maxima_ptr,
    groups,
    kept_scores_ptr,
    kept_index_ptr,
    kept,
    out_scores_ptr,
    out_index_ptr,
    start,
    K: tl.constexpr,
    K_PAD: tl.constexpr,
    G: tl.constexpr,
    N_PAD: tl.constexpr,
    RUN: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    slots = tl.arange(0, K_PAD)
    # The k best groups. Groups are taken in runs of RUN: each run's best untaken group key
    # stands for it, and taking one re-reads that run (cached) for its next, so a step costs
    # O(groups / RUN + RUN). Padding lanes rank below every group, a taken lane below them.
    runs = tl.arange(0, N_PAD // RUN)
    lanes = runs[:, None] * RUN + tl.arange(0, RUN)[None, :]  # (N_PAD / RUN, RUN)
    maxima = tl.load(maxima_ptr + row * groups + lanes, mask=lanes < groups, other=NO_KEY)
    run_heads = tl.max(_pack(maxima, lanes), axis=1)  # (N_PAD / RUN,)
    chosen = tl.zeros([K_PAD], dtype=tl.int64)
    for i in range(K):
        best = tl.max(run_heads, axis=0)
        group = _index_of(best)
        chosen = tl.where(slots == i, group, chosen)
        run = group // RUN
        lane = run * RUN + tl.arange(0, RUN)
        run_maxima = tl.load(maxima_ptr + row * groups + lane, mask=lane < groups, other=NO_KEY)
        run_keys = _pack(run_maxima, lane)
        run_next = tl.max(tl.where(run_keys < best, run_keys, TAKEN), axis=0)
        run_heads = tl.where(runs == run, run_next, run_heads)
    # Their scores and the kept entries, merged: the k largest keys, in order. The same way:
    # each chosen group's best untaken key stands for it, and taking one re-reads the group.
    offsets = tl.arange(0, G)
    columns = chosen[:, None] * G + offsets[None, :]  # (K_PAD, G)
    inside = (slots[:, None] < K) & (columns < width)
    values = tl.load(scores_ptr + row * row_stride + columns, mask=inside, other=0.0) * scale
    heads = tl.max(
        tl.where(inside, _pack(_order_key(values), start + columns), TAKEN), axis=1
    )  # (K_PAD,)
    have = slots < kept
    kept_scores = tl.load(kept_scores_ptr + row * kept + slots, mask=have, other=0.0)
    kept_index = tl.load(kept_index_ptr + row * kept + slots, mask=have, other=0)
    kept_keys = tl.where(have, _pack(_order_key(kept_scores), kept_index), TAKEN)
    best_keys = tl.zeros([K_PAD], dtype=tl.int64)
    for i in range(K):
        top = tl.max(heads, axis=0)
        best = tl.maximum(top, tl.max(kept_keys, axis=0))
        best_keys = tl.where(slots == i, best, best_keys)
        kept_keys = tl.where(kept_keys == best, TAKEN, kept_keys)
        source = heads == best  # the group it came from; none if it was a kept entry
        source_group = tl.sum(tl.where(source, chosen, 0), axis=0)
        column = source_group * G + offsets
        live = (column < width) & (top == best)
        group_values = tl.load(scores_ptr + row * row_stride + column, mask=live, other=0.0)
        group_keys = _pack(_order_key(group_values * scale), start + column)
        group_keys = tl.where(live, group_keys, TAKEN)
        group_next = tl.max(tl.where(group_keys < best, group_keys, TAKEN), axis=0)
        heads = tl.where(source, group_next, heads)
    key = (best_keys >> 32).to(tl.int32)
    bits = tl.where(key >= 0, key, key ^ 0x7FFFFFFF)
    done = slots < K
    tl.store(out_scores_ptr + row * K + slots, bits.to(tl.float32, bitcast=True), mask=done)
    tl.store(out_index_ptr + row * K + slots, _index_of(best_keys), mask=done)


def select_merge(
    scores: Tensor, start: int, k: int, kept_scores: Tensor, kept_index: Tensor, scale: float = 1.0
) -> tuple[Tensor, Tensor]:
    """The k best of float32 scores `scale`·(Q, B) (memories start … start + B − 1, B ≥ k
    groups of `group_size(k)`; the product rounded to float32, as `scores.mul_(scale)` rounds
    it) and of the kept (Q, ≤k) entries, as (scores (Q, k), indices (Q, k)) sorted by (score
    descending, index ascending): what `TopKAccumulator.add` keeps. Blocks wider than
    `MAX_GROUPS` groups are taken in balanced column slices, each holding ≥ k groups."""
    rows, width = scores.shape
    group, k_pad = group_size(k), triton.next_power_of_2(k)
    total_groups = triton.cdiv(width, group)
    slice_width = triton.cdiv(total_groups, triton.cdiv(total_groups, MAX_GROUPS)) * group
    for first in range(0, width, slice_width):
        part = scores[:, first : first + slice_width]
        groups = triton.cdiv(part.shape[1], group)
        maxima = torch.empty(rows, groups, device=scores.device, dtype=torch.int32)
        _group_maxima_kernel[(rows, triton.cdiv(groups, MAXIMA_GROUPS))](
            part, part.stride(0), part.shape[1], scale, maxima, groups, G=group, CHUNK=MAXIMA_GROUPS
        )
        out_scores = torch.empty(rows, k, device=scores.device, dtype=torch.float32)
        out_index = torch.empty(rows, k, device=scores.device, dtype=torch.int64)
        kept = kept_scores.shape[1]
        n_pad = max(triton.next_power_of_2(groups), k_pad)
        _select_kernel[(rows,)](
            part,
            part.stride(0),
            part.shape[1],
            scale,
            maxima,
            groups,
            kept_scores.contiguous() if kept else out_scores,
            kept_index.contiguous() if kept else out_index,
            kept,
            out_scores,
            out_index,
            start + first,
            K=k,
            K_PAD=k_pad,
            G=group,
            N_PAD=n_pad,
            RUN=min(GROUP_RUN, n_pad),
            num_warps=4 if k_pad * group <= 2048 else 8,
        )
        kept_scores, kept_index = out_scores, out_index
    return kept_scores, kept_index
