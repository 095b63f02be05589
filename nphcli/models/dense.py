"""Dense modern Hopfield retrieval (Ramsauer et al. 2021): every memory gets softmax weight."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nphcli.models.base import HopfieldModel, Update
from nphcli.models.registry import register_model


@register_model(
    "dense",
    summary="softmax over all memories (Ramsauer et al. 2021)",
    formula="T(x) = Vᵀ softmax(β K x)",
    cost="time O(Q·M·d); scores O(Q·M)",
)
@dataclass(kw_only=True)
class Dense(HopfieldModel):
    def update(self, queries: Tensor, keys: Tensor, values: Tensor, positions: Tensor) -> Update:
        scores = self.beta * (queries @ keys.T)  # (Q, M)
        weights = torch.softmax(scores, dim=-1)  # (Q, M)
        return Update(weights @ values)  # (Q, d_v)
