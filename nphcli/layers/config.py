"""`LayerConfig`: what NPH, NPHPooling and NPHLayer are built from, each option declared once."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, TypedDict

import torch

from nphcli.core.errors import NphError
from nphcli.models import HopfieldModel, Retriever, create_model
from nphcli.models.inputs import check_whole

NORM_KINDS = ("affine", "plain")  # layer norm with a learnable scale and shift, or without
LEARNED_SPACES = ("projected", "input")


class LayerOptions(TypedDict, total=False):
    """The layers' keywords for a type checker: `LayerConfig`'s fields but `d_model`."""

    rule: Retriever | None  # a Hopfield model (a baseline is refused)
    heads: int
    head_dim: int | None
    value_dim: int | None
    out_dim: int | None
    head_beta: tuple[float, ...] | None
    learn_beta: bool
    dropout: float
    bias: bool
    separate_values: bool
    learned: str
    norms: Norms


@dataclass(frozen=True, kw_only=True)
class Norms:
    """Layer norms on the inputs before their projections, each None (off), "affine" or "plain"."""

    stored: str | None = None  # on the stored patterns Y, before W_K
    state: str | None = None  # on the queries R (state patterns), before W_Q
    values: str | None = None  # on the value inputs V (default Y), before W_V
    eps: float = 1e-5  # added to the variance, as torch.nn.LayerNorm

    def __post_init__(self) -> None:
        for name in ("stored", "state", "values"):
            kind = getattr(self, name)
            if kind is not None and kind not in NORM_KINDS:
                raise NphError(f"norms.{name} must be None, 'affine' or 'plain', got {kind!r}")
        if not (isinstance(self.eps, (int, float)) and math.isfinite(self.eps) and self.eps > 0):
            raise NphError(f"norms.eps must be a finite number > 0, got {self.eps!r}")


@dataclass(frozen=True, kw_only=True)
class LayerConfig:
    """What NPH, NPHPooling and NPHLayer are built from; defaults are resolved on creation."""

    d_model: int  # d: width of the inputs R, Y and V
    rule: Retriever | None = None  # T with its parameters, β, steps, tol (default: dense)
    heads: int = 1  # H: T runs on each head's slice; outputs concatenated
    head_dim: int | None = None  # d_h, width of a head's queries and keys (default d_model / H)
    value_dim: int | None = None  # width of a head's values (default head_dim)
    out_dim: int | None = None  # width of W_O's output (default d_model)
    head_beta: tuple[float, ...] | None = None  # one β per head instead of the rule's
    learn_beta: bool = False  # β (or each head's) becomes a parameter, kept positive as e^log_beta
    dropout: float = 0.0  # on the weights T(·) in training (on the output for feature rules)
    bias: bool = False  # biases in the projections
    separate_values: bool = False  # values V W_V (hopfield-layers); False: V W_K W_V (NPH)
    learned: str = "projected"  # NPHPooling's prototypes, NPHLayer's memories: see `learned_input`
    norms: Norms = field(default_factory=Norms)  # layer norms on the inputs

    def __post_init__(self) -> None:
        for label in ("d_model", "heads", "head_dim", "value_dim", "out_dim"):
            if label in ("d_model", "heads") or getattr(self, label) is not None:  # None: default
                check_whole(getattr(self, label), label, 1)
        if not (0 <= self.dropout < 1):
            raise NphError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.learned not in LEARNED_SPACES:
            raise NphError(f"learned must be 'projected' or 'input', got {self.learned!r}")
        if not isinstance(self.norms, Norms):
            raise NphError(f"norms must be a Norms(...), got {self.norms!r}")
        head_dim = self.head_dim or max(1, self.d_model // self.heads)
        # The attention convention for β, as in hopfield-layers, when no rule is given.
        rule = self.rule
        if rule is None:
            rule = create_model("dense", beta=1 / math.sqrt(head_dim))
        if isinstance(rule, Retriever) and rule.baseline:
            raise NphError(
                f"model {rule.name!r} is a retrieval baseline with no layer form; use one of "
                "the Hopfield models in a layer"
            )
        if not isinstance(rule, HopfieldModel):
            raise NphError(
                f"rule must be a model, e.g. rule=create_model('topk', k=0.2), got {rule!r}"
            )
        resolved = {
            "rule": rule,
            "head_dim": head_dim,
            "value_dim": self.value_dim or head_dim,
            "out_dim": self.out_dim or self.d_model,
            "head_beta": _head_beta(self.head_beta, self.heads),
        }
        for name, value in resolved.items():
            object.__setattr__(self, name, value)  # frozen: resolved once, here

    @property
    def learned_input(self) -> bool:
        """Whether learned patterns are inputs (width d_model, projected like one), or else
        the queries / keys themselves (width heads·head_dim)."""
        return self.learned == "input"

    def initial_log_beta(self) -> torch.Tensor:
        """log β: 0-d from the rule, or (H,) from `head_beta`; float64, exact."""
        beta = self.rule.beta if self.head_beta is None else self.head_beta
        return torch.tensor(beta, dtype=torch.float64).log()

    @classmethod
    def build(cls, d_model: int, options: dict[str, Any]) -> LayerConfig:
        """The config from a layer's keywords; an unknown one says where model parameters go."""
        known = {f.name for f in dataclasses.fields(cls)}
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
        """The config of `to_json`; fields a file predates take their defaults."""
        params = dict(data["rule"])
        norms = Norms(**data.get("norms", {}))
        return cls(**{**data, "rule": create_model(params.pop("name"), **params), "norms": norms})


def _head_beta(given: Any, heads: int) -> tuple[float, ...] | None:
    """`head_beta` as a tuple of H positive floats (a list or tensor is accepted)."""
    if given is None:
        return None
    values = given.detach().cpu().tolist() if isinstance(given, torch.Tensor) else given
    try:
        values = tuple(float(value) for value in values)
    except (TypeError, ValueError):
        raise NphError(f"head_beta must be {heads} numbers, one per head, got {given!r}") from None
    if len(values) != heads or not all(math.isfinite(b) and b > 0 for b in values):
        raise NphError(f"head_beta must be {heads} finite numbers > 0, one per head, got {values}")
    return values


def hopfield_layers_options() -> dict[str, Any]:
    """The `LayerConfig` fields that give hopfield-layers' defaults."""
    return {
        "bias": True,
        "separate_values": True,
        "learned": "input",
        "norms": Norms(stored="affine", state="affine", values="affine"),
    }
