"""The paper's layers: NPH(R, Y) = W_O · T(β · R W_Q (Y W_K)ᵀ) · Y W_K W_V per head, with T a
registered model passed as itself (`create_model("topk", k=0.2)`). `NPH` (queries and stored
patterns), `NPHPooling` (learnable prototype queries) and `NPHLayer` (learnable stored patterns)
share one `LayerConfig`. With identity projections and one head each is exactly `rule.retrieve`;
options give hopfield-layers' form too (docs/porting.md).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from nphcli.core.errors import NphError
from nphcli.layers.association import associate, weights_from_scores
from nphcli.layers.config import LayerConfig, LayerOptions, Norms
from nphcli.models.base import forms_weights
from nphcli.models.inputs import check_whole

if TYPE_CHECKING:
    from typing_extensions import Self, Unpack


class _Retriever(nn.Module):
    """What the three layers share: the rule, heads, β, the norms, the value and output maps."""

    def __init__(self, config: LayerConfig) -> None:
        super().__init__()
        self.config = config
        self.rule = config.rule
        self.heads, self.head_dim, self.value_dim = config.heads, config.head_dim, config.value_dim
        self.dropout = config.dropout
        heads, bias, d_model = config.heads, config.bias, config.d_model
        log_beta = config.initial_log_beta()  # () or (H,), float64: exact
        if config.learn_beta:
            self.log_beta = nn.Parameter(log_beta)  # β = e^log_beta stays positive
        else:
            self.register_buffer("log_beta", log_beta)
        self.norm_stored = _norm(config.norms, "stored", d_model)
        self.norm_state = _norm(config.norms, "state", d_model)
        self.norm_values = _norm(config.norms, "values", d_model)
        value_in = d_model if config.separate_values else heads * self.head_dim
        self.value = nn.Linear(value_in, heads * self.value_dim, bias=bias)  # W_V
        self.out = nn.Linear(heads * self.value_dim, config.out_dim, bias=bias)  # W_O

    def arguments(self) -> dict[str, Any]:
        """The class's own constructor arguments beside the config (`save_layer`): none here."""
        return {}

    @property
    def beta(self) -> Tensor:
        """β: 0-d, or (H,) with `head_beta`."""
        return self.log_beta.exp()

    def _beta(self, dtype: torch.dtype) -> Tensor:
        beta = self.beta.to(dtype)
        return beta if beta.ndim == 0 else beta[:, None, None]  # () or (H, 1, 1)

    def _split(self, x: Tensor) -> Tensor:
        return x.unflatten(-1, (self.heads, -1)).transpose(-3, -2)  # (B, H, rows, width)

    def _keys(self, stored: Tensor) -> Tensor:
        """Y (…, M, d) -> keys LN(Y) W_K (…, M, H·d_h)."""
        return self.key(_apply(self.norm_stored, stored))

    def _values(self, values: Tensor | None, stored: Tensor | None, keys: Tensor) -> Tensor:
        """Values (…, M, H·d_v): LN(V) W_V, or LN(V) W_K W_V (NPH), V defaulting to Y."""
        if values is None and self._values_are_keys():
            return self.value(keys)
        source = _apply(self.norm_values, stored if values is None else values)
        return self.value(source if self.config.separate_values else self.key(source))

    def _values_are_keys(self) -> bool:
        return not self.config.separate_values and self.norm_values is None

    def _retrieve(
        self,
        q: Tensor,
        keys: Tensor,
        values: Tensor,
        key_padding_mask: Tensor | None,
        association_mask: Tensor | None,
    ) -> Tensor:
        """q (B, N, H·d_h), keys (B, M, H·d_h), values (B, M, H·d_v) -> W_O(T(β q kᵀ) values)
        (B, N, d_out)."""
        out = associate(
            self.rule,
            self._split(q),  # (B, H, N, d_h)
            self._split(keys),  # (B, H, M, d_h)
            self._split(values),  # (B, H, M, d_v)
            beta=self._beta(q.dtype),
            key_padding_mask=key_padding_mask,
            association_mask=association_mask,
            dropout=self.dropout,
            training=self.training,
        )  # (B, H, N, d_v)
        return self.out(out.transpose(-3, -2).flatten(-2))  # (B, N, d_out)

    identity_maps: tuple[str, ...] = ()  # the projections `identity_` sets

    def identity_(self) -> Self:
        """Set the projections `identity_maps` to the identity (the learned prototypes or stored
        patterns stay as they are): the layer is then memory retrieval."""
        with torch.no_grad():
            for linear in (getattr(self, name) for name in self.identity_maps):
                rows, cols = linear.weight.shape
                if rows != cols:
                    raise NphError(
                        f"identity weights need square projections, but one maps {cols} to {rows}"
                        "; use heads·head_dim = heads·value_dim = d_model = out_dim"
                    )
                linear.weight.copy_(torch.eye(rows))
                if linear.bias is not None:
                    linear.bias.zero_()
        return self

    def _refuse_projected(self, layer: str, options: dict[str, bool]) -> None:
        """Options that need learned patterns in the input space, refused in the projected one."""
        if self.config.learned_input:
            return
        given = [name for name, on in options.items() if on]
        if given:
            raise NphError(
                f"{layer}'s learned patterns are already projected (learned='projected'), so "
                f"{', '.join(given)} has nothing to act on; use learned='input'"
            )

    def extra_repr(self) -> str:
        return f"rule={self.rule!r}, heads={self.heads}, head_dim={self.head_dim}"


def _norm(norms: Norms, name: str, width: int) -> nn.LayerNorm | None:
    kind = getattr(norms, name)
    if kind is None:
        return None
    return nn.LayerNorm(width, eps=norms.eps, elementwise_affine=kind == "affine")


def _apply(norm: nn.Module | None, x: Tensor) -> Tensor:
    return x if norm is None else norm(x)


def _check_input(x: Tensor, label: str, dim: int) -> None:
    if not isinstance(x, Tensor):
        raise NphError(f"{label} must be a tensor (batch, rows, {dim}), got {type(x).__name__}")
    if not x.is_floating_point():
        raise NphError(f"{label} must be floating point, got {x.dtype}; convert them with .float()")
    if x.ndim != 3 or x.shape[-1] != dim:
        raise NphError(f"{label} must have shape (batch, rows, {dim}), got {tuple(x.shape)}")


def _check_values(values: Tensor | None, stored: Tensor, dim: int) -> None:
    if values is None:
        return
    _check_input(values, "values", dim)
    if values.shape[:2] != stored.shape[:2]:
        raise NphError(
            f"values must have one row per stored pattern, shape ({stored.shape[0]}, "
            f"{stored.shape[1]}, {dim}), got {tuple(values.shape)}"
        )


class NPH(_Retriever):
    """NPH(R, Y) = W_O · T(β R W_Q W_Kᵀ Yᵀ) · V W_K W_V with learnable W_Q, W_K, W_V, W_O, the
    values V defaulting to Y (`separate_values`: V W_V).

    `NPH(d_model, rule=create_model("topk", k=0.2), heads=4, ...)`: the keywords are
    `LayerConfig`'s. β starts at the rule's; `learn_beta=True` makes it a parameter.
    """

    identity_maps = ("query", "key", "value", "out")

    def __init__(self, d_model: int, **options: Unpack[LayerOptions]) -> None:
        super().__init__(LayerConfig.build(d_model, dict(options)))
        width = self.heads * self.head_dim
        self.query = nn.Linear(d_model, width, bias=self.config.bias)  # W_Q
        self.key = nn.Linear(d_model, width, bias=self.config.bias)  # W_K

    def forward(
        self,
        queries: Tensor,
        stored: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        *,
        values: Tensor | None = None,
        association_mask: Tensor | None = None,
    ) -> Tensor:
        """queries R (B, N, d), stored Y (B, M, d) (default R: self-attention), values V (B, M, d)
        (default Y), key_padding_mask (B, M) bool, True at padded rows of Y, association_mask
        (N, M), (B, N, M) or (B, H, N, M) bool, True at excluded pairs -> (B, N, d_out)."""
        stored = queries if stored is None else stored
        d_model = self.config.d_model
        _check_input(queries, "queries", d_model)
        _check_input(stored, "stored patterns", d_model)
        _check_values(values, stored, d_model)
        keys = self._keys(stored)  # (B, M, H·d_h)
        q = self.query(_apply(self.norm_state, queries))  # (B, N, H·d_h)
        v = self._values(values, stored, keys)  # (B, M, H·d_v)
        return self._retrieve(q, keys, v, key_padding_mask, association_mask)


class NPHPooling(_Retriever):
    """Pool each set Y (B, M, d) with S learnable prototype queries Q (S, H·d_h):
    W_O · T(β Q W_Kᵀ Yᵀ) · V W_K W_V -> (B, S, d_out), V defaulting to Y. With
    `learned="input"` the prototypes P (S, d) are state patterns: Q = LN(P) W_Q, as in
    hopfield-layers' HopfieldPooling. Other keywords: `LayerConfig`'s."""

    identity_maps = ("key", "value", "out")  # not the prototypes, nor W_Q

    def __init__(
        self, d_model: int, *, prototypes: int = 1, **options: Unpack[LayerOptions]
    ) -> None:
        check_whole(prototypes, "prototypes", 1)
        super().__init__(LayerConfig.build(d_model, dict(options)))
        self._refuse_projected("NPHPooling", {"norms.state": self.norm_state is not None})
        width = self.heads * self.head_dim
        learned_input = self.config.learned_input
        self.prototypes = nn.Parameter(torch.empty(prototypes, d_model if learned_input else width))
        nn.init.normal_(self.prototypes)
        if learned_input:
            self.query = nn.Linear(d_model, width, bias=self.config.bias)  # W_Q
        self.key = nn.Linear(d_model, width, bias=self.config.bias)  # W_K

    def arguments(self) -> dict[str, Any]:
        return {"prototypes": self.prototypes.shape[0]}

    def forward(
        self,
        stored: Tensor,
        key_padding_mask: Tensor | None = None,
        *,
        values: Tensor | None = None,
        association_mask: Tensor | None = None,
    ) -> Tensor:
        """stored Y (B, M, d), values V (B, M, d) (default Y), key_padding_mask (B, M) bool (True
        = padded), association_mask (S, M), (B, S, M) or (B, H, S, M) bool (True = excluded)
        -> (B, S, d_out)."""
        _check_input(stored, "stored patterns", self.config.d_model)
        _check_values(values, stored, self.config.d_model)
        queries = self._queries(stored.dtype)  # (S, H·d_h)
        if self.folds():
            return self._retrieve_folded(
                queries, stored, values, key_padding_mask, association_mask
            )
        keys = self._keys(stored)  # (B, M, H·d_h)
        q = queries.expand(stored.shape[0], -1, -1)  # (B, S, H·d_h)
        v = self._values(values, stored, keys)  # (B, M, H·d_v)
        return self._retrieve(q, keys, v, key_padding_mask, association_mask)

    def _queries(self, dtype: torch.dtype) -> Tensor:
        """The prototypes as queries (S, H·d_h): themselves, or LN(P) W_Q (`learned="input"`)."""
        prototypes = self.prototypes.to(dtype)
        if not self.config.learned_input:
            return prototypes
        return self.query(_apply(self.norm_state, prototypes))

    def folds(self) -> bool:
        """Whether `forward` folds W_K into the prototypes instead of projecting every stored row.

        ⟨q, W_K y + b⟩ = ⟨W_Kᵀ q, y⟩ + ⟨q, b⟩ and Σ w_μ A(v_μ) = A(Σ w_μ v_μ) + A(0)(Σ w_μ − 1)
        for the affine value map A: S·d instead of H·d_h·(d + H·d_v) multiply-adds per stored
        row. Exact for one-step rules that form weights (not the feature rules).
        """
        return (
            forms_weights(self.rule)
            and self.rule.steps == 1
            and self.prototypes.shape[0] < self.head_dim
        )

    def _retrieve_folded(
        self,
        queries: Tensor,
        stored: Tensor,
        values: Tensor | None,
        key_padding_mask: Tensor | None,
        association_mask: Tensor | None,
    ) -> Tensor:
        heads, dtype = self.heads, stored.dtype
        prototypes = queries.unflatten(-1, (heads, -1))  # (S, H, d_h)
        w_key = self.key.weight.to(dtype).unflatten(0, (heads, -1))  # (H, d_h, d)
        folded = torch.einsum("shk,hkd->hsd", prototypes, w_key)  # (H, S, d)
        rows = _apply(self.norm_stored, stored)  # (B, M, d)
        scores = torch.einsum("bmd,hsd->bhsm", rows, folded)  # (B, H, S, M)
        if self.key.bias is not None:  # ⟨q, b_K⟩ per head and prototype
            b_key = self.key.bias.to(dtype).unflatten(0, (heads, -1))  # (H, d_h)
            scores = scores + torch.einsum("shk,hk->hs", prototypes, b_key)[..., None]
        weights = weights_from_scores(
            self.rule,
            self._beta(dtype) * scores,  # (B, H, S, M)
            key_padding_mask=key_padding_mask,
            association_mask=association_mask,
            dropout=self.dropout,
            training=self.training,
        )
        if values is None and self._values_are_keys():
            value_rows = rows  # the keys' own rows: A = W_V ∘ W_K
        else:
            value_rows = _apply(self.norm_values, stored if values is None else values)
        pooled = torch.einsum("bhsm,bmd->bhsd", weights, value_rows)  # Σ_μ w_μ v_μ per head
        out = self._value_map(pooled)  # (B, H, S, H·d_v)
        if self.key.bias is not None or self.value.bias is not None:
            constant = self._value_map(pooled.new_zeros(pooled.shape[-1]))  # A(0) (H·d_v,)
            out = out + constant * (weights.sum(-1, keepdim=True) - 1)
        own = out.unflatten(-1, (heads, -1)).diagonal(dim1=1, dim2=3)  # (B, S, d_v, H)
        return self.out(own.permute(0, 1, 3, 2).flatten(-2))  # (B, S, d_out)

    def _value_map(self, rows: Tensor) -> Tensor:
        """A: a value row (…, d) to the values (…, H·d_v), through W_K unless separate."""
        return self.value(rows if self.config.separate_values else self.key(rows))


class NPHLayer(_Retriever):
    """Retrieve from M learnable stored patterns W_K (M, H·d_h) for input R (B, N, d):
    W_O · T(β R W_Q W_Kᵀ) · W_K W_V -> (B, N, d_out). With `learned="input"` the memories P
    (M, d) are stored patterns: keys LN(P) W_K and values from P, as in hopfield-layers'
    HopfieldLayer. Other keywords: `LayerConfig`'s."""

    identity_maps = ("query", "value", "out")  # not the stored patterns

    def __init__(self, d_model: int, *, memories: int, **options: Unpack[LayerOptions]) -> None:
        check_whole(memories, "memories", 1)
        super().__init__(LayerConfig.build(d_model, dict(options)))
        config = self.config
        self._refuse_projected(
            "NPHLayer",
            {
                "norms.stored": self.norm_stored is not None,
                "norms.values": self.norm_values is not None,
                "separate_values": config.separate_values,
            },
        )
        width = self.heads * self.head_dim
        self.query = nn.Linear(d_model, width, bias=config.bias)  # W_Q
        size = d_model if config.learned_input else width
        self.memories = nn.Parameter(torch.empty(memories, size))  # W_K, or P
        scale = d_model if config.learned_input else self.head_dim
        nn.init.normal_(self.memories, std=1 / math.sqrt(scale))
        if config.learned_input:
            self.key = nn.Linear(d_model, width, bias=config.bias)  # W_K

    def arguments(self) -> dict[str, Any]:
        return {"memories": self.memories.shape[0]}

    def forward(
        self,
        queries: Tensor,
        key_padding_mask: Tensor | None = None,
        *,
        association_mask: Tensor | None = None,
    ) -> Tensor:
        """queries R (B, N, d), key_padding_mask (B, M) bool (True at memories to leave out),
        association_mask (N, M), (B, N, M) or (B, H, N, M) bool -> (B, N, d_out)."""
        _check_input(queries, "queries", self.config.d_model)
        batch, memories = queries.shape[0], self.memories.to(queries.dtype)  # (M, ·)
        if self.config.learned_input:
            keys = self._keys(memories)  # (M, H·d_h)
            values = self._values(None, memories, keys)  # (M, H·d_v)
        else:
            keys, values = memories, self.value(memories)
        q = self.query(_apply(self.norm_state, queries))  # (B, N, H·d_h)
        return self._retrieve(
            q,
            keys.expand(batch, -1, -1),  # (B, M, H·d_h)
            values.expand(batch, -1, -1),  # (B, M, H·d_v)
            key_padding_mask,
            association_mask,
        )
