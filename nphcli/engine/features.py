"""The kernel feature models' core (`linear`, `random-feature`): with log-features a(k) (M, F) and
a(x) (Q, F), T(x) = Σ_μ ⟨e^a(x), e^a(k_μ)⟩ v_μ / Σ_μ ⟨e^a(x), e^a(k_μ)⟩ factorises into an
(F, d_v) summary and an (F,) normaliser of the memories (`summarise_keys`), read per query.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import torch
from torch import Tensor

from nphcli.engine.planning import Plan, itemsize, plan_rows
from nphcli.engine.precision import accumulation_dtype
from nphcli.memory.bank import MemoryBank
from nphcli.memory.collective import Collective


class FeatureSummary(NamedTuple):
    """The memories folded into feature space: everything a query's readout needs."""

    column_max: Tensor  # (F,) c_j = max_μ a_μj, the shift that keeps exponents ≤ 0
    summary: Tensor  # (F, d_v) Σ_μ e^(a_μ − c) v_μᵀ
    normaliser: Tensor  # (F,) Σ_μ e^(a_μ − c), each entry ≥ 1


def summarise_keys(blocks: Iterable[tuple[Tensor, Tensor]]) -> FeatureSummary:
    """Fold blocks of (key log-features (B, F), values (B, d_v)) into a `FeatureSummary`, the
    shift c a running column maximum as in online softmax (detached: it cancels in `readout`)."""
    column_max = summary = normaliser = None
    for key_logits, values in blocks:
        block_max = key_logits.amax(dim=0).detach()  # (F,)
        if column_max is None:
            new_max = block_max
            summary = values.new_zeros(key_logits.shape[1], values.shape[1])  # (F, d_v)
            normaliser = values.new_zeros(key_logits.shape[1])  # (F,)
            rescale = torch.zeros_like(new_max)
        else:
            new_max = torch.maximum(column_max, block_max)  # (F,)
            rescale = torch.exp(column_max - new_max)  # (F,), ≤ 1
        key_features = torch.exp(key_logits - new_max)  # (B, F), exponents ≤ 0
        summary = summary * rescale[:, None] + key_features.T @ values
        normaliser = normaliser * rescale + key_features.sum(dim=0)
        column_max = new_max
        del key_logits, values, key_features  # freed before the next block is made, not after
    return FeatureSummary(column_max, summary, normaliser)


def merge_summaries(keys: FeatureSummary, collective: Collective) -> FeatureSummary:
    """Add up the ranks' summaries, rescaled to the global column maximum."""
    if collective.world_size == 1:
        return keys
    column_max = collective.all_max(keys.column_max)  # (F,)
    rescale = torch.exp(keys.column_max - column_max)  # (F,)
    packed = torch.cat([keys.summary * rescale[:, None], (keys.normaliser * rescale)[:, None]], 1)
    packed = collective.all_sum(packed)  # (F, d_v + 1)
    return FeatureSummary(column_max, packed[:, :-1], packed[:, -1])


def readout(query_logits: Tensor, keys: FeatureSummary) -> Tensor:
    """T = Σ_μ ⟨e^a(x), e^a(k_μ)⟩ v_μ / Σ_μ ⟨e^a(x), e^a(k_μ)⟩ for query log-features (Q, F).

    Query column j is multiplied by the e^c_j the keys were divided by, then each row by its
    own maximum (it cancels): every exponent is ≤ 0 and the denominator ≥ 1, at any β.
    """
    shifted = query_logits + keys.column_max  # (Q, F)
    row_max = shifted.amax(dim=1, keepdim=True).detach()  # (Q, 1)
    query_features = torch.exp(shifted - row_max)  # (Q, F), each row's maximum is 1
    numerator = query_features @ keys.summary  # (Q, d_v)
    denominator = query_features @ keys.normaliser  # (Q,)
    return numerator / denominator.unsqueeze(1)  # (Q, d_v)


def feature_readout(query_logits: Tensor, key_logits: Tensor, values: Tensor) -> Tensor:
    """`readout` against all memories at once: key_logits (M, F), values (M, d_v)."""
    return readout(query_logits, summarise_keys([(key_logits, values)]))


def feature_plan(
    num_queries: int, bank: MemoryBank, budget: int, *, features: int, held: int = 0
) -> Plan:
    """Rows per block within `budget`: `prepare` holds a memory block, `update` a query batch,
    never both, each beside `held` and four copies of the summary (while a block is folded in).
    Per row in the compute dtype: a memory d + d_v (bank dtype) + 3F + 2d, a query
    2d + 4F + 2·d_v (counted from the code). Both stop at `CACHE_ROWS`."""
    size, compute = itemsize(bank.dtype), itemsize(accumulation_dtype(bank.dtype))
    d, d_v = bank.dim, bank.value_dim
    room = budget - held - 4 * features * (d_v + 1) * compute
    per_memory = (d + d_v) * size + (3 * features + 2 * d) * compute
    per_query = (2 * d + 4 * features + 2 * d_v) * compute
    return Plan(
        query_rows=plan_rows(room, 1, per_query, total=min(num_queries, CACHE_ROWS)),
        memory_rows=plan_rows(room, 1, per_memory, total=min(bank.num_memories, CACHE_ROWS)),
    )


# Rows per block for the feature models: blocks of a few MB stay in the last-level cache.
CACHE_ROWS = 4096
