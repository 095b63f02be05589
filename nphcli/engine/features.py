"""Kernel feature models' shared core: memories folded into a feature-space summary once, then
read out per query (`linear`, `random-feature`).

With key log-features a(k) (M, F) and query log-features a(x) (Q, F), both models compute

    T(x) = Σ_μ ⟨e^a(x), e^a(k_μ)⟩ v_μ / Σ_μ ⟨e^a(x), e^a(k_μ)⟩,

which factorises: the memories collapse into an (F, d_v) summary and an (F,) normaliser
(`summarise_keys`), and each query needs only those (`readout`). No (Q, M) score matrix is formed.
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
    """Fold memory blocks of (key log-features a (B, F), values (B, d_v)) into a `FeatureSummary`.

    The shift c is the column maximum over all memories, but blocks arrive one at a time, so it
    is kept as a running maximum: when a block raises c_j, the sums so far are rescaled by
    e^(c_old − c_new), as in online softmax. The result equals the one-shot sums up to rounding.
    The maxima are detached: they cancel exactly in the readout, so they carry no gradient.
    """
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
    """Add up the summaries of memories spread over ranks: each rank's sums are rescaled from
    its own column maximum to the global one (as `summarise_keys` does between blocks), then
    summed; the result is the one-process summary up to rounding."""
    if collective.world_size == 1:
        return keys
    column_max = collective.all_max(keys.column_max)  # (F,)
    rescale = torch.exp(keys.column_max - column_max)  # (F,)
    packed = torch.cat([keys.summary * rescale[:, None], (keys.normaliser * rescale)[:, None]], 1)
    packed = collective.all_sum(packed)  # (F, d_v + 1)
    return FeatureSummary(column_max, packed[:, :-1], packed[:, -1])


def readout(query_logits: Tensor, keys: FeatureSummary) -> Tensor:
    """T = Σ_μ ⟨e^a(x), e^a(k_μ)⟩ v_μ / Σ_μ ⟨e^a(x), e^a(k_μ)⟩ for query log-features (Q, F).

    Stabilised without changing the result: key column j was divided by e^c_j (`summarise_keys`)
    and query column j is multiplied by e^c_j, which leaves every product ⟨e^a(x), e^a(k_μ)⟩ as
    it was; then each query's features are divided by their own maximum, a positive per-query
    factor that cancels between numerator and denominator. Afterwards every exponent is ≤ 0, so
    nothing overflows, and the denominator is ≥ 1 (the query's largest feature is 1 and the keys'
    sum in that column is ≥ 1), so no 0/0 arises at any β; a term that underflows is below the
    float precision of that denominator.
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
    """Rows per block so that the feature models' peak stays within `budget`. `prepare` holds a
    block of B memories, `update` a batch of Q queries, never both, so each gets the budget less
    what lives throughout: `held` (the model's own tensors, e.g. a projection) and the (F, d_v)
    summary with the normaliser, four copies while a block is folded in (old, rescaled, the
    block's sum, new). Per row, in the compute dtype c (float32 for half banks), counted from the
    code with the previous block already freed (`summarise_keys` drops it):

        memory row: the block (d + d_v, bank dtype) + at most 3F + 2d (the inputs cast and
                    scaled, the feature map's temporaries, then log-features, shifted, exp)
        query row:  2d + 4F + 2·d_v (scaled queries, log-features, shifted, minus the row
                    maximum, exp; numerator and quotient)

    Neither needs large blocks (the work per row is fixed), so both stop at `CACHE_ROWS`, where
    the elementwise passes over a block still run from cache; this keeps time linear in M."""
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
