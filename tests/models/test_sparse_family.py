"""The sparse and masked models: sparse, entmax, topk, random, window.

Each model is checked against a slow reference written from its formula with Python loops in
float64, against identities with `dense`, against the defects of the paper's released code, at
numerical extremes, by gradcheck, and through iterated retrieval. Weights are read off directly
by retrieving with values = I (then T(x) = Vᵀp = p).
"""

from __future__ import annotations

import math

import pytest
import torch

from nphcli.core.errors import NphError
from nphcli.models import create_model

SPARSE_FAMILY = {
    "sparse": {},
    "entmax": {"alpha": 1.5},
    "topk": {"k": 3},
    "random": {"k": 3, "seed": 7},
    "window": {"window": 1},
}


def _data(num_queries: int, num_memories: int, dim: int, seed: int, device, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(num_memories, dim, generator=generator, dtype=torch.float64)
    queries = torch.randn(num_queries, dim, generator=generator, dtype=torch.float64)
    return queries.to(device, dtype), keys.to(device, dtype)


def _weights(model, queries, keys, positions=None):
    """The model's weights p (Q, M): with values = I, one step returns Vᵀp = p."""
    eye = torch.eye(keys.shape[0], dtype=keys.dtype, device=keys.device)
    return model.retrieve(queries, keys, eye, positions=positions).patterns


# -- slow references, one row at a time in Python floats ------------------------------------------


def _softmax_over(row: list[float], keep: list[int]) -> list[float]:
    top = max(row[i] for i in keep)
    exps = {i: math.exp(row[i] - top) for i in keep}
    total = sum(exps.values())
    return [exps[i] / total if i in exps else 0.0 for i in range(len(row))]


def _entmax_by_scalar_bisection(row: list[float], alpha: float) -> list[float]:
    """Solve Σ_i [(α−1)s_i − τ]_+^{1/(α−1)} = 1 for τ by halving until the bracket stops
    shrinking; α = 2 is sparsemax (the Euclidean projection onto the simplex)."""
    x = [(alpha - 1) * v for v in row]
    exponent = 1 / (alpha - 1)

    def mass(tau: float) -> float:
        return sum(max(v - tau, 0.0) ** exponent for v in x)

    lo, hi = max(x) - 1, max(x)
    while True:
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        if mass(mid) >= 1:
            lo = mid
        else:
            hi = mid
    p = [max(v - lo, 0.0) ** exponent for v in x]
    total = sum(p)
    return [v / total for v in p]


def _fmix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x85EBCA6B) % 2**32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) % 2**32
    return x ^ (x >> 16)


def _random_keep(seed: int, position: int, num_memories: int, k: int) -> list[int]:
    """The memories the random model keeps, by plain Python ints: Floyd's algorithm with hashed
    draws for k ≤ 256 and 64·k ≤ M, else the k smallest hashes h(seed, position, memory)."""
    state = _fmix32((seed % 2**32) ^ 0x6A09E667)
    state = _fmix32(state ^ (seed >> 32))
    state = _fmix32(state ^ (position % 2**32))
    state = _fmix32(state ^ (position >> 32))
    if k > 256 or 64 * k > num_memories:
        return sorted(range(num_memories), key=lambda m: _fmix32(state ^ m))[:k]
    kept: set[int] = set()
    for j in range(num_memories - k, num_memories):
        high = _fmix32(_fmix32(state ^ (j % 2**32)) ^ (j >> 32) ^ 0x3C6EF372)
        low = _fmix32(high ^ 0xBB67AE85)
        draw = ((high // 2) * 2**31 + low // 2) % (j + 1)
        kept.add(j if draw in kept else draw)
    return sorted(kept)


def _reference_weights(name: str, params: dict, scores: torch.Tensor, positions) -> torch.Tensor:
    rows = scores.cpu().tolist()
    num_memories = len(rows[0])
    k = params.get("k", 0)
    if 0 < k < 1:
        k = max(1, math.floor(k * num_memories + 0.5))
    out = []
    for row, position in zip(rows, positions, strict=True):
        if name == "sparse":
            out.append(_entmax_by_scalar_bisection(row, 2.0))
        elif name == "entmax":
            out.append(_entmax_by_scalar_bisection(row, params["alpha"]))
        elif name == "topk":
            keep = sorted(range(num_memories), key=lambda m, row=row: (-row[m], m))[: int(k)]
            out.append(_softmax_over(row, keep))
        elif name == "random":
            out.append(_softmax_over(row, _random_keep(params["seed"], position, num_memories, k)))
        elif name == "window":
            w = params["window"]
            keep = list(range(max(0, position - w), min(num_memories, position + w + 1)))
            out.append(_softmax_over(row, keep))
    return torch.tensor(out, dtype=torch.float64)


REFERENCE_CASES = [
    ("sparse", {}),
    ("entmax", {"alpha": 1.5}),
    ("entmax", {"alpha": 1.2}),
    ("entmax", {"alpha": 1.8}),
    ("entmax", {"alpha": 2.0}),
    ("topk", {"k": 1}),
    ("topk", {"k": 4}),
    ("topk", {"k": 0.2}),
    ("random", {"k": 4, "seed": 0}),
    ("random", {"k": 0.5, "seed": 2**40 + 1}),
    ("window", {"window": 0}),
    ("window", {"window": 2}),
]


@pytest.mark.parametrize("beta", [0.5, 3.0])
@pytest.mark.parametrize(("name", "params"), REFERENCE_CASES)
def test_matches_loop_reference(device, name, params, beta):
    queries, keys = _data(9, 11, 6, seed=10, device=device)
    values = _data(1, 11, 5, seed=11, device=device)[1]  # (M, d_v)
    positions = list(range(9))
    if name == "window":  # shuffled, and with w = 2 queries past both ends of the memory
        positions = [0, 3, 10, 9, 2, 5, 1, 8, 7]
        if params["window"] == 2:
            positions = [0, 3, 10, 11, 12, 5, 1, 8, -1]
    positions_t = torch.tensor(positions, device=device)
    model = create_model(name, beta=beta, **params)
    scores = beta * (queries @ keys.T)  # (Q, M)
    expected = _reference_weights(name, params, scores, positions)
    got = model.retrieve(queries, keys, values, positions=positions_t).patterns
    torch.testing.assert_close(got.cpu(), expected @ values.cpu(), rtol=0, atol=1e-10)


def test_support_counts(device):
    queries, keys = _data(6, 12, 4, seed=12, device=device)
    positions = torch.tensor([0, 1, 5, 10, 11, 12], device=device)
    for name, params in SPARSE_FAMILY.items():
        model = create_model(name, beta=4.0, **params)
        result = model.retrieve(queries, keys, positions=positions)
        weights = _weights(model, queries, keys, positions)
        if name in ("topk", "random"):
            expected = torch.full((6,), 3)
        elif name == "window":
            expected = torch.tensor([2, 3, 3, 3, 2, 1])  # clipped at both ends
        else:
            expected = (weights > 0).sum(-1).cpu()
        assert torch.equal(result.support.cpu(), expected), name


# -- identities -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("topk", {"k": 10}),
        ("topk", {"k": 0.999}),
        ("random", {"k": 10, "seed": 3}),
        ("window", {"window": 10}),
        ("window", {"window": 1000}),
        ("entmax", {"alpha": 1.0}),
    ],
)
def test_equals_dense_when_nothing_is_masked(device, name, params):
    queries, keys = _data(7, 10, 5, seed=13, device=device)
    dense = create_model("dense", beta=2.0).retrieve(queries, keys).patterns
    got = create_model(name, beta=2.0, **params).retrieve(queries, keys).patterns
    torch.testing.assert_close(got, dense, rtol=0, atol=1e-14)


def test_entmax_near_one_approaches_dense_and_two_equals_sparse(device):
    queries, keys = _data(7, 10, 5, seed=14, device=device)
    dense = create_model("dense", beta=2.0).retrieve(queries, keys).patterns
    near = create_model("entmax", beta=2.0, alpha=1.0 + 1e-6).retrieve(queries, keys).patterns
    torch.testing.assert_close(near, dense, rtol=0, atol=1e-4)
    sparse = create_model("sparse", beta=2.0).retrieve(queries, keys).patterns
    two = create_model("entmax", beta=2.0, alpha=2.0).retrieve(queries, keys).patterns
    torch.testing.assert_close(two, sparse, rtol=0, atol=1e-12)


def test_sparse_rows_on_simplex_with_exact_zeros(device):
    queries, keys = _data(20, 30, 8, seed=15, device=device)
    weights = _weights(create_model("sparse", beta=2.0), queries, keys)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(20, dtype=torch.float64, device=device))
    assert ((weights == 0).sum(-1) > 0).all()  # spread-out scores leave memories at exactly 0


def test_topk_rows_have_exactly_m_minus_k_zeros(device):
    queries, keys = _data(20, 30, 8, seed=16, device=device)
    for k in (1, 7, 30):
        weights = _weights(create_model("topk", k=k), queries, keys)
        assert ((weights == 0).sum(-1) == 30 - k).all()
        selected = weights.argsort(dim=-1, descending=True)[:, :k]  # (Q, k)
        scores = queries @ keys.T  # (Q, M)
        top = scores.topk(k, dim=-1).values  # (Q, k)
        torch.testing.assert_close(scores.gather(-1, selected).sort(-1).values, top.sort(-1).values)


def test_topk_ties_go_to_lower_memory_index(device):
    keys = torch.tensor([[1.0], [2.0], [2.0], [0.0], [2.0]], device=device)
    weights = _weights(create_model("topk", k=2), torch.ones(1, 1, device=device), keys)
    assert torch.equal(weights.cpu(), torch.tensor([[0.0, 0.5, 0.5, 0.0, 0.0]]))


def test_random_masks_seeded_exact_k_and_batch_independent(device):
    queries, keys = _data(40, 25, 4, seed=17, device=device)
    model = create_model("random", k=6, seed=5)
    weights = _weights(model, queries, keys)
    mask = weights > 0
    assert (mask.sum(-1) == 6).all()
    assert torch.equal(_weights(create_model("random", k=6, seed=5), queries, keys) > 0, mask)
    assert not torch.equal(_weights(create_model("random", k=6, seed=6), queries, keys) > 0, mask)
    assert len({tuple(row.tolist()) for row in mask.cpu()}) > 30  # queries draw different subsets
    for rows in (torch.tensor([3]), torch.tensor([39, 0, 17]), torch.arange(10, 30)):
        rows = rows.to(device)
        part = _weights(model, queries[rows], keys, positions=rows)
        assert torch.equal(part > 0, mask[rows])
        # Only rounding may differ: a matmul over fewer rows can block its sums differently.
        torch.testing.assert_close(part, weights[rows], rtol=0, atol=1e-14)


def test_random_masks_roughly_uniform_over_memories(device):
    num_queries, num_memories, k = 4000, 20, 5
    queries = torch.zeros(num_queries, 2, dtype=torch.float64, device=device)
    keys = torch.zeros(num_memories, 2, dtype=torch.float64, device=device)
    mask = _weights(create_model("random", k=k, seed=9), queries, keys) > 0
    counts = mask.sum(0).double()  # (M,), expected Q·k/M = 1000 each
    expected = num_queries * k / num_memories
    assert ((counts - expected).abs() < 5 * math.sqrt(expected)).all()


# -- the released code's defects ------------------------------------------------------------------


def test_sparse_is_not_softmax(device):
    queries, keys = _data(10, 15, 6, seed=18, device=device)
    sparse = _weights(create_model("sparse", beta=1.5), queries, keys)
    dense = _weights(create_model("dense", beta=1.5), queries, keys)
    assert (sparse - dense).abs().max() > 1e-2
    assert (sparse == 0).any() and not (dense == 0).any()


@pytest.mark.parametrize(("name", "params"), [("topk", {"k": 3}), ("random", {"k": 3})])
def test_unselected_memories_get_weight_zero_not_logit_zero(device, name, params):
    # Scores near 0 make the released code's logit-0 fill visible: exp(0) is about exp(s).
    queries, keys = _data(8, 12, 4, seed=19, device=device)
    scores = 0.1 * (queries @ keys.T)  # (Q, M)
    weights = _weights(create_model(name, beta=0.1, **params), queries, keys)
    mask = weights > 0
    assert ((~mask).sum(-1) == 9).all()
    assert torch.equal(weights[~mask], torch.zeros_like(weights[~mask]))
    released = torch.softmax(torch.where(mask, scores, 0), dim=-1)  # (Q, M)
    assert (released[~mask] > 0.01).all()
    masked = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)  # (Q, M)
    torch.testing.assert_close(weights, masked, rtol=0, atol=1e-14)


# -- numerics -------------------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [1e-6, 1e-2, 1.0, 1e2, 1e4])
@pytest.mark.parametrize("name", list(SPARSE_FAMILY))
def test_finite_across_beta(device, name, beta):
    queries, keys = _data(6, 9, 5, seed=20, device=device, dtype=torch.float32)
    weights = _weights(create_model(name, beta=beta, **SPARSE_FAMILY[name]), queries, keys)
    assert torch.isfinite(weights).all() and (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(6, device=device))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(SPARSE_FAMILY))
def test_half_inputs_keep_dtype_and_device(device, name, dtype):
    queries, keys = _data(5, 8, 4, seed=21, device=device, dtype=dtype)
    for beta in (1e-6, 1.0, 1e4):
        model = create_model(name, beta=beta, **SPARSE_FAMILY[name])
        patterns = model.retrieve(queries, keys).patterns
        assert patterns.dtype == dtype and patterns.device == queries.device
        assert torch.isfinite(patterns).all()


@pytest.mark.parametrize("name", list(SPARSE_FAMILY))
def test_equal_scores_and_single_memory(device, name):
    params = SPARSE_FAMILY[name]
    queries = torch.ones(4, 3, device=device)
    keys = torch.ones(6, 3, device=device)
    weights = _weights(create_model(name, beta=1e4, **params), queries, keys)
    assert torch.isfinite(weights).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(4, device=device))
    if name in ("sparse", "entmax"):
        torch.testing.assert_close(weights, torch.full((4, 6), 1 / 6, device=device))
    if name == "topk":  # equal scores: the lowest indices win
        assert torch.equal(weights.cpu(), torch.tensor([[1 / 3] * 3 + [0.0] * 3] * 4))
    single = {**params, "k": 1} if "k" in params else params
    queries, keys = _data(3, 1, 4, seed=22, device=device, dtype=torch.float32)
    model = create_model(name, beta=100.0, **single)
    positions = torch.zeros(3, dtype=torch.int64, device=device)  # window: all near memory 0
    weights = _weights(model, queries, keys, positions)
    assert torch.equal(weights.cpu(), torch.ones(3, 1))


@pytest.mark.parametrize(
    ("name", "params"), [("topk", {"k": 1}), ("random", {"k": 1}), ("window", {"window": 0})]
)
def test_rows_keeping_one_memory_are_one_hot(device, name, params):
    queries, keys = _data(5, 7, 3, seed=23, device=device, dtype=torch.float32)
    for beta in (1e-6, 1.0, 1e4):
        weights = _weights(create_model(name, beta=beta, **params), queries, keys)
        assert torch.isfinite(weights).all()
        assert ((weights == 1).sum(-1) == 1).all() and ((weights == 0).sum(-1) == 6).all()


# -- gradients ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params"),
    [*SPARSE_FAMILY.items(), ("entmax", {"alpha": 1.2}), ("entmax", {"alpha": 2.0})],
)
def test_gradcheck_wrt_queries(device, name, params):
    queries, keys = _data(3, 6, 4, seed=24, device=device)
    values = _data(1, 6, 3, seed=25, device=device)[1]  # (M, d_v)
    model = create_model(name, beta=1.5, **params)

    def retrieve(q):
        return model.retrieve(q, keys, values).patterns

    assert torch.autograd.gradcheck(retrieve, (queries.requires_grad_(),), eps=1e-6, atol=1e-6)


# -- iteration ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SPARSE_FAMILY))
def test_iteration_matches_hand_written_loop(device, name):
    queries, keys = _data(8, 10, 6, seed=26, device=device)
    steps, tol = 6, 1e-3
    model = create_model(name, beta=1.0, steps=steps, tol=tol, **SPARSE_FAMILY[name])
    one_step = create_model(name, beta=1.0, **SPARSE_FAMILY[name])
    result = model.retrieve(queries, keys)
    expected_steps = []
    for row in range(queries.shape[0]):
        x, position = queries[row : row + 1], torch.tensor([row], device=device)
        taken = 0
        for _ in range(steps):
            nxt = one_step.retrieve(x, keys, positions=position).patterns
            taken += 1
            change = float(torch.linalg.vector_norm(nxt - x))
            x = nxt
            if change <= tol:
                break
        torch.testing.assert_close(result.patterns[row : row + 1], x, rtol=0, atol=1e-12)
        expected_steps.append(taken)
    assert result.steps.tolist() == expected_steps
    assert min(expected_steps) < steps and len(set(expected_steps)) > 1  # some stop early


@pytest.mark.parametrize("name", list(SPARSE_FAMILY))
def test_fixed_point_on_separated_patterns(device, name):
    generator = torch.Generator().manual_seed(27)
    keys = torch.randn(8, 64, generator=generator, dtype=torch.float64)  # (M, d)
    noise = 0.5 * torch.randn(8, 64, generator=generator, dtype=torch.float64)  # (Q, d)
    keys, queries = keys.to(device), (keys + noise).to(device)
    params = SPARSE_FAMILY[name]
    model = create_model(name, beta=0.5, steps=50, tol=1e-12, **params)
    fixed = model.retrieve(queries, keys).patterns
    again = create_model(name, beta=0.5, **params).retrieve(fixed, keys).patterns
    torch.testing.assert_close(again, fixed, rtol=0, atol=1e-10)
    if name != "random":  # a random mask need not contain the target
        # Softmax-based models keep weight ~exp(−β·gap) on the other memories.
        torch.testing.assert_close(fixed, keys, rtol=0, atol=1e-10 if name == "sparse" else 1e-6)


# -- parameters -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params", "flag"),
    [
        ("topk", {"k": 0}, "--k"),
        ("topk", {"k": -0.3}, "--k"),
        ("topk", {"k": 2.5}, "--k"),
        ("topk", {"k": float("nan")}, "--k"),
        ("random", {"k": 0}, "--k"),
        ("random", {"k": 1.5}, "--k"),
        ("random", {"seed": -1}, "--seed"),
        ("random", {"seed": 2**64}, "--seed"),
        ("entmax", {"alpha": 0.99}, "--alpha"),
        ("entmax", {"alpha": 2.01}, "--alpha"),
        ("entmax", {"alpha": float("nan")}, "--alpha"),
        ("window", {"window": -1}, "--window"),
        ("window", {"window": 1.5}, "--window"),
        ("sparse", {"k": 3}, "--k"),
        ("sparse", {"beta": 0}, "--beta"),
        ("topk", {"alpha": 1.5}, "--alpha"),
        ("entmax", {"window": 3}, "--window"),
        ("window", {"seed": 1}, "--seed"),
        ("random", {"window": 2}, "--window"),
    ],
)
def test_bad_parameters_raise(name, params, flag):
    with pytest.raises(NphError, match=flag):
        create_model(name, **params)


@pytest.mark.parametrize("name", ["topk", "random"])
def test_k_above_m_raises_at_retrieval(device, name):
    queries, keys = _data(2, 6, 3, seed=28, device=device)
    model = create_model(name, k=6)
    with pytest.raises(NphError, match="--k 6 exceeds the 5 stored memories"):
        model.retrieve(queries, keys[:5])
    model.retrieve(queries, keys)  # k = M is fine


def test_window_without_memories_raises(device):
    queries, keys = _data(9, 5, 3, seed=29, device=device)
    model = create_model("window", window=2)
    model.retrieve(queries[:7], keys)  # positions 0..6 ≤ M − 1 + w
    with pytest.raises(NphError, match="--window 2: the query at position 7"):
        model.retrieve(queries, keys)
    with pytest.raises(NphError, match="position -3"):
        model.retrieve(queries[:1], keys, positions=torch.tensor([-3], device=device))
