"""Random-masked Hopfield retrieval (BigBird-like): softmax over k memories drawn per query.

Each query keeps the k memories with the smallest hash h(seed, query position, memory index)
(`masks.random_mask`), a uniformly random k-subset; all others get weight exactly 0. Because the
mask is a pure function of (seed, position, index), it does not depend on how queries are
batched or memories blocked, and it does not change between iteration steps: T is one fixed
map, so its fixed points are well defined. A different `--seed` draws different subsets.
The reported support is k (the kept memories, even where a weight underflows to 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from nphcli.errors import NphError
from nphcli.models.base import HopfieldModel, Update, param
from nphcli.models.functional import masked_softmax
from nphcli.models.masks import K_HELP, check_k, random_mask, resolve_k
from nphcli.models.registry import register_model


@register_model(
    "random",
    summary="softmax over k memories drawn per query by a seeded hash (BigBird-like random mask)",
    formula="T(x) = Vᵀ softmax(β K x) restricted to k random memories R(seed, position)",
    cost="time O(Q·M·d), all scores computed then masked; scores and mask O(Q·M)",
)
@dataclass(kw_only=True)
class RandomMask(HopfieldModel):
    k: float = param(0.2, K_HELP)
    seed: int = param(0, "seed of the random masks; each query's mask depends on it and its row")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_k(self.k)
        seed = self.seed
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise NphError(f"--seed must be a whole number in [0, 2^64), got {seed!r}")

    def check_memory(self, num_memories: int, dim: int) -> None:
        resolve_k(self.k, num_memories)

    def update(self, queries: Tensor, keys: Tensor, values: Tensor, positions: Tensor) -> Update:
        k = resolve_k(self.k, keys.shape[0])
        scores = self.beta * (queries @ keys.T)  # (Q, M)
        mask = random_mask(self.seed, positions, keys.shape[0], k)  # (Q, M)
        weights = masked_softmax(scores, mask)  # (Q, M)
        support = positions.new_full((queries.shape[0],), k)  # (Q,)
        return Update(weights @ values, support=support)  # (Q, d_v)
