"""The capacity experiment (Proposition 4.1 / Ramsauer et al. Theorem 3)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import assert_one_error_line

from nphcli.models import create_model
from nphcli.theory import capacity


def w0_bisection(z: float) -> float:
    """W₀(z) for z ≥ 0 by bisection on w·e^w = z: slow, but shares nothing with Halley."""
    lo, hi = 0.0, max(1.0, math.log(z + 1) + 1)
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid * math.exp(mid) < z:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def reference_bound(d: int, K: float, beta: float, p: float) -> tuple[float, float]:
    """c and M* of Theorem 3 written out from the statement, with the bisection W₀."""
    a = 2 / (d - 1) * (1 + math.log(2 * beta * K * K * p * (d - 1)))
    b = 2 * K * K * beta / 5
    c = b / w0_bisection(math.exp(a + math.log(b)))
    return c, math.sqrt(p) * c ** ((d - 1) / 4)


@pytest.mark.parametrize("z", [0.0, 1e-8, 0.3, 1.0, math.e, 3.57, 50.0, 1e6])
def test_lambert_w0_satisfies_its_defining_identity(z):
    w = capacity.lambert_w0(z)
    assert w * math.exp(w) == pytest.approx(z, rel=1e-13, abs=1e-300)
    assert w == pytest.approx(w0_bisection(z), rel=1e-12, abs=1e-15)


def test_lambert_w0_known_values():
    assert capacity.lambert_w0(1.0) == pytest.approx(0.5671432904097838, rel=1e-15)
    assert capacity.lambert_w0(math.e) == pytest.approx(1.0, rel=1e-15)


@pytest.mark.parametrize(
    ("d", "K", "beta", "p"),
    [(20, 3.0, 1.0, 0.001), (75, 1.0, 1.0, 0.001), (40, 2.0, 0.5, 0.01), (10, 1.0, 1.0, 0.1)],
)
def test_bound_matches_an_independent_reference(d, K, beta, p):
    got = capacity.capacity_bound(d, K * math.sqrt(d - 1), beta, p)
    c, m_star = reference_bound(d, K, beta, p)
    assert got["K"] == pytest.approx(K, rel=1e-12)
    assert got["c"] == pytest.approx(c, rel=1e-10)
    assert got["M_star"] == pytest.approx(m_star, rel=1e-9)
    assert got["condition_met"] == (c >= (2 / math.sqrt(p)) ** (4 / (d - 1)))


def test_bound_reproduces_the_papers_two_examples():
    """Theorem 3's text: c ≥ 3.1546 (β = 1, K = 3, d = 20, p = 0.001, a + ln b > 1.27) and
    c ≥ 1.3718 (β = 1, K = 1, d = 75, p = 0.001, a + ln b < −0.94)."""
    first = capacity.capacity_bound(20, 3 * math.sqrt(19), 1.0, 0.001)
    second = capacity.capacity_bound(75, math.sqrt(74), 1.0, 0.001)
    # The theorem prints c truncated to four decimals ("proven for c ≥ ...").
    assert math.floor(first["c"] * 1e4) / 1e4 == 3.1546
    assert first["a"] + math.log(first["b"]) > 1.27
    assert math.floor(second["c"] * 1e4) / 1e4 == 1.3718
    assert second["a"] + math.log(second["b"]) < -0.94
    assert first["condition_met"] and second["condition_met"]
    assert first["M_star"] == pytest.approx(7.413, abs=1e-3)
    assert second["M_star"] == pytest.approx(10.97, abs=1e-2)


def test_the_side_condition_is_m_star_at_least_two():
    """c ≥ (2/√p)^(4/(d−1)) ⇔ √p·c^((d−1)/4) ≥ 2, so a failed condition shows as M* < 2."""
    for radius in (1.0, 2.0, 4.0, 8.0, 13.0):
        bound = capacity.capacity_bound(20, radius, 1.0, 0.001)
        assert bound["condition_met"] == (bound["M_star"] >= 2 * (1 - 1e-12))


def test_sphere_patterns_have_the_radius_and_are_seeded():
    X = capacity.sphere_patterns(50, 7, 2.5, torch.Generator().manual_seed(3))
    assert X.dtype == torch.float64
    assert torch.linalg.vector_norm(X, dim=1).tolist() == pytest.approx([2.5] * 50, rel=1e-12)
    again = capacity.sphere_patterns(50, 7, 2.5, torch.Generator().manual_seed(3))
    assert torch.equal(X, again)


WELL_APART = torch.tensor([[3.0, 0.0], [0.0, 3.0]], dtype=torch.float64)
THETA = 0.15  # the mean lies 0.075 from each: outside 1/(βMm) = 0.05, inside 1/(βm)
CLOSE = torch.tensor([[1.0, 0.0], [math.cos(THETA), math.sin(THETA)]], dtype=torch.float64)


def test_premise_by_hand():
    """Orthogonal, norm 3, β = 1: Δ = 9 ≥ 2/2 + ln(2·1·2·1·9) = 1 + ln 36 ≈ 4.58. Unit vectors
    0.15 rad apart, β = 10: Δ = 1 − cos 0.15 ≈ 0.011 < 0.1 + ln(40)/10 ≈ 0.469."""
    assert capacity.separation_premise(WELL_APART, 1.0).tolist() == [True, True]
    assert capacity.separation_premise(CLOSE, 10.0).tolist() == [False, False]
    # Over a grid of β through the crossing, the verdict is Δ ≥ 2/(βM) + ln(2(M−1)Mβm²)/β.
    flips = set()
    for beta in [0.05 * i for i in range(1, 60)]:
        expected = 9 >= 2 / (beta * 2) + math.log(2 * 1 * 2 * beta * 9) / beta
        flips.add(expected)
        got = capacity.separation_premise(WELL_APART, beta).tolist()
        assert got == [expected, expected], beta
    assert flips == {True, False}


def test_stored_and_retrieved_by_hand():
    """Orthogonal, norm 3, β = 1: the fixed point lies e^−9·3·√2 ≈ 5e-4 from ξ_μ, inside S_μ
    (radius 1/(β·M·m) = 1/6): stored. Unit vectors 0.15 rad apart at β = 10: the Jacobian norm
    is at most β·(‖ξ_1 − ξ_2‖/2)² ≈ 0.056 < 1 on their hull, so the only fixed point is their
    mean, 0.075 from each pattern, outside S_μ (radius 1/20): neither is stored."""
    generator = torch.Generator().manual_seed(0)
    dense = create_model("dense", beta=1.0)
    out = capacity.stored_and_retrieved(dense, WELL_APART, generator, steps=50, epsilon=1e-9)
    assert out["stored"].tolist() == [True, True]
    assert out["at_target"].tolist() == [True, True]
    dense = create_model("dense", beta=10.0)
    out = capacity.stored_and_retrieved(dense, CLOSE, generator, steps=200, epsilon=1e-9)
    assert out["stored"].tolist() == [False, False]
    mean = CLOSE.mean(dim=0)
    end = create_model("dense", beta=10.0, steps=200).retrieve(CLOSE, CLOSE).patterns
    assert torch.allclose(end, mean.expand(2, 2), atol=1e-9)
    assert float(torch.linalg.vector_norm(mean - CLOSE[0])) > 1 / 20


def test_too_few_steps_is_not_a_fixed_point():
    """One step from a point of S_μ does not reach the fixed point to ε = 1e-15: the residual
    test must refuse it (it would pass with a test that never looks at the residual)."""
    generator = torch.Generator().manual_seed(1)
    X = capacity.sphere_patterns(6, 3, 1.0, generator)
    dense = create_model("dense", beta=2.0)
    out = capacity.stored_and_retrieved(dense, X, generator, steps=1, epsilon=1e-15)
    assert not out["stored"].any()


def test_success_is_one_far_below_the_bound():
    """d = 20, K = 3, β = 1 (M* ≈ 7.4): every pattern of every set is stored at M = 2 and 4."""
    request = capacity.CapacityRequest(sizes=(2, 4), trials=2, models=("dense", "topk"))
    rows = capacity.run_capacity(request)["capacity"]["rows"]
    assert [(row["model"], row["M"]) for row in rows] == [
        ("dense", 2),
        ("topk", 2),
        ("dense", 4),
        ("topk", 4),
    ]
    for row in rows:
        assert row["below_bound"] is True
        assert row["all_stored"] == 1.0 and row["premise_all"] == 1.0


def test_failures_appear_when_patterns_crowd():
    """Unit-norm patterns in d = 4 at β = 1: the premise fails and so does storage, which the
    table must show (a success column stuck at 1 would pass the test above)."""
    request = capacity.CapacityRequest(
        dim=4, radius=1.0, sizes=(16,), trials=2, models=("dense",), steps=50
    )
    result = capacity.run_capacity(request)["capacity"]
    (row,) = result["rows"]
    assert row["all_stored"] == 0.0 and row["stored_fraction"] < 0.5
    assert row["premise_all"] == 0.0
    assert result["bound"]["condition_met"] is False and row["below_bound"] is False


def test_cli_json_smoke(invoke):
    result = invoke(
        "analyze", "--capacity", "--sizes", "2,3", "--trials", "1", "--model", "topk",
        "--k", "2", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)["capacity"]
    assert round(out["bound"]["c"], 4) == 3.1546
    assert out["models"] == {"topk": {"beta": 1.0, "k": 2.0}}
    assert [row["M"] for row in out["rows"]] == [2, 3]
    assert all(row["all_stored"] == 1.0 for row in out["rows"])


def test_cli_table_marks_m_star(invoke):
    result = invoke("analyze", "--capacity", "--sizes", "2,8", "--trials", "1", "--model", "dense")
    assert result.exit_code == 0, result.stderr
    assert "M* = √p·c^((d−1)/4)" in result.stdout and "7.413" in result.stdout
    assert "≤ M*" in result.stdout and "> M*" in result.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--capacity", "mem.safetensors"], ["takes no FILE"]),
        (["--capacity", "--sizes", "1,4"], ["--sizes"]),
        (["--capacity", "--sizes", "2,x"], ["--sizes"]),
        (["--capacity", "--sizes", ","], ["--sizes"]),
        (["--capacity", "--failure-p", "0"], ["--failure-p"]),
        (["--capacity", "--failure-p", "1.5"], ["--failure-p"]),
        (["--capacity", "--dim", "1"], ["--dim"]),
        (["--capacity", "--radius", "-1"], ["--radius"]),
        (["--capacity", "--trials", "0"], ["--trials"]),
        (["--capacity", "--epsilon", "0"], ["--epsilon"]),
        (["--capacity", "--beta", "0"], ["--beta"]),
        (["--capacity", "--mask", "0.5"], ["--mask", "--capacity"]),
        (["--capacity", "--steps", "3"], ["--steps"]),
        (["--capacity", "--theorem-k", "3"], ["--theorem-k", "--capacity"]),
        (["--capacity", "--model", "dense,topk"], ["--model takes one value"]),
        (["--capacity", "--model", "hopscotch"], ["hopscotch"]),
        ([], ["FILE", "--capacity"]),
        (["mem.safetensors", "--dim", "8"], ["--dim", "--capacity"]),
    ],
)
def test_cli_bad_input_is_one_error_line(invoke, args, words):
    assert_one_error_line(invoke("analyze", *args), *words)
