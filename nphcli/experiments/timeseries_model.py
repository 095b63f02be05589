"""The paper's time-series network: every time step a query of one NPH layer, then NPHPooling.

    x (B, L, 1) → Linear(1, d) → LayerNorm → NPH(self-attention over the L steps, the model
    under test) → GELU → LayerNorm → NPHPooling(1 prototype) → LayerNorm → Linear(d, H)

The univariate series enters as L one-value signals, each projected into the hidden space, so
the layer's memory size is the input length and its queries are the time steps ("we treat every
signal as a query pattern"). The layer norms, GELU, biases and input-space pooling prototype
follow the authors' released model; `timeseries_config` says what comes from where.
"""

from __future__ import annotations

import torch.nn.functional as F  # noqa: N812  (torch's own convention)
from torch import Tensor, nn

from nphcli.experiments.timeseries_config import TSConfig, Variant, window_size
from nphcli.layers import NPH, NPHPooling
from nphcli.models import HopfieldModel, create_model


def rules(config: TSConfig, variant: Variant, horizon: int) -> tuple[HopfieldModel, HopfieldModel]:
    """The layer's and the pooling's retrieval rules for one column of the table."""
    params = dict(variant.params)
    if variant.model == "window":
        params["window"] = window_size(horizon)
    if variant.model == "random-feature":
        params["features"] = config.features
    layer = create_model(variant.model, beta=config.beta, **params)
    if variant.pool_model is None:
        return layer, create_model(variant.model, beta=config.beta, **params)
    return layer, create_model(variant.pool_model, beta=config.beta)


class TSNet(nn.Module):
    """Predict the next H values of a standardised series from its last L = H values."""

    def __init__(self, config: TSConfig, variant: Variant, horizon: int) -> None:
        super().__init__()
        layer_rule, pool_rule = rules(config, variant, horizon)
        d, heads = config.d_model, config.heads
        self.embed = nn.Linear(1, d)
        self.norm_embed = nn.LayerNorm(d)
        self.layer = NPH(d, rule=layer_rule, heads=heads, bias=True, dropout=variant.dropout)
        self.norm_layer = nn.LayerNorm(d)
        self.pool = NPHPooling(
            d, rule=pool_rule, heads=heads, bias=True, learned="input", dropout=variant.pool_dropout
        )
        self.norm_pool = nn.LayerNorm(d)
        self.head = nn.Linear(d, horizon)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, L) standardised inputs -> (B, H) predictions."""
        h = self.norm_embed(self.embed(x.unsqueeze(-1)))  # (B, L, d)
        h = self.norm_layer(F.gelu(self.layer(h)))  # (B, L, d)
        pooled = self.norm_pool(self.pool(h).squeeze(1))  # (B, d)
        return self.head(pooled)  # (B, H)
