"""Merging per-block results exactly: a model reads a `MemoryBank` block by block, and these
accumulators turn the partial results into what a one-shot computation gives (up to float
rounding): `SoftmaxAccumulator` (online softmax: running max, normaliser and weighted sum),
`TopKAccumulator` (running k best scores with deterministic tie-breaking; `running_topk` feeds it
a bank's blocks) and `weighted_rows` (sums of a few kept rows per query).
"""

from __future__ import annotations

import importlib

import torch
from torch import Tensor

from nphcli.core.notices import notice
from nphcli.engine.precision import HALF_DTYPES, accumulation_dtype, matmul
from nphcli.engine.selection import block_topk, fused_selection_applies
from nphcli.memory.bank import MemoryBank
from nphcli.memory.collective import Collective


class SoftmaxAccumulator:
    """Online softmax over memory blocks: Σ_μ exp(s_μ − m) v_μ / Σ_μ exp(s_μ − m).

    After each block the running max m is raised and earlier sums are rescaled by exp(m_old −
    m_new), which makes the merged result equal to the one-shot softmax. (m is the reference
    the sums are relative to: the Triton step on CUDA may keep it up to
    `triton_kernels.step_lead(dtype)` below the true max, saving a pass; the result is the same.)
    Excluded memories carry a score of −inf and get weight exactly 0; a row whose memories are
    all excluded so far keeps m = −inf and contributes nothing until a finite score arrives.

    `batch` are leading dimensions (e.g. heads): scores (*batch, Q, B), values (*batch, B, d_v).
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
        """Merge one block: scores (*batch, Q, B) (−inf = excluded), values (*batch, B, d_v);
        the block's scores are `scale` times `scores` (β, for half products: `precision`).

        The scores are consumed: their buffer becomes the block's weights (unless it carries a
        gradient). `complete` says no score is excluded (dense retrieval): the support grows by
        B with no pass over the scores, and the shift needs no guard for rows with none finite.
        """
        if complete:
            self.support += scores.shape[-1]
        else:
            self.support += torch.isfinite(scores).sum(dim=-1)
        new_max, shift, weights, sums = exp_step(scores, self.max, values.dtype, complete, scale)
        self.fold(new_max, shift, sums, matmul(weights, values))

    def fold(self, new_max: Tensor, shift: Tensor, norm: Tensor, total: Tensor) -> None:
        """Merge sums computed elsewhere with weights exp(s − shift): their normaliser (*batch,
        Q) and weighted sum (*batch, Q, d_v), the max becoming `new_max`."""
        rescale = torch.exp(self.max - shift)  # (*batch, Q); exp(−inf) = 0 for empty rows
        self.norm = self.norm * rescale + norm
        self.total = self.total * rescale.unsqueeze(-1) + total
        self.max = new_max

    def merge(self, collective: Collective) -> None:
        """Combine every rank's running sums (log-sum-exp merge): the global max is the maximum
        of the ranks' maxima, and each rank's sums are rescaled by exp(m_rank − m) before they
        are added, exactly as a later block rescales earlier ones in `add`."""
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
        """The weighted average (*batch, Q, d_v); rows with no admitted memory are an error
        upstream."""
        return self.total / self.norm.unsqueeze(-1)


def exp_step(
    scores: Tensor, running_max: Tensor, dtype: torch.dtype, complete: bool, scale: float = 1.0
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One block's elementwise softmax work, for scores s = scale · `scores` (*batch, Q, B) and
    the running max m: the new max m' = max(m, max_j s_j), the shift c (m', or 0 where m' = −inf
    unless `complete`), the weights exp(s − c) (*batch, Q, B) (in `dtype` if that is a half dtype,
    as the product with half values takes them) and their row sums (*batch, Q) before rounding.

    On CUDA, float32 blocks of at least `KERNEL_MIN_CELLS` scores take a Triton kernel
    (`triton_kernels.softmax_step`) that reads each score once and writes each weight once;
    eager torch takes four to six passes. Anywhere else, or if the kernel fails, eager torch
    runs, in place on the scores' buffer (one (Q, B) tensor, not three).
    """
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
    """`call(kernels)` with `kernels` the Triton module `nphcli.engine.<module>`, or None where
    Triton is absent or cannot compile for this GPU: then `state["failed"]` records why (the
    caller stops asking) and a notice says that `what` runs in eager torch, which is exact, from
    now on."""
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


# Devices and block sizes that take the Triton step: below this many scores a block's eager
# passes cost microseconds, and the kernel's first call compiles (about a second, cached on disk).
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
    """The k largest scores per query over memory blocks, ties going to the lower memory index.

    Invariant: the kept entries are sorted by (score descending, index ascending). A new block is
    first cut to its own best k, with the same tie rule, and then merged by a stable descending
    sort of [kept, block]: every kept index is smaller than any index in the block, and the
    block's entries are laid out in index order, so equal scores stay in index order, exactly as
    one stable sort over all M scores would leave them.

    The cut (`block_topk`) is exact with the same tie rule; `nphcli.engine.selection` says how.
    On CUDA, for k ≤ `selection.FUSED_MAX_K`, cut and merge are two Triton launches
    (`triton_selection.select_merge`) in place of about 45 eager operations per block.
    """

    def __init__(self, num_queries: int, k: int, *, device, dtype: torch.dtype):
        self.k = k
        self.scores = torch.empty(num_queries, 0, device=device, dtype=dtype)  # (Q, ≤k)
        self.index = torch.empty(num_queries, 0, device=device, dtype=torch.int64)  # (Q, ≤k)

    def add(self, scores: Tensor, start: int, scale: float = 1.0) -> None:
        """Merge one block of scores `scale`·(Q, B) for memories start .. start + B − 1 (the
        scaling is left to this step, so the fused kernels can do it while reading)."""
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
        order = torch.sort(merged_scores, dim=1, descending=True, stable=True).indices
        order = order[:, : self.k]  # (Q, ≤k)
        self.scores = merged_scores.gather(1, order)
        self.index = merged_index.gather(1, order)

    def merge(self, collective: Collective) -> None:
        """Select the k best of every rank's k best (each with global indices): the global k
        best are among them, since a memory beaten by k others on its own rank is beaten by k
        others overall. Ranks hold fewer than k rows pad with (−inf, index beyond any row).
        Ranks hold rows in rank order and each list is sorted by (score desc, index asc), so in
        the concatenation equal scores are in index order, and a stable sort by score gives
        ties to the lowest global index, as one process would."""
        if collective.world_size == 1:
            return
        missing = self.k - self.scores.shape[1]
        rows = self.scores.shape[0]
        scores = torch.cat([self.scores, self.scores.new_full((rows, missing), -torch.inf)], 1)
        index = torch.cat([self.index, self.index.new_full((rows, missing), _NO_ROW)], 1)
        scores = collective.all_cat(scores, dim=1)  # (Q, W·k)
        index = collective.all_cat(index, dim=1)  # (Q, W·k)
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, : self.k]
        self.scores, self.index = scores.gather(1, order), index.gather(1, order)


def running_topk(
    queries: Tensor, bank: MemoryBank, k: int, *, block_rows: int, scale: float = 1.0
) -> TopKAccumulator:
    """The k best scores `scale`·xᵀξ_μ per query (Q, d) over every memory, merged over ranks: a
    `TopKAccumulator` fed the bank's blocks of `block_rows`.

    Blocks are the planner's, not cut to the cache: tiles of 2^22 scores (in one reused
    buffer, each tile's top-k merged at once) took 1.20× the CPU time of one block on the
    2-core CI machine (Q = 200, M = 60,000, one thread; 2^18 to 2^23 were all slower), since the
    (Q, M) scores' writing and re-reading is a few per cent of the product's time."""
    dtype = accumulation_dtype(queries.dtype)  # float32 scores for half inputs
    top = TopKAccumulator(queries.shape[0], k, device=queries.device, dtype=dtype)
    for start, keys in bank.key_blocks(block_rows):
        top.add(matmul(queries, keys.T), start, scale)  # (Q, B)
    top.merge(bank.collective)  # rows spread over ranks: the global k best
    return top


_SELECT: dict[str, str | None] = {"failed": None}  # why the fused selection is off, if it is
_NO_ROW = torch.iinfo(torch.int64).max  # the index of a padding entry: after every real row


# `weighted_rows` gathers rows while each query keeps fewer than 1/this of the memories; above
# that, one blockwise matrix product with mostly-zero weights is faster than scattered reads.
GATHER_LIMIT = 8


def weighted_rows(bank: MemoryBank, index: Tensor, weights: Tensor, *, block_rows: int) -> Tensor:
    """Σ_j weights[q, j] · values[index[q, j]] for index, weights (Q, c): shape (Q, d_v).

    Few rows per query: gathered (`MemoryBank.weighted_sum`), Q·c·d_v reads at memory speed.
    Many: each memory block's weights are scattered into a (Q, B) matrix and multiplied with the
    block's values, Q·M·d_v multiply-adds at matrix-product speed. An index may repeat within a
    row (the padding of ragged rows, weight 0): repeats are summed, never overwritten.
    """
    num_queries, kept = index.shape
    if kept * GATHER_LIMIT <= bank.num_memories:
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
