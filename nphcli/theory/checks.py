"""The paper's §4 checks on queries: the Theorem 4.1 error bound and Corollary 4.1 (the
well-separation condition per pattern is `nphcli.theory.well_separated`).

Notation (Hu et al., "Nonparametric Modern Hopfield Models", ICML 2025, §4): stored patterns
ξ_1 … ξ_M (rows of X (M, d)), a query x (one row of (Q, d)) whose target is ξ_μ, and a
sparse-structured model: softmax over a support set S(x) ⊆ {1 … M} of k memories,

    T(x) = Σ_{ν∈S} p_ν ξ_ν,   p_ν = exp(β⟨x, ξ_ν⟩) / Σ_{ρ∈S} exp(β⟨x, ξ_ρ⟩)

(dense retrieval is S = everything); m, R and Δ_μ as in `nphcli.theory.separation`.

- Theorem 4.1 as stated, for x in the sphere S_μ = {x : ‖x − ξ_μ‖ ≤ R} and μ ∈ S(x):
  ‖T(x) − ξ_μ‖ ≤ m(M + k − 2)·exp(−β(⟨ξ_μ, x⟩ − max_{ν≠μ} ⟨ξ_μ, ξ_ν⟩));
- the query-gap bound, the same with the gap at the query, Δ̃_μ(x) = ⟨x, ξ_μ⟩ − max_{ν≠μ}
  ⟨x, ξ_ν⟩, which holds for every x with μ ∈ S(x) (derived below, with the
  other bounds that hold). The stated bound uses ⟨ξ_μ, ξ_ν⟩ where the proof has ⟨x, ξ_ν⟩; inside
  S_μ the difference can outweigh the constant's slack, and it fails on well-separated,
  in-sphere, in-support queries (docs/reproduction.md; `tests/theory/counterexamples.py`);
- Corollary 4.1, read per query: when μ ∈ S(x), the sparse-structured error is at most the dense
  error ‖T_dense(x) − ξ_μ‖. The errors need not obey it: removing memories from a softmax can
  undo cancellations between the remaining error terms. nph counts how often it holds.

Every check recomputes T(x) here in float64 from the support set (independent of the models'
blockwise code) and reports how far the model's own output is from it (`impl_gap`): a large gap
is an implementation problem, a failure with a small gap a problem with the statement. Which
memories a model's support holds is asked of the model (`support_mask`, which only the
sparse-structured models define), so nothing here knows a model by its name.

The bounds that do hold, and how tight they are (`bound_summary`). With μ ∈ S(x), p the softmax
of β⟨x, ξ_ν⟩ over S(x) and Δ̃_μ(x) = ⟨x, ξ_μ⟩ − max_{ν≠μ} ⟨x, ξ_ν⟩ the query's own gap,

    T(x) − ξ_μ = Σ_{ν∈S, ν≠μ} p_ν (ξ_ν − ξ_μ)                                  (Σ p = 1)

so, every ‖ξ_ν − ξ_μ‖ being at most 2m and every p_ν/p_μ at most exp(−β Δ̃_μ(x)):

    weight:  ‖T(x) − ξ_μ‖ ≤ 2m(1 − p_μ)
    tight:                ≤ 2m(k − 1)·exp(−β Δ̃_μ(x))          (1 − p_μ ≤ Σ_{ν≠μ} p_ν/p_μ)
    query:                ≤ m(M + k − 2)·exp(−β Δ̃_μ(x))        (2(k − 1) ≤ M + k − 2, k ≤ M)
    lemma:                ≤ m(M + k − 2)·exp(−β(Δ_μ − 2m‖x − ξ_μ‖))
                                    (Δ̃_μ(x) ≥ Δ_μ − 2m‖x − ξ_μ‖ by Cauchy–Schwarz)

Each holds for every x whose target is in its support; no sphere or separation premise is
needed. The tightness of a bound on a query is bound / error (≥ 1 when it holds; the stated
Theorem 4.1 bound, which is not valid, can fall below 1).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nphcli.models import HopfieldModel, create_model
from nphcli.theory.separation import Separation, separation
from nphcli.theory.well_separated import well_separation_threshold

# Relative slack when comparing an error with a bound: float64 rounding, nothing more.
RELATIVE_SLACK = 1e-9
QUERY_BLOCK = 256  # queries per block of (Q, M) scores


def _structured_model(model: str, params: dict[str, Any]) -> HopfieldModel | None:
    """The model, if one step of it is sparse-structured (softmax over a support set, see
    `HopfieldModel.support_mask`) and so covered by Theorem 4.1; else None."""
    if params.get("steps", 1) != 1:
        return None
    instance = create_model(model, **params)
    overrides = type(instance).support_mask is not HopfieldModel.support_mask
    return instance if overrides else None


def is_structured(model: str, params: dict[str, Any]) -> bool:
    """Whether Theorem 4.1 covers one step of this model: softmax over a support set."""
    return _structured_model(model, params) is not None


def theorem_bound(beta: float, num_memories: int, k: Tensor, m: float, gap: Tensor) -> Tensor:
    """m(M + k − 2)·exp(−β·gap), elementwise over k and gap (float64)."""
    factor = (num_memories + k.to(torch.float64) - 2).clamp(min=0)
    return m * factor * torch.exp(-beta * gap.to(torch.float64))


@dataclass
class QueryCheck:
    """Theorem 4.1 and Corollary 4.1, per query. Tensors are float64 or bool, shape (Q,)."""

    model: str
    beta: float
    num_memories: int  # M
    m: float
    R: float | None
    target: Tensor  # (Q,) int64 μ
    k: Tensor  # (Q,) int64 support size |S(x)|
    in_support: Tensor  # μ ∈ S(x)
    distance: Tensor  # ‖x − ξ_μ‖
    in_sphere: Tensor  # ‖x − ξ_μ‖ ≤ R
    well_separated: Tensor  # Δ_μ ≥ threshold(k)
    error: Tensor  # ‖T(x) − ξ_μ‖, T recomputed in float64
    model_error: Tensor  # ‖T_model(x) − ξ_μ‖ from the model's own output
    impl_gap: Tensor  # ‖T_model(x) − T(x)‖
    stated_bound: Tensor  # m(M + k − 2) exp(−β(⟨ξ_μ, x⟩ − max_{ν≠μ}⟨ξ_μ, ξ_ν⟩))
    query_bound: Tensor  # m(M + k − 2) exp(−β Δ̃_μ(x))
    dense_error: Tensor  # ‖T_dense(x) − ξ_μ‖, float64
    # The bounds that hold (module docstring), and the stated bound with ν = μ in its max.
    stated_self_bound: Tensor  # m(M + k − 2) exp(−β(⟨ξ_μ, x⟩ − max_ν⟨ξ_μ, ξ_ν⟩))
    lemma_bound: Tensor  # m(M + k − 2) exp(−β(Δ_μ − 2m‖x − ξ_μ‖))
    tight_bound: Tensor  # 2m(k − 1) exp(−β Δ̃_μ(x))
    weight_bound: Tensor  # 2m(1 − p_μ)

    @property
    def premises(self) -> Tensor:
        """Theorem 4.1's premises: μ ∈ S(x) and x ∈ S_μ (‖x − ξ_μ‖ ≤ R)."""
        return self.in_support & self.in_sphere

    def holds(self, bound: str) -> Tensor:
        """(Q,) bool: error ≤ the named bound field (e.g. "lemma_bound"; Corollary 4.1's is
        "dense_error"), to rounding."""
        return self.error <= getattr(self, bound) * (1 + RELATIVE_SLACK)

    def summary(self) -> dict[str, Any]:
        """Counts over the queries (so trials can be added up), and the largest impl_gap."""
        support = self.in_support
        premises = self.premises
        premises_ws = premises & self.well_separated
        stated = self.holds("stated_bound")
        return {
            "queries": int(self.target.numel()),
            "k_mean": float(self.k.double().mean()),
            "in_support": int(support.sum()),
            "in_sphere": int(self.in_sphere.sum()),
            "premises": int(premises.sum()),
            "premises_well_separated": int(premises_ws.sum()),
            "well_separated": int(self.well_separated.sum()),
            "stated_holds": int((stated & support).sum()),
            "stated_holds_premises": int((stated & premises).sum()),
            "stated_holds_premises_well_separated": int((stated & premises_ws).sum()),
            "query_holds": int((self.holds("query_bound") & support).sum()),
            "corollary_holds": int((self.holds("dense_error") & support).sum()),
            "impl_gap_max": float(self.impl_gap.max()) if self.impl_gap.numel() else 0.0,
            **bound_summary(self),
        }

    def per_query(self) -> dict[str, list]:
        """Every per-query field (the tensors, in declaration order) and the three verdicts."""
        tensors = [f.name for f in dataclasses.fields(self) if f.type == "Tensor"]
        out = {name: getattr(self, name).tolist() for name in tensors}
        out["stated_holds"] = self.holds("stated_bound").tolist()
        out["query_holds"] = self.holds("query_bound").tolist()
        out["corollary_holds"] = self.holds("dense_error").tolist()
        return out


def check_queries(
    patterns: Tensor,
    queries: Tensor,
    retrieved: Tensor,
    targets: Tensor,
    positions: Tensor,
    *,
    model: str,
    params: dict[str, Any],
    sep: Separation | None = None,
) -> QueryCheck:
    """Theorem 4.1 and Corollary 4.1 for one step of a sparse-structured `model` (one whose
    `support_mask` gives its support set)
    with `params` (its full parameters, as in a report's config: beta, k, seed, window, ...).

    patterns (M, d): the stored ξ; queries (Q, d): the x given to the model; retrieved (Q, d): the
    model's T(x); targets (Q,): μ per query; positions (Q,): the positions the model was given.
    """
    structured = _structured_model(model, params)
    if structured is None:
        raise ValueError(f"Theorem 4.1 does not cover {model!r} with {params}")
    X = patterns.detach().to("cpu", torch.float64)  # (M, d)
    x_all = queries.detach().to("cpu", torch.float64)  # (Q, d)
    y_all = retrieved.detach().to("cpu", torch.float64)  # (Q, d)
    targets = targets.detach().to("cpu", torch.int64)  # (Q,)
    positions = positions.detach().to("cpu", torch.int64)  # (Q,)
    M = X.shape[0]
    beta = float(params["beta"])
    sep = sep or separation(X, max_rows=None)
    got = _check_blocks(X, x_all, y_all, targets, positions, structured, beta, sep)
    k = got["k"]
    R = sep.R
    distance = torch.linalg.vector_norm(x_all - X[targets], dim=1)  # (Q,)
    in_sphere = distance <= R if R is not None else torch.zeros_like(distance, dtype=torch.bool)
    thresholds = torch.tensor(
        [
            well_separation_threshold(beta, M, int(kq), sep.m, R) if R is not None else math.inf
            for kq in k.tolist()
        ],
        dtype=torch.float64,
    )  # (Q,)
    return QueryCheck(
        model=model,
        beta=beta,
        num_memories=M,
        m=sep.m,
        R=R,
        target=targets,
        k=k,
        in_support=got["in_support"],
        distance=distance,
        in_sphere=in_sphere,
        well_separated=sep.delta[targets] >= thresholds,
        error=got["error"],
        model_error=got["model_error"],
        impl_gap=got["impl_gap"],
        stated_bound=theorem_bound(beta, M, k, sep.m, got["stated_gap"]),
        query_bound=theorem_bound(beta, M, k, sep.m, got["query_gap"]),
        dense_error=got["dense_error"],
        stated_self_bound=theorem_bound(beta, M, k, sep.m, got["stated_self_gap"]),
        lemma_bound=theorem_bound(beta, M, k, sep.m, sep.delta[targets] - 2 * sep.m * distance),
        tight_bound=tight_bound(beta, k, sep.m, got["query_gap"]),
        weight_bound=2 * sep.m * got["rest_weight"],
    )


def _check_blocks(
    X: Tensor,
    x_all: Tensor,
    y_all: Tensor,
    targets: Tensor,
    positions: Tensor,
    model: HopfieldModel,
    beta: float,
    sep: Separation,
) -> dict[str, Tensor]:
    """`_check_block` over blocks of QUERY_BLOCK queries, plus the stated bound's gaps (with ν ≠ μ
    and with ν = μ allowed in its max); per-query tensors (Q,) concatenated."""
    own_norm2 = (X * X).sum(dim=1)  # (M,)
    competitor = own_norm2 - sep.delta  # (M,) max_{ν≠μ} ⟨ξ_μ, ξ_ν⟩ (all rows: not sampled)
    parts: dict[str, list[Tensor]] = {}
    for start in range(0, x_all.shape[0], QUERY_BLOCK):
        block = slice(start, start + QUERY_BLOCK)
        mu = targets[block]  # (B,)
        step = _check_block(X, x_all[block], y_all[block], mu, positions[block], model, beta)
        target_score = (x_all[block] * X[mu]).sum(1)  # (B,) ⟨ξ_μ, x⟩
        step["stated_gap"] = target_score - competitor[mu]  # − max_{ν≠μ}⟨ξ_μ, ξ_ν⟩
        step["stated_self_gap"] = target_score - torch.maximum(competitor, own_norm2)[mu]
        for key, value in step.items():
            parts.setdefault(key, []).append(value)
    return {key: torch.cat(values) for key, values in parts.items()}


def _check_block(
    X: Tensor,
    x: Tensor,
    y: Tensor,
    targets: Tensor,
    positions: Tensor,
    model: HopfieldModel,
    beta: float,
) -> dict[str, Tensor]:
    """The per-query quantities of one block of queries, all float64."""
    rows = torch.arange(x.shape[0])
    scores = x @ X.T  # (B, M) ⟨x, ξ_ν⟩
    support = model.support_mask(scores, positions)  # (B, M)
    target_score = scores[rows, targets]  # (B,)
    others = scores.clone()
    others[rows, targets] = -math.inf
    query_gap = target_score - others.max(dim=1).values  # (B,) Δ̃_μ(x); -inf-safe for M ≥ 2
    T, error, rest = _softmax_retrieval(X, beta * scores, support, targets)
    _, dense_error, _ = _softmax_retrieval(X, beta * scores, torch.ones_like(support), targets)
    return {
        "rest_weight": rest,
        "k": support.sum(dim=1),
        "in_support": support[rows, targets],
        "error": error,
        "model_error": torch.linalg.vector_norm(y - X[targets], dim=1),
        "impl_gap": torch.linalg.vector_norm(y - T, dim=1),
        "query_gap": query_gap,
        "dense_error": dense_error,
    }


def _softmax_retrieval(
    X: Tensor, logits: Tensor, support: Tensor, targets: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """T(x) = Σ_{ν∈S} p_ν ξ_ν (B, d), ‖T(x) − ξ_μ‖ (B,) and 1 − p_μ = Σ_{ν≠μ} p_ν (B,), p the
    softmax of `logits` (B, M) over `support` (B, M).

    The error is computed as ‖Σ_{ν≠μ} p_ν ξ_ν − (Σ_{ν≠μ} p_ν) ξ_μ‖ (Σ p = 1), which never
    subtracts two nearly equal vectors of size ‖ξ_μ‖: tiny errors keep their relative precision,
    so they can be compared with bounds far below float rounding of ξ itself.
    """
    masked = logits.masked_fill(~support, -math.inf)  # (B, M)
    weights = torch.softmax(masked, dim=1)  # (B, M); all-masked rows give NaN
    weights = torch.nan_to_num(weights, nan=0.0)
    T = weights @ X  # (B, d)
    rows = torch.arange(logits.shape[0])
    rest = weights.clone()
    rest[rows, targets] = 0.0  # (B, M) p_ν for ν ≠ μ
    diff = rest @ X - rest.sum(dim=1, keepdim=True) * X[targets]  # (B, d) Σ_{ν≠μ} p_ν (ξ_ν − ξ_μ)
    target_weight = weights[rows, targets]
    # A target outside the support has weight 0: T(x) − ξ_μ is then T(x) − ξ_μ itself.
    outside = target_weight == 0
    if bool(outside.any()):
        diff[outside] = T[outside] - X[targets[outside]]
    return T, torch.linalg.vector_norm(diff, dim=1), rest.sum(dim=1)


def check_report(memory: Any, report: Any) -> QueryCheck | None:
    """`check_queries` for a self-evaluation `RetrievalReport` of `memory`; None when Theorem
    4.1 does not cover the run (another model, several steps, or a hetero-associative memory)."""
    config = report.config
    params = config["params"]
    if not is_structured(config["model"], params) or memory.hetero:
        return None
    if "target_index" not in report.per_query or memory.num_memories < 2:
        return None
    return check_queries(
        memory.patterns,
        report.queries,
        report.retrieved,
        report.per_query["target_index"],
        report.per_query["query_row"],
        model=config["model"],
        params=params,
    )


# The per-query bound fields of `QueryCheck` whose tightness is summarised.
TIGHTNESS_BOUNDS = (
    "stated_bound",
    "stated_self_bound",
    "query_bound",
    "lemma_bound",
    "tight_bound",
    "weight_bound",
)
# The valid bounds (beyond `query_bound`, counted by theory) whose "holds" counts are reported.
VALID_BOUNDS = ("lemma_bound", "tight_bound", "weight_bound")


def tight_bound(beta: float, k: Tensor, m: float, gap: Tensor) -> Tensor:
    """2m(k − 1)·exp(−β·gap), elementwise over k and gap (float64)."""
    factor = (k.to(torch.float64) - 1).clamp(min=0)
    return 2 * m * factor * torch.exp(-beta * gap.to(torch.float64))


def bound_summary(check: Any) -> dict[str, Any]:
    """Counts of the valid bounds holding on in-support queries, the stated bound with ν = μ
    in its max on queries meeting Theorem 4.1's premises, and each bound's tightness
    (min and median of bound / error over in-support queries with a non-zero error)."""
    support = check.in_support
    out: dict[str, Any] = {}
    for name in VALID_BOUNDS:
        out[f"{name.removesuffix('_bound')}_holds"] = int((check.holds(name) & support).sum())
    self_holds = check.holds("stated_self_bound") & check.premises
    out["stated_self_holds_premises"] = int(self_holds.sum())
    error = check.error[support]
    for name in TIGHTNESS_BOUNDS:  # bound / error where the error is not 0
        ratio = (getattr(check, name)[support][error > 0] / error[error > 0]).to(torch.float64)
        short = name.removesuffix("_bound")
        out[f"{short}_tightness_min"] = float(ratio.min()) if ratio.numel() else None
        out[f"{short}_tightness_median"] = float(ratio.median()) if ratio.numel() else None
    return out
