"""Linear attention (Katharopoulos et al. 2020): a positive feature map replaces exp(β xᵀk).

T(x) = Σ_μ φ(x̃)ᵀφ(k̃_μ) v_μ / Σ_μ φ(x̃)ᵀφ(k̃_μ), φ(u) = elu(u) + 1, x̃ = √β·x, k̃ = √β·k.

The kernel factorises, so the memories collapse into a (d, d_v) summary Σ_μ φ(k̃_μ) v_μᵀ and a (d,)
normaliser Σ_μ φ(k̃_μ) before any query is read: cost is linear in Q and in M, and no (Q, M) score
matrix is ever formed.

How β enters: both sides are scaled by √β, so the kernel's cross term is β·xᵀk as in the softmax.
β → 0 flattens the weights to the mean of the values, as it does for dense; large β sharpens them
until φ is essentially relu, after which a larger β changes little (the ratio is then scale-free).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from nphcli.models.base import HopfieldModel, Update
from nphcli.models.registry import register_model


def feature_readout(query_logits: Tensor, key_logits: Tensor, values: Tensor) -> Tensor:
    """T = Σ_μ ⟨e^a(x), e^a(k_μ)⟩ v_μ / Σ_μ ⟨e^a(x), e^a(k_μ)⟩ from log-features a, in O((Q+M)·F).

    query_logits (Q, F) and key_logits (M, F) are logs of positive feature maps; values (M, d_v).

    Stabilised without changing the result: key column j is divided by e^c_j (c_j its maximum
    over the memories) and query column j multiplied by e^c_j, which leaves every product
    ⟨e^a(x), e^a(k_μ)⟩ as it was; then each query's features are divided by their own maximum, a
    positive per-query factor that cancels between numerator and denominator. Afterwards every
    exponent is ≤ 0, so nothing overflows, and the denominator is ≥ 1 (the query's largest
    feature is 1 and the keys' sum in that column is ≥ 1), so no 0/0 arises at any β; a term
    that underflows is below the float precision of that denominator. The maxima are detached:
    they cancel exactly, so they carry no gradient.
    """
    column_max = key_logits.amax(dim=0).detach()  # (F,)
    key_features = torch.exp(key_logits - column_max)  # (M, F), each column's maximum is 1
    summary = key_features.T @ values  # (F, d_v)
    normaliser = key_features.sum(dim=0)  # (F,), each entry ≥ 1
    shifted = query_logits + column_max  # (Q, F)
    row_max = shifted.amax(dim=1, keepdim=True).detach()  # (Q, 1)
    query_features = torch.exp(shifted - row_max)  # (Q, F), each row's maximum is 1
    numerator = query_features @ summary  # (Q, d_v)
    denominator = query_features @ normaliser  # (Q,)
    return numerator / denominator.unsqueeze(1)  # (Q, d_v)


def log_elu_plus_one(u: Tensor) -> Tensor:
    """log(elu(u) + 1): u for u ≤ 0 and log1p(u) above, so e^u never has to be formed."""
    # The clamp keeps the unselected log1p branch finite, so its gradient is not NaN.
    return torch.where(u > 0, torch.log1p(u.clamp(min=0)), u)


@register_model(
    "linear",
    summary="linear attention with the elu+1 feature map (Katharopoulos et al. 2020)",
    formula="T(x) = Vᵀφ(√β K)φ(√β x) / 1ᵀφ(√β K)φ(√β x), φ(u) = elu(u) + 1",
    cost="time O((Q+M)·d·d_v); extra memory O(d·d_v + Q·d), no Q×M scores",
)
@dataclass(kw_only=True)
class Linear(HopfieldModel):
    """β scales the feature-map inputs by √β on both sides; see the module docstring."""

    def update(self, queries: Tensor, keys: Tensor, values: Tensor, positions: Tensor) -> Update:
        scale = math.sqrt(self.beta)
        query_logits = log_elu_plus_one(scale * queries)  # (Q, d)
        key_logits = log_elu_plus_one(scale * keys)  # (M, d)
        return Update(feature_readout(query_logits, key_logits, values))
