"""The kernel family: linear, random-feature and multihead against slow references and dense.

Each reference below is written straight from the model's formula with explicit loops, sharing no
code with the model, and the two are compared in float64.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from nphcli.core.errors import NphError
from nphcli.models import create_model, model_names

KERNEL_MODELS = {"linear": {}, "random-feature": {"features": 32}, "multihead": {"heads": 2}}


def _data(
    num_queries: int,
    num_memories: int,
    dim: int,
    value_dim: int | None = None,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    value_dim = dim if value_dim is None else value_dim
    queries = torch.randn(num_queries, dim, generator=generator, dtype=torch.float64)
    keys = torch.randn(num_memories, dim, generator=generator, dtype=torch.float64)
    values = torch.randn(num_memories, value_dim, generator=generator, dtype=torch.float64)
    return tuple(t.to(device=device, dtype=dtype) for t in (queries, keys, values))


# -- slow references --------------------------------------------------------------------------


def _weighted_average(kernel: list[list[float]], values: torch.Tensor) -> torch.Tensor:
    """Row i: Σ_μ kernel[i][μ] v_μ / Σ_μ kernel[i][μ]."""
    rows = []
    for weights in kernel:
        numerator = torch.zeros(values.shape[1], dtype=torch.float64)
        for weight, value in zip(weights, values, strict=True):
            numerator += weight * value
        rows.append(numerator / sum(weights))
    return torch.stack(rows)


def linear_reference(beta, queries, keys, values):
    def phi(u):
        return torch.tensor(
            [math.exp(c) if c <= 0 else 1 + c for c in u.tolist()], dtype=torch.float64
        )

    root = math.sqrt(beta)
    kernel = [[float(phi(root * x) @ phi(root * k)) for k in keys] for x in queries]
    return _weighted_average(kernel, values)


def random_feature_reference(beta, projection, queries, keys, values):
    num_features = projection.shape[0]

    def phi(u):
        squared = float(u @ u)
        return torch.tensor(
            [math.exp(float(w @ u) - squared / 2) / math.sqrt(num_features) for w in projection],
            dtype=torch.float64,
        )

    root = math.sqrt(beta)
    kernel = [[float(phi(root * x) @ phi(root * k)) for k in keys] for x in queries]  # (Q, M)
    return _weighted_average(kernel, values)


def multihead_reference(beta, heads, queries, keys, values):
    width, value_width = queries.shape[1] // heads, values.shape[1] // heads
    outputs = []
    for h in range(heads):
        x = queries[:, h * width : (h + 1) * width]
        k = keys[:, h * width : (h + 1) * width]
        v = values[:, h * value_width : (h + 1) * value_width]
        outputs.append(torch.softmax(beta * x @ k.T, dim=1) @ v)
    return torch.cat(outputs, dim=1)


# -- reference equivalence --------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.3, 1.0, 2.5])
def test_linear_matches_reference(beta):
    queries, keys, values = _data(5, 7, 6, 4, seed=1)
    got = create_model("linear", beta=beta).retrieve(queries, keys, values).patterns
    expected = linear_reference(beta, queries, keys, values)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize(("beta", "features"), [(0.5, 7), (1.0, 16), (2.0, 20)])
def test_random_feature_matches_reference(beta, features):
    queries, keys, values = _data(5, 7, 6, 3, seed=2)
    queries, keys = queries / 2, keys / 2  # keep exp(wᵀu − ‖u‖²/2) well inside float64
    model = create_model("random-feature", beta=beta, features=features, seed=3)
    got = model.retrieve(queries, keys, values).patterns
    expected = random_feature_reference(beta, model.projection(6), queries, keys, values)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize(
    ("heads", "dim", "value_dim"), [(1, 6, 4), (2, 6, 4), (3, 6, 9), (6, 6, 6)]
)
def test_multihead_matches_reference(heads, dim, value_dim):
    queries, keys, values = _data(5, 7, dim, value_dim, seed=4)
    got = create_model("multihead", beta=1.7, heads=heads).retrieve(queries, keys, values).patterns
    expected = multihead_reference(1.7, heads, queries, keys, values)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


def test_multihead_with_one_head_is_dense(device):
    queries, keys, values = _data(9, 13, 8, 5, seed=5, device=device)
    got = create_model("multihead", beta=3.0, heads=1).retrieve(queries, keys, values).patterns
    dense = create_model("dense", beta=3.0).retrieve(queries, keys, values).patterns
    torch.testing.assert_close(got, dense, atol=1e-12, rtol=0)


def test_models_are_registered():
    assert {"linear", "random-feature", "multihead"} <= set(model_names())


# -- random-feature ---------------------------------------------------------------------------


def test_random_feature_error_falls_with_features():
    # Unit-norm patterns and β = 1 keep β·‖x‖‖k‖ = 1, where the estimator's variance is modest.
    generator = torch.Generator().manual_seed(6)
    queries = torch.nn.functional.normalize(torch.randn(32, 16, generator=generator), dim=1)
    keys = torch.nn.functional.normalize(torch.randn(64, 16, generator=generator), dim=1)
    values = torch.randn(64, 8, generator=generator)
    queries, keys, values = (t.double() for t in (queries, keys, values))
    dense = create_model("dense").retrieve(queries, keys, values).patterns
    errors = []
    for features in (16, 256, 4096):
        per_seed = [
            (
                create_model("random-feature", features=features, seed=seed)
                .retrieve(queries, keys, values)
                .patterns
                - dense
            )
            .abs()
            .mean()
            for seed in range(5)
        ]
        errors.append(float(sum(per_seed)) / len(per_seed))
    assert errors[1] < errors[0] / 2 and errors[2] < errors[1] / 2, errors
    # At 4096 features it resolves the softmax weights, not just their mean.
    mean_only = (dense - values.mean(dim=0)).abs().mean()
    assert errors[2] < mean_only / 3, (errors, float(mean_only))


def test_random_feature_seed_decides_output(device):
    queries, keys, values = _data(6, 10, 5, seed=7, device=device)

    def run(seed):
        model = create_model("random-feature", features=24, seed=seed)
        return model.retrieve(queries, keys, values).patterns

    assert torch.equal(run(11), run(11))
    assert not torch.allclose(run(11), run(12))


def test_random_feature_independent_of_batching(device):
    queries, keys, values = _data(10, 12, 5, seed=8, device=device)
    model = create_model("random-feature", features=40, seed=1)
    whole = model.retrieve(queries, keys, values).patterns
    parts = [
        model.retrieve(
            queries[start:stop], keys, values, positions=torch.arange(start, stop, device=device)
        ).patterns
        for start, stop in ((0, 3), (3, 4), (4, 10))
    ]
    torch.testing.assert_close(torch.cat(parts), whole, atol=1e-12, rtol=0)


def test_random_feature_projection_is_block_orthogonal(device):
    dim, features = 8, 20  # two full blocks and a partial one
    model = create_model("random-feature", features=features, seed=5)
    projection = model.projection(dim)
    assert projection.shape == (features, dim)
    for start in range(0, features, dim):
        block = projection[start : start + dim]  # (≤ d, d)
        gram = block @ block.T
        off_diagonal = gram - torch.diag(gram.diagonal())
        assert off_diagonal.abs().max() < 1e-12
    norms = projection.norm(dim=1)
    assert norms.std() > 0.1  # chi-distributed lengths, not all √d
    # Drawn on the CPU from the seed alone, so every device sees the same W.
    torch.testing.assert_close(
        model.projection(dim, device, torch.float64).cpu(), projection, atol=0, rtol=0
    )
    many = create_model("random-feature", features=4096, seed=5).projection(dim)
    assert abs(float((many * many).sum(dim=1).mean()) - dim) < 0.5  # E‖w‖² = d


# -- no (Q, M) matrix -------------------------------------------------------------------------


class _ShapeRecorder(TorchDispatchMode):
    """Records the shape of every tensor each aten op produces."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.shapes.append((str(func), tuple(leaf.shape)))
        return out


def _query_memory_tensors(name: str, params: dict) -> list[tuple[str, tuple[int, ...]]]:
    # Q and M are distinct primes, unequal to d, d_v and m, and Q·M exceeds every tensor that a
    # linear-in-M method needs, so a (Q, M) matrix, flattened or not, cannot hide.
    num_queries, num_memories = 37, 41
    queries, keys, values = _data(num_queries, num_memories, 8, 6, seed=9, dtype=torch.float32)
    model = create_model(name, **params)
    with _ShapeRecorder() as recorder:
        model.retrieve(queries, keys, values)
    assert recorder.shapes
    return [
        (op, shape)
        for op, shape in recorder.shapes
        if (num_queries in shape and num_memories in shape)
        or math.prod(shape) >= num_queries * num_memories
    ]


@pytest.mark.parametrize(("name", "params"), [("linear", {}), ("random-feature", {"features": 16})])
def test_never_forms_query_by_memory_matrix(name, params):
    assert _query_memory_tensors(name, params) == []


def test_shape_recorder_catches_dense_scores():
    assert _query_memory_tensors("dense", {})


# -- numerics ---------------------------------------------------------------------------------


def _assert_convex_combination(patterns, values):
    """Every kernel model averages the values with non-negative weights."""
    patterns, values = patterns.double(), values.double()
    slack = 1e-3 * (values.abs().max() + 1)
    assert torch.isfinite(patterns).all()
    assert (patterns >= values.min(dim=0).values - slack).all()
    assert (patterns <= values.max(dim=0).values + slack).all()


@pytest.mark.parametrize("name", list(KERNEL_MODELS))
@pytest.mark.parametrize("beta", [1e-6, 1e-2, 1.0, 1e2, 1e4])
def test_extreme_beta_stays_finite(name, beta, device):
    queries, keys, values = _data(11, 13, 8, seed=10, dtype=torch.float32, device=device)
    model = create_model(name, beta=beta, **KERNEL_MODELS[name])
    patterns = model.retrieve(queries, keys, values).patterns
    _assert_convex_combination(patterns, values)
    if beta == 1e-6:  # weights are flat: every model returns the mean of the values
        torch.testing.assert_close(
            patterns, values.mean(dim=0).expand_as(patterns), atol=1e-3, rtol=0
        )


def test_stabilisation_is_exact_where_plain_exp_underflows():
    # In float32 these features underflow to 0 without the max shifts (0/0 = NaN); in float64
    # the plain formula still works, so the shifted float32 result can be checked against it.
    queries, keys, values = _data(4, 5, 6, seed=17)
    queries[0] = -5.0  # φ(√β x) = e^(−500) in every coordinate
    got = create_model("linear", beta=1e4).retrieve(queries.float(), keys.float(), values.float())
    expected = linear_reference(1e4, queries, keys, values)
    torch.testing.assert_close(got.patterns.double(), expected, atol=1e-4, rtol=0)

    model = create_model("random-feature", beta=30.0, features=16, seed=2)
    got = model.retrieve(queries[1:].float(), keys.float(), values.float()).patterns
    expected = random_feature_reference(30.0, model.projection(6), queries[1:], keys, values)
    torch.testing.assert_close(got.double(), expected, atol=1e-3, rtol=0)


@pytest.mark.parametrize("name", list(KERNEL_MODELS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_keeps_dtype_and_device(name, dtype, device):
    queries, keys, values = _data(6, 9, 8, seed=11, dtype=dtype, device=device)
    patterns = create_model(name, **KERNEL_MODELS[name]).retrieve(queries, keys, values).patterns
    assert patterns.dtype == dtype and patterns.device == queries.device
    _assert_convex_combination(patterns, values)


@pytest.mark.parametrize("name", list(KERNEL_MODELS))
@pytest.mark.parametrize(
    ("num_queries", "num_memories", "equal"), [(1, 7, False), (5, 1, False), (5, 6, True)]
)
@pytest.mark.parametrize("beta", [1.0, 1e4])
def test_degenerate_memories(name, num_queries, num_memories, equal, beta, device):
    queries, keys, values = _data(
        num_queries, num_memories, 8, seed=12, dtype=torch.float32, device=device
    )
    if equal:
        keys, values = keys[:1].expand_as(keys), values[:1].expand_as(values)
    model = create_model(name, beta=beta, **KERNEL_MODELS[name])
    patterns = model.retrieve(queries, keys, values).patterns
    assert patterns.shape == (num_queries, 8)
    _assert_convex_combination(patterns, values)
    if equal or num_memories == 1:  # a single distinct memory is all there is to retrieve
        torch.testing.assert_close(patterns, values[:1].expand_as(patterns), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(KERNEL_MODELS))
def test_gradcheck_wrt_queries(name):
    queries, keys, values = _data(3, 5, 4, seed=13)
    queries = queries.clone().requires_grad_(True)
    params = {"features": 8} if name == "random-feature" else KERNEL_MODELS[name]
    model = create_model(name, beta=0.7, **params)
    assert torch.autograd.gradcheck(
        lambda x: model.retrieve(x, keys, values).patterns, (queries,), eps=1e-6, atol=1e-7
    )


# -- iteration --------------------------------------------------------------------------------


def test_multihead_iteration_matches_hand_loop():
    beta, heads, steps, tol = 3.0, 2, 12, 1e-4
    queries, keys, values = _data(8, 5, 6, seed=14)
    keys = values = torch.nn.functional.normalize(keys, dim=1) * 2  # auto-association
    got = create_model("multihead", beta=beta, heads=heads, steps=steps, tol=tol).retrieve(
        queries, keys
    )
    expected_patterns, expected_steps = [], []
    for x in queries:
        state, taken = x[None], 0
        for _ in range(steps):
            new = multihead_reference(beta, heads, state, keys, values)
            taken += 1
            change = float((new - state).norm())
            state = new
            if change <= tol:
                break
        expected_patterns.append(state[0])
        expected_steps.append(taken)
    torch.testing.assert_close(got.patterns, torch.stack(expected_patterns), atol=1e-10, rtol=0)
    assert got.steps.tolist() == expected_steps
    assert min(expected_steps) < steps  # some queries converge early, so tol is exercised


# -- parameters -------------------------------------------------------------------------------


@pytest.mark.parametrize("features", [0, -3, 2.5, True])
def test_bad_features(features):
    with pytest.raises(NphError, match="--features"):
        create_model("random-feature", features=features)


@pytest.mark.parametrize("seed", [-1, 1.5])
def test_bad_seed(seed):
    with pytest.raises(NphError, match="--seed"):
        create_model("random-feature", seed=seed)


@pytest.mark.parametrize("heads", [0, -2, 1.0, False])
def test_bad_heads(heads):
    with pytest.raises(NphError, match="--heads"):
        create_model("multihead", heads=heads)


@pytest.mark.parametrize(
    ("name", "params", "flag"),
    [
        ("linear", {"features": 16}, "--features"),
        ("linear", {"heads": 2}, "--heads"),
        ("multihead", {"seed": 1}, "--seed"),
        ("random-feature", {"heads": 2}, "--heads"),
    ],
)
def test_parameter_the_model_does_not_take(name, params, flag):
    with pytest.raises(NphError, match=f"does not take {flag}"):
        create_model(name, **params)


def test_heads_must_divide_pattern_dimension():
    queries, keys, _ = _data(2, 3, 784, seed=15, dtype=torch.float32)
    model = create_model("multihead", heads=3)
    with pytest.raises(NphError, match="--heads 3 does not divide the pattern dimension 784; "):
        model.retrieve(queries, keys)


def test_heads_must_divide_value_dimension():
    queries, keys, values = _data(2, 3, 6, 4, seed=16)
    with pytest.raises(NphError, match="--heads 3 does not divide the value dimension 4"):
        create_model("multihead", heads=3).retrieve(queries, keys, values)
