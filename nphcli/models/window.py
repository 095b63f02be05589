"""Sliding-window Hopfield retrieval (Longformer-like): softmax over memories near the query.

The query at position p (its row in the query set, or the `positions` given to `retrieve`)
attends only to memories with index μ in [p − w, p + w]; all others get weight exactly 0.
This is only meaningful when query p is a corrupted copy of stored pattern p: then the window
contains the target by construction and the model chooses among it and its 2w index
neighbours. For queries unrelated to the memory order the window is an arbitrary subset.
A query whose window holds no memory (p − w > M − 1 or p + w < 0) is an error. The reported
support is the number of memories inside the window.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from nphcli.errors import NphError
from nphcli.models.base import HopfieldModel, Update, param
from nphcli.models.functional import masked_softmax
from nphcli.models.masks import window_mask
from nphcli.models.registry import register_model


@register_model(
    "window",
    summary="softmax over memories whose index is within w of the query's position (Longformer)",
    formula="T(x) = Vᵀ softmax(β K x) restricted to memories μ with |μ − p| ≤ w, p the position",
    cost="time O(Q·M·d), all scores computed then masked; scores O(Q·M)",
)
@dataclass(kw_only=True)
class Window(HopfieldModel):
    window: int = param(
        5, "half-width w: the query at position p sees memories p − w … p + w (w ≥ 0)"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        window = self.window
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise NphError(f"--window must be a whole number ≥ 0, got {window!r}")

    def update(self, queries: Tensor, keys: Tensor, values: Tensor, positions: Tensor) -> Update:
        num_memories, w = keys.shape[0], self.window
        empty = (positions - w > num_memories - 1) | (positions + w < 0)  # (Q,)
        if bool(empty.any()):
            p = int(positions[empty][0])
            raise NphError(
                f"--window {w}: the query at position {p} sees memories {p - w}…{p + w}, but "
                f"memory indices run 0…{num_memories - 1}; the window model pairs query i with "
                f"stored pattern i, so give at most M + w = {num_memories + w} queries or a "
                "larger --window"
            )
        scores = self.beta * (queries @ keys.T)  # (Q, M)
        mask = window_mask(positions, num_memories, w)  # (Q, M)
        weights = masked_softmax(scores, mask)  # (Q, M)
        return Update(weights @ values, support=mask.sum(dim=-1))  # (Q, d_v), (Q,)
