"""α-entmax Hopfield retrieval: interpolates between dense (α = 1) and sparse (α = 2) retrieval.

α-entmax maximises pᵀs plus a Tsallis entropy of order α over the simplex. For α > 1 it gives
memories below a per-query threshold weight exactly 0, with a support that shrinks as α grows;
the threshold is found by bisection (see `functional.entmax_bisect`), exactly, on each query's
largest scores collected over memory blocks (`candidates.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from nphcli.engine import energy as en
from nphcli.engine.candidate_rule import CandidateRule, threshold_rule
from nphcli.engine.candidates import candidate_update, candidate_working_set
from nphcli.engine.functional import entmax_bisect
from nphcli.errors import NphError
from nphcli.memory.bank import MemoryBank
from nphcli.models.base import HopfieldModel, Update, param
from nphcli.models.registry import register_model


@register_model(
    "entmax",
    summary="α-entmax over all memories: softmax at α = 1, sparsemax at α = 2 (Peters et al. 2019)",
    formula="T(x) = Vᵀ α-entmax(β K x)",
    cost=(
        "time O(Q·M·d + Q·c·b), b = 26 (float32) or 55 (float64) bisection steps, c ≥ support "
        "candidates; extra memory O(Q·c + Q·B)"
    ),
)
@dataclass(kw_only=True)
class Entmax(HopfieldModel):
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
                queries,
                bank,
                beta=self.beta,
                simplex_map=lambda scores: entmax_bisect(scores, self.alpha),
                block_rows=block_rows,
            )
        )

    def energy(self, queries: Tensor, memories: Tensor, positions: Tensor) -> Tensor:
        """−(1/β)·Ψ*_α(β·X·x) + ½‖x‖², Ψ*_α the conjugate of the Tsallis negentropy of order α
        (log-sum-exp at α = 1; `nphcli.engine.energy`)."""
        return en.energy(queries, memories, self.beta, alpha=float(self.alpha))

    def candidate_rule(self, num_memories: int) -> CandidateRule:
        """The map on the candidates' exact scores; exact when every other memory scores below
        the threshold."""
        return threshold_rule(
            beta=self.beta,
            alpha=float(self.alpha),
            simplex_map=lambda scores: entmax_bisect(scores, self.alpha),
            num_memories=num_memories,
        )

    def working_set(self, bank: MemoryBank) -> tuple[int, int]:
        return candidate_working_set(bank)

    # -- functional form (the layers) ---------------------------------------------------------
    def weights(self, scores: Tensor, valid: Tensor, positions: Tensor) -> Tensor:
        """α-entmax of each row (B, H, N, M), padded keys at −∞ (weight 0)."""
        filled = scores.masked_fill(~valid[:, None, None, :], -math.inf)  # (B, H, N, M)
        flat = filled.reshape(-1, filled.shape[-1])  # (B·H·N, M): entmax_bisect works on rows
        return entmax_bisect(flat, self.alpha).reshape(filled.shape)
