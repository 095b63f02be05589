"""Batched, masked, differentiable retrieval for the layers: T(β·Q Kᵀ) V for every model.

The layers need what `HopfieldModel.retrieve` computes, but for a batch of sets of different sizes
(B, H heads, N queries, M keys) with padded keys, and with gradients. The retrieval rules are not
written again here: each model's weights come from the functional core the models use
(`functional.masked_softmax`, `sparsemax`, `entmax_bisect`, the masks of `masks.py`, the feature
readout of `linear.py`), applied to batched scores. This module only says, per model class, how its
parameters and a key padding mask enter those functions.

Padding: a padded key gets weight exactly 0 for every model, and so exactly zero gradient. For
the models whose parameters depend on M (`--k` as a fraction, the random subset), M is each
set's own number of unpadded keys, so a padded set behaves as the unpadded set alone would.
Positions (used by `random` and `window`) are the queries' indices 0 … N − 1 within their set.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own convention)
from torch import Tensor

from nphcli.engine.features import feature_readout
from nphcli.engine.functional import entmax_bisect, masked_softmax, sparsemax
from nphcli.engine.masks import random_keys, random_mask, resolve_k, topk_mask, window_mask
from nphcli.errors import NphError
from nphcli.models.base import HopfieldModel
from nphcli.models.dense import Dense
from nphcli.models.entmax import Entmax
from nphcli.models.linear import Linear, log_elu_plus_one
from nphcli.models.multihead import MultiHead
from nphcli.models.random_feature import RandomFeature
from nphcli.models.random_mask import RandomMask
from nphcli.models.sparse import Sparse
from nphcli.models.topk import TopK
from nphcli.models.window import Window

# Weights from scores: (model, scores (B, H, N, M) already times β, valid (B, M), positions (N,))
# -> weights (B, H, N, M), each row on the simplex over its set's valid keys.
WeightsFn = Callable[[HopfieldModel, Tensor, Tensor, Tensor], Tensor]
# Retrieval without a score matrix: (model, q, k, v, beta, valid) -> (B, H, N, d_v).
FeatureFn = Callable[[HopfieldModel, Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]

_WEIGHTS: dict[type, WeightsFn] = {}
_FEATURES: dict[type, FeatureFn] = {}


def _weights_for(*classes: type):
    def decorator(fn: WeightsFn) -> WeightsFn:
        for cls in classes:
            _WEIGHTS[cls] = fn
        return fn

    return decorator


def _features_for(*classes: type):
    def decorator(fn: FeatureFn) -> FeatureFn:
        for cls in classes:
            _FEATURES[cls] = fn
        return fn

    return decorator


def supports(model: HopfieldModel) -> bool:
    """Whether `model` has a layer form (every registered model should; a test checks)."""
    return type(model) in _WEIGHTS or type(model) in _FEATURES


def uses_scores(model: HopfieldModel) -> bool:
    """True when the model forms explicit weights (B, H, N, M) (then dropout acts on them)."""
    return type(model) in _WEIGHTS


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
    if type(model) in _FEATURES:
        valid = _valid(key_padding_mask, q.shape[0], k.shape[2], q.device)  # (B, M)
        out = _FEATURES[type(model)](model, q, k, v, beta, valid)  # (B, H, N, d_v)
        return F.dropout(out, dropout, training) if dropout else out
    scores = beta * (q @ k.transpose(-1, -2))  # (B, H, N, M)
    weights = weights_from_scores(
        model, scores, key_padding_mask=key_padding_mask, dropout=dropout, training=training
    )
    return weights @ v  # (B, H, N, d_v)


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
    if type(model) not in _WEIGHTS:
        raise NphError(f"model {model.name!r} has no layer form")
    batch, _, num_queries, num_keys = scores.shape
    valid = _valid(key_padding_mask, batch, num_keys, scores.device)  # (B, M)
    positions = torch.arange(num_queries, device=scores.device)  # (N,)
    weights = _WEIGHTS[type(model)](model, scores, valid, positions)  # (B, H, N, M)
    return F.dropout(weights, dropout, training) if dropout else weights


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


def _set_sizes(valid: Tensor) -> list[int]:
    return [int(n) for n in valid.sum(dim=1)]  # (B,) unpadded keys per set


def _rank_below(order_keys: Tensor, counts: Tensor, descending: bool) -> Tensor:
    """Mask of the entries whose rank along the last dim (stable sort, ties to the lower index)
    is below counts (broadcast against the leading dims)."""
    order = torch.sort(order_keys, dim=-1, descending=descending, stable=True).indices
    ranks = torch.empty_like(order).scatter_(
        -1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order)
    )
    return ranks < counts


@_weights_for(Dense, MultiHead)
def _softmax_weights(model, scores, valid, positions):
    # multihead is dense per head: the layer's heads are the model's heads.
    return masked_softmax(scores, valid[:, None, None, :])


@_weights_for(Sparse)
def _sparsemax_weights(model, scores, valid, positions):
    return sparsemax(scores.masked_fill(~valid[:, None, None, :], -math.inf))


@_weights_for(Entmax)
def _entmax_weights(model, scores, valid, positions):
    filled = scores.masked_fill(~valid[:, None, None, :], -math.inf)
    flat = filled.reshape(-1, filled.shape[-1])  # (B·H·N, M): entmax_bisect works on rows
    return entmax_bisect(flat, model.alpha).reshape(filled.shape)


@_weights_for(TopK)
def _topk_weights(model, scores, valid, positions):
    sizes = _set_sizes(valid)
    counts = [resolve_k(model.k, n) for n in sizes]  # each set's own k
    if all(n == scores.shape[-1] for n in sizes):
        keep = topk_mask(scores.reshape(-1, scores.shape[-1]), counts[0]).reshape(scores.shape)
    else:
        # Padded keys sort last; each set keeps its own k highest, ties to the lower index.
        filled = scores.masked_fill(~valid[:, None, None, :], -math.inf)
        k = torch.tensor(counts, device=scores.device)[:, None, None, None]  # (B, 1, 1, 1)
        keep = _rank_below(filled, k, descending=True)
    return masked_softmax(scores, keep)


@_weights_for(RandomMask)
def _random_weights(model, scores, valid, positions):
    sizes = _set_sizes(valid)
    num_keys = scores.shape[-1]
    counts = [resolve_k(model.k, n) for n in sizes]
    if all(n == num_keys for n in sizes):
        keep = random_mask(model.seed, positions, num_keys, counts[0])[None, None]  # (1,1,N,M)
    else:
        # A set of n keys keeps its k smallest hashes among its own keys, as the model does for
        # M = n: the hash of (seed, position, index) does not depend on M.
        hashes = random_keys(model.seed, positions, torch.arange(num_keys, device=valid.device))
        hashes = hashes[None].masked_fill(~valid[:, None, :], 2**62)  # (B, N, M)
        k = torch.tensor(counts, device=scores.device)[:, None, None]  # (B, 1, 1)
        keep = _rank_below(hashes, k, descending=False)[:, None]  # (B, 1, N, M)
    return masked_softmax(scores, keep & valid[:, None, None, :])


@_weights_for(Window)
def _window_weights(model, scores, valid, positions):
    keep = window_mask(positions, scores.shape[-1], model.window)[None, None]  # (1, 1, N, M)
    keep = keep & valid[:, None, None, :]  # (B, 1, N, M)
    if not bool(keep.any(dim=-1).all()):
        raise NphError(
            f"window {model.window}: some query sees no unpadded key (query i sees keys "
            f"i − w … i + w); use a larger window or sets with at least as many keys as queries"
        )
    return masked_softmax(scores, keep)


def _feature_retrieval(q_logits: Tensor, k_logits: Tensor, v: Tensor, valid: Tensor) -> Tensor:
    """`linear.feature_readout` for every batch and head; padded keys get log-feature −∞, i.e.
    feature 0, so they add nothing to the summaries."""
    k_logits = k_logits.masked_fill(~valid[:, None, :, None], -math.inf)  # (B, H, M, F)
    lead = q_logits.shape[:2]
    out = torch.func.vmap(feature_readout)(
        q_logits.flatten(0, 1), k_logits.flatten(0, 1), v.flatten(0, 1)
    )  # (B·H, N, d_v)
    return out.reshape(*lead, *out.shape[1:])


@_features_for(Linear)
def _linear_retrieval(model, q, k, v, beta, valid):
    scale = beta.sqrt()
    return _feature_retrieval(log_elu_plus_one(scale * q), log_elu_plus_one(scale * k), v, valid)


@_features_for(RandomFeature)
def _random_feature_retrieval(model, q, k, v, beta, valid):
    weights = model.projection(q.shape[-1], q.device, q.dtype)  # (m, d)
    scale = beta.sqrt()
    scaled_k = scale * k  # (B, H, M, d)
    k_logits = scaled_k @ weights.T - 0.5 * (scaled_k * scaled_k).sum(-1, keepdim=True)
    return _feature_retrieval((scale * q) @ weights.T, k_logits, v, valid)  # (B, H, N, d_v)
