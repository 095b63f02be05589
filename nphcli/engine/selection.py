"""Exact per-block top-k: each row's k best scores of a (Q, B) block, ties to the lower index.

`full_topk`: `torch.topk(k + 1)`, with rows tied across the cut redone by a stable sort.

`group_topk`: cut each row into groups of G scores, keep their maxima, choose k groups by (max
descending, index ascending); τ, the k-th chosen max, is ≤ the k-th best score, every score > τ
lies in a chosen group, and enough τ's in chosen groups come before any unchosen one. So a
stable sort of the k·G chosen scores gives exactly the stable top k of all B, with no host
sync. It beats torch's radix select on CUDA only (`GROUP_DEVICES`). NaN ranks first, ties
among NaNs to the lowest index.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nphcli.engine.planning import Plan, plan_blocks
from nphcli.memory.bank import MemoryBank

SMALL_K = 16  # up to this k, groups of 128 scores; above, 64 (see `group_size`)
MIN_GROUPS_PER_K = 4  # group selection from ⌈B/G⌉ ≥ this many times k groups; below, a full topk
GROUP_DEVICES = ("cuda",)  # where group selection is faster (see benchmarks/topk_select.py)
FUSED_MAX_K = 64  # up to this k, Triton kernels select and merge (work grows with k·(k·G))
FUSED_INDEX_LIMIT = 2**32 - 1  # memory indices the kernels' packed keys can hold
# Above SMALL_K the kernels need this many rows, one program each (H200, M = 10⁶, k = 64: one
# query 1.61 ms against 1.25 eager; Q = 1024 1.09× faster). The cut itself is unmeasured.
FUSED_WIDE_K_MIN_ROWS = 16


def group_size(k: int) -> int:
    """Scores per group G: longer groups speed `amax`, shorter ones the sort of k·G scores
    (H100, (1024, 65,536) float32: fastest at G = 128 for k = 10, 64 for k = 64)."""
    return 128 if k <= SMALL_K else 64


def selection_block_rows(k: int, device: torch.device) -> int:
    """The smallest memory block whose top-k selection is efficient on `device`."""
    if device.type in GROUP_DEVICES:
        return MIN_GROUPS_PER_K * k * group_size(k)
    return k


def fused_selection_applies(scores: Tensor, kept: Tensor, start: int, k: int) -> bool:
    """Whether `TopKAccumulator.add` merges this block (Q, B) into the kept (Q, ≤k) with the
    Triton kernels (their keys are a float32's bits)."""
    device = scores.device
    return (
        device.type in GROUP_DEVICES
        and scores.dtype == kept.dtype == torch.float32
        and k <= FUSED_MAX_K
        and (k <= SMALL_K or scores.shape[0] >= FUSED_WIDE_K_MIN_ROWS)
        and scores.shape[1] >= selection_block_rows(k, device)
        and scores.stride(1) == 1
        and start + scores.shape[1] <= FUSED_INDEX_LIMIT
        and not scores.requires_grad
    )


def running_topk_plan(
    num_queries: int, bank: MemoryBank, budget: int, k: int, working_set: tuple[int, int]
) -> Plan:
    """`plan_blocks` for a running top-k (`TopKAccumulator`) with a model's `working_set` (bytes
    per query and per pair): blocks of at least k rows (each merge sorts the k kept with the
    block's), and as wide as group selection needs where M allows (narrower took sparse to 4.2×
    dense, H200, Q = 16384 bfloat16)."""
    row_bytes, cell_bytes = working_set
    wide = selection_block_rows(k, bank.device)
    return plan_blocks(
        num_queries,
        bank,
        budget,
        row_bytes=row_bytes,
        cell_bytes=cell_bytes,
        min_block_rows=wide if wide <= bank.num_memories else k,
    )


def block_topk(scores: Tensor, k: int) -> Tensor:
    """Indices (Q, k), ascending, of each row's k largest scores (Q, B), B > k."""
    scores = scores.detach()
    device = scores.device
    if device.type in GROUP_DEVICES and scores.shape[1] >= selection_block_rows(k, device):
        return group_topk(scores, k, group_size(k))
    return full_topk(scores, k)


def full_topk(scores: Tensor, k: int) -> Tensor:
    """`block_topk` by `torch.topk(k + 1)` and a stable sort of rows tied across the cut."""
    values, index = torch.topk(scores, k + 1, dim=1)  # (Q, k + 1), descending
    tied = values[:, k - 1] == values[:, k]  # (Q,) a tie straddles the cut
    index = index[:, :k]  # (Q, k)
    if bool(tied.any()):
        rows = tied.nonzero().squeeze(1)  # (T,)
        index = index.index_copy(0, rows, stable_top(scores[rows], k))
    return torch.sort(index, dim=1).values  # (Q, k)


def group_topk(scores: Tensor, k: int, group: int) -> Tensor:
    """`block_topk` by group maxima; needs at least k groups."""
    num_queries, block = scores.shape
    full = block // group
    maxima = scores[:, : full * group].reshape(num_queries, full, group).amax(dim=2)  # (Q, n)
    if full * group < block:  # a shorter last group
        tail = scores[:, full * group :].amax(dim=1, keepdim=True)  # (Q, 1)
        maxima = torch.cat([maxima, tail], dim=1)  # (Q, n)
    chosen = stable_top(maxima, k).sort(dim=1).values  # (Q, k) group numbers, ascending
    offsets = torch.arange(group, device=scores.device)  # (G,)
    columns = (chosen.unsqueeze(2) * group + offsets).reshape(num_queries, k * group)  # (Q, kG)
    picked = scores.gather(1, columns.clamp(max=block - 1))  # (Q, kG), in index order
    if full * group < block:  # past the end: below every real score, after it in index order
        picked = picked.masked_fill(columns >= block, -torch.inf)
    best = stable_top(picked, k)  # (Q, k) positions within the gathered scores
    return columns.gather(1, best).sort(dim=1).values  # (Q, k)


def stable_top(values: Tensor, k: int) -> Tensor:
    """Positions (Q, k) of each row's k largest values, equal values in position order."""
    return torch.sort(values, dim=1, descending=True, stable=True).indices[:, :k]
