"""Batched, masked, differentiable retrieval for the layers: T(β·Q Kᵀ) V with any model.

The layers need what `Retriever.retrieve` computes, but for a batch of sets of different sizes
(B, H heads, N queries, M keys) with padded keys, and with gradients. Each model says how in its
own module (`Retriever.weights`, or `associate` for rules that form no weights); this module
only turns a layer's key padding mask, positions and dropout into those arguments, and adds
what every rule shares: update steps in the key space and an association mask of excluded
(query, key) pairs, so a newly registered model works as a layer with no edit here.

Padding: a padded key gets weight exactly 0 for every model, and so exactly zero gradient. For
the models whose parameters depend on M (`--k` as a fraction, the random subset), M is each
set's own number of unpadded keys, so a padded set behaves as the unpadded set alone would.
Positions (used by `random` and `window`) are the queries' indices 0 … N − 1 within their set.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own convention)
from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.models.base import Retriever, forms_weights


def associate(
    model: Retriever,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    beta: Tensor,
    key_padding_mask: Tensor | None = None,
    association_mask: Tensor | None = None,
    dropout: float = 0.0,
    training: bool = False,
) -> Tensor:
    """T(β x kᵀ) v per batch and head: q (B, H, N, d), k (B, H, M, d), v (B, H, M, d_v) -> (B, H,
    N, d_v), with T the model's retrieval rule. `beta` is positive, 0-d or (H, 1, 1) (one per
    head), and may be learnable. `key_padding_mask` (B, M) bool is True at padded keys and
    `association_mask` (N, M), (B, N, M) or (B, H, N, M) bool at excluded (query, key) pairs;
    both get weight 0.

    The state x starts at q. With `model.steps` = s > 1 it is first updated s − 1 times in the key
    space, x ← T(β x kᵀ) k, as hopfield-layers' update steps do; with `model.tol` > 0 a query
    stops once its state moves by ≤ tol (‖·‖₂ per head). The output is T(β x kᵀ) v of the last
    state; with identity projections and v = k that is `model.retrieve` with s steps.

    Dropout (rate `dropout`, when `training`) acts on the output's weights, as in hopfield-layers;
    for the feature models, which never form weights, on the retrieved patterns.
    """
    valid = _valid(key_padding_mask, q.shape[0], k.shape[2], q.device)  # (B, M)
    excluded = _excluded(association_mask, q.shape, k.shape[2])  # (B|1, H|1, N, M) or None
    if excluded is not None and not forms_weights(model):
        raise NphError(
            f"rule {model.name!r} forms no (N, M) weights, so it takes no association_mask; "
            "use a rule that does (dense, sparse, entmax, topk, ...) or key_padding_mask"
        )
    positions = torch.arange(q.shape[2], device=q.device)  # (N,)

    def step(x: Tensor, values: Tensor, drop: Callable[[Tensor], Tensor] | None) -> Tensor:
        if excluded is None:
            return model.associate(
                x, k, values, beta=beta, valid=valid, positions=positions, dropout=drop
            )
        scores = beta * (x @ k.transpose(-1, -2))  # (B, H, N, M)
        weights = _weights(model, scores, valid, excluded, positions)
        return (drop(weights) if drop else weights) @ values

    state, moving = q, None  # moving: (B, H, N, 1) queries still updating (tol > 0)
    for _ in range(model.steps - 1):
        new = step(state, k, None)  # (B, H, N, d)
        if model.tol:
            moved = torch.linalg.vector_norm(new - state, dim=-1, keepdim=True) > model.tol
            new = new if moving is None else torch.where(moving, new, state)
            moving = moved if moving is None else moving & moved
        state = new
        if moving is not None and not bool(moving.any()):
            break
    return step(state, v, _dropout(dropout, training))  # (B, H, N, d_v)


def weights_from_scores(
    model: Retriever,
    scores: Tensor,
    *,
    key_padding_mask: Tensor | None = None,
    association_mask: Tensor | None = None,
    dropout: float = 0.0,
    training: bool = False,
) -> Tensor:
    """The model's weights (B, H, N, M) from scores β·q·k (B, H, N, M), padded keys and excluded
    pairs at exactly 0, then dropout: `associate` for callers that form the scores themselves
    (`NPHPooling`)."""
    batch, heads, num_queries, num_keys = scores.shape
    valid = _valid(key_padding_mask, batch, num_keys, scores.device)  # (B, M)
    excluded = _excluded(association_mask, (batch, heads, num_queries), num_keys)
    positions = torch.arange(num_queries, device=scores.device)  # (N,)
    weights = _weights(model, scores, valid, excluded, positions)  # (B, H, N, M)
    drop = _dropout(dropout, training)
    return drop(weights) if drop else weights


def _weights(
    model: Retriever, scores: Tensor, valid: Tensor, excluded: Tensor | None, positions: Tensor
) -> Tensor:
    """The rule's weights with excluded pairs scored −∞ (so the rule chooses among the allowed
    keys) and set to exactly 0 after it."""
    if excluded is None:
        return model.weights(scores, valid, positions)  # (B, H, N, M)
    weights = model.weights(scores.masked_fill(excluded, -math.inf), valid, positions)
    weights = weights.masked_fill(excluded, 0.0)  # (B, H, N, M)
    if not bool(torch.isfinite(weights).all()):
        raise NphError(
            f"rule {model.name!r} keeps no allowed key for some query: its own support "
            "(window, random subset) and association_mask leave nothing to retrieve"
        )
    return weights


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


def _excluded(mask: Tensor | None, query_shape: tuple, num_keys: int) -> Tensor | None:
    """An association mask as (B|1, H|1, N, M) bool, True at excluded pairs; every query must
    keep at least one pair (key padding is checked with the keys)."""
    if mask is None:
        return None
    batch, heads, num_queries = query_shape[:3]
    shapes = {
        2: (num_queries, num_keys),
        3: (batch, num_queries, num_keys),
        4: (batch, heads, num_queries, num_keys),
    }
    if mask.dtype != torch.bool or tuple(mask.shape) != shapes.get(mask.ndim):
        raise NphError(
            f"association_mask must be a bool tensor of shape ({num_queries}, {num_keys}), "
            f"({batch}, {num_queries}, {num_keys}) or ({batch}, {heads}, {num_queries}, "
            f"{num_keys}) (True at excluded pairs), got {mask.dtype} {tuple(mask.shape)}"
        )
    if bool(mask.all(dim=-1).any()):
        raise NphError("every query needs at least one allowed key; association_mask excludes all")
    return {2: mask[None, None], 3: mask[:, None], 4: mask}[mask.ndim]  # (B|1, H|1, N, M)
