"""What every retrieval rule shares (`Retriever`: checks, planning, iterated retrieval) and what
the Hopfield family adds (`HopfieldModel`: β, steps, tol). A model implements `update`, one
application of T to a block of queries. Keys `(M, d)`, values `(M, d_v)`, queries `(Q, d)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from nphcli.core.defaults import DEFAULT_BETA
from nphcli.core.errors import NphError
from nphcli.engine import energy as en
from nphcli.engine.candidate_rule import CandidateRule
from nphcli.engine.functional import masked_softmax
from nphcli.engine.planning import Plan, itemsize, plan_blocks
from nphcli.engine.precision import HALF_DTYPES
from nphcli.memory.bank import MemoryBank
from nphcli.models.inputs import check_budget, check_inputs, check_output, check_whole, is_real


def param(default: Any, help: str) -> Any:
    """A model parameter: a dataclass field whose `help` feeds `nph models`, --help, the README."""
    return field(default=default, metadata={"help": help})


@dataclass
class Retrieval:
    """The result of retrieving Q queries."""

    patterns: Tensor  # (Q, d_v) retrieved patterns T^t(x), in the input's dtype and device
    steps: Tensor  # (Q,) int64: update steps applied to each query
    support: Tensor | None = None  # (Q,) int64: memories with non-zero weight at the last step


@dataclass(frozen=True)
class Update:
    """One application of T to a block of queries."""

    patterns: Tensor  # (Q, d_v)
    support: Tensor | None = None  # (Q,) for models whose weights have exact zeros


STEPS_HELP = "maximum number of updates x ← T(x) (1 = the paper's one-step retrieval)"
TOL_HELP = "stop iterating a query once ‖T(x) − x‖₂ ≤ tol (0: run all steps unless fixed)"


@dataclass(kw_only=True)
class Retriever:
    """Base class of every retrieval rule; an iterated one declares `steps` and `tol`."""

    name: ClassVar[str] = "base"
    # A baseline (nearest neighbour, the classical networks) is compared with the Hopfield models
    # on every surface but has no layer form, support set or energy of the family.
    baseline: ClassVar[bool] = False
    # The memories must be ±1 patterns (the classical networks); `check_memory` refuses others.
    binary: ClassVar[bool] = False

    def __post_init__(self) -> None:
        """Check the parameters (subclasses add theirs)."""

    @property
    def steps(self) -> int:
        """Updates x ← T(x) at most: one, unless the rule declares `steps`."""
        return 1

    @property
    def tol(self) -> float:
        """Change below which a query stops iterating: 0, unless the rule declares `tol`."""
        return 0.0

    # -- to implement -------------------------------------------------------------------------
    def update(
        self,
        queries: Tensor,
        bank: MemoryBank,
        positions: Tensor,
        prepared: Any,
        *,
        block_rows: int,
    ) -> Update:
        """One application of T to queries (Q, d), reading `bank` in blocks of `block_rows`.
        `positions` (Q,): the queries' global rows (window, random); `prepared`: `prepare`'s."""
        raise NotImplementedError

    def prepare(self, bank: MemoryBank, block_rows: int) -> Any:
        """Work on the memories alone, once per `retrieve`, reused by every batch and step."""
        return None

    def working_set(self, bank: MemoryBank) -> tuple[int, int]:
        """Bytes `update` needs per query and per (query, memory) pair of a block."""
        size = itemsize(bank.dtype)
        return (bank.dim + 2 * bank.value_dim + 8) * size, 4 * size

    def plan(self, num_queries: int, bank: MemoryBank, budget: int) -> Plan:
        """Query batch and memory block sizes that keep `update`'s working set within `budget`."""
        row_bytes, cell_bytes = self.working_set(bank)
        return plan_blocks(num_queries, bank, budget, row_bytes=row_bytes, cell_bytes=cell_bytes)

    def check_memory(self, memory: MemoryBank) -> None:
        """Reject parameters that do not fit this memory (e.g. k > M), before any work."""

    def support_mask(self, scores: Tensor, positions: Tensor) -> Tensor | None:
        """The support 𝓜(x) of a sparse-structured model (softmax over 𝓜(x)) as a (Q, M) bool
        mask from unscaled scores (Q, M) and positions (Q,); None for other models."""
        return None

    def energy(self, queries: Tensor, memories: Tensor, positions: Tensor) -> Tensor | None:
        """E(x) (Q,) float64 whose concave–convex step is this update, or None; default, over a
        `support_mask`: −(1/β)·log Σ_{μ∈S(x)} exp(β⟨ξ_μ, x⟩) + ½‖x‖²."""
        if not self._has_support():
            return None
        x, X = queries.to(torch.float64), memories.to(torch.float64)  # (Q, d), (M, d)
        return en.energy(x, X, self.beta, support=self.support_mask(x @ X.T, positions))

    def candidate_rule(self, num_memories: int) -> CandidateRule | None:
        """How to retrieve from each query's best candidates alone (`--index`), or None."""
        return None

    # -- the functional form: one step on a padded batch, differentiable (the layers) ---------
    def weights(self, scores: Tensor, valid: Tensor, positions: Tensor) -> Tensor:
        """The weights (B, H, N, M) from scores β·⟨x, k⟩ of B sets padded to M keys (`valid`
        (B, M)), H heads, N queries at `positions`: on each set's valid keys what `update`
        gives, padded keys 0. Default: softmax over each set's `support_mask`."""
        if self.baseline:
            raise NphError(
                f"model {self.name!r} is a retrieval baseline with no layer form; use one of "
                "the Hopfield models in a layer"
            )
        if not self._has_support():
            raise NphError(
                f"model {self.name!r} has no layer form: it needs `weights` or `associate` "
                "(see Retriever) or a `support_mask`"
            )
        return masked_softmax(scores, padded_support(self, scores, valid, positions))

    def associate(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        beta: Tensor,
        valid: Tensor,
        positions: Tensor,
        dropout: Callable[[Tensor], Tensor] | None = None,
    ) -> Tensor:
        """T(β q kᵀ) v: q (B, H, N, d), k (B, H, M, d), v (B, H, M, d_v) -> (B, H, N, d_v), `beta`
        0-d or (H, 1, 1), `valid` and `positions` as in `weights`, `dropout` on the weights.
        Rules that form no weights (the feature models) override this instead of `weights`."""
        scores = beta * (q @ k.transpose(-1, -2))  # (B, H, N, M)
        weights = self.weights(scores, valid, positions)  # (B, H, N, M)
        return (dropout(weights) if dropout else weights) @ v  # (B, H, N, d_v)

    def _has_support(self) -> bool:
        return type(self).support_mask is not Retriever.support_mask

    # -- shared -------------------------------------------------------------------------------
    def retrieve(
        self,
        queries: Tensor,
        memory: Tensor | MemoryBank,
        values: Tensor | None = None,
        *,
        positions: Tensor | None = None,
        memory_budget: int | None = None,
        plan: Plan | None = None,
    ) -> Retrieval:
        """x ← T(x) up to `steps` times for `queries` (Q, d), a query stopping once
        ‖T(x) − x‖₂ ≤ tol, from keys (M, d) with optional `values` (M, d_v) or a `MemoryBank`.
        `memory_budget` (bytes) bounds the working memory (batches and blocks: speed, not
        results); `plan` overrides the sizes."""
        queries, bank = check_inputs(queries, memory, values)
        self.check_memory(bank)
        if self.steps > 1 and bank.value_dim != bank.dim:
            raise NphError(
                f"--steps {self.steps} needs values in the key space (d_v = d), but d = "
                f"{bank.dim} and d_v = {bank.value_dim}; use --steps 1 for hetero-association"
            )
        budget = check_budget(memory_budget)
        num_queries = queries.shape[0]
        if num_queries == 0:  # nothing to retrieve: an empty (0, d_v) answer, not an error
            empty = torch.empty(0, bank.value_dim, dtype=queries.dtype, device=queries.device)
            return Retrieval(patterns=empty, steps=torch.zeros(0, dtype=torch.int64), support=None)
        if positions is None:
            positions = torch.arange(num_queries, device=queries.device)
        if bank.dtype != queries.dtype:
            bank = bank.to(dtype=queries.dtype)
        if plan is None:
            # Half inputs keep scores and sums in float32: half the budget covers the width.
            half = queries.dtype in HALF_DTYPES
            plan = self.plan(num_queries, bank, max(1, budget // 2) if half else budget)
        prepared = self.prepare(bank, plan.memory_rows)

        state = queries
        steps = torch.zeros(num_queries, dtype=torch.int64, device=queries.device)
        support = None
        active = torch.arange(num_queries, device=queries.device)  # (A,) rows still iterating
        for _ in range(self.steps):
            patterns, step_support = self._update_batches(
                state, active, bank, positions, prepared, plan
            )
            if self.steps == 1:  # one step updates every row: nothing to compare or index
                support = None if step_support is None else step_support.to(torch.int64)
                state = patterns
                steps.add_(1)
                break
            if step_support is not None:
                if support is None:
                    support = torch.zeros(num_queries, dtype=torch.int64, device=queries.device)
                support[active] = step_support.to(torch.int64)
            steps[active] += 1
            change = torch.linalg.vector_norm(patterns - state[active], dim=1)  # (A,)
            if active.numel() == num_queries:  # every row updated (always on the first step)
                state = patterns
            else:
                state = state.clone()
                state[active] = patterns
            active = active[change > self.tol]
            if active.numel() == 0:
                break
        result = state.to(queries.dtype)
        check_output(result, (("queries", queries), ("memories", bank)))
        return Retrieval(patterns=result, steps=steps, support=support)

    def _update_batches(
        self,
        state: Tensor,
        active: Tensor,
        bank: MemoryBank,
        positions: Tensor,
        prepared: Any,
        plan: Plan,
    ) -> tuple[Tensor, Tensor | None]:
        """T on the rows `active` of `state`, in batches written into one output: (A, d_v) and
        the support (A,) or None."""
        patterns = support = None
        every_row = active.numel() == state.shape[0]  # then batches are slices, not copies
        for start in range(0, active.numel(), plan.query_rows):
            rows = active[start : start + plan.query_rows]  # (B,)
            stop = start + rows.numel()
            batch = state[start:stop] if every_row else state[rows]  # (B, d)
            where = positions[start:stop] if every_row else positions[rows]  # (B,)
            step = self.update(batch, bank, where, prepared, block_rows=plan.memory_rows)
            if rows.numel() == active.numel():
                return step.patterns, step.support
            if patterns is None:
                patterns = step.patterns.new_empty(active.numel(), step.patterns.shape[1])
                if step.support is not None:
                    support = step.support.new_empty(active.numel())
            patterns[start:stop] = step.patterns
            if support is not None:
                support[start:stop] = step.support
        return patterns, support


@dataclass(kw_only=True)
class HopfieldModel(Retriever):
    """A rule of the Hopfield family: scores β⟨x, ξ⟩, iterated up to `steps` times."""

    beta: float = param(DEFAULT_BETA, "inverse temperature β; scores are S = β·X·Kᵀ")
    steps: int = param(1, STEPS_HELP)  # type: ignore[assignment]  (the base's fixed 1)
    tol: float = param(0.0, TOL_HELP)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if not (is_real(self.beta) and self.beta > 0):
            raise NphError(f"--beta must be a finite number > 0, got {self.beta!r}")
        check_iteration(self.steps, self.tol)


def check_iteration(steps: Any, tol: Any) -> None:
    """Refuse steps that are not a whole number ≥ 1 and a tol that is not a number ≥ 0."""
    check_whole(steps, "--steps", 1)
    if not (is_real(tol) and tol >= 0):
        raise NphError(f"--tol must be a finite number ≥ 0, got {tol!r}")


def padded_support(model: Retriever, scores: Tensor, valid: Tensor, positions: Tensor) -> Tensor:
    """`model.support_mask` of every set of a padded batch (B, H, N, M), False at padding; sets
    of one size are asked together about their valid keys, moved to the front."""
    batch, heads, num_queries, num_keys = scores.shape
    scores = scores.detach()  # a support is piecewise constant: it carries no gradient
    if bool(valid.all()):
        rows = scores.reshape(-1, num_keys)  # (B·H·N, M)
        return model.support_mask(rows, positions.repeat(batch * heads)).view(scores.shape)
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices  # (B, M) valid first
    order = order[:, None, None, :].expand_as(scores)  # (B, H, N, M)
    compact = scores.gather(-1, order)  # (B, H, N, M), set b's valid keys at 0 … n_b − 1
    keep = torch.zeros_like(scores, dtype=torch.bool)  # (B, H, N, M), in compact order
    sizes = valid.sum(dim=1)  # (B,)
    for size in sizes.unique().tolist():
        sets = torch.nonzero(sizes == size).squeeze(1)  # (S,) the sets with `size` keys
        rows = compact[sets, ..., :size].reshape(-1, size)  # (S·H·N, n)
        support = model.support_mask(rows, positions.repeat(sets.numel() * heads))
        keep[sets, ..., :size] = support.view(sets.numel(), heads, num_queries, size)
    return torch.zeros_like(keep).scatter_(-1, order, keep)  # back to index order


def forms_weights(model: Retriever) -> bool:
    """Whether the rule is weights (N, M) times the values (the default `associate`)."""
    return type(model).associate is Retriever.associate
