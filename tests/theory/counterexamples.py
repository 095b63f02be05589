"""Small exact counterexamples to §4 of Hu et al. 2025 as stated (docs/reproduction.md), for
the tests (test data, not part of the nph package).

Each function returns float64 `patterns` (M, d), one `query` (1, d), its `target` μ (0-based),
`beta`, the model and its parameters (`model`, `params`), and a one-line `claim` saying what the
example contradicts. `check(example)` runs the model and the float64 checks of `theory.checks`.

Indices in the docstrings are 1-based as in the paper (ξ_1 is row 0).
"""

from __future__ import annotations

from typing import Any

import torch

from nphcli.models import create_model
from nphcli.theory.checks import QueryCheck, check_queries


def stated_bound_counterexample() -> dict[str, Any]:
    """Three patterns and a query on which the stated Theorem 4.1 bound fails although every
    premise holds (x ∈ S_μ, μ in the support, pattern μ well separated), dense retrieval (k = M).

    ξ_1 = e_1, ξ_2 = e_2, ξ_3 = e_2 + 0.1·e_3: m = 1, R = 0.05 (ξ_2 and ξ_3 are close), Δ_1 = 1.
    With β = 10 the condition needs Δ_1 ≥ 0.1·ln(4/0.05) + 0.1 ≈ 0.54: it holds. The query
    x = ξ_1 + 0.045·e_2 lies inside the sphere around ξ_1 and leans towards ξ_2 and ξ_3, so
    ⟨x, ξ_ν⟩ = 0.045 > ⟨ξ_1, ξ_ν⟩ = 0: the competitors gain weight the stated bound ignores
    (error ≈ 2.0e-4, stated bound ≈ 1.8e-4, query-gap bound ≈ 2.9e-4).
    """
    patterns = torch.tensor(
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.1]], dtype=torch.float64
    )  # (3, 3)
    query = torch.tensor([[1.0, 0.045, 0.0]], dtype=torch.float64)  # (1, 3)
    return {"patterns": patterns, "query": query, "target": 0, "beta": 10.0}


def corollary_counterexample() -> dict[str, Any]:
    """Patterns and a query on which top-k retrieval (target in its support) has a larger error
    than dense retrieval: two competitors on either side of ξ_1 pull in opposite directions and
    cancel under dense weights; top-2 keeps only one of them.

    ξ_1 = e_2, ξ_2 = e_2 + e_1, ξ_3 = e_2 − e_1; the query x = e_2 + 0.01·e_1 ranks ξ_2 above ξ_3.
    """
    patterns = torch.tensor([[0.0, 1.0], [1.0, 1.0], [-1.0, 1.0]], dtype=torch.float64)
    query = torch.tensor([[0.01, 1.0]], dtype=torch.float64)
    return {"patterns": patterns, "query": query, "target": 0, "beta": 1.0, "k": 2}


def _example(rows: list[list[float]], query: list[float], **rest: Any) -> dict[str, Any]:
    return {
        "patterns": torch.tensor(rows, dtype=torch.float64),  # (M, d)
        "query": torch.tensor([query], dtype=torch.float64),  # (1, d)
        "target": 0,
        **rest,
    }


def stated_bound_dense() -> dict[str, Any]:
    """Theorem 4.1 as stated fails for dense retrieval (`theory.stated_bound_counterexample`):
    ξ_1 = e_1, ξ_2 = e_2, ξ_3 = e_2 + 0.1e_3, β = 10, x = e_1 + 0.045e_2."""
    base = stated_bound_counterexample()
    return {
        **base,
        "model": "dense",
        "params": {"beta": base["beta"]},
        "claim": "Theorem 4.1 (stated bound), dense, all premises and well separation hold",
    }


def stated_bound_sparse() -> dict[str, Any]:
    """Theorem 4.1 as stated fails for top-3 retrieval by a factor of about 136.

    ξ_1 = e_1, ξ_2 = e_2, ξ_3 = e_2 + 0.6e_3, ξ_4 = −e_1, ξ_5 = −e_1 + 0.6e_4, β = 20,
    x = e_1 + 0.29e_2: m = √1.36, R = 0.3 (the pairs ξ_2, ξ_3 and ξ_4, ξ_5), ‖x − ξ_1‖ = 0.29 ≤ R,
    Δ_1 = 1 above the threshold 0.05·ln(6m/0.3) + 0.6m ≈ 0.86, and the top-3 support is
    {1, 2, 3}. The stated exponent sees ⟨ξ_1, ξ_2⟩ = 0, the query sees ⟨x, ξ_2⟩ = 0.29: the
    error exceeds the bound by exp(20·0.29)/… ≈ 136, and the factor grows like
    exp(β·m·‖x − ξ_μ‖) as β grows, so no constant repairs the statement.
    """
    rows = [
        [1.0, 0.0, 0.0, 0.0],
        [0.0, 1.0, 0.0, 0.0],
        [0.0, 1.0, 0.6, 0.0],
        [-1.0, 0.0, 0.0, 0.0],
        [-1.0, 0.0, 0.0, 0.6],
    ]
    return _example(
        rows,
        [1.0, 0.29, 0.0, 0.0],
        beta=20.0,
        model="topk",
        params={"beta": 20.0, "k": 3},
        claim="Theorem 4.1 (stated bound), top-3, all premises and well separation hold",
    )


def stated_bound_with_self() -> dict[str, Any]:
    """The stated bound with ν = μ allowed in its max (max_ν ⟨ξ_μ, ξ_ν⟩) also fails.

    ξ_1 = (1, 0), ξ_2 = (1, 0.1), β = 100, x = (1.049, 0), dense: R = 0.05, ‖x − ξ_1‖ = 0.049 ≤ R.
    ⟨x, ξ_1⟩ = ⟨x, ξ_2⟩, so T(x) = (1, 0.05) and the error is 0.05, while the bound is
    m·2·exp(−100·0.049) ≈ 0.015. (ξ_1 is not well separated, Δ_1 = 0; that reading's premises
    are only x ∈ S_μ and μ ∈ S(x).)
    """
    return _example(
        [[1.0, 0.0], [1.0, 0.1]],
        [1.049, 0.0],
        beta=100.0,
        model="dense",
        params={"beta": 100.0},
        claim="Theorem 4.1 with max over all ν (ν = μ included), dense, x ∈ S_μ",
    )


def corollary_cancellation() -> dict[str, Any]:
    """Corollary 4.1 per query fails: top-2 error 0.50 against dense 0.0067
    (`corollary_counterexample` above: ξ_1 = e_2, ξ_2,3 = e_2 ± e_1, β = 1, x = e_2 + 0.01e_1).
    The target is not well separated here; `corollary_top_scoring` is the stronger example."""
    base = corollary_counterexample()
    return {
        **base,
        "model": "topk",
        "params": {"beta": base["beta"], "k": base["k"]},
        "claim": "Corollary 4.1 (sparse error ≤ dense error), top-2",
    }


def corollary_top_scoring() -> dict[str, Any]:
    """Corollary 4.1 fails with the target top-scoring, well separated and x ∈ S_μ.

    ξ_1 = e_1, ξ_2,3 = 0.7e_1 ± e_2, ξ_4 = −e_1, ξ_5 = −e_1 + 0.1e_3, β = 50, x = e_1 + 0.01e_2,
    top-2 (support {1, 2}): error 5.27e-7 against the dense 3.80e-7. Dense retrieval also weighs
    ξ_3, whose pull along −e_2 cancels part of ξ_2's; top-2 drops it. Corollary 4.3's proof
    (fixed-point convergence of the sparse model at least as good as the dense one) relies on
    Corollary 4.1.
    """
    rows = [[1.0, 0.0, 0.0], [0.7, 1.0, 0.0], [0.7, -1.0, 0.0], [-1.0, 0.0, 0.0], [-1.0, 0.0, 0.1]]
    return _example(
        rows,
        [1.0, 0.01, 0.0],
        beta=50.0,
        model="topk",
        params={"beta": 50.0, "k": 2},
        claim="Corollary 4.1, top-2, target top-scoring and well separated, x ∈ S_μ",
    )


EXAMPLES = {
    "stated_bound_dense": stated_bound_dense,
    "stated_bound_sparse": stated_bound_sparse,
    "stated_bound_with_self": stated_bound_with_self,
    "corollary_cancellation": corollary_cancellation,
    "corollary_top_scoring": corollary_top_scoring,
}


def check(example: dict[str, Any]) -> QueryCheck:
    """Retrieve the example's query with its model (float64, one step) and run
    `theory.check_queries` on it."""
    X, x = example["patterns"], example["query"]
    target = torch.tensor([example["target"]])
    params = {"steps": 1, **example["params"]}
    y = create_model(example["model"], **params).retrieve(x, X, positions=target).patterns
    return check_queries(X, x, y, target, target, model=example["model"], params=params)
