"""Both readings of well separation, and the fixed-point check."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from conftest import write_memory

from nphcli.theory.energy import fixed_point_check
from nphcli.theory.well_separated import support_reading, well_separation


def reference_support_reading(X, beta, k):
    """Loops: for each μ, the k largest ⟨ξ_μ, ξ_ν⟩ plus μ, R_μ over their pairs, the test."""
    M = X.shape[0]
    m = max(float(X[i].norm()) for i in range(M))
    out = []
    for mu in range(M):
        scores = [float(X[mu] @ X[v]) for v in range(M)]
        order = sorted(range(M), key=lambda v: (-scores[v], v))[:k]
        members = sorted(set(order) | {mu})
        R = 0.5 * min(float((X[a] - X[b]).norm()) for a, b in itertools.combinations(members, 2))
        delta = scores[mu] - max(scores[v] for v in range(M) if v != mu)
        threshold = math.log((M + k - 2) * m / R) / beta + 2 * m * R
        out.append((R, delta >= threshold))
    return out


@pytest.mark.parametrize(("seed", "k"), [(0, 3), (1, 4), (2, 8)])
def test_support_reading_matches_a_loop_reference(seed, k):
    generator = torch.Generator().manual_seed(seed)
    X = torch.randn(8, 3, generator=generator, dtype=torch.float64)
    X[1] = X[0] + 0.01  # a close pair far below every other distance
    got = support_reading(X, 2.0, k)
    expected = reference_support_reading(X, 2.0, k)
    assert got.R.tolist() == pytest.approx([r for r, _ in expected], rel=1e-12)
    assert got.well_separated.tolist() == [w for _, w in expected]


def test_support_reading_with_k_equal_M_is_the_all_pairs_reading():
    generator = torch.Generator().manual_seed(4)
    X = 3 * torch.randn(10, 5, generator=generator, dtype=torch.float64)
    support = support_reading(X, 1.0)
    pairs = well_separation(X, 1.0)
    assert torch.equal(support.well_separated, pairs.well_separated)
    assert float(support.R[0]) == pairs.separation.R


@pytest.mark.parametrize("seed", range(3))
def test_support_reading_never_separates_a_pattern_in_its_supports_closest_pair(seed):
    """Δ_μ ≤ ⟨ξ_μ, ξ_μ − ξ_ν⟩ ≤ m‖ξ_μ − ξ_ν‖ for every ν: if μ itself is in the closest pair of
    its support (distance 2R_μ), Δ_μ ≤ 2mR_μ, below the threshold (log term ≥ 0 here)."""
    generator = torch.Generator().manual_seed(seed)
    X = torch.randn(10, 4, generator=generator, dtype=torch.float64)
    got = support_reading(X, 1.0, 4)
    hits = 0
    for i, mu in enumerate(got.rows.tolist()):
        top = (X @ X[mu]).topk(4).indices.tolist()
        own = min(float((X[mu] - X[v]).norm()) for v in set(top) - {mu})
        if own <= 2 * float(got.R[i]) * (1 + 1e-12):
            hits += 1
            assert not bool(got.well_separated[i])
    assert hits > 0  # the case occurs


def test_fixed_point_check_counts_by_hand():
    X = 3.0 * torch.eye(5, dtype=torch.float64)
    targets = torch.arange(5)
    queries = X + 0.1  # every query is closest to its own pattern
    out = fixed_point_check("topk", {"beta": 2.0, "k": 2}, X, queries, targets, targets, steps=20)
    assert out["queries"] == 5 and out["converged"] == 5 and out["at_target"] == 5
    assert out["energy_monotone"] == 5 and out["dense_energy_monotone"] == 5
    # The fixed point of top-2 is closer to ξ_μ than dense's (fewer competitors).
    assert out["error_le_dense"] == 5 and out["error_mean"] < out["dense_error_mean"]


def test_analyze_json_reports_both_readings_and_fixed_points(invoke, tmp_path):
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(12, 6, generator=generator)
    path = tmp_path / "m.safetensors"
    write_memory(path, X)
    result = invoke(
        "analyze", path, "--beta", "2", "--model", "topk", "--k", "3", "--noise", "0.1",
        "--fixed-point", "5", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["well_separation_support"]["k"] == 3
    assert data["fixed_point"]["queries"] == 12 and data["fixed_point"]["steps"] == 5
    summary = data["queries"]["summary"]
    assert summary["tight_holds"] == summary["lemma_holds"] == summary["in_support"]
    refused = invoke("analyze", path, "--fixed-point", "3")
    assert refused.exit_code != 0
