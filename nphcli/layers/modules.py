"""The paper's deep-learning layers: every retrieval rule of the family as a `torch.nn.Module`.

    NPH(R, Y) = T(β · R W_Q (Y W_K)ᵀ) · Y W_K W_V,   then an output projection W_O,

with T a registered model's retrieval rule, passed as the model itself (`create_model("topk",
k=0.2)`, β included), applied per head. Three configurations, as in the paper:

- `NPH`: queries R (B, N, d), keys and values from Y (B, M, d); self-attention when Y is R.
- `NPHPooling`: S learnable prototype queries pool each set Y (B, M, d) into (B, S, d_out).
- `NPHLayer`: input R only; the stored patterns (keys) are learnable parameters.

The three share one `LayerConfig` (their keyword arguments besides `prototypes` / `memories`).
With identity projections (`identity_()`) and one head, each layer is exactly `rule.retrieve`
(tests check this for every model). The rule's own `associate` / `weights` compute T.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from nphcli.errors import NphError
from nphcli.layers.association import associate, forms_weights, weights_from_scores
from nphcli.models import HopfieldModel, create_model


@dataclass(frozen=True, kw_only=True)
class LayerConfig:
    """What NPH, NPHPooling and NPHLayer are built from; defaults are resolved on creation."""

    d_model: int  # d: width of the inputs R and Y
    rule: HopfieldModel | None = None  # T with its parameters and β (default: dense, 1/√head_dim)
    heads: int = 1  # H: T runs on each head's slice; outputs concatenated
    head_dim: int | None = None  # d_h, width of a head's queries and keys (default d_model / H)
    value_dim: int | None = None  # width of a head's values (default head_dim)
    out_dim: int | None = None  # width of W_O's output (default d_model)
    learn_beta: bool = False  # β becomes a parameter, kept positive as e^log_beta
    dropout: float = 0.0  # on the weights T(·) in training (on the output for feature rules)
    bias: bool = False  # biases in the projections

    def __post_init__(self) -> None:
        for label, value in (("d_model", self.d_model), ("heads", self.heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise NphError(f"{label} must be a whole number ≥ 1, got {value!r}")
        if not (0 <= self.dropout < 1):
            raise NphError(f"dropout must be in [0, 1), got {self.dropout}")
        head_dim = self.head_dim or max(1, self.d_model // self.heads)
        # The attention convention for β, as in hopfield-layers, when no rule is given.
        rule = self.rule
        if rule is None:
            rule = create_model("dense", beta=1 / math.sqrt(head_dim))
        if not isinstance(rule, HopfieldModel):
            raise NphError(
                f"rule must be a model, e.g. rule=create_model('topk', k=0.2), got {rule!r}"
            )
        if rule.steps != 1:
            raise NphError("a layer applies one retrieval step; leave the rule's `steps` at 1")
        resolved = {
            "rule": rule,
            "head_dim": head_dim,
            "value_dim": self.value_dim or head_dim,
            "out_dim": self.out_dim or self.d_model,
        }
        for name, value in resolved.items():
            object.__setattr__(self, name, value)  # frozen: resolved once, here

    @classmethod
    def build(cls, d_model: int, options: dict[str, Any]) -> LayerConfig:
        """The config from a layer's keyword arguments; an unknown one is a user error that
        says where model parameters go."""
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise NphError(
                f"the layers do not take {', '.join(unknown)}; they take "
                f"{', '.join(sorted(known - {'d_model'}))}. Model parameters belong to the rule: "
                "rule=create_model(name, k=..., beta=...)"
            )
        return cls(d_model=d_model, **options)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values, with the rule as {"name": ..., its parameters} (`from_json`)."""
        rule = self.rule
        params = {f.name: getattr(rule, f.name) for f in dataclasses.fields(rule) if f.init}
        return {**dataclasses.asdict(self), "rule": {"name": rule.name, **params}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LayerConfig:
        params = dict(data["rule"])
        return cls(**{**data, "rule": create_model(params.pop("name"), **params)})


class _Retriever(nn.Module):
    """What the three layers share: the retrieval rule, heads, β, the value and output maps."""

    def __init__(self, config: LayerConfig) -> None:
        super().__init__()
        self.config = config
        self.rule = config.rule
        self.heads, self.head_dim, self.value_dim = config.heads, config.head_dim, config.value_dim
        self.dropout = config.dropout
        heads, bias = config.heads, config.bias
        log_beta = torch.tensor(math.log(self.rule.beta), dtype=torch.float64)  # exact in float64
        if config.learn_beta:
            self.log_beta = nn.Parameter(log_beta)  # β = e^log_beta stays positive
        else:
            self.register_buffer("log_beta", log_beta)
        self.value = nn.Linear(heads * self.head_dim, heads * self.value_dim, bias=bias)  # W_V
        self.out = nn.Linear(heads * self.value_dim, config.out_dim, bias=bias)  # W_O

    def arguments(self) -> dict[str, Any]:
        """The class's own constructor arguments beside the config (`save_layer`): none here."""
        return {}

    @property
    def beta(self) -> Tensor:
        """The inverse temperature β (0-d tensor, learnable when `learn_beta`)."""
        return self.log_beta.exp()

    def _split(self, x: Tensor) -> Tensor:
        return x.unflatten(-1, (self.heads, -1)).transpose(-3, -2)  # (B, H, rows, width)

    def _retrieve(self, q: Tensor, keys: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        """q (B, N, H·d_h), keys Y W_K (B, M, H·d_h) -> W_O(T(β q kᵀ) keys W_V) (B, N, d_out)."""
        values = self.value(keys)  # (B, M, H·d_v)
        out = associate(
            self.rule,
            self._split(q),  # (B, H, N, d_h)
            self._split(keys),  # (B, H, M, d_h)
            self._split(values),  # (B, H, M, d_v)
            beta=self.beta.to(q.dtype),
            key_padding_mask=key_padding_mask,
            dropout=self.dropout,
            training=self.training,
        )  # (B, H, N, d_v)
        return self.out(out.transpose(-3, -2).flatten(-2))  # (B, N, d_out)

    def _identity(self, linears: list[nn.Linear]) -> None:
        with torch.no_grad():
            for linear in linears:
                rows, cols = linear.weight.shape
                if rows != cols:
                    raise NphError(
                        f"identity weights need square projections, but one maps {cols} to {rows}"
                        "; use heads·head_dim = heads·value_dim = d_model = out_dim"
                    )
                linear.weight.copy_(torch.eye(rows))
                if linear.bias is not None:
                    linear.bias.zero_()

    def extra_repr(self) -> str:
        return f"rule={self.rule!r}, heads={self.heads}, head_dim={self.head_dim}"


def _check_input(x: Tensor, label: str, dim: int) -> None:
    if x.ndim != 3 or x.shape[-1] != dim:
        raise NphError(f"{label} must have shape (batch, rows, {dim}), got {tuple(x.shape)}")


class NPH(_Retriever):
    """NPH(R, Y) = W_O · T(β R W_Q W_Kᵀ Yᵀ) · Y W_K W_V with learnable W_Q, W_K, W_V, W_O.

    `NPH(d_model, rule=create_model("topk", k=0.2), heads=4, ...)`: the keywords are
    `LayerConfig`'s. β starts at the rule's; `learn_beta=True` makes it a parameter.
    """

    def __init__(self, d_model: int, **options: Any) -> None:
        super().__init__(LayerConfig.build(d_model, options))
        width = self.heads * self.head_dim
        self.query = nn.Linear(d_model, width, bias=self.config.bias)  # W_Q
        self.key = nn.Linear(d_model, width, bias=self.config.bias)  # W_K

    def forward(
        self, queries: Tensor, stored: Tensor | None = None, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """queries R (B, N, d), stored Y (B, M, d) (default R: self-attention), key_padding_mask
        (B, M) bool, True at padded rows of Y -> (B, N, d_out)."""
        stored = queries if stored is None else stored
        _check_input(queries, "queries", self.config.d_model)
        _check_input(stored, "stored patterns", self.config.d_model)
        return self._retrieve(self.query(queries), self.key(stored), key_padding_mask)

    def identity_(self) -> NPH:
        """Set every projection to the identity: the layer is then memory retrieval."""
        self._identity([self.query, self.key, self.value, self.out])
        return self


class NPHPooling(_Retriever):
    """Pool each set Y (B, M, d) with S learnable prototype queries Q (S, H·d_h):
    W_O · T(β Q W_Kᵀ Yᵀ) · Y W_K W_V -> (B, S, d_out). Other keywords: `LayerConfig`'s."""

    def __init__(self, d_model: int, *, prototypes: int = 1, **options: Any) -> None:
        if isinstance(prototypes, bool) or not isinstance(prototypes, int) or prototypes < 1:
            raise NphError(f"prototypes must be a whole number ≥ 1, got {prototypes!r}")
        super().__init__(LayerConfig.build(d_model, options))
        width = self.heads * self.head_dim
        self.prototypes = nn.Parameter(torch.empty(prototypes, width))  # Q
        nn.init.normal_(self.prototypes)
        self.key = nn.Linear(d_model, width, bias=self.config.bias)  # W_K

    def arguments(self) -> dict[str, Any]:
        return {"prototypes": self.prototypes.shape[0]}

    def forward(self, stored: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """stored Y (B, M, d), key_padding_mask (B, M) bool (True = padded) -> (B, S, d_out)."""
        _check_input(stored, "stored patterns", self.config.d_model)
        if self.folds():
            return self._retrieve_folded(stored, key_padding_mask)
        q = self.prototypes.to(stored.dtype).expand(stored.shape[0], -1, -1)  # (B, S, H·d_h)
        return self._retrieve(q, self.key(stored), key_padding_mask)

    def folds(self) -> bool:
        """Whether `forward` folds W_K into the prototypes instead of projecting every stored row.

        Per head, ⟨q, W_K y⟩ = ⟨W_Kᵀ q, y⟩ and Σ w_μ W_V W_K y_μ = W_V W_K Σ w_μ y_μ, so the rule
        can run on the raw rows Y with folded queries and the projections applied to S pooled rows
        only: S·d instead of H·d_h·(d + H·d_v) multiply-adds per stored row. Exact for every rule
        that forms weights from scores; not for the feature rules (linear, random-feature), which
        transform the keys themselves, nor with biases (a dropped-out weight row need not sum to 1).
        """
        return (
            forms_weights(self.rule)
            and self.key.bias is None
            and self.value.bias is None
            and self.prototypes.shape[0] < self.head_dim
        )

    def _retrieve_folded(self, stored: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        heads = self.heads
        prototypes = self.prototypes.to(stored.dtype).unflatten(-1, (heads, -1))  # (S, H, d_h)
        w_key = self.key.weight.to(stored.dtype).unflatten(0, (heads, -1))  # (H, d_h, d)
        folded = torch.einsum("shk,hkd->hsd", prototypes, w_key)  # (H, S, d)
        # Two plain products over the raw rows: scores as one (B·M, d) × (d, H·S) product and the
        # weighted sums batched over the sets, never a per-head copy of Y.
        scores = self.beta.to(stored.dtype) * torch.einsum("bmd,hsd->bhsm", stored, folded)
        weights = weights_from_scores(
            self.rule,
            scores,  # (B, H, S, M)
            key_padding_mask=key_padding_mask,
            dropout=self.dropout,
            training=self.training,
        )
        pooled = torch.einsum("bhsm,bmd->bhsd", weights, stored)  # Σ_μ w_μ y_μ per head
        values = self.value(self.key(pooled)).unflatten(-1, (heads, -1))  # (B, H, S, H, d_v)
        own = values.diagonal(dim1=1, dim2=3)  # (B, S, d_v, H): head h's block of head h's sum
        return self.out(own.permute(0, 1, 3, 2).flatten(-2))  # (B, S, d_out)

    def identity_(self) -> NPHPooling:
        """Identity W_K, W_V, W_O (the prototypes are left as they are)."""
        self._identity([self.key, self.value, self.out])
        return self


class NPHLayer(_Retriever):
    """Retrieve from M learnable stored patterns W_K (M, H·d_h) for input R (B, N, d):
    W_O · T(β R W_Q W_Kᵀ) · W_K W_V -> (B, N, d_out). Other keywords: `LayerConfig`'s."""

    def __init__(self, d_model: int, *, memories: int, **options: Any) -> None:
        if isinstance(memories, bool) or not isinstance(memories, int) or memories < 1:
            raise NphError(f"memories must be a whole number ≥ 1, got {memories!r}")
        super().__init__(LayerConfig.build(d_model, options))
        width = self.heads * self.head_dim
        self.query = nn.Linear(d_model, width, bias=self.config.bias)  # W_Q
        self.memories = nn.Parameter(torch.empty(memories, width))  # W_K
        nn.init.normal_(self.memories, std=1 / math.sqrt(self.head_dim))

    def arguments(self) -> dict[str, Any]:
        return {"memories": self.memories.shape[0]}

    def forward(self, queries: Tensor) -> Tensor:
        """queries R (B, N, d) -> (B, N, d_out)."""
        _check_input(queries, "queries", self.config.d_model)
        keys = self.memories.to(queries.dtype).expand(queries.shape[0], -1, -1)  # (B, M, H·d_h)
        return self._retrieve(self.query(queries), keys, None)

    def identity_(self) -> NPHLayer:
        """Identity W_Q, W_V, W_O (the stored patterns are left as they are)."""
        self._identity([self.query, self.value, self.out])
        return self
