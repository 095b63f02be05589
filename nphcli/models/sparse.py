"""Sparse modern Hopfield retrieval (Hu et al. 2023): sparsemax in place of softmax.

Sparsemax is the Euclidean projection of the scores onto the simplex, so every memory scoring
below a per-query threshold τ gets weight exactly 0; the support (memories with non-zero weight)
adapts to the query instead of being fixed in advance as in `topk`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from nphcli.models.base import HopfieldModel, Update
from nphcli.models.functional import sparsemax
from nphcli.models.registry import register_model


@register_model(
    "sparse",
    summary="sparsemax over all memories: exact zeros below a per-query threshold (Hu et al. 2023)",
    formula="T(x) = Vᵀ sparsemax(β K x)",
    cost="time O(Q·M·(d + log M)); scores O(Q·M)",
)
@dataclass(kw_only=True)
class Sparse(HopfieldModel):
    def update(self, queries: Tensor, keys: Tensor, values: Tensor, positions: Tensor) -> Update:
        scores = self.beta * (queries @ keys.T)  # (Q, M)
        weights = sparsemax(scores)  # (Q, M)
        return Update(weights @ values, support=(weights > 0).sum(dim=-1))  # (Q, d_v), (Q,)
