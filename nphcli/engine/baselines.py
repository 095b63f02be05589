"""Kernels of the baseline rules: exact nearest-neighbour search and classical Hopfield networks.

Nearest neighbour: a running top-1 (`TopKAccumulator`) of a biased score, ties to the lower
index: Euclidean argmax_μ ⟨x, ξ_μ⟩ − ½‖ξ_μ‖², cosine argmax_μ ⟨x, ξ_μ⟩ / ‖ξ_μ‖.

Classical networks (Hopfield 1982) on ±1 patterns, from the Gram matrix G = Ξᵀ Ξ (d, d) in
float64 (exact): Hebbian W = (G − diag G) / d; pseudo-inverse W = V_r V_rᵀ, the projection onto
span{ξ_μ} (Personnaz et al. 1985) from G's eigenvectors above `PROJECTION_RTOL` · λ_max, never
an inverse of the ill-conditioned Ξ Ξᵀ: every stored pattern is a fixed point of sgn(W x).
"""

from __future__ import annotations

import torch
from torch import Tensor

from nphcli.engine.blocks import TopKAccumulator
from nphcli.engine.precision import accumulation_dtype, matmul
from nphcli.memory.bank import MemoryBank

METRICS = ("euclidean", "cosine")
# The pseudo-inverse's rank cut: eigenvalues of G below this share of the largest are zero.
PROJECTION_RTOL = 1e-10


def nearest_scores(queries: Tensor, keys: Tensor, metric: str) -> Tensor:
    """Scores (Q, B) whose row-wise argmax is the nearest key under `metric` (module docstring)."""
    scores = matmul(queries, keys.T)  # (Q, B), float32 at least
    wide = keys.to(scores.dtype)  # (B, d)
    if metric == "euclidean":
        return scores - 0.5 * (wide * wide).sum(dim=1)
    norms = torch.linalg.vector_norm(wide, dim=1)  # (B,)
    return torch.where(
        norms > 0, scores / norms.clamp_min(torch.finfo(wide.dtype).tiny), -torch.inf
    )


def nearest_index(queries: Tensor, bank: MemoryBank, metric: str, *, block_rows: int) -> Tensor:
    """(Q,) int64: each query's nearest memory under `metric`, ties to the lower index."""
    dtype = accumulation_dtype(queries.dtype)  # float32 scores for half inputs
    top = TopKAccumulator(queries.shape[0], 1, device=queries.device, dtype=dtype)
    for start, keys in bank.key_blocks(block_rows):
        top.add(nearest_scores(queries, keys, metric), start)  # (Q, B)
    top.merge(bank.collective)  # rows spread over ranks: the global best
    return top.index[:, 0]


def gram(bank: MemoryBank, *, block_rows: int) -> Tensor:
    """G = Σ_μ ξ_μ ξ_μᵀ (d, d) float64 over every memory (summed over ranks)."""
    total = torch.zeros(bank.dim, bank.dim, dtype=torch.float64, device=bank.device)
    for _, keys in bank.key_blocks(block_rows):
        wide = keys.to(torch.float64)  # (B, d)
        total += wide.T @ wide
    return bank.collective.all_sum(total)


def hebbian_couplings(g: Tensor) -> Tensor:
    """d·W = G − diag G (d, d): without the 1/d, fields of ±1 states are exact integers, so a
    tie is exactly zero in every dtype."""
    return g.clone().fill_diagonal_(0.0)


def projection_weights(g: Tensor) -> Tensor:
    """W = V_r V_rᵀ (d, d): the projection onto the span of the patterns (module docstring)."""
    values, vectors = torch.linalg.eigh(g)  # ascending eigenvalues, orthonormal columns
    if float(values[-1]) <= 0:
        return torch.zeros_like(g)
    kept = vectors[:, values > PROJECTION_RTOL * values[-1]]  # (d, r)
    return kept @ kept.T


def binary_state(queries: Tensor) -> Tensor:
    """s = sgn(x) with sgn(0) = +1: the network's initial ±1 state for a (possibly real) query."""
    return torch.where(queries >= 0, 1.0, -1.0).to(queries.dtype)


def sign_keep(field: Tensor, state: Tensor) -> Tensor:
    """sgn(h), keeping the current state where h = 0 (the usual tie rule of the network)."""
    return torch.where(field > 0, 1.0, torch.where(field < 0, -1.0, state)).to(state.dtype)


def synchronous_step(state: Tensor, weights: Tensor) -> Tensor:
    """One synchronous update of every neuron: s ← sgn(W s) (Q, d), W symmetric."""
    field = matmul(state, weights)  # (Q, d) = (W s)ᵀ per row
    return sign_keep(field, state.to(field.dtype)).to(state.dtype)


def asynchronous_sweep(state: Tensor, weights: Tensor, order: Tensor) -> Tensor:
    """For i in `order` (a permutation of the d neurons) in turn: s_i ← sgn(Σ_j W_ij s_j)."""
    state = state.to(weights.dtype).clone()  # (Q, d)
    for i in order.tolist():
        field = state @ weights[:, i]  # (Q,)
        state[:, i] = sign_keep(field, state[:, i])
    return state
