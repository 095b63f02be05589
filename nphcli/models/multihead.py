"""Multi-head dense retrieval: H independent softmax retrievals on contiguous slices of the pattern.

Keys and queries are cut into H contiguous slices of d/H dimensions, values into H slices of d_v/H;
head h computes softmax(β X_h K_hᵀ) V_h and the heads' outputs are concatenated. Each head picks
its own memory from its slice alone, so a query can combine parts of different memories. H = 1 is
`dense`. β is shared and not rescaled per head: a head's scores sum over d/H coordinates only, so
they are about H times smaller than dense's, and a larger --beta restores the same sharpness.

Cost: the score products total Q·M·d multiply-adds, as in dense, but the scores and weights take
H·Q·M memory (H times dense's) and the softmax H·Q·M time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nphcli.errors import NphError
from nphcli.models.base import HopfieldModel, Update, param
from nphcli.models.registry import register_model


@register_model(
    "multihead",
    summary="dense softmax on H contiguous slices of the dimensions, outputs concatenated",
    formula="T(x) = concat_h V_hᵀ softmax(β K_h x_h), slices h = 1..H of d and d_v",
    cost="time O(Q·M·d + H·Q·M); scores O(H·Q·M)",
)
@dataclass(kw_only=True)
class MultiHead(HopfieldModel):
    """Dense retrieval per slice of the dimensions; see the module docstring."""

    heads: int = param(
        1, "number H of heads, each on d/H contiguous dimensions; must divide d and d_v"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.heads, int) or isinstance(self.heads, bool) or self.heads < 1:
            raise NphError(f"--heads must be a whole number ≥ 1, got {self.heads}")

    def check_memory(self, num_memories: int, dim: int) -> None:
        if dim % self.heads:
            raise NphError(
                f"--heads {self.heads} does not divide the pattern dimension {dim}; "
                f"use a divisor of {dim} such as {_divisors(dim)}"
            )

    def update(self, queries: Tensor, keys: Tensor, values: Tensor, positions: Tensor) -> Update:
        heads = self.heads
        if values.shape[1] % heads:
            raise NphError(
                f"--heads {heads} does not divide the value dimension {values.shape[1]}; "
                f"use a divisor of both {keys.shape[1]} and {values.shape[1]}"
            )
        num_queries, num_memories = queries.shape[0], keys.shape[0]
        x = queries.reshape(num_queries, heads, -1).transpose(0, 1)  # (H, Q, d/H)
        k = keys.reshape(num_memories, heads, -1).transpose(0, 1)  # (H, M, d/H)
        v = values.reshape(num_memories, heads, -1).transpose(0, 1)  # (H, M, d_v/H)
        scores = self.beta * (x @ k.transpose(1, 2))  # (H, Q, M)
        weights = torch.softmax(scores, dim=-1)  # (H, Q, M)
        retrieved = weights @ v  # (H, Q, d_v/H)
        return Update(retrieved.transpose(0, 1).reshape(num_queries, -1))  # (Q, d_v)


def _divisors(n: int, limit: int = 8) -> str:
    found = [str(k) for k in range(1, n + 1) if n % k == 0][:limit]
    return ", ".join(found)
