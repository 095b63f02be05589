"""Retrieval from a candidate set: how a sparse-structured model turns the exact scores of a few
candidate memories per query into weights, and what every other memory must score below for the
result to equal retrieval over all M memories.

An approximate nearest-neighbour index (`nphcli.ann`) hands out each query's candidates; the
scores are recomputed exactly from the stored patterns and the model's rule does the rest.
Models that can work this way return a `CandidateRule` from `HopfieldModel.candidate_rule`;
models that need every score (dense, kernels, window, random masks) return None.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class CandidateRule:
    """Weights over candidate memories and the cut score of exactness.

    `apply(scores)` takes unscaled exact scores ⟨x, ξ⟩ of each query's candidates (Q, c), −inf
    where the index found fewer than c, and returns the weights (Q, c) (a point of the simplex)
    and the cut (Q,): if every memory outside the candidate set scores strictly below the cut,
    the weights are those of the full problem over all M memories. A cut of −inf means no bound
    can certify the result (e.g. softmax, where every memory has weight).
    """

    minimum: int  # candidates the rule needs per query (topk: k)
    report_k: int  # the k of the recall@k reported against exact search
    apply: Callable[[Tensor], tuple[Tensor, Tensor]]


# Recall@k reported for rules whose support is not a fixed k (the usual 10-NN recall).
REPORT_K = 10


def threshold_rule(
    *, beta: float, alpha: float, simplex_map: Callable[[Tensor], Tensor], num_memories: int
) -> CandidateRule:
    """The rule of α-entmax-type maps (sparsemax: α = 2): p_i = [(α−1)·z_i − τ]_+^{1/(α−1)} with
    z = β·s, zero iff z_i ≤ τ/(α−1). On the support, τ/(α−1) = z_i − p_i^{α−1}/(α−1); the cut is
    the smallest of those over the support, divided by β (unscaled). α = 1 (softmax) has no cut.

    Missing candidates get z = max z − 1/(α−1) − 1, below any threshold (p ≤ 1 forces
    τ/(α−1) ≥ max z − 1/(α−1)), so they take weight 0 without −inf entering the map.
    """

    def apply(scores: Tensor) -> tuple[Tensor, Tensor]:
        z = beta * scores  # (Q, c)
        if alpha == 1:
            return simplex_map(z), z.new_full((z.shape[0],), -torch.inf)
        top = z.amax(dim=1, keepdim=True)  # (Q, 1)
        z = torch.where(torch.isfinite(z), z, top - 1 / (alpha - 1) - 1)  # (Q, c)
        weights = simplex_map(z)  # (Q, c)
        level = z - weights.pow(alpha - 1) / (alpha - 1)  # (Q, c) τ/(α−1) on the support
        cut = torch.where(weights > 0, level, torch.inf).amin(dim=1)  # (Q,)
        return weights, cut / beta

    return CandidateRule(minimum=1, report_k=min(REPORT_K, num_memories), apply=apply)
