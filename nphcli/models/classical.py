"""Classical Hopfield networks (Hopfield 1982) on ±1 patterns: the baselines of the family.

s = sgn(x) (0 → +1) is updated with a d×d weight matrix W (`engine.baselines`): all neurons at
once (`--order sync`) or one at a time in an order drawn once from `--order-seed`; a zero field
keeps the state. One step is one sweep. Memories must be ±1 and auto-associative; no β.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.core.resources import human_bytes
from nphcli.engine.baselines import (
    asynchronous_sweep,
    binary_state,
    gram,
    hebbian_couplings,
    projection_weights,
    synchronous_step,
)
from nphcli.engine.planning import Plan, itemsize
from nphcli.engine.precision import accumulation_dtype
from nphcli.engine.summary_cache import cached_summary
from nphcli.memory.bank import MemoryBank, as_bank
from nphcli.models.base import (
    STEPS_HELP,
    TOL_HELP,
    Retriever,
    Update,
    check_iteration,
    check_whole,
    param,
)
from nphcli.models.registry import register_model

ORDERS = ("sync", "async")
ORDER_HELP = "update order: sync (every neuron at once) or async (one at a time, seeded order)"
ORDER_SEED_HELP = "seed of the asynchronous update order (--order async)"
BINARISE = (
    "binarise it first, e.g. `nph store random --distribution binary`, or store sign(x − mean) "
    "of your patterns (every entry −1 or +1)"
)


@dataclass(kw_only=True)
class ClassicalNetwork(Retriever):
    """What the two learning rules share; a subclass says how W comes from the Gram matrix."""

    baseline = True
    binary = True
    steps: int = param(1, STEPS_HELP)  # type: ignore[assignment]  (the base's fixed 1)
    tol: float = param(0.0, TOL_HELP)  # type: ignore[assignment]
    order: str = param("sync", ORDER_HELP)
    order_seed: int = param(0, ORDER_SEED_HELP)

    def __post_init__(self) -> None:
        check_iteration(self.steps, self.tol)
        if self.order not in ORDERS:
            raise NphError(f"--order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        check_whole(self.order_seed, "--order-seed", 0, 2**63)

    def learn(self, g: Tensor) -> Tensor:
        """W (d, d) float64 from G = Ξᵀ Ξ (d, d) float64."""
        raise NotImplementedError

    def couplings(self, bank: MemoryBank, block_rows: int) -> Tensor:
        """`learn(G)` (d, d) float64 for this memory, kept (`summary_cache`) except over ranks,
        where a hit on one rank and a miss on another would leave the sum of G waiting."""
        build = lambda: self.learn(gram(bank, block_rows=block_rows))  # noqa: E731
        if bank.collective.world_size > 1:
            return build()
        return cached_summary(bank, (self.name, "couplings", block_rows), build)

    def coupling_scale(self, dim: int) -> float:
        """W = scale · `learn(G)`: `learn` may leave out a positive factor that changes no sign."""
        return 1.0

    def energy(self, queries: Tensor, memories: Tensor, positions: Tensor) -> Tensor:
        """E(s) = −½ sᵀ W s (Q,) float64 at s = sgn(x) (Hopfield 1982)."""
        bank = as_bank(memories)
        weights = self.couplings(bank, bank.num_memories) * self.coupling_scale(bank.dim)
        state = binary_state(queries.to(torch.float64))  # (Q, d)
        return -0.5 * ((state @ weights) * state).sum(dim=1)

    def check_memory(self, memory: MemoryBank) -> None:
        if memory.hetero or memory.value_dim != memory.dim:
            raise NphError(
                f"model {self.name!r} is auto-associative: its memories are their own values; "
                "drop the separate values"
            )
        for _, keys in memory.key_blocks(max(1, (1 << 24) // max(1, memory.dim))):
            if not bool((keys.abs() == 1).all()):
                raise NphError(
                    f"model {self.name!r} stores ±1 patterns only, but this memory holds other "
                    f"values; {BINARISE}"
                )

    def weight_bytes(self, bank: MemoryBank) -> int:
        """W and the float64 Gram matrix and eigensolver workspace that build it."""
        return bank.dim * bank.dim * (itemsize(accumulation_dtype(bank.dtype)) + 3 * 8)

    def plan(self, num_queries: int, bank: MemoryBank, budget: int) -> Plan:
        """W must fit the budget; the rest takes query batches of (Q, d) states and fields."""
        needed = self.weight_bytes(bank)
        if needed > budget:
            raise NphError(
                f"model {self.name!r} needs its {bank.dim}×{bank.dim} weight matrix (about "
                f"{human_bytes(needed)} with its construction) within --memory-budget "
                f"{human_bytes(budget)}; raise --memory-budget to at least {needed}"
            )
        per_query = 4 * bank.dim * itemsize(accumulation_dtype(bank.dtype))
        rows = max(1, min(num_queries, (budget - needed) // per_query))
        return Plan(query_rows=int(rows), memory_rows=max(1, min(bank.num_memories, 4096)))

    def prepare(self, bank: MemoryBank, block_rows: int) -> tuple[Tensor, Tensor | None]:
        """W in the accumulation dtype and, for `async`, the seeded neuron order."""
        weights = self.couplings(bank, block_rows).to(accumulation_dtype(bank.dtype))  # (d, d)
        order = None
        if self.order == "async":
            generator = torch.Generator().manual_seed(self.order_seed)
            order = torch.randperm(bank.dim, generator=generator)  # (d,)
        return weights, order

    def update(
        self,
        queries: Tensor,
        bank: MemoryBank,
        positions: Tensor,
        prepared: Any,
        *,
        block_rows: int,
    ) -> Update:
        weights, order = prepared
        state = binary_state(queries.to(weights.dtype))  # (Q, d) ±1
        if order is None:
            state = synchronous_step(state, weights)
        else:
            state = asynchronous_sweep(state, weights, order)
        return Update(state.to(queries.dtype))


@register_model(
    "hebbian",
    summary="baseline: classical Hopfield network, Hebbian weights, ±1 patterns",
    formula="s ← sgn(W s), W = (Ξᵀ Ξ − diag) / d, s₀ = sgn(x)",
    cost="time O(M·d²) once for W, then O(Q·d²) per step; extra memory O(d²) for W",
)
@dataclass(kw_only=True)
class Hebbian(ClassicalNetwork):
    learn = staticmethod(hebbian_couplings)

    def coupling_scale(self, dim: int) -> float:
        return 1.0 / dim


@register_model(
    "pseudoinverse",
    summary="baseline: classical Hopfield network, pseudo-inverse (projection) weights, ±1",
    formula="s ← sgn(W s), W = Ξ⁺ Ξ (projection onto the stored patterns), s₀ = sgn(x)",
    cost="time O(M·d² + d³) once for W, then O(Q·d²) per step; extra memory O(d²) for W",
)
@dataclass(kw_only=True)
class PseudoInverse(ClassicalNetwork):
    learn = staticmethod(projection_weights)
