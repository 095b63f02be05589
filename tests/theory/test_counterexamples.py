"""The counterexamples to §4 as stated, and the bounds that do hold.

Every quantity is recomputed here from the formulas with plain float64 loops, independently of
`nphcli.theory.checks`, and compared with what nph reports."""

from __future__ import annotations

import itertools
import math

import counterexamples as cx
import pytest
import torch

from nphcli.theory import checks as theory
from nphcli.theory.well_separated import well_separation


def reference(X, x, mu, beta, support):
    """Straight from the definitions: error, m, R, Δ_μ, gaps and bounds (floats)."""
    X = X.tolist()
    x = x[0].tolist()
    M = len(X)
    k = len(support)

    def dot(a, b):
        return math.fsum(ai * bi for ai, bi in zip(a, b, strict=True))

    def norm(a):
        return math.sqrt(dot(a, a))

    def sub(a, b):
        return [ai - bi for ai, bi in zip(a, b, strict=True)]

    m = max(norm(r) for r in X)
    R = 0.5 * min(norm(sub(X[a], X[b])) for a, b in itertools.combinations(range(M), 2))
    delta = dot(X[mu], X[mu]) - max(dot(X[mu], X[v]) for v in range(M) if v != mu)
    top = max(beta * dot(x, X[v]) for v in support)
    w = {v: math.exp(beta * dot(x, X[v]) - top) for v in support}
    z = math.fsum(w.values())
    p = {v: w[v] / z for v in support}
    diff = [math.fsum(p[v] * (X[v][i] - X[mu][i]) for v in support) for i in range(len(x))]
    error = norm(diff)
    dist = norm(sub(x, X[mu]))
    query_gap = dot(x, X[mu]) - max(dot(x, X[v]) for v in range(M) if v != mu)
    stated_gap = dot(X[mu], x) - max(dot(X[mu], X[v]) for v in range(M) if v != mu)
    self_gap = dot(X[mu], x) - max(dot(X[mu], X[v]) for v in range(M))
    factor = m * (M + k - 2)
    return {
        "error": error,
        "m": m,
        "R": R,
        "delta": delta,
        "distance": dist,
        "threshold": math.log((M + k - 2) * m / R) / beta + 2 * m * R,
        "stated": factor * math.exp(-beta * stated_gap),
        "stated_self": factor * math.exp(-beta * self_gap),
        "query": factor * math.exp(-beta * query_gap),
        "lemma": factor * math.exp(-beta * (delta - 2 * m * dist)),
        "tight": 2 * m * (k - 1) * math.exp(-beta * query_gap),
        "weight": 2 * m * (1 - p[mu]),
    }


def dense_error(X, x, mu, beta):
    return reference(X, x, mu, beta, list(range(X.shape[0])))["error"]


def test_sparse_stated_counterexample_meets_every_premise_and_fails_136_fold():
    ex = cx.stated_bound_sparse()
    X, x = ex["patterns"], ex["query"]
    ref = reference(X, x, 0, ex["beta"], [0, 1, 2])
    assert ref["R"] == pytest.approx(0.3) and ref["distance"] <= ref["R"]
    assert ref["delta"] >= ref["threshold"]  # ξ_1 well separated
    ratio = ref["error"] / ref["stated"]
    assert 130 < ratio < 140
    for bound in ("query", "lemma", "tight", "weight"):
        assert ref["error"] <= ref[bound]
    check = cx.check(ex)
    assert check.k.tolist() == [3] and bool(check.in_support[0])
    assert bool(check.premises[0] and check.well_separated[0])
    assert not bool(check.holds("stated_bound")[0])
    assert float(check.error[0]) == pytest.approx(ref["error"], rel=1e-9)
    assert float(check.error[0] / check.stated_bound[0]) == pytest.approx(ratio, rel=1e-9)
    # The model's support is the top-3 {1, 2, 3}: its output matches the reference.
    assert float(check.impl_gap[0]) < 1e-15


def test_sparse_violation_grows_like_exp_beta_m_distance():
    """Raising β multiplies error / stated bound by about exp(Δβ·⟨x − ξ_1, ξ_2⟩) (here 0.29):
    no constant factor in front of the bound repairs it."""
    ex = cx.stated_bound_sparse()
    X, x = ex["patterns"], ex["query"]
    ratios = [
        (lambda r: r["error"] / r["stated"])(reference(X, x, 0, beta, [0, 1, 2]))
        for beta in (20.0, 40.0, 80.0)
    ]
    assert ratios[1] / ratios[0] == pytest.approx(math.exp(20 * 0.29), rel=1e-3)
    assert ratios[2] / ratios[1] == pytest.approx(math.exp(40 * 0.29), rel=1e-3)


def test_dense_stated_counterexample():
    ex = cx.stated_bound_dense()
    X, x = ex["patterns"], ex["query"]
    ref = reference(X, x, 0, ex["beta"], [0, 1, 2])
    assert ref["distance"] <= ref["R"] and ref["delta"] >= ref["threshold"]
    assert ref["error"] > ref["stated"]
    assert ref["error"] == pytest.approx(2.01e-4, rel=5e-3)
    check = cx.check(ex)
    assert not bool(check.holds("stated_bound")[0]) and bool(check.holds("query_bound")[0])


def test_stated_bound_with_self_in_the_max_is_false_too():
    ex = cx.stated_bound_with_self()
    X, x = ex["patterns"], ex["query"]
    ref = reference(X, x, 0, ex["beta"], [0, 1])
    assert ref["distance"] <= ref["R"]
    assert ref["error"] == pytest.approx(0.05, rel=1e-6)
    assert ref["stated_self"] == pytest.approx(0.015, abs=5e-4)
    assert ref["error"] > ref["stated_self"]
    check = cx.check(ex)
    assert bool(check.premises[0])
    assert not bool(check.holds("stated_self_bound")[0])
    assert float(check.stated_self_bound[0]) == pytest.approx(ref["stated_self"], rel=1e-9)
    assert bool(check.holds("query_bound")[0] and check.holds("tight_bound")[0])


def test_corollary_top_scoring_counterexample():
    ex = cx.corollary_top_scoring()
    X, x = ex["patterns"], ex["query"]
    scores = (x @ X.T)[0]
    assert int(scores.argmax()) == 0  # the target scores highest
    ref = reference(X, x, 0, ex["beta"], [0, 1])
    assert ref["distance"] <= ref["R"] and ref["delta"] >= ref["threshold"]
    dense = dense_error(X, x, 0, ex["beta"])
    assert ref["error"] == pytest.approx(5.27e-7, rel=2e-3)
    assert dense == pytest.approx(3.80e-7, rel=2e-3)
    check = cx.check(ex)
    assert bool(check.premises[0] and check.well_separated[0])
    assert not bool(check.holds("dense_error")[0])
    assert float(check.dense_error[0]) == pytest.approx(dense, rel=1e-9)


def test_corollary_cancellation_counterexample():
    ex = cx.corollary_cancellation()
    X, x = ex["patterns"], ex["query"]
    sparse = reference(X, x, 0, ex["beta"], [0, 1])["error"]
    assert sparse > dense_error(X, x, 0, ex["beta"])
    assert not bool(cx.check(ex).holds("dense_error")[0])


def test_every_listed_example_contradicts_its_claim():
    for name, make in cx.EXAMPLES.items():
        check = cx.check(make())
        held = {
            "stated_bound_dense": check.holds("stated_bound"),
            "stated_bound_sparse": check.holds("stated_bound"),
            "stated_bound_with_self": check.holds("stated_self_bound"),
            "corollary_cancellation": check.holds("dense_error"),
            "corollary_top_scoring": check.holds("dense_error"),
        }[name]
        assert bool(check.in_support[0]) and not bool(held[0]), name
        for bound in ("query_bound", "lemma_bound", "tight_bound", "weight_bound"):
            assert bool(check.holds(bound)[0]), (name, bound)


@pytest.mark.parametrize("seed", range(4))
def test_valid_bounds_match_reference_and_hold_on_random_queries(seed):
    generator = torch.Generator().manual_seed(seed)
    X = torch.randn(7, 5, generator=generator, dtype=torch.float64)
    targets = torch.arange(7).repeat(3)  # (21,)
    queries = X[targets] + 0.4 * torch.randn(21, 5, generator=generator, dtype=torch.float64)
    params = {"beta": 1.5, "steps": 1, "k": 3}
    from nphcli.models import create_model

    y = create_model("topk", **params).retrieve(queries, X, positions=targets).patterns
    check = theory.check_queries(X, queries, y, targets, targets, model="topk", params=params)
    scores = queries @ X.T  # (Q, M)
    for q in range(21):
        support = scores[q].topk(3).indices.tolist()
        if int(targets[q]) not in support:
            continue
        ref = reference(X, queries[q : q + 1], int(targets[q]), 1.5, support)
        for name in ("query", "lemma", "tight", "weight", "stated", "stated_self"):
            assert float(getattr(check, f"{name}_bound")[q]) == pytest.approx(ref[name], rel=1e-9)
        # Chain of the module docstring: error ≤ weight ≤ tight ≤ query ≤ lemma.
        chain = [ref["error"], ref["weight"], ref["tight"], ref["query"], ref["lemma"]]
        assert all(a <= b * (1 + 1e-12) for a, b in itertools.pairwise(chain))
    summary = check.summary()
    assert summary["lemma_holds"] == summary["tight_holds"] == summary["in_support"]
    assert summary["tight_tightness_min"] >= 1.0
    assert summary["query_tightness_min"] >= summary["tight_tightness_min"]


@pytest.mark.parametrize("seed", range(5))
def test_closest_pair_is_never_well_separated_with_R_over_all_pairs(seed):
    generator = torch.Generator().manual_seed(seed)
    X = torch.randn(9, 4, generator=generator, dtype=torch.float64)
    for beta in (0.1, 1.0, 10.0, 1000.0):
        distances = torch.cdist(X, X).fill_diagonal_(math.inf)  # (M, M)
        a, b = divmod(int(distances.argmin()), X.shape[0])  # the two closest patterns
        separated = well_separation(X, beta).well_separated
        assert not (separated[a] and separated[b])
