"""Top-k modern Hopfield retrieval: softmax over each query's k highest-scoring memories.

All other memories get weight exactly 0. (The paper's released code sets their logits to 0
instead, which still gives them weight exp(0) / Z; this is the model as the paper defines it.)
`--k` is a count or a fraction of M (`masks.resolve_k`); ties at the k-th score go to the
lower memory index. The support is always k.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from nphcli.models.base import HopfieldModel, Update, param
from nphcli.models.functional import masked_softmax
from nphcli.models.masks import K_HELP, check_k, resolve_k, topk_mask
from nphcli.models.registry import register_model


@register_model(
    "topk",
    summary="softmax over each query's k highest-scoring memories; the rest get weight 0",
    formula="T(x) = Vᵀ softmax(β K x) restricted to the k largest scores",
    cost="time O(Q·M·(d + log M)); scores O(Q·M)",
)
@dataclass(kw_only=True)
class TopK(HopfieldModel):
    k: float = param(0.2, K_HELP)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_k(self.k)

    def check_memory(self, num_memories: int, dim: int) -> None:
        resolve_k(self.k, num_memories)

    def update(self, queries: Tensor, keys: Tensor, values: Tensor, positions: Tensor) -> Update:
        k = resolve_k(self.k, keys.shape[0])
        scores = self.beta * (queries @ keys.T)  # (Q, M)
        weights = masked_softmax(scores, topk_mask(scores, k))  # (Q, M)
        support = positions.new_full((queries.shape[0],), k)  # (Q,)
        return Update(weights @ values, support=support)  # (Q, d_v)
