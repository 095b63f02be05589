"""The baselines (nearest neighbour, classical Hopfield networks) against references written from
their formulas, on every kind of memory, and their refusals."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_one_error_line, write_memory

from nphcli.core.errors import NphError
from nphcli.engine.planning import Plan
from nphcli.memory import open_memory
from nphcli.memory.shards import write_shards
from nphcli.models import create_model, get_model_info, layer_model_names, model_names

CLASSICAL = ("hebbian", "pseudoinverse")


def _binary(rows: int, dim: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.where(torch.rand(rows, dim, generator=g) < 0.5, -1.0, 1.0).double()  # (M, d)


def _flip(patterns: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    out = patterns.clone()
    for row in out:
        row[torch.randperm(row.numel(), generator=g)[:count]] *= -1
    return out


# -- references, from the formulas ----------------------------------------------------------------
def nearest_reference(queries, keys, metric):
    """argmin ‖x − ξ‖ (or argmax cos) by an explicit loop; ties to the lower index."""
    index = []
    for x in queries:
        best, best_score = 0, None
        for mu, xi in enumerate(keys):
            if metric == "euclidean":
                score = -float(((x - xi) ** 2).sum())
            else:
                score = float(x @ xi) / float(xi.norm()) if float(xi.norm()) > 0 else -float("inf")
            if best_score is None or score > best_score:
                best, best_score = mu, score
        index.append(best)
    return torch.tensor(index)


def hebbian_reference(patterns):
    """W_ij = (1/d) Σ_μ ξ_μi ξ_μj, i ≠ j; W_ii = 0."""
    dim = patterns.shape[1]
    weights = torch.zeros(dim, dim, dtype=torch.float64)
    for i in range(dim):
        for j in range(dim):
            if i != j:
                weights[i, j] = sum(float(p[i] * p[j]) for p in patterns) / dim
    return weights


def projection_reference(patterns):
    """W = Ξ⁺ Ξ with the Moore–Penrose pseudo-inverse (numpy's SVD)."""
    array = patterns.numpy()
    import numpy as np

    return torch.from_numpy(np.linalg.pinv(array) @ array)


def network_reference(queries, weights, steps, order=None):
    """s₀ = sgn(x) (0 → +1); sweeps of s_i ← sgn(Σ_j W_ij s_j), h = 0 keeping s_i; synchronous
    (order None) or one neuron at a time in `order`; stop when a sweep changes nothing."""
    out = []
    for x in queries:
        s = [1.0 if float(v) >= 0 else -1.0 for v in x]
        for _ in range(steps):
            old = list(s)
            if order is None:
                fields = [
                    sum(float(weights[i, j]) * old[j] for j in range(len(s))) for i in range(len(s))
                ]
                s = [1.0 if h > 0 else -1.0 if h < 0 else old[i] for i, h in enumerate(fields)]
            else:
                for i in order:
                    h = sum(float(weights[i, j]) * s[j] for j in range(len(s)))
                    s[i] = 1.0 if h > 0 else -1.0 if h < 0 else s[i]
            if s == old:
                break
        out.append(s)
    return torch.tensor(out, dtype=torch.float64)


# -- nearest --------------------------------------------------------------------------------------
@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_nearest_is_the_reference_on_every_bank(tmp_path, device, metric):
    g = torch.Generator().manual_seed(3)
    keys = torch.randn(40, 6, generator=g, dtype=torch.float64) * torch.rand(40, 1, generator=g) * 3
    keys[7] = keys[3]  # a duplicate: the tie goes to the lower index
    values = torch.randn(40, 4, generator=g, dtype=torch.float64)
    queries = torch.randn(9, 6, generator=g, dtype=torch.float64)
    queries[0] = keys[7]
    want = nearest_reference(queries, keys, metric)
    model = create_model("nearest", metric=metric)
    got = model.retrieve(queries.to(device), keys.to(device), values.to(device))
    assert torch.equal(got.patterns.cpu(), values[want]) and int(want[0]) == 3
    assert torch.equal(got.support.cpu(), torch.ones(9, dtype=torch.int64))
    path = tmp_path / "m.safetensors"
    write_memory(path, keys, values=values, labels=torch.arange(40) % 3, dtype=torch.float64)
    (tmp_path / "s").mkdir()
    manifest = write_shards(path, tmp_path / "s", sizes=[10, 13, 17])
    for bank in (
        open_memory(path, stream=True),
        open_memory(manifest, owned=range(3)),
        open_memory(manifest, stream=True),
    ):
        for plan in (None, Plan(query_rows=4, memory_rows=6)):
            assert torch.equal(model.retrieve(queries, bank, plan=plan).patterns, values[want])


def test_nearest_is_top1_in_the_beta_limit_in_one_step():
    g = torch.Generator().manual_seed(4)
    keys = torch.randn(30, 8, generator=g, dtype=torch.float64)
    keys = keys / keys.norm(dim=1, keepdim=True)  # equal norms: Euclidean = inner product order
    queries = torch.randn(6, 8, generator=g, dtype=torch.float64)
    near = create_model("nearest").retrieve(queries, keys).patterns
    top1 = create_model("topk", k=1, beta=1.0).retrieve(queries, keys).patterns
    assert torch.equal(near, top1)
    assert create_model("nearest").retrieve(queries, keys).steps.tolist() == [1] * 6


def test_baselines_take_no_parameter_they_would_ignore(invoke, mnist):
    """nearest is applied once and scales no scores; the classical networks iterate (steps, tol)
    but have no β. A parameter a model would ignore is refused, by name, in one line."""
    taken = {name: {p.name for p in get_model_info(name).params} for name in ("nearest", "hebbian")}
    assert not taken["nearest"] & {"beta", "steps", "tol"}
    assert {"steps", "tol"} <= taken["hebbian"] and "beta" not in taken["hebbian"]
    for name, given in (
        ("nearest", {"beta": 3.0}),
        ("nearest", {"steps": 2}),
        ("hebbian", {"beta": 1.0}),
    ):
        with pytest.raises(NphError, match=f"does not take --{next(iter(given))}"):
            create_model(name, **given)
    result = invoke("retrieve", "--memory", mnist, "--model", "nearest", "--beta", "3")
    assert_one_error_line(result, "no listed model (nearest) takes --beta")
    result = invoke("retrieve", "--memory", mnist, "--model", "nearest", "--queries", "3", "--json")
    assert result.exit_code == 0, result.stderr
    assert "β" not in result.stderr and "beta" not in result.stderr  # no notice about a β it lacks
    assert json.loads(result.stdout)["config"]["params"] == {"metric": "euclidean"}


def test_nearest_half_precision_agrees_on_separated_memories():
    keys = torch.eye(8, dtype=torch.float64) * torch.arange(1, 9, dtype=torch.float64)[:, None]
    queries = keys[[2, 5]] + 0.05
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        got = create_model("nearest").retrieve(queries.to(dtype), keys.to(dtype)).patterns
        assert torch.equal(got.double(), keys[[2, 5]])


def test_nearest_refuses_an_unknown_metric():
    with pytest.raises(NphError, match="--metric must be one of euclidean, cosine"):
        create_model("nearest", metric="manhattan")


# -- classical networks ---------------------------------------------------------------------------
def test_weights_are_the_formulas():
    from nphcli.engine.baselines import hebbian_couplings, projection_weights

    patterns = _binary(5, 12, 0)
    g = patterns.T @ patterns
    torch.testing.assert_close(hebbian_couplings(g) / 12, hebbian_reference(patterns))
    torch.testing.assert_close(projection_weights(g), projection_reference(patterns))
    dependent = torch.cat([patterns, patterns[:2] * -1])  # rank 5 of 7 rows: still a projection
    w = projection_weights(dependent.T @ dependent)
    torch.testing.assert_close(w, projection_reference(dependent))
    torch.testing.assert_close(w @ w, w)


@pytest.mark.parametrize("name", CLASSICAL)
@pytest.mark.parametrize("order", ["sync", "async"])
def test_network_is_the_reference(name, order):
    patterns = _binary(4, 16, 1)
    queries = _flip(patterns, 3, 2)
    queries[0] *= 0.3  # real-valued queries are binarised first
    queries[1, 0] = 0.0  # sgn(0) = +1
    model = create_model(name, order=order, order_seed=5, steps=6)
    weights = (hebbian_reference if name == "hebbian" else projection_reference)(patterns)
    sequence = None
    if order == "async":
        sequence = torch.randperm(16, generator=torch.Generator().manual_seed(5)).tolist()
    want = network_reference(queries, weights, 6, sequence)
    got = model.retrieve(queries, patterns)
    torch.testing.assert_close(got.patterns, want)


@pytest.mark.parametrize("name", CLASSICAL)
def test_stored_patterns_are_fixed_points_below_capacity(name):
    patterns = _binary(6, 200, 3)  # 0.03·d, well below 0.138·d
    got = create_model(name, steps=5).retrieve(_flip(patterns, 20, 4), patterns)
    assert torch.equal(got.patterns, patterns)


def test_projection_stores_correlated_patterns_that_hebbian_loses():
    base = _binary(1, 100, 5)
    patterns = torch.cat([_flip(base, 10, seed) for seed in range(6, 14)])  # overlap 0.8
    assert torch.equal(
        create_model("pseudoinverse").retrieve(patterns, patterns).patterns, patterns
    )
    assert not torch.equal(create_model("hebbian").retrieve(patterns, patterns).patterns, patterns)


@pytest.mark.parametrize("name", CLASSICAL)
def test_network_on_streamed_sharded_half_and_blocks(tmp_path, name):
    patterns = _binary(40, 6 * 4, 6)
    queries = _flip(patterns[:9], 2, 7)
    model = create_model(name, steps=4, order="async")
    want = model.retrieve(queries, patterns).patterns
    path = tmp_path / "m.safetensors"
    write_memory(path, patterns, labels=torch.arange(40) % 3, dtype=torch.float64)
    (tmp_path / "s").mkdir()
    manifest = write_shards(path, tmp_path / "s", sizes=[10, 13, 17])
    for bank in (open_memory(path, stream=True), open_memory(manifest, owned=range(3))):
        for plan in (None, Plan(query_rows=4, memory_rows=6)):
            assert torch.equal(model.retrieve(queries, bank, plan=plan).patterns, want)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        got = model.retrieve(queries.to(dtype), patterns.to(dtype)).patterns
        assert torch.equal(got.double(), want)


def test_network_refusals():
    real = torch.randn(5, 8, dtype=torch.float64)
    with pytest.raises(NphError, match="±1 patterns only.*binarise"):
        create_model("hebbian").retrieve(real, real)
    patterns = _binary(5, 8, 8)
    with pytest.raises(NphError, match="auto-associative"):
        create_model("pseudoinverse").retrieve(patterns, patterns, torch.randn(5, 3).double())
    with pytest.raises(NphError, match="raise --memory-budget to at least"):
        create_model("hebbian").retrieve(patterns, patterns, memory_budget=100)
    with pytest.raises(NphError, match="--order must be one of sync, async"):
        create_model("hebbian", order="random")
    with pytest.raises(NphError, match="--order-seed"):
        create_model("hebbian", order_seed=-1)


# -- every surface --------------------------------------------------------------------------------
def test_baselines_are_registered_with_their_cost_and_no_layer_form():
    for name in ("nearest", *CLASSICAL):
        info = get_model_info(name)
        assert info.cls.baseline and "O(" in info.cost and name in model_names()
        assert name not in layer_model_names()
    from nphcli.layers import NPH

    with pytest.raises(NphError, match="retrieval baseline with no layer form"):
        NPH(4, rule=create_model("nearest"))(torch.randn(1, 2, 4), torch.randn(1, 3, 4))


def test_cli_runs_the_baselines_beside_a_hopfield_model(invoke, tmp_path):
    memory = tmp_path / "binary.safetensors"
    stored = invoke(
        "store",
        "random",
        "--distribution",
        "binary",
        "--dim",
        "64",
        "--n",
        "8",
        "--out",
        str(memory),
    )
    assert stored.exit_code == 0, stored.stderr
    result = invoke(
        "retrieve",
        "--memory",
        str(memory),
        "--model",
        "dense,nearest,hebbian,pseudoinverse",
        "--order",
        "sync,async",
        "--noise",
        "0.5",
        "--steps",
        "5",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert len(rows) == 1 + 1 + 2 * 2
    models = sorted(row["config"]["model"] for row in rows)
    assert models == ["dense", "hebbian", "hebbian", "nearest", "pseudoinverse", "pseudoinverse"]
    for row in rows:
        assert 0 <= row["metrics"]["success"]["mean"] <= 1


def test_cli_refuses_real_memories_for_a_classical_network(invoke, mnist):
    result = invoke("retrieve", "--memory", mnist, "--model", "hebbian")
    assert_one_error_line(result, "±1 patterns only")


def test_classical_couplings_are_built_once_per_memory(monkeypatch):
    """Retrieval and each energy of a trace read one W per memory (the pseudo-inverse's costs
    O(d³)); a changed memory gets a new one."""
    import nphcli.models.classical as classical
    from nphcli.engine import summary_cache

    summary_cache.clear()
    built = []
    real = classical.gram
    monkeypatch.setattr(classical, "gram", lambda *a, **k: built.append(1) or real(*a, **k))
    memories = torch.sign(torch.randn(6, 16, generator=torch.Generator().manual_seed(0)))
    model = create_model("pseudoinverse")
    first = [model.energy(memories[:2], memories, torch.arange(2)) for _ in range(3)]
    assert len(built) == 1 and all(torch.equal(first[0], e) for e in first)
    memories[0, 0] *= -1  # in place: a new version of the tensor
    model.energy(memories[:2], memories, torch.arange(2))
    assert len(built) == 2
