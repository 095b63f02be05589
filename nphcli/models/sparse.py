"""Sparse modern Hopfield retrieval (Hu et al. 2023): sparsemax in place of softmax.

Memories below a per-query threshold weigh exactly 0, a support that adapts to the query.
Computed exactly from each query's largest scores (`candidates.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from nphcli.engine import energy as en
from nphcli.engine.candidate_rule import CandidateRule, threshold_rule
from nphcli.engine.candidates import candidate_plan, candidate_update, candidate_working_set
from nphcli.engine.functional import sparsemax
from nphcli.engine.planning import Plan
from nphcli.memory.bank import MemoryBank
from nphcli.models.base import HopfieldModel, Update
from nphcli.models.registry import register_model


@register_model(
    "sparse",
    summary="sparsemax over all memories: exact zeros below a per-query threshold (Hu et al. 2023)",
    formula="T(x) = Vᵀ sparsemax(β K x)",
    cost="time O(Q·M·d + Q·c·log c), c ≥ support candidates; extra memory O(Q·c + Q·B)",
)
@dataclass(kw_only=True)
class Sparse(HopfieldModel):
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
            *candidate_update(
                queries, bank, beta=self.beta, simplex_map=sparsemax, block_rows=block_rows
            )
        )

    def energy(self, queries: Tensor, memories: Tensor, positions: Tensor) -> Tensor:
        """−(1/β)·Ψ*_2(β·X·x) + ½‖x‖² (`nphcli.engine.energy`)."""
        return en.energy(queries, memories, self.beta, alpha=2.0)

    def candidate_rule(self, num_memories: int) -> CandidateRule:
        return threshold_rule(
            beta=self.beta,
            alpha=2.0,
            simplex_map=sparsemax,
            num_memories=num_memories,
        )

    def working_set(self, bank: MemoryBank) -> tuple[int, int]:
        return candidate_working_set(bank)

    def plan(self, num_queries: int, bank: MemoryBank, budget: int) -> Plan:
        return candidate_plan(num_queries, bank, budget)

    def weights(self, scores: Tensor, valid: Tensor, positions: Tensor) -> Tensor:
        """Sparsemax of each row (B, H, N, M), padded keys at −∞ (weight 0)."""
        return sparsemax(scores.masked_fill(~valid[:, None, None, :], -math.inf))
