"""Merging per-block results into what a one-shot computation gives (up to rounding): online
softmax (`SoftmaxAccumulator`), a running top-k (`TopKAccumulator`), sums of kept rows
(`weighted_rows`).
"""

from __future__ import annotations

import importlib

import torch
from torch import Tensor

from nphcli.core.notices import notice
from nphcli.engine.precision import HALF_DTYPES, accumulation_dtype, matmul
from nphcli.engine.selection import block_topk, fused_selection_applies, stable_top
from nphcli.memory.bank import MemoryBank
from nphcli.memory.collective import Collective


class SoftmaxAccumulator:
    """Online softmax over memory blocks: Σ_μ exp(s_μ − m) v_μ / Σ_μ exp(s_μ − m).

    Each block raises the running max m and rescales earlier sums by exp(m_old − m_new) (the
    Triton step may keep m up to `triton_kernels.step_lead` below the true max). Scores of −inf
    weigh exactly 0. `batch`: leading dimensions (heads) of scores and values.
    """

    def __init__(
        self,
        num_queries: int,
        value_dim: int,
        *,
        device,
        dtype: torch.dtype,
        batch: tuple[int, ...] = (),
    ):
        rows = (*batch, num_queries)
        self.max = torch.full(rows, -torch.inf, device=device, dtype=dtype)  # (*batch, Q)
        self.norm = torch.zeros(rows, device=device, dtype=dtype)  # (*batch, Q)
        self.total = torch.zeros(*rows, value_dim, device=device, dtype=dtype)  # (*batch, Q, d_v)
        self.support = torch.zeros(rows, dtype=torch.int64, device=device)  # (*batch, Q)

    def add(
        self, scores: Tensor, values: Tensor, *, complete: bool = False, scale: float = 1.0
    ) -> None:
        """Merge one block of scores `scale`·(*batch, Q, B) (consumed: their buffer becomes the
        weights) with values (*batch, B, d_v). `complete`: no score is −inf."""
        if complete:
            self.support += scores.shape[-1]
        else:
            self.support += torch.isfinite(scores).sum(dim=-1)
        new_max, shift, weights, sums = exp_step(scores, self.max, values.dtype, complete, scale)
        self.fold(new_max, shift, sums, matmul(weights, values))

    def fold(self, new_max: Tensor, shift: Tensor, norm: Tensor, total: Tensor) -> None:
        """Merge sums made elsewhere with weights exp(s − shift); the max becomes `new_max`."""
        rescale = torch.exp(self.max - shift)  # (*batch, Q); exp(−inf) = 0 for empty rows
        self.norm = self.norm * rescale + norm
        self.total = self.total * rescale.unsqueeze(-1) + total
        self.max = new_max

    def merge(self, collective: Collective) -> None:
        """Combine every rank's sums, rescaled to the global max as `add` rescales blocks."""
        if collective.world_size == 1:
            return
        new_max = collective.all_max(self.max)  # (*batch, Q)
        shift = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
        rescale = torch.exp(self.max - shift)  # (*batch, Q)
        norm = (self.norm * rescale).unsqueeze(-1)  # (*batch, Q, 1)
        packed = torch.cat([self.total * rescale.unsqueeze(-1), norm], dim=-1)
        packed = collective.all_sum(packed)  # (*batch, Q, d_v + 1): one message, not two
        self.total, self.norm = packed[..., :-1], packed[..., -1]
        self.support = collective.all_sum(self.support)
        self.max = new_max

    def result(self) -> Tensor:
        """The weighted average (*batch, Q, d_v)."""
        return self.total / self.norm.unsqueeze(-1)


def exp_step(
    scores: Tensor, running_max: Tensor, dtype: torch.dtype, complete: bool, scale: float = 1.0
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """For s = scale · `scores` (*batch, Q, B) and the running max m: m' = max(m, max_j s_j),
    the shift c (m', or 0 where m' = −inf unless `complete`), the weights exp(s − c) (in `dtype`
    if half) and their row sums. A Triton kernel on large CUDA float32 blocks (one pass, where
    eager torch takes four to six, in place)."""
    if _kernel_applies(scores):
        step = triton_or_none(
            _KERNEL,
            "the fused softmax step",
            lambda kernels: kernels.softmax_step(scores, running_max, dtype, complete, scale),
        )
        if step is not None:
            return step
    in_place = not scores.requires_grad
    if scale != 1:
        scores = scores.mul_(scale) if in_place else scores * scale
    return _exp_math(scores, running_max, dtype, complete, in_place)


def triton_or_none(state: dict, what: str, call, module: str = "triton_kernels"):
    """`call(nphcli.engine.<module>)`, or None where Triton fails: `state["failed"]` records
    why (the caller stops asking) and a notice says `what` runs in eager torch from now on."""
    try:
        return call(importlib.import_module(f"nphcli.engine.{module}"))
    except torch.OutOfMemoryError:
        raise
    except Exception as error:  # noqa: BLE001  (any failure of the optional kernel)
        state["failed"] = f"{type(error).__name__}: {str(error)[:200]}"
        notice(f"{what} is unavailable ({state['failed']}); using eager")
        return None


def _exp_math(
    scores: Tensor, running_max: Tensor, dtype: torch.dtype, complete: bool, in_place: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`exp_step`'s formula in eager torch."""
    new_max = torch.maximum(running_max, scores.amax(dim=-1))  # (*batch, Q)
    shift = new_max if complete else torch.where(torch.isfinite(new_max), new_max, 0.0)
    if in_place:
        weights = scores.sub_(shift.unsqueeze(-1)).exp_()  # (*batch, Q, B)
    else:
        weights = torch.exp(scores - shift.unsqueeze(-1))  # (*batch, Q, B)
    sums = weights.sum(dim=-1)  # (*batch, Q)
    if dtype in HALF_DTYPES:
        weights = weights.to(dtype)
    return new_max, shift, weights, sums


# Below KERNEL_MIN_CELLS eager passes cost microseconds; the kernel's first call, a second.
KERNEL_DEVICES = ("cuda",)
KERNEL_MIN_CELLS = 1 << 20
_KERNEL: dict[str, str | None] = {"failed": None}


def _kernel_applies(scores: Tensor) -> bool:
    return (
        scores.device.type in KERNEL_DEVICES
        and scores.dtype == torch.float32
        and scores.numel() >= KERNEL_MIN_CELLS
        and scores.is_contiguous()
        and not scores.requires_grad
        and _KERNEL["failed"] is None
    )


class TopKAccumulator:
    """The k largest scores per query over memory blocks, ties to the lower memory index.

    The kept entries stay sorted by (score desc, index asc): a block is cut to its own best k
    (`block_topk`) and merged by a stable sort of [kept, block], whose indices are all larger,
    as one stable sort over all M would leave them. On CUDA two Triton launches do both
    (`triton_selection.select_merge`)."""

    def __init__(self, num_queries: int, k: int, *, device, dtype: torch.dtype):
        self.k = k
        self.scores = torch.empty(num_queries, 0, device=device, dtype=dtype)  # (Q, ≤k)
        self.index = torch.empty(num_queries, 0, device=device, dtype=torch.int64)  # (Q, ≤k)

    def add(self, scores: Tensor, start: int, scale: float = 1.0) -> None:
        """Merge one block of scores `scale`·(Q, B) for memories start .. start + B − 1."""
        num_queries, block = scores.shape
        if fused_selection_applies(scores, self.scores, start, self.k) and not _SELECT["failed"]:
            merged = triton_or_none(
                _SELECT,
                "the fused top-k selection",
                lambda kernels: kernels.select_merge(
                    scores, start, self.k, self.scores, self.index, scale
                ),
                module="triton_selection",
            )
            if merged is not None:
                self.scores, self.index = merged
                return
        if scale != 1:
            scores = scores * scale if scores.requires_grad else scores.mul_(scale)
        if block > self.k:
            local = block_topk(scores, self.k)  # (Q, k) block-local indices, ascending
        else:
            local = torch.arange(block, device=scores.device).expand(num_queries, -1)  # (Q, B)
        merged_scores = scores.gather(1, local)  # (Q, ≤k)
        merged_index = local + start if start else local  # (Q, ≤k)
        if self.scores.shape[1]:  # nothing kept before the first block: nothing to merge
            merged_scores = torch.cat([self.scores, merged_scores], dim=1)  # (Q, ≤2k)
            merged_index = torch.cat([self.index, merged_index], dim=1)  # (Q, ≤2k)
        order = stable_top(merged_scores, self.k)  # (Q, ≤k)
        self.scores = merged_scores.gather(1, order)
        self.index = merged_index.gather(1, order)

    def merge(self, collective: Collective) -> None:
        """The k best of every rank's k best (padded with −inf), by a stable sort: ranks hold
        rows in order, so ties go to the lowest global index as in one process."""
        if collective.world_size == 1:
            return
        missing = self.k - self.scores.shape[1]
        rows = self.scores.shape[0]
        scores = torch.cat([self.scores, self.scores.new_full((rows, missing), -torch.inf)], 1)
        index = torch.cat([self.index, self.index.new_full((rows, missing), _NO_ROW)], 1)
        scores = collective.all_cat(scores, dim=1)  # (Q, W·k)
        index = collective.all_cat(index, dim=1)  # (Q, W·k)
        order = stable_top(scores, self.k)
        self.scores, self.index = scores.gather(1, order), index.gather(1, order)


def running_topk(
    queries: Tensor, bank: MemoryBank, k: int, *, block_rows: int, scale: float = 1.0
) -> TopKAccumulator:
    """The k best scores `scale`·xᵀξ_μ per query (Q, d) over every memory, merged over ranks.
    Blocks are the planner's: cache-sized tiles were 1.2× slower (CPU, Q = 200, M = 60,000)."""
    dtype = accumulation_dtype(queries.dtype)  # float32 scores for half inputs
    top = TopKAccumulator(queries.shape[0], k, device=queries.device, dtype=dtype)
    for start, keys in bank.key_blocks(block_rows):
        top.add(matmul(queries, keys.T), start, scale)  # (Q, B)
    top.merge(bank.collective)  # rows spread over ranks: the global k best
    return top


_SELECT: dict[str, str | None] = {"failed": None}  # why the fused selection is off, if it is
_NO_ROW = torch.iinfo(torch.int64).max  # the index of a padding entry: after every real row


GATHER_LIMIT = 8  # gather rows below 1/this of the memories per query, else a blockwise product


def gathers(rows: int, num_memories: int) -> bool:
    """Whether `rows` memories per query are read by index (`GATHER_LIMIT`), not in blocks."""
    return rows * GATHER_LIMIT <= num_memories


def weighted_rows(bank: MemoryBank, index: Tensor, weights: Tensor, *, block_rows: int) -> Tensor:
    """Σ_j weights[q, j] · values[index[q, j]] for index, weights (Q, c): (Q, d_v). Repeated
    indices (padding, weight 0) are summed, never overwritten."""
    num_queries, kept = index.shape
    if gathers(kept, bank.num_memories):
        return bank.weighted_sum(index, weights)
    total = weights.new_zeros(num_queries, bank.value_dim)  # (Q, d_v)
    for start, _, values in bank.blocks(block_rows):
        rows = values.shape[0]
        inside = (index >= start) & (index < start + rows)  # (Q, c)
        column = torch.where(inside, index - start, rows)  # (Q, c); outside → spare column
        block = weights.new_zeros(num_queries, rows + 1)  # (Q, B + 1)
        block = block.scatter_add(1, column, torch.where(inside, weights, 0))
        total = total + matmul(block[:, :rows], values)
    return bank.collective.all_sum(total)  # other ranks' rows
