"""Retrieval from a candidate set (`nphcli.ann`): weights from the exact scores of a few candidates
per query, and the cut every other memory must score below for the result to be exact. Models
that need every score return None from `candidate_rule`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class CandidateRule:
    """`apply(scores)`: unscaled exact scores (Q, c) (−inf where missing) → the weights (Q, c)
    and the cut (Q,): if every other memory scores strictly below it, the weights are exact
    (−inf: nothing certifies them)."""

    minimum: int  # candidates the rule needs per query (topk: k)
    report_k: int  # the k of the recall@k reported against exact search
    apply: Callable[[Tensor], tuple[Tensor, Tensor]]


REPORT_K = 10  # recall@k reported for rules whose support is not a fixed k


def threshold_rule(
    *, beta: float, alpha: float, simplex_map: Callable[[Tensor], Tensor], num_memories: int
) -> CandidateRule:
    """The rule of α-entmax maps, p_i = [(α−1)·z_i − τ]_+^{1/(α−1)}, z = β·s: the cut is
    min over the support of τ/(α−1) = z_i − p_i^{α−1}/(α−1), over β; none at α = 1. Missing
    candidates get z = max z − 1/(α−1) − 1, below any threshold, so no −inf enters the map."""

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
