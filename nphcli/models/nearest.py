"""Nearest-neighbour retrieval: the stored pattern closest to the query, the honest baseline.

T(x) = v_μ*, μ* = argmin_μ ‖x − ξ_μ‖₂ or argmax_μ cos(x, ξ_μ), ties to the lower index: the β → ∞
limit of top-1, exact and blockwise (`engine.baselines.nearest_index`). No β, steps, tol or layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.engine.baselines import METRICS, nearest_index
from nphcli.engine.planning import Plan, itemsize
from nphcli.engine.precision import accumulation_dtype
from nphcli.engine.selection import running_topk_plan
from nphcli.memory.bank import MemoryBank
from nphcli.models.base import Retriever, Update, param
from nphcli.models.registry import register_model


@register_model(
    "nearest",
    summary="baseline: the stored pattern nearest to the query (Euclidean or cosine)",
    formula="T(x) = v_μ*, μ* = argmin_μ ‖x − ξ_μ‖ (or argmax_μ cos(x, ξ_μ))",
    cost="time O(Q·M·d); extra memory O(Q) plus blocks of O(Q·B) scores",
)
@dataclass(kw_only=True)
class Nearest(Retriever):
    baseline = True
    metric: str = param("euclidean", "distance for the nearest stored pattern: euclidean or cosine")

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise NphError(f"--metric must be one of {', '.join(METRICS)}, got {self.metric!r}")

    def update(
        self,
        queries: Tensor,
        bank: MemoryBank,
        positions: Tensor,
        prepared: Any,
        *,
        block_rows: int,
    ) -> Update:
        index = nearest_index(queries, bank, self.metric, block_rows=block_rows)  # (Q,)
        _, rows = bank.gather(index)  # (Q, d_v): the nearest rows themselves
        patterns = rows.to(device=queries.device, dtype=accumulation_dtype(queries.dtype))
        return Update(patterns, support=positions.new_ones(queries.shape[0]))

    def plan(self, num_queries: int, bank: MemoryBank, budget: int) -> Plan:
        return running_topk_plan(num_queries, bank, budget, 1, self.working_set(bank))

    def working_set(self, bank: MemoryBank) -> tuple[int, int]:
        size = itemsize(bank.dtype)
        # Per pair: the score, its biased copy and the key norms' broadcast; per query the
        # running best (score, index) and the output.
        return (bank.dim + 2 * bank.value_dim + 3) * size + 5 * 8, 3 * max(size, 4)
