"""Model energies (engine.energy) and traces (theory.energy): reference values,
−∇E(x) = T(x) − x, and monotone descent."""

from __future__ import annotations

import json
import math

import pytest
import torch

from nphcli.engine.energy import energy
from nphcli.models import create_model
from nphcli.theory import energy as en

ENERGY_MODELS = [
    ("dense", {}),
    ("sparse", {}),
    ("entmax", {"alpha": 1.5}),
    ("entmax", {"alpha": 1.2}),
    ("topk", {"k": 3}),
    ("window", {"window": 2}),
    ("random", {"k": 4, "seed": 5}),
]


def data(seed=0, M=9, d=6, Q=5, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    X = scale * torch.randn(M, d, generator=generator, dtype=torch.float64)
    x = scale * torch.randn(Q, d, generator=generator, dtype=torch.float64)
    return X, x


def simplex_projection(z):
    """Sparsemax of one list by the sort-and-threshold formula (Martins & Astudillo 2016)."""
    s = sorted(z, reverse=True)
    cumulative = 0.0
    tau = None
    for j, value in enumerate(s, start=1):
        cumulative += value
        if 1 + j * value > cumulative:
            tau = (cumulative - 1) / j
    return [max(v - tau, 0.0) for v in z]


def test_dense_energy_matches_the_log_sum_exp_formula():
    X, x = data()
    beta = 0.7
    got = create_model("dense", beta=beta).energy(x, X, torch.arange(5))
    for q in range(5):
        xs = x[q].tolist()
        scores = [beta * sum(a * b for a, b in zip(xs, row, strict=True)) for row in X.tolist()]
        top = max(scores)
        lse = top + math.log(sum(math.exp(s - top) for s in scores))
        expected = -lse / beta + 0.5 * sum(v * v for v in xs)
        assert float(got[q]) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_sparse_energy_matches_the_projection_identity():
    """Ψ*_2(z) = max_p ⟨p, z⟩ + ½(1 − ‖p‖²) = ½‖z‖² − ½‖z − sparsemax(z)‖² + ½."""
    X, x = data(1)
    beta = 1.3
    got = create_model("sparse", beta=beta).energy(x, X, torch.arange(5))
    for q in range(5):
        z = [beta * float(v) for v in (X @ x[q])]
        p = simplex_projection(z)
        gap = sum((a - b) ** 2 for a, b in zip(z, p, strict=True))
        conj = 0.5 * sum(v * v for v in z) - 0.5 * gap + 0.5
        expected = -conj / beta + 0.5 * float(x[q] @ x[q])
        assert float(got[q]) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_entmax_energy_tends_to_dense_and_equals_sparse_at_the_ends():
    X, x = data(2)
    pos = torch.arange(5)
    dense = create_model("dense", beta=0.9).energy(x, X, pos)
    near_one = create_model("entmax", beta=0.9, alpha=1.0001).energy(x, X, pos)
    assert torch.allclose(near_one, dense, atol=2e-3)
    assert torch.equal(create_model("entmax", beta=0.9, alpha=1.0).energy(x, X, pos), dense)
    sparse = create_model("sparse", beta=0.9).energy(x, X, pos)
    two = energy(x, X, 0.9, alpha=2.0)
    assert torch.allclose(sparse, two, rtol=0, atol=1e-13)


@pytest.mark.parametrize(("model", "params"), ENERGY_MODELS)
def test_minus_gradient_of_energy_is_the_update_step(model, params):
    """−∇E(x) = T(x) − x: the update is the concave–convex step on the energy."""
    X, x = data(3)
    instance = create_model(model, beta=0.8, **params)
    positions = torch.arange(5)
    xg = x.clone().requires_grad_(True)
    instance.energy(xg, X, positions).sum().backward()
    step = instance.retrieve(x, X, positions=positions).patterns
    assert torch.allclose(-xg.grad, step - x, rtol=0, atol=1e-9)


@pytest.mark.parametrize(("model", "params"), ENERGY_MODELS)
@pytest.mark.parametrize("seed", range(3))
def test_energy_never_increases_along_iteration(model, params, seed):
    X, x = data(10 + seed, M=16, d=8, Q=16, scale=1.5)
    instance = create_model(model, beta=2.0, **params)
    trace = en.trace(instance, x, X, 12)
    energies = trace.energy  # (13, Q)
    scale = energies.abs().max()
    rises = energies[1:] - energies[:-1]
    assert float(rises.max()) <= 1e-12 * float(scale)
    assert float(energies[-1].mean()) < float(energies[0].mean())  # it does descend


def test_trace_residuals_and_end_point_match_iterated_retrieval():
    X, x = data(4)
    model = create_model("sparse", beta=1.5)
    trace = en.trace(model, x, X, 4)
    state = x
    for t in range(4):
        step = model.retrieve(state, X).patterns
        assert torch.allclose(trace.residual[t], (step - state).norm(dim=1), atol=1e-12)
        state = step
    full = create_model("sparse", beta=1.5, steps=4).retrieve(x, X).patterns
    assert torch.allclose(trace.final, full, atol=1e-12)
    assert trace.energy.shape == (5, 5) and trace.residual.shape == (4, 5)


def test_theory_does_not_import_models_inside_functions():
    """The energies sit below the models (engine) and traces above them (theory): no import
    from theory inside a model and no function-level import of the models in theory."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "nphcli"
    for path in [*root.glob("models/*.py"), root / "theory" / "energy.py"]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("nphcli.theory"), f"{path.name} imports theory"
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            inner = [
                n.module
                for n in ast.walk(function)
                if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("nphcli.")
            ]
            assert not inner, f"{path.name}:{function.name} imports {inner} inside a function"


def test_models_without_an_energy_say_so():
    X, x = data(5)
    linear = create_model("linear")
    assert linear.energy(x, X, torch.arange(5)) is None
    trace = en.trace(linear, x, X, 2)
    assert trace.energy is None and trace.to_json()[0]["energy_mean"] is None


@pytest.fixture
def retrieve(invoke):
    def run(*args: str):
        return invoke("retrieve", *args)

    return run


def test_retrieve_trace_json(retrieve, memory_file):
    result = retrieve(
        "--memory", memory_file, "--model", "sparse", "--beta", "1", "--noise", "0.5",
        "--steps", "4", "--queries", "12", "--trace", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    steps = json.loads(result.stdout)["trace"]
    assert [item["step"] for item in steps] == [0, 1, 2, 3, 4]
    assert all(item["energy_rise_max"] <= 1e-9 for item in steps[1:])
    assert steps[0]["residual_max"] > 0 and steps[-1]["residual_mean"] is None
    table = retrieve("--memory", memory_file, "--model", "dense", "--steps", "2", "--trace")
    assert table.exit_code == 0 and "Trace" in table.stdout
    refused = retrieve("--memory", memory_file, "--steps", "2", "--trace", "--csv")
    assert refused.exit_code != 0 and "--trace" in refused.stderr
