"""The paper's §4: separation, well-separation, Theorem 4.1's bound, Corollary 4.1."""

from __future__ import annotations

import json
import math

import counterexamples as cx
import pytest
import torch
from conftest import assert_one_error_line, write_memory

from nphcli.evaluation.evaluate import evaluate
from nphcli.memory.file import Memory
from nphcli.models import create_model
from nphcli.schema.settings import RetrieveSettings
from nphcli.theory import checks as theory
from nphcli.theory.well_separated import well_separation


def hand_patterns():
    """ξ_1 = (3, 0), ξ_2 = (0, 4), ξ_3 = (0, 0): norms 3, 4, 0; distances 5, 3, 4."""
    return torch.tensor([[3.0, 0.0], [0.0, 4.0], [0.0, 0.0]], dtype=torch.float64)


def test_m_R_delta_and_threshold_by_hand():
    ws = well_separation(hand_patterns(), beta=1.0)  # k = M = 3
    sep = ws.separation
    assert sep.m == 4.0  # max(3, 4, 0)
    assert sep.R == 1.5  # ½ min(5, 3, 4)
    assert sep.delta.tolist() == [9.0, 16.0, 0.0]  # ‖ξ_μ‖² − max_{ν≠μ}⟨ξ_μ, ξ_ν⟩ (all ⟨⟩ = 0)
    # (1/β) ln((M + k − 2) m / R) + 2mR = ln(4 · 4 / 1.5) + 12
    assert ws.threshold == pytest.approx(math.log(16 / 1.5) + 12)
    assert ws.well_separated.tolist() == [False, True, False]
    small_k = well_separation(hand_patterns(), beta=1.0, k=1)
    assert small_k.threshold == pytest.approx(math.log(2 * 4 / 1.5) + 12)


def well_separated_memory():
    """Four big orthogonal patterns and a close small pair (which makes R small), in R^10.

    ξ_i = 10·e_i (i = 1..4), ξ_5 = 0.1·e_5, ξ_6 = 0.1·e_5 + 0.1·e_6: m = 10, R = 0.05,
    Δ = 100 for the big four; with β = 1 the threshold is ln(10·10/0.05) + 1 ≈ 8.6.
    """
    X = torch.zeros(6, 10, dtype=torch.float64)
    for i in range(4):
        X[i, i] = 10.0
    X[4, 4] = 0.1
    X[5, 4], X[5, 5] = 0.1, 0.1
    return X


@pytest.mark.parametrize(
    ("model", "params"),
    [
        ("dense", {}),
        ("topk", {"k": 2}),
        ("topk", {"k": 0.5}),
        ("window", {"window": 1}),
        ("random", {"k": 4, "seed": 3}),
    ],
)
def test_bound_holds_on_well_separated_patterns(model, params):
    X = well_separated_memory()
    ws = well_separation(X, beta=1.0)
    assert ws.separation.R == pytest.approx(0.05)
    assert ws.well_separated.tolist() == [True] * 4 + [False] * 2
    # Queries: each big pattern itself, and moved by 0.04 < R away from every pattern
    # (along e_7 … e_10, which no pattern uses).
    generator = torch.Generator().manual_seed(0)
    targets = torch.arange(4).repeat(3)  # (12,)
    offsets = torch.zeros(12, 10, dtype=torch.float64)
    offsets[4:, 6:] = torch.randn(8, 4, generator=generator, dtype=torch.float64)
    offsets[4:] *= 0.04 / offsets[4:].norm(dim=1, keepdim=True).clamp(min=1e-12)
    queries = X[targets] + offsets  # (12, 10)
    positions = targets
    full = {"beta": 1.0, "steps": 1, **params}
    retrieved = create_model(model, **full).retrieve(queries, X, positions=positions).patterns
    check = theory.check_queries(
        X, queries, retrieved, targets, positions, model=model, params=full
    )
    premises = check.premises & check.well_separated
    assert premises.any()
    assert bool(check.holds("stated_bound")[premises].all())
    assert bool(check.holds("query_bound")[check.in_support].all())
    # The model's own output and the float64 reference agree: the support sets match.
    assert float(check.impl_gap.max()) < 1e-12


def test_stated_bound_counterexample_meets_every_premise():
    example = cx.stated_bound_counterexample()
    X, x = example["patterns"], example["query"]
    target = torch.tensor([example["target"]])
    params = {"beta": example["beta"], "steps": 1}
    y = create_model("dense", **params).retrieve(x, X).patterns
    check = theory.check_queries(X, x, y, target, target, model="dense", params=params)
    assert check.R == pytest.approx(0.05)
    assert bool(check.in_support[0] and check.in_sphere[0] and check.well_separated[0])
    # error > m(M + k − 2) exp(−β(⟨ξ_μ,x⟩ − max⟨ξ_μ,ξ_ν⟩))
    assert not bool(check.holds("stated_bound")[0])
    assert bool(check.holds("query_bound")[0])  # error ≤ m(M + k − 2) exp(−β Δ̃_μ(x))
    # Inside S_μ the stated bound times exp(βm‖x − ξ_μ‖) is always a valid bound.
    corrected = check.stated_bound * torch.exp(check.beta * check.m * check.distance)
    assert bool((check.error <= corrected).all())
    assert float(check.impl_gap[0]) < 1e-15


def test_bounds_on_random_queries():
    """The query-gap bound, and the stated bound corrected by exp(βm‖x − ξ_μ‖), hold for every
    query whose target is in the support; the stated bound as read can fail."""
    generator = torch.Generator().manual_seed(1)
    X = torch.randn(12, 6, generator=generator, dtype=torch.float64)
    targets = torch.arange(12).repeat(4)  # (48,)
    queries = X[targets] + 0.3 * torch.randn(48, 6, generator=generator, dtype=torch.float64)
    for model, params in (("dense", {}), ("topk", {"k": 4}), ("window", {"window": 2})):
        full = {"beta": 2.0, "steps": 1, **params}
        y = create_model(model, **full).retrieve(queries, X, positions=targets).patterns
        check = theory.check_queries(X, queries, y, targets, targets, model=model, params=full)
        support = check.in_support
        assert bool(check.holds("query_bound")[support].all())
        corrected = check.stated_bound * torch.exp(check.beta * check.m * check.distance)
        assert bool((check.error[support] <= corrected[support] * (1 + 1e-9)).all())


def test_corollary_on_constructed_data():
    # Holds: orthogonal patterns queried at themselves; top-k drops competitors only.
    X = 3.0 * torch.eye(6, dtype=torch.float64)
    targets = torch.arange(6)
    params = {"beta": 0.5, "steps": 1, "k": 2}
    y = create_model("topk", **params).retrieve(X, X).patterns
    check = theory.check_queries(X, X, y, targets, targets, model="topk", params=params)
    assert bool(check.in_support.all()) and bool(check.holds("dense_error").all())
    assert bool((check.error < check.dense_error).all())
    # Fails per query: competitors on both sides cancel under dense weights, not under top-2.
    example = cx.corollary_counterexample()
    X, x = example["patterns"], example["query"]
    target = torch.tensor([example["target"]])
    params = {"beta": example["beta"], "steps": 1, "k": example["k"]}
    y = create_model("topk", **params).retrieve(x, X).patterns
    check = theory.check_queries(X, x, y, target, target, model="topk", params=params)
    assert bool(check.in_support[0]) and not bool(check.holds("dense_error")[0])
    # The bounds themselves always obey the corollary: M + k − 2 ≤ 2(M − 1).
    dense = theory.theorem_bound(1.0, 3, torch.tensor([3]), 1.0, torch.tensor([0.5]))
    sparse = theory.theorem_bound(1.0, 3, torch.tensor([2]), 1.0, torch.tensor([0.5]))
    assert float(sparse) <= float(dense)


def test_check_report_on_an_evaluation():
    X = well_separated_memory().float()
    memory = Memory(patterns=X)
    report = evaluate(
        memory, RetrieveSettings(model="topk", params={"beta": 1.0, "k": 3}, dtype="float64")
    )
    check = theory.check_report(memory, report)
    assert check is not None and check.target.tolist() == list(range(6))
    assert float(check.impl_gap.max()) < 1e-6
    linear = evaluate(memory, RetrieveSettings(model="linear", params={"beta": 1.0}))
    assert theory.check_report(memory, linear) is None


def test_analyze_command(invoke, tmp_path):
    path = tmp_path / "m.safetensors"
    write_memory(path, well_separated_memory().float())
    result = invoke("analyze", path, "--beta", "1", "--json", "--per-pattern")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)["well_separation"]
    assert report["well_separated"] == 4 and report["k"] == 6
    assert report["per_pattern"]["well_separated"] == [True] * 4 + [False] * 2
    assert report["m"] == pytest.approx(10) and report["R"] == pytest.approx(0.05)
    checked = invoke("analyze", path, "--beta", "1", "--model", "topk", "--k", "2", "--json")
    assert checked.exit_code == 0, checked.stderr
    summary = json.loads(checked.stdout)["queries"]["summary"]
    assert summary["queries"] == 6 and summary["in_support"] == 6
    assert summary["stated_holds_premises"] == summary["premises"] == 6
    table = invoke("analyze", path, "--beta", "1", "--model", "window", "--window", "1")
    assert table.exit_code == 0 and "Theorem 4.1 per query" in table.stdout
    bad = invoke("analyze", path, "--model", "linear")
    assert assert_one_error_line(bad).startswith("Error: Theorem 4.1 covers")
    assert_one_error_line(invoke("analyze", path, "--mask", "0.5"), "go with --model")
    model_k = invoke("analyze", path, "--k", "2")  # the model's k, not the conditions'
    assert_one_error_line(model_k, "--theorem-k")
    many = invoke("analyze", path, "--model", "topk", "--k", "1,2")
    assert_one_error_line(many, "--k takes one value")


def test_analyze_theorem_k_is_the_conditions_support_size(invoke, tmp_path):
    """--theorem-k sets k in the conditions; --k is the model's, and with --model the
    conditions take the model's support unless --theorem-k says otherwise."""
    path = tmp_path / "m.safetensors"
    write_memory(path, well_separated_memory().float())

    def conditions(*args):
        result = invoke("analyze", path, "--beta", "1", "--json", *args)
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)["well_separation"]["k"]

    assert conditions() == 6  # M, the dense support
    assert conditions("--theorem-k", "2") == 2
    assert conditions("--model", "topk", "--k", "3") == 3  # the model's support
    assert conditions("--model", "topk", "--k", "3", "--theorem-k", "2") == 2
