"""Linear attention (Katharopoulos et al. 2020): a positive feature map replaces exp(β xᵀk).

T(x) = Σ_μ φ(x̃)ᵀφ(k̃_μ) v_μ / Σ_μ φ(x̃)ᵀφ(k̃_μ), φ(u) = elu(u) + 1, x̃ = √β·x, k̃ = √β·k.

The memories fold into a (d, d_v) summary and a (d,) normaliser once per memory and β
(`engine.features`, `engine.summary_cache`): linear in Q and M, no (Q, M) scores. √β on both
sides makes the cross term β·xᵀk; large β sharpens φ to relu, after which β changes little.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from nphcli.engine.features import (
    FeatureSummary,
    feature_plan,
    feature_readout,
    merge_summaries,
    readout,
    summarise_keys,
)
from nphcli.engine.planning import Plan
from nphcli.engine.precision import accumulation_dtype
from nphcli.engine.summary_cache import cached_summary
from nphcli.memory.bank import MemoryBank
from nphcli.models.base import HopfieldModel, Update
from nphcli.models.registry import register_model


def log_elu_plus_one(u: Tensor) -> Tensor:
    """log(elu(u) + 1): u for u ≤ 0 and log1p(u) above, so e^u never has to be formed."""
    # The clamp keeps the unselected log1p branch finite, so its gradient is not NaN.
    return torch.where(u > 0, torch.log1p(u.clamp(min=0)), u)


def padded_feature_readout(
    query_logits: Tensor, key_logits: Tensor, values: Tensor, valid: Tensor
) -> Tensor:
    """`feature_readout` per set and head: log-features (B, H, N, F), (B, H, M, F), values
    (B, H, M, d_v), `valid` (B, M) -> (B, H, N, d_v); padded keys get feature 0."""
    key_logits = key_logits.masked_fill(~valid[:, None, :, None], -math.inf)  # (B, H, M, F)
    lead = query_logits.shape[:2]
    out = torch.func.vmap(feature_readout)(
        query_logits.flatten(0, 1), key_logits.flatten(0, 1), values.flatten(0, 1)
    )  # (B·H, N, d_v)
    return out.reshape(*lead, *out.shape[1:])


@dataclass(kw_only=True)
class FeatureModel(HopfieldModel):
    """What `linear` and `random-feature` share: log-features a(√β x), a(√β k) whose
    exponentials' inner products stand in for exp(β xᵀk); the memories folded once per memory
    and β (`summarise_keys`), each query read against the summary."""

    # The parameters besides block_rows that the folded memories depend on (the cache key).
    summary_params: ClassVar[tuple[str, ...]] = ("beta",)

    def log_features(self, x: Tensor, scale: float | Tensor, *, keys: bool) -> Tensor:
        """a(scale · x) (…, F) of rows x (…, d) in their dtype and device (`keys`: memories)."""
        raise NotImplementedError

    def prepare(self, bank: MemoryBank, block_rows: int) -> FeatureSummary:
        scale = math.sqrt(self.beta)
        dtype = accumulation_dtype(bank.dtype)  # half memories are summed in float32

        def build() -> FeatureSummary:
            return summarise_keys(
                (self.log_features(keys.to(dtype), scale, keys=True), values.to(dtype))
                for _, keys, values in bank.blocks(block_rows)
            )

        params = tuple(getattr(self, name) for name in self.summary_params)
        local = cached_summary(bank, (self.name, *params, block_rows), build)
        return merge_summaries(local, bank.collective)  # rows spread over ranks

    def update(
        self,
        queries: Tensor,
        bank: MemoryBank,
        positions: Tensor,
        prepared: FeatureSummary,
        *,
        block_rows: int,
    ) -> Update:
        queries = queries.to(accumulation_dtype(queries.dtype))
        query_logits = self.log_features(queries, math.sqrt(self.beta), keys=False)  # (Q, F)
        return Update(readout(query_logits, prepared))

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
        """The feature readout as in `prepare` and `update` (B, H, N, d_v); `dropout` on it."""
        scale = beta.sqrt()
        out = padded_feature_readout(
            self.log_features(q, scale, keys=False),
            self.log_features(k, scale, keys=True),
            v,
            valid,
        )  # (B, H, N, d_v)
        return dropout(out) if dropout else out


@register_model(
    "linear",
    summary="linear attention with the elu+1 feature map (Katharopoulos et al. 2020)",
    formula="T(x) = Vᵀφ(√β K)φ(√β x) / 1ᵀφ(√β K)φ(√β x), φ(u) = elu(u) + 1",
    cost="time O((Q+M)·d·d_v); extra memory O(d·d_v + Q·d), no Q×M scores",
)
@dataclass(kw_only=True)
class Linear(FeatureModel):
    """β scales the feature-map inputs by √β on both sides; see the module docstring."""

    def log_features(self, x: Tensor, scale: float | Tensor, *, keys: bool) -> Tensor:
        return log_elu_plus_one(scale * x)  # (…, d)

    def plan(self, num_queries: int, bank: MemoryBank, budget: int) -> Plan:
        return feature_plan(num_queries, bank, budget, features=bank.dim)
