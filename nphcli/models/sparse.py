"""Sparse modern Hopfield retrieval (Hu et al. 2023): sparsemax in place of softmax.

Memories below a per-query threshold weigh exactly 0, a support that adapts to the query.
Computed exactly from each query's largest scores (`candidates.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from nphcli.models.entmax import ThresholdModel
from nphcli.models.registry import register_model


@register_model(
    "sparse",
    summary="sparsemax over all memories: exact zeros below a per-query threshold (Hu et al. 2023)",
    formula="T(x) = Vᵀ sparsemax(β K x)",
    cost="time O(Q·M·d + Q·c·log c), c ≥ support candidates; extra memory O(Q·c + Q·B)",
)
@dataclass(kw_only=True)
class Sparse(ThresholdModel):
    pass
