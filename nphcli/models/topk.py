"""Top-k modern Hopfield retrieval: softmax over each query's k highest-scoring memories.

All other memories get weight exactly 0 (the paper's released code sets their logits to 0,
which still weighs them). Ties at the k-th score go to the lower index. The k best come from a
running top-k over memory blocks, or FAISS's flat search (`engine/exact_search.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nphcli.engine.blocks import weighted_rows
from nphcli.engine.candidate_rule import CandidateRule
from nphcli.engine.exact_search import exact_topk
from nphcli.engine.masks import K_HELP, check_k, resolve_k, topk_mask
from nphcli.engine.planning import Plan, itemsize
from nphcli.engine.selection import running_topk_plan, stable_top
from nphcli.memory.bank import MemoryBank
from nphcli.models.base import HopfieldModel, Update, param
from nphcli.models.registry import register_model


@register_model(
    "topk",
    summary="softmax over each query's k highest-scoring memories; the rest get weight 0",
    formula="T(x) = Vᵀ softmax(β K x) restricted to the k largest scores",
    cost="time O(Q·M·d + Q·M·log k); extra memory O(Q·k) plus blocks of O(Q·B) scores",
)
@dataclass(kw_only=True)
class TopK(HopfieldModel):
    k: float = param(0.2, K_HELP)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.k = check_k(self.k)  # a count as an int

    def check_memory(self, memory: MemoryBank) -> None:
        resolve_k(self.k, memory.num_memories)

    def support_mask(self, scores: Tensor, positions: Tensor) -> Tensor:
        return topk_mask(scores, resolve_k(self.k, scores.shape[1]))

    def update(
        self,
        queries: Tensor,
        bank: MemoryBank,
        positions: Tensor,
        prepared: Any,
        *,
        block_rows: int,
    ) -> Update:
        k = resolve_k(self.k, bank.num_memories)
        # (Q, k) unscaled scores xᵀk: β > 0 does not change the order. FAISS or torch.
        scores, index = exact_topk(queries, bank, k, block_rows=block_rows)
        weights = torch.softmax(self.beta * scores, dim=1)  # (Q, k)
        support = positions.new_full((queries.shape[0],), k)  # (Q,)
        patterns = weighted_rows(bank, index, weights, block_rows=block_rows)  # (Q, d_v)
        return Update(patterns, support=support)

    def candidate_rule(self, num_memories: int) -> CandidateRule:
        """Softmax over the k best candidates; exact when all others score below the k-th."""
        k = resolve_k(self.k, num_memories)

        def apply(scores: Tensor) -> tuple[Tensor, Tensor]:
            kept = min(k, scores.shape[1])
            order = stable_top(scores, kept)
            top = scores.gather(1, order)  # (Q, k)
            weights = torch.zeros_like(scores).scatter(1, order, torch.softmax(self.beta * top, 1))
            cut = top[:, -1] if kept == k else torch.full_like(top[:, 0], -torch.inf)  # (Q,)
            return weights, cut

        return CandidateRule(minimum=k, report_k=k, apply=apply)

    def plan(self, num_queries: int, bank: MemoryBank, budget: int) -> Plan:
        """The running top-k's blocks (`selection.running_topk_plan`)."""
        k = resolve_k(self.k, bank.num_memories)
        return running_topk_plan(num_queries, bank, budget, k, self.working_set(bank))

    def working_set(self, bank: MemoryBank) -> tuple[int, int]:
        size = itemsize(bank.dtype)
        k = resolve_k(self.k, bank.num_memories)
        # Running top-k: kept (k) and merged (2k) scores with int64 indices, and the sort order.
        return (bank.dim + 2 * bank.value_dim + 3 * k) * size + 5 * k * 8, 3 * size
