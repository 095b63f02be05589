"""α-entmax Hopfield retrieval: interpolates between dense (α = 1) and sparse (α = 2) retrieval.

α-entmax maximises pᵀs plus a Tsallis entropy of order α; for α > 1 memories below a per-query
threshold weigh exactly 0. Exact either way: from one block of all scores (`entmax_block.py`)
where the memories are resident and fit, else from each query's largest scores (`candidates.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.engine import energy as en
from nphcli.engine.candidate_rule import CandidateRule, threshold_rule
from nphcli.engine.candidates import candidate_plan, candidate_update, candidate_working_set
from nphcli.engine.entmax_block import entmax_block_update, one_block_bytes
from nphcli.engine.functional import entmax, sparsemax
from nphcli.engine.planning import Plan, itemsize, plan_rows
from nphcli.engine.precision import accumulation_dtype
from nphcli.memory.bank import MemoryBank
from nphcli.models.base import HopfieldModel, Update, param
from nphcli.models.registry import register_model

MIN_QUERY_ROWS = 64  # the one-block path's smallest batch: narrower products run slow


@dataclass(kw_only=True)
class ThresholdModel(HopfieldModel):
    """What `entmax` and `sparse` (α = 2) share: a map onto the simplex that gives every score
    below a per-query threshold weight exactly 0, solved on each query's largest scores."""

    alpha = 2.0

    def simplex_map(self, scores: Tensor) -> Tensor:
        """The weights (Q, M) of scores (Q, M), row by row."""
        return sparsemax(scores)

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
                queries, bank, beta=self.beta, simplex_map=self.simplex_map, block_rows=block_rows
            )
        )

    def energy(self, queries: Tensor, memories: Tensor, positions: Tensor) -> Tensor:
        """−(1/β)·Ψ*_α(β·X·x) + ½‖x‖² (`nphcli.engine.energy`)."""
        return en.energy(queries, memories, self.beta, alpha=float(self.alpha))

    def candidate_rule(self, num_memories: int) -> CandidateRule:
        return threshold_rule(
            beta=self.beta,
            alpha=float(self.alpha),
            simplex_map=self.simplex_map,
            num_memories=num_memories,
        )

    def working_set(self, bank: MemoryBank) -> tuple[int, int]:
        return candidate_working_set(bank)

    def plan(self, num_queries: int, bank: MemoryBank, budget: int) -> Plan:
        return candidate_plan(num_queries, bank, budget)

    def weights(self, scores: Tensor, valid: Tensor, positions: Tensor) -> Tensor:
        """The map of each row (B, H, N, M), padded keys at −∞ (weight 0)."""
        filled = scores.masked_fill(~valid[:, None, None, :], -math.inf)  # (B, H, N, M)
        flat = filled.reshape(-1, filled.shape[-1])  # (B·H·N, M): the map works on rows
        return self.simplex_map(flat).reshape(filled.shape)


@register_model(
    "entmax",
    summary="α-entmax over all memories: softmax at α = 1, sparsemax at α = 2 (Peters et al. 2019)",
    formula="T(x) = Vᵀ α-entmax(β K x)",
    cost=(
        "time O(Q·M·d + Q·M·n), n ≈ 2–4 closed-form steps (α = 1.5, 2) or 3–10 Newton "
        "steps, fewer scores (c ≥ support) for narrow supports; "
        "extra memory O(Q·M) in one block, else O(Q·c + Q·B)"
    ),
)
@dataclass(kw_only=True)
class Entmax(ThresholdModel):
    alpha: float = param(
        1.5, "entmax order α in [1, 2]: 1 = softmax, 2 = sparsemax; larger α, sparser"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        alpha = self.alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise NphError(f"--alpha must be a number in [1, 2], got {alpha!r}")
        if not (math.isfinite(alpha) and 1 <= alpha <= 2):
            raise NphError(f"--alpha must be in [1, 2] (1: softmax, 2: sparsemax), got {alpha}")

    def simplex_map(self, scores: Tensor) -> Tensor:
        return entmax(scores, self.alpha)

    def update(
        self,
        queries: Tensor,
        bank: MemoryBank,
        positions: Tensor,
        prepared: Any,
        *,
        block_rows: int,
    ) -> Update:
        differentiable = torch.is_grad_enabled() and (
            queries.requires_grad or any(t.requires_grad for t in bank.resident() or ())
        )  # the one-block path has no backward; the candidate path's map does
        if block_rows >= bank.num_memories and self._one_block(bank) and not differentiable:
            return Update(*entmax_block_update(queries, bank, beta=self.beta, alpha=self.alpha))
        return super().update(queries, bank, positions, prepared, block_rows=block_rows)

    def plan(self, num_queries: int, bank: MemoryBank, budget: int) -> Plan:
        """One block of all M when `MIN_QUERY_ROWS` queries fit (`one_block_bytes`); else the
        blockwise plan, kept below M (a block of all M is what selects the one-block path)."""
        if not self._one_block(bank):
            return candidate_plan(num_queries, bank, budget)
        per_query, fixed = one_block_bytes(bank, itemsize(accumulation_dtype(bank.dtype)))
        rows = plan_rows(budget - fixed, 1, per_query, total=num_queries)
        if budget >= fixed + rows * per_query and rows >= min(num_queries, MIN_QUERY_ROWS):
            return Plan(query_rows=rows, memory_rows=bank.num_memories)
        plan = candidate_plan(num_queries, bank, budget)
        if plan.memory_rows < bank.num_memories or bank.num_memories == 1:
            return plan
        return Plan(query_rows=plan.query_rows, memory_rows=-(-bank.num_memories // 2))

    def _one_block(self, bank: MemoryBank) -> bool:
        """Whether the one-block path applies: α > 1, memories resident, one process."""
        return self.alpha > 1 and bank.resident() is not None and bank.collective.world_size == 1
