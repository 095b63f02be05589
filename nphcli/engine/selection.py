"""Exact per-block top-k: each row's k best scores of a (Q, B) block, ties to the lower index.

`full_topk` runs `torch.topk(k + 1)`, which is fast but breaks ties arbitrarily. If the k-th
and (k+1)-th largest differ, the k best are one well-defined set and the arbitrary order does
not matter; only rows where they are equal (a tie across the cut) are redone by a stable sort,
which costs a host sync per block.

`group_topk` reads the block once with a cheap reduction, then selects on a few scores. Each
row is cut into groups of G consecutive scores and only the group maxima (Q, ⌈B/G⌉) are kept
(one `amax` pass). Choose k groups by (max descending, group index ascending), and let τ be the
k-th chosen max. Every chosen group holds a score ≥ τ, so the k-th best score is ≥ τ; a score
> τ lies in a group whose max is > τ, and every such group is chosen. Among scores equal to τ
the lowest indices win; a τ in an unchosen group comes after one τ in each chosen group of max
τ (those groups come earlier, being chosen by lowest index), and there are at least as many of
those as τ's still needed. So the true top k, with nph's tie rule, lies in the k chosen groups:
a stable descending sort of their k·G scores, gathered in index order, gives exactly what one
stable sort over all B scores gives. Ties need no second pass and the host is never asked.

On CUDA, `torch.topk` is a radix select that reads the whole block several times, while the
two stable sorts here are on small rows (⌈B/G⌉ and k·G); on the CPU, `torch.topk` is a
one-pass partial sort and the sort of the group maxima costs more than it saves, so group
selection runs on `GROUP_DEVICES` only.

NaN sorts above every number (as in `torch.sort`) and `amax` propagates it, so a NaN group
ranks first; among NaNs the lowest index wins (`torch.topk` leaves that order unspecified).
"""

from __future__ import annotations

import torch
from torch import Tensor

from nphcli.engine.planning import Plan, plan_blocks
from nphcli.memory.bank import MemoryBank

SMALL_K = 16  # up to this k, groups of 128 scores; above, 64 (see `group_size`)
MIN_GROUPS_PER_K = 4  # group selection from ⌈B/G⌉ ≥ this many times k groups; below, a full topk
GROUP_DEVICES = ("cuda",)  # where group selection is faster (see benchmarks/topk_select.py)
# Up to this k, group selection and the merge with the kept k run as Triton kernels
# (`triton_selection`): each program takes the best key k times, so its work grows with k·(k·G).
FUSED_MAX_K = 64
FUSED_INDEX_LIMIT = 2**32 - 1  # memory indices the kernels' packed keys can hold
# Above SMALL_K, the fused selection runs only for this many query rows or more: each row is one
# program taking its k best one by one, ~2k dependent reads, which at k = 64 and one query left
# most of the GPU idle (H200, M = 10⁶, float32: sparse took 1.61 ms against 1.25 eager; at
# Q = 1024 the kernels were 1.09× faster in float32, 1.5× in bfloat16). The threshold between
# those two is a choice, unmeasured.
FUSED_WIDE_K_MIN_ROWS = 16


def group_size(k: int) -> int:
    """Scores per group G. Eager `amax` over groups runs faster the longer they are (H100,
    (1024, 65,536) float32: 0.52, 0.28, 0.16 ms for G = 32, 64, 128; one pass over the row
    takes 0.11), while the stable sort of the k·G gathered scores grows with k·G: G = 128 was
    fastest for k = 10 (0.34 ms in all, against 1.11 for `full_topk`), G = 64 for k = 64 (0.63
    against 1.08)."""
    return 128 if k <= SMALL_K else 64


def selection_block_rows(k: int, device: torch.device) -> int:
    """The smallest memory block whose top-k selection is efficient on `device`: where group
    selection runs, the block it starts from (so a planner's blocks take it); elsewhere k."""
    if device.type in GROUP_DEVICES:
        return MIN_GROUPS_PER_K * k * group_size(k)
    return k


def fused_selection_applies(scores: Tensor, kept: Tensor, start: int, k: int) -> bool:
    """Whether `TopKAccumulator.add` cuts and merges this block (Q, B) into the kept scores
    (Q, ≤k) with the Triton kernels: both float32 (their keys are a float32's bits) on a
    `GROUP_DEVICES` device, rows of contiguous columns wide enough for group selection,
    k ≤ `FUSED_MAX_K` (above `SMALL_K`, enough query rows), nothing to differentiate."""
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
    num_queries: int, bank: MemoryBank, budget: int, k: int, *, row_bytes: int, cell_bytes: int
) -> Plan:
    """`plan_blocks` for a running top-k over memory blocks (`TopKAccumulator`): blocks of at
    least k rows, since each block's merge sorts the k kept entries with the block's (at k = M
    and a 64 KiB budget, blocks of one row made a step 50× slower), and where M has that many,
    as wide as group selection starts from on the bank's device (`selection_block_rows`);
    narrower blocks fall back to `torch.topk`, a radix select several times slower per block on
    a GPU (H200, Q = 16384 bfloat16: blocks of 4,096 rows took sparse to 4.2× dense)."""
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
    """Indices (Q, k), ascending, of each row's k largest scores (Q, B), B > k; ties go to the
    lower index. Group selection where it pays (see the module docstring), else a full topk."""
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
        stable = torch.sort(scores[rows], dim=1, descending=True, stable=True).indices
        index = index.index_copy(0, rows, stable[:, :k])
    return torch.sort(index, dim=1).values  # (Q, k)


def group_topk(scores: Tensor, k: int, group: int) -> Tensor:
    """`block_topk` by group maxima; needs at least k groups (B > (k − 1)·G), pays when
    k·G ≪ B."""
    num_queries, block = scores.shape
    full = block // group
    maxima = scores[:, : full * group].reshape(num_queries, full, group).amax(dim=2)  # (Q, n)
    if full * group < block:  # a shorter last group
        tail = scores[:, full * group :].amax(dim=1, keepdim=True)  # (Q, 1)
        maxima = torch.cat([maxima, tail], dim=1)  # (Q, n)
    chosen = _stable_top(maxima, k).sort(dim=1).values  # (Q, k) group numbers, ascending
    offsets = torch.arange(group, device=scores.device)  # (G,)
    columns = (chosen.unsqueeze(2) * group + offsets).reshape(num_queries, k * group)  # (Q, kG)
    picked = scores.gather(1, columns.clamp(max=block - 1))  # (Q, kG), in index order
    if full * group < block:  # past the end: below every real score, after it in index order
        picked = picked.masked_fill(columns >= block, -torch.inf)
    best = _stable_top(picked, k)  # (Q, k) positions within the gathered scores
    return columns.gather(1, best).sort(dim=1).values  # (Q, k)


def _stable_top(values: Tensor, k: int) -> Tensor:
    """Positions (Q, k) of each row's k largest values, equal values in position order."""
    return torch.sort(values, dim=1, descending=True, stable=True).indices[:, :k]
