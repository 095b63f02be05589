"""Batched, masked, differentiable retrieval for the layers: T(β·Q Kᵀ) V with any model.

Each model's own `weights` (or `associate`) computes T on padded sets (B, H, N, M); this module
turns a layer's padding mask, positions (0 … N − 1 per set) and dropout into their arguments and
adds what every rule shares: update steps and an association mask. A padded key weighs exactly
0, and a model whose parameters depend on M sees each set's own M.
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
    """T(β x kᵀ) v per batch and head: q (B, H, N, d), k (B, H, M, d), v (B, H, M, d_v) ->
    (B, H, N, d_v); `beta` 0-d or (H, 1, 1); `key_padding_mask` (B, M) True at padded keys,
    `association_mask` (N, M), (B, N, M) or (B, H, N, M) True at excluded pairs.

    x starts at q and is first updated `model.steps` − 1 times in the key space, x ← T(β x kᵀ) k
    (a query stops once it moves by ≤ `model.tol`). Dropout acts on the output's weights (the
    feature models: on the output).
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
    """`associate`'s weights (B, H, N, M) from scores β·q·k formed by the caller (`NPHPooling`)."""
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
    """The rule's weights with excluded pairs scored −∞, then set to exactly 0."""
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
    """An association mask as (B|1, H|1, N, M) bool; every query must keep a pair."""
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
