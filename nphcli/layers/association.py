"""Batched, masked, differentiable retrieval for the layers: T(β·Q Kᵀ) V with any model.

The layers need what `HopfieldModel.retrieve` computes, but for a batch of sets of different sizes
(B, H heads, N queries, M keys) with padded keys, and with gradients. Each model says how in its
own module (`HopfieldModel.weights`, or `associate` for rules that form no weights); this module
only turns a layer's key padding mask, positions and dropout into those arguments, so a newly
registered model works as a layer with no edit here.

Padding: a padded key gets weight exactly 0 for every model, and so exactly zero gradient. For
the models whose parameters depend on M (`--k` as a fraction, the random subset), M is each
set's own number of unpadded keys, so a padded set behaves as the unpadded set alone would.
Positions (used by `random` and `window`) are the queries' indices 0 … N − 1 within their set.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own convention)
from torch import Tensor

from nphcli.errors import NphError
from nphcli.models.base import HopfieldModel


def forms_weights(model: HopfieldModel) -> bool:
    """True when the model's layer form is weights (B, H, N, M) of each head's scores times the
    values (the default `associate`): dropout then acts on them, and pooling may fold W_K."""
    return type(model).associate is HopfieldModel.associate


def associate(
    model: HopfieldModel,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    beta: Tensor,
    key_padding_mask: Tensor | None = None,
    dropout: float = 0.0,
    training: bool = False,
) -> Tensor:
    """T(β q kᵀ) v per batch and head: q (B, H, N, d), k (B, H, M, d), v (B, H, M, d_v) -> (B, H,
    N, d_v), with T the model's retrieval rule (one step). `beta` is a positive 0-d tensor (it may
    be learnable). `key_padding_mask` (B, M) bool is True at padded keys, which get weight 0.

    Dropout (rate `dropout`, when `training`) acts on the weights, as in hopfield-layers; for the
    feature models, which never form weights, on the retrieved patterns.
    """
    return model.associate(
        q,
        k,
        v,
        beta=beta,
        valid=_valid(key_padding_mask, q.shape[0], k.shape[2], q.device),  # (B, M)
        positions=torch.arange(q.shape[2], device=q.device),  # (N,)
        dropout=_dropout(dropout, training),
    )  # (B, H, N, d_v)


def weights_from_scores(
    model: HopfieldModel,
    scores: Tensor,
    *,
    key_padding_mask: Tensor | None = None,
    dropout: float = 0.0,
    training: bool = False,
) -> Tensor:
    """The model's weights (B, H, N, M) from scores β·q·k (B, H, N, M), padded keys at exactly 0,
    then dropout: `associate` for callers that form the scores themselves (`NPHPooling`)."""
    batch, _, num_queries, num_keys = scores.shape
    valid = _valid(key_padding_mask, batch, num_keys, scores.device)  # (B, M)
    positions = torch.arange(num_queries, device=scores.device)  # (N,)
    weights = model.weights(scores, valid, positions)  # (B, H, N, M)
    drop = _dropout(dropout, training)
    return drop(weights) if drop else weights


def _dropout(rate: float, training: bool) -> Callable[[Tensor], Tensor] | None:
    return partial(F.dropout, p=rate, training=training) if rate else None


def _valid(key_padding_mask: Tensor | None, batch: int, num_keys: int, device) -> Tensor:
    if key_padding_mask is None:
        return torch.ones(batch, num_keys, dtype=torch.bool, device=device)
    if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != (batch, num_keys):
        raise NphError(
            f"key_padding_mask must be a bool tensor of shape ({batch}, {num_keys}) "
            f"(True at padded keys), got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
        )
    valid = ~key_padding_mask
    if not bool(valid.any(dim=1).all()):
        raise NphError(
            "every set needs at least one unpadded key; key_padding_mask pads a whole set"
        )
    return valid
