"""Random-masked Hopfield retrieval (BigBird-like): softmax over k memories drawn per query.

Each query keeps a uniformly random k-subset (`masks.random_choice`: Floyd's draws for small k,
else the k smallest hashes), a pure function of (seed, position, M, k): independent of batching
and fixed across steps. The support is k. For k ≤ M/8 only the chosen memories are gathered;
above, every memory is scored and masked (fused attention with an additive mask, or blockwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own convention)
from torch import Tensor

from nphcli.engine.attention import fused_attention_chosen, gathered_attention, masked_attention
from nphcli.engine.blocks import gathers
from nphcli.engine.functional import masked_softmax
from nphcli.engine.hashing import query_state
from nphcli.engine.masks import (
    K_HELP,
    check_k,
    floyd_draws,
    mask_key_bytes,
    random_bias,
    random_choice,
    random_keep,
    random_mask,
    resolve_k,
    uses_floyd,
)
from nphcli.engine.planning import Plan, itemsize, plan_rows
from nphcli.memory.bank import MemoryBank
from nphcli.models.base import HopfieldModel, Update, param
from nphcli.models.inputs import check_whole
from nphcli.models.registry import register_model


@register_model(
    "random",
    summary="softmax over k memories drawn per query by a seeded hash (BigBird-like random mask)",
    formula="T(x) = Vᵀ softmax(β K x) restricted to k random memories R(seed, position)",
    cost=(
        "time O(Q·k·(k + d)) for k ≤ 256 and 64·k ≤ M, O(Q·M + Q·k·d) for k ≤ M/8, "
        "else O(Q·M·d) masked; "
        "extra memory O(Q·k + Q·B), O(Q·M) masked"
    ),
)
@dataclass(kw_only=True)
class RandomMask(HopfieldModel):
    k: float = param(0.2, K_HELP)
    seed: int = param(0, "seed of the random masks; each query's mask depends on it and its row")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.k = check_k(self.k)  # a count as an int
        check_whole(self.seed, "--seed", 0, 2**64)

    def check_memory(self, memory: MemoryBank) -> None:
        resolve_k(self.k, memory.num_memories)

    def support_mask(self, scores: Tensor, positions: Tensor) -> Tensor:
        num_memories = scores.shape[1]
        return random_mask(self.seed, positions, num_memories, resolve_k(self.k, num_memories))

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
        support = positions.new_full((queries.shape[0],), k)  # (Q,)
        num_memories = bank.num_memories
        if gathers(k, num_memories):  # (every k that `uses_floyd` gathers: 64·k ≤ M)
            if uses_floyd(num_memories, k) and positions.shape[0] * k <= HOST_FLOYD_MAX_DRAWS:
                chosen = floyd_host(self.seed, positions, num_memories, k)
            else:
                chosen = random_choice(self.seed, positions, num_memories, k, block_rows=block_rows)
            patterns = gathered_attention(queries, bank, chosen, None, beta=self.beta)
        else:
            if block_rows >= num_memories and fused_attention_chosen(bank, 1):
                keys, values = bank.resident()
                bias = random_bias(self.seed, positions, num_memories, k, queries.dtype)
                patterns = F.scaled_dot_product_attention(
                    queries[None], keys[None], values[None], attn_mask=bias, scale=self.beta
                )[0]  # (Q, d_v); torch's fused kernel, the mask added inside its tiles
            else:
                mask = random_keep(self.seed, positions, num_memories, k)  # (Q, M)
                patterns, _ = masked_attention(
                    queries,
                    bank,
                    lambda start, rows: mask[:, start : start + rows],
                    beta=self.beta,
                    block_rows=block_rows,
                )
        return Update(patterns, support=support)  # (Q, d_v)

    def working_set(self, bank: MemoryBank) -> tuple[int, int]:
        size, k = itemsize(bank.dtype), resolve_k(self.k, bank.num_memories)
        row_bytes = (bank.dim + 2 * bank.value_dim) * size
        if gathers(k, bank.num_memories):
            # The running k smallest hashes, indices and gathered rows; per pair, hash scratch.
            return row_bytes + 4 * k * 8 + k * (bank.dim + bank.value_dim + 2) * size, 4 * 8
        # A row of the (Q, M) mask and of its keys; per pair, a score's temporaries and a mask.
        mask_bytes = bank.num_memories * size + mask_key_bytes(bank.device, bank.num_memories)
        return row_bytes + mask_bytes, 4 * size + 1

    def plan(self, num_queries: int, bank: MemoryBank, budget: int) -> Plan:
        """All memories at once where the fused kernel scores them (only the mask grows with M)."""
        k = resolve_k(self.k, bank.num_memories)
        if not gathers(k, bank.num_memories) and fused_attention_chosen(bank, 1):
            row_bytes, _ = self.working_set(bank)
            rows = plan_rows(budget, 1, row_bytes, total=num_queries)
            return Plan(query_rows=rows, memory_rows=bank.num_memories)
        return super().plan(num_queries, bank, budget)

    # -- functional form (the layers) ---------------------------------------------------------
    def weights(self, scores: Tensor, valid: Tensor, positions: Tensor) -> Tensor:
        """Softmax over each query's random k-subset (B, H, N, M), drawn once for all sets when
        none is padded (else per set, by the default)."""
        if not bool(valid.all()):
            return super().weights(scores, valid, positions)
        num_keys = scores.shape[-1]
        keep = random_mask(self.seed, positions, num_keys, resolve_k(self.k, num_keys))  # (N, M)
        return masked_softmax(scores, keep[None, None])


# Up to this many draws (Q·k), Floyd's steps run in Python integers: the tensor form's ~250 small
# launches at k = 10 made one query on a GPU cost more than scoring 10⁶ memories.
HOST_FLOYD_MAX_DRAWS = 256


def floyd_host(seed: int, positions: Tensor, num_memories: int, k: int) -> Tensor:
    """`masks.floyd_subset` in Python integers, the same arithmetic on the same words."""
    rows = []
    for position in positions.tolist():
        state = query_state(seed, position)
        chosen: set[int] = set()
        for j in range(num_memories - k, num_memories):
            draw = floyd_draws(state, j)
            chosen.add(j if draw in chosen else draw)
        rows.append(sorted(chosen))
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, k).to(positions.device)  # (Q, k)
