"""Dense modern Hopfield retrieval (Ramsauer et al. 2021): every memory gets softmax weight."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nphcli.engine.attention import attention_plan, fused_heads, softmax_attention
from nphcli.engine.functional import masked_softmax
from nphcli.engine.planning import Plan
from nphcli.memory.bank import MemoryBank
from nphcli.models.base import HopfieldModel, Update
from nphcli.models.registry import register_model


@dataclass(kw_only=True)
class SoftmaxHeads(HopfieldModel):
    """Softmax attention on `heads` contiguous slices of d and d_v (`engine.attention`): what
    `dense` (one head) and `multihead` share."""

    heads = 1

    def update(
        self,
        queries: Tensor,
        bank: MemoryBank,
        positions: Tensor,
        prepared: Any,
        *,
        block_rows: int,
    ) -> Update:
        return Update(
            softmax_attention(
                queries,
                bank,
                beta=self.beta,
                heads=self.heads,
                block_rows=block_rows,
                fused=prepared,
            )
        )

    def prepare(self, bank: MemoryBank, block_rows: int) -> tuple[Tensor, Tensor] | None:
        """The heads the fused kernel reads, made once per retrieve (`fused_heads`)."""
        return fused_heads(bank, self.heads, block_rows)

    def weights(self, scores: Tensor, valid: Tensor, positions: Tensor) -> Tensor:
        """Softmax over each set's valid keys (B, H, N, M)."""
        return masked_softmax(scores, valid[:, None, None, :])

    def plan(self, num_queries: int, bank: MemoryBank, budget: int) -> Plan:
        row_bytes, _ = self.working_set(bank)
        return attention_plan(num_queries, bank, budget, heads=self.heads, row_bytes=row_bytes)


@register_model(
    "dense",
    summary="softmax over all memories (Ramsauer et al. 2021)",
    formula="T(x) = Vᵀ softmax(β K x)",
    cost="time O(Q·M·d); extra memory O(Q·d_v) fused in RAM, else blocks of O(Q·B) scores",
)
@dataclass(kw_only=True)
class Dense(SoftmaxHeads):
    def support_mask(self, scores: Tensor, positions: Tensor) -> Tensor:
        """Every memory: dense retrieval is the sparse-structured case 𝓜(x) = {1 … M}."""
        return torch.ones_like(scores, dtype=torch.bool)
