"""Sliding-window Hopfield retrieval (Longformer-like): softmax over memories near the query.

The query at position p attends only to memories μ in [p − w, p + w]: meaningful when query p
is a corrupted copy of stored pattern p. An empty window is an error. The band is gathered, or
for wide windows scored as masked blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.engine.attention import gathered_attention, masked_attention
from nphcli.engine.blocks import gathers
from nphcli.engine.functional import masked_softmax
from nphcli.engine.masks import window_band, window_mask
from nphcli.engine.planning import itemsize
from nphcli.memory.bank import MemoryBank
from nphcli.models.base import HopfieldModel, Update, param
from nphcli.models.inputs import check_whole
from nphcli.models.registry import register_model


@register_model(
    "window",
    summary="softmax over memories whose index is within w of the query's position (Longformer)",
    formula="T(x) = Vᵀ softmax(β K x) restricted to memories μ with |μ − p| ≤ w, p the position",
    cost="time O(Q·w·d): only each query's band of 2w + 1 memories is read; extra memory O(Q·w·d)",
)
@dataclass(kw_only=True)
class Window(HopfieldModel):
    window: int = param(
        5, "half-width w: the query at position p sees memories p − w … p + w (w ≥ 0)"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_whole(self.window, "--window", 0)

    def support_mask(self, scores: Tensor, positions: Tensor) -> Tensor:
        return window_mask(positions, scores.shape[1], self.window)

    def update(
        self,
        queries: Tensor,
        bank: MemoryBank,
        positions: Tensor,
        prepared: Any,
        *,
        block_rows: int,
    ) -> Update:
        num_memories, w = bank.num_memories, self.window
        empty = (positions - w > num_memories - 1) | (positions + w < 0)  # (Q,)
        if bool(empty.any()):
            p = int(positions[empty][0])
            raise NphError(
                f"--window {w}: the query at position {p} sees memories {p - w}…{p + w}, but "
                f"memory indices run 0…{num_memories - 1}; the window model pairs query i with "
                f"stored pattern i, so give at most M + w = {num_memories + w} queries or a "
                "larger --window"
            )
        if gathers(2 * w + 1, num_memories):
            index, valid = window_band(positions, num_memories, w)  # (Q, c), (Q, c)
            patterns = gathered_attention(queries, bank, index, valid, beta=self.beta)
            return Update(patterns, support=valid.sum(dim=1))  # (Q, d_v), (Q,)
        offsets = positions.to(torch.int64)  # (Q,): a block's mask is the window shifted by start
        patterns, support = masked_attention(
            queries,
            bank,
            lambda start, rows: window_mask(offsets - start, rows, w),  # (Q, B)
            beta=self.beta,
            block_rows=block_rows,
        )
        return Update(patterns, support=support)

    def weights(self, scores: Tensor, valid: Tensor, positions: Tensor) -> Tensor:
        """Softmax over the unpadded keys μ with |μ − p| ≤ w (B, H, N, M)."""
        keep = window_mask(positions, scores.shape[-1], self.window)[None, None]  # (1, 1, N, M)
        keep = keep & valid[:, None, None, :]  # (B, 1, N, M)
        if not bool(keep.any(dim=-1).all()):
            raise NphError(
                f"window {self.window}: some query sees no unpadded key (query i sees keys "
                f"i − w … i + w); use a larger window or sets with at least as many keys as queries"
            )
        return masked_softmax(scores, keep)

    def working_set(self, bank: MemoryBank) -> tuple[int, int]:
        size = itemsize(bank.dtype)
        row_bytes = (bank.dim + 2 * bank.value_dim) * size
        if gathers(2 * self.window + 1, bank.num_memories):
            width = min(2 * self.window + 1, bank.num_memories)
            return row_bytes + width * (bank.dim + bank.value_dim + 4) * size + 2 * width * 8, 1
        return row_bytes, 4 * size + 2 * 8
