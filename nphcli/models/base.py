"""What every Hopfield model shares: parameters β, steps, tol; validation; iterated retrieval.

A model only implements `update`, one application of its retrieval rule T to a block of queries.
`retrieve` handles what is common: shape and dtype checks, float32 accumulation for half inputs,
and iteration x ← T(x) with per-query early stopping.

Tensor names are fixed across nph: keys (memories) `(M, d)`, values `(M, d_v)`, queries `(Q, d)`,
scores `(Q, M)`, positions `(Q,)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from nphcli.errors import NphError

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def param(default: Any, help: str) -> Any:
    """A model parameter: a dataclass field whose `help` feeds `nph models`, --help and the README."""
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


@dataclass(kw_only=True)
class HopfieldModel:
    """Base class: parameters shared by every model. Subclasses add their own fields."""

    name: ClassVar[str] = "base"

    beta: float = param(1.0, "inverse temperature β; scores are S = β·X·Kᵀ")
    steps: int = param(
        1, "maximum number of updates x ← T(x) (1 = the paper's one-step retrieval)"
    )
    tol: float = param(
        0.0, "stop iterating a query once ‖T(x) − x‖₂ ≤ tol (0: run all steps unless fixed)"
    )

    def __post_init__(self) -> None:
        if not (isinstance(self.beta, (int, float)) and math.isfinite(self.beta) and self.beta > 0):
            raise NphError(f"--beta must be a finite number > 0, got {self.beta}")
        if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 1:
            raise NphError(f"--steps must be a whole number ≥ 1, got {self.steps}")
        if not (math.isfinite(self.tol) and self.tol >= 0):
            raise NphError(f"--tol must be a finite number ≥ 0, got {self.tol}")

    # -- to implement -------------------------------------------------------------------------
    def update(self, queries: Tensor, keys: Tensor, values: Tensor, positions: Tensor) -> Update:
        """One application of T. `positions` (Q,) are the queries' global row indices, which
        position-aware models (window) and seeded per-query randomness (random) use, so the
        result does not depend on how queries are split into batches."""
        raise NotImplementedError

    def check_memory(self, num_memories: int, dim: int) -> None:
        """Reject parameters that do not fit this memory (e.g. k > M). Default: nothing to check."""

    # -- shared -------------------------------------------------------------------------------
    def retrieve(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor | None = None,
        *,
        positions: Tensor | None = None,
    ) -> Retrieval:
        """Retrieve patterns for `queries` (Q, d) from memories `keys` (M, d) / `values` (M, d_v).

        Applies x ← T(x) up to `steps` times; a query stops once ‖T(x) − x‖₂ ≤ tol. Half-precision
        inputs are computed in float32 and the result is cast back to the input's dtype.
        """
        values = keys if values is None else values
        _check_inputs(queries, keys, values)
        self.check_memory(keys.shape[0], keys.shape[1])
        if self.steps > 1 and values.shape[1] != keys.shape[1]:
            raise NphError(
                f"--steps {self.steps} needs values in the key space (d_v = d), but d = "
                f"{keys.shape[1]} and d_v = {values.shape[1]}; use --steps 1 for hetero-association"
            )
        num_queries = queries.shape[0]
        if positions is None:
            positions = torch.arange(num_queries, device=queries.device)
        out_dtype = queries.dtype
        compute = torch.float32 if queries.dtype in (torch.float16, torch.bfloat16) else None
        if compute is not None:
            queries, keys, values = (t.to(compute) for t in (queries, keys, values))

        state = queries
        steps = torch.zeros(num_queries, dtype=torch.int64, device=queries.device)
        support = None
        active = torch.arange(num_queries, device=queries.device)  # (A,) rows still iterating
        for _ in range(self.steps):
            step = self.update(state[active], keys, values, positions[active])
            if step.support is not None:
                if support is None:
                    support = torch.zeros(num_queries, dtype=torch.int64, device=queries.device)
                support[active] = step.support.to(torch.int64)
            previous = state[active]
            if state.shape[1] != step.patterns.shape[1]:  # one hetero-associative step
                state = step.patterns
            else:
                state = state.clone()
                state[active] = step.patterns
            steps[active] += 1
            if self.steps == 1:
                break
            change = torch.linalg.vector_norm(step.patterns - previous, dim=1)  # (A,)
            active = active[change > self.tol]
            if active.numel() == 0:
                break
        return Retrieval(patterns=state.to(out_dtype), steps=steps, support=support)


def _check_inputs(queries: Tensor, keys: Tensor, values: Tensor) -> None:
    for label, tensor in (("queries", queries), ("memories", keys), ("values", values)):
        if tensor.ndim != 2:
            raise NphError(f"{label} must be a 2-D (rows, dim) tensor, got shape {tuple(tensor.shape)}")
        if tensor.dtype not in FLOAT_DTYPES:
            raise NphError(f"{label} must be floating point, got {tensor.dtype}")
    if keys.shape[0] == 0:
        raise NphError("the memory holds no patterns (M = 0)")
    if queries.shape[1] != keys.shape[1]:
        raise NphError(
            f"queries have dimension {queries.shape[1]} but memories have {keys.shape[1]}"
        )
    if values.shape[0] != keys.shape[0]:
        raise NphError(f"{values.shape[0]} values for {keys.shape[0]} memories; counts must match")
    if not (queries.device == keys.device == values.device):
        raise NphError("queries, memories and values must be on the same device")
