"""The functional core of the sparse and masked models: simplex maps, k resolution, random masks.

Two independent methods are compared wherever one exists: sparsemax by sort vs α-entmax at α = 2
by bisection, α = 1.5 bisection vs its exact sort-based closed form, the vectorised hash vs a
plain-Python one. The model-level tests (test_sparse_family.py) add loop references.
"""

from __future__ import annotations

import math
from collections import Counter
from itertools import combinations

import pytest
import torch
from conftest import fmix32_reference

from nphcli.core.errors import NphError
from nphcli.engine.functional import entmax_bisect, masked_softmax, sparsemax
from nphcli.engine.hashing import random_keys
from nphcli.engine.masks import check_k, floyd_subset, random_mask, resolve_k, topk_mask
from nphcli.models import create_model


def _scores(rows: int, cols: int, seed: int, scale: float = 1.0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(rows, cols, generator=generator, dtype=torch.float64)).to(dtype)


def _entmax15_exact(row: list[float]) -> list[float]:
    """α = 1.5 in closed form (Peters et al. 2019): with x = s/2 sorted descending, the support
    of size k solves Σ_{j≤k} (x_j − τ)² = 1, i.e. τ_k = mean_k − √((1 − k·var_k) / k)."""
    x = [v / 2 for v in row]
    ordered = sorted(x, reverse=True)
    tau = None
    for k in range(1, len(x) + 1):
        top = ordered[:k]
        mean = sum(top) / k
        var = sum(v * v for v in top) / k - mean * mean
        tau_k = mean - math.sqrt(max((1 - k * var) / k, 0.0))
        if tau_k < ordered[k - 1]:
            tau = tau_k
    p = [max(v - tau, 0.0) ** 2 for v in x]
    total = sum(p)
    return [v / total for v in p]


# -- simplex maps ---------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1e-5, 1e-2, 1.0, 1e2, 1e4])
def test_sparsemax_sort_equals_entmax_bisection_at_alpha_two(scale):
    scores = _scores(6, 11, seed=1, scale=scale)
    torch.testing.assert_close(sparsemax(scores), entmax_bisect(scores, 2.0), rtol=0, atol=1e-12)


def test_entmax15_bisection_equals_sort_based_closed_form():
    scores = _scores(8, 9, seed=2, scale=3.0)
    expected = torch.tensor([_entmax15_exact(row) for row in scores.tolist()], dtype=torch.float64)
    torch.testing.assert_close(entmax_bisect(scores, 1.5), expected, rtol=0, atol=1e-12)


def test_entmax_alpha_one_is_softmax_and_near_one_approaches_it():
    scores = _scores(4, 7, seed=3)
    assert torch.equal(entmax_bisect(scores, 1.0), torch.softmax(scores, dim=-1))
    close = entmax_bisect(scores, 1.0 + 1e-6)
    torch.testing.assert_close(close, torch.softmax(scores, dim=-1), rtol=0, atol=1e-5)


def test_sparsity_grows_with_alpha():
    scores = _scores(16, 20, seed=4, scale=2.0)
    counts = [int((entmax_bisect(scores, a) > 0).sum()) for a in (1.0, 1.25, 1.5, 2.0)]
    assert counts[0] == scores.numel()
    assert counts == sorted(counts, reverse=True) and counts[-1] < counts[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1e-5, 1e-2, 1.0, 1e2, 1e4])
def test_simplex_maps_finite_and_normalised_at_scale_extremes(dtype, scale):
    scores = _scores(5, 13, seed=5, scale=scale, dtype=dtype)
    mask = torch.ones_like(scores, dtype=torch.bool)
    mask[:, ::2] = False
    for weights in (
        sparsemax(scores),
        entmax_bisect(scores, 1.5),
        entmax_bisect(scores, 1.1),
        masked_softmax(scores, mask),
    ):
        assert weights.dtype == dtype
        assert torch.isfinite(weights).all() and (weights >= 0).all()
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        torch.testing.assert_close(weights.sum(-1), torch.ones(5, dtype=dtype), rtol=0, atol=tol)


@pytest.mark.parametrize("fn", [sparsemax, lambda s: entmax_bisect(s, 1.5)], ids=["sparse", "1.5"])
def test_equal_scores_and_single_memory(fn):
    torch.testing.assert_close(fn(torch.full((2, 4), 3.0)), torch.full((2, 4), 0.25))
    assert torch.equal(fn(torch.tensor([[-7.0], [1e4]])), torch.ones(2, 1))


def test_masked_softmax_exact_zeros_and_single_kept_memory():
    scores = torch.tensor([[1.0, -50.0, 3.0, 0.5], [2.0, 2.0, 2.0, 2.0]])
    mask = torch.tensor([[True, False, True, False], [False, False, True, False]])
    weights = masked_softmax(scores, mask)
    assert torch.equal(weights[~mask], torch.zeros(5))
    torch.testing.assert_close(weights[0, [0, 2]], torch.softmax(scores[0, [0, 2]], dim=-1))
    assert torch.equal(weights[1], torch.tensor([0.0, 0.0, 1.0, 0.0]))


def test_entmax_backward_equals_autograd_through_sparsemax_at_alpha_two():
    scores = _scores(4, 9, seed=6, scale=2.0).requires_grad_()
    upstream = _scores(4, 9, seed=7)
    (by_formula,) = torch.autograd.grad(entmax_bisect(scores, 2.0), scores, upstream)
    (by_autograd,) = torch.autograd.grad(sparsemax(scores), scores, upstream)
    torch.testing.assert_close(by_formula, by_autograd, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "fn",
    [
        sparsemax,
        lambda s: entmax_bisect(s, 1.25),
        lambda s: entmax_bisect(s, 1.5),
        lambda s: entmax_bisect(s, 2.0),
        lambda s: masked_softmax(s, torch.arange(s.shape[1]) % 3 != 1),
    ],
    ids=["sparsemax", "entmax1.25", "entmax1.5", "entmax2", "masked_softmax"],
)
def test_gradcheck(fn):
    scores = _scores(3, 7, seed=8, scale=2.0).requires_grad_()
    assert torch.autograd.gradcheck(fn, (scores,), eps=1e-6, atol=1e-6)


# -- k resolution and masks -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "num_memories", "expected"),
    [
        (3, 10, 3),
        (3.0, 3, 3),
        (1, 1, 1),
        (0.2, 10, 2),
        (0.25, 10, 3),  # 2.5 rounds half up
        (0.249, 10, 2),
        (0.01, 10, 1),  # at least one memory
        (0.5, 1, 1),
        (0.999, 7, 7),
    ],
)
def test_resolve_k(k, num_memories, expected):
    check_k(k)
    assert resolve_k(k, num_memories) == expected


@pytest.mark.parametrize("k", [0, -0.5, 2.5, float("nan"), float("inf"), True, "3"])
def test_check_k_rejects(k):
    with pytest.raises(NphError, match="--k"):
        check_k(k)


def test_resolve_k_rejects_count_above_m():
    with pytest.raises(NphError, match="--k 6 exceeds the 5 stored memories"):
        resolve_k(6, 5)


def test_topk_mask_ties_go_to_lower_index():
    scores = torch.tensor([[1.0, 2.0, 2.0, 0.0, 2.0], [5.0, 5.0, 5.0, 5.0, 5.0]])
    expected = torch.tensor([[False, True, True, False, False], [True, True, False, False, False]])
    assert torch.equal(topk_mask(scores, 2), expected)


def _hash_reference(seed: int, position: int, memory: int) -> int:
    state = fmix32_reference((seed % 2**32) ^ 0x6A09E667)
    state = fmix32_reference(state ^ (seed >> 32))
    state = fmix32_reference(state ^ (position % 2**32))
    state = fmix32_reference(state ^ (position >> 32))
    return fmix32_reference(state ^ memory)


def test_random_keys_match_plain_python_hash():
    for seed in (0, 1, 2**40 + 5, 2**64 - 1):
        positions = torch.tensor([0, 1, 17, 2**33 + 3])
        keys = random_keys(seed, positions, torch.arange(6))
        expected = [[_hash_reference(seed, p, m) for m in range(6)] for p in positions.tolist()]
        assert keys.tolist() == expected


def test_random_keys_never_tie_within_a_query():
    keys = random_keys(11, torch.arange(50), torch.arange(2000))
    assert all(len(set(row)) == 2000 for row in keys.tolist())


def test_random_mask_is_uniform_over_k_subsets():
    draws = 20000
    mask = random_mask(3, torch.arange(draws), 5, 2)
    subsets = Counter(tuple(row.nonzero().flatten().tolist()) for row in mask)
    assert set(subsets) == set(combinations(range(5), 2))
    expected = draws / 10
    chi2 = sum((count - expected) ** 2 / expected for count in subsets.values())
    assert chi2 < 30  # 9 degrees of freedom: P(χ² > 30) ≈ 4e-4


def test_random_mask_pairs_of_positions_are_independent():
    mask = random_mask(0, torch.arange(10000), 20, 5).double()  # (Q, M)
    overlap = (mask[:-1] * mask[1:]).sum(-1).mean()  # expected k²/M = 1.25
    assert abs(float(overlap) - 1.25) < 0.05


def test_floyd_subset_is_uniform_over_k_subsets_of_a_large_memory():
    # Floyd's draws for k ≤ 256: each of the C(6, 3) = 20 subsets equally often.
    draws = 20000
    chosen = floyd_subset(5, torch.arange(draws), 6, 3)  # (Q, 3)
    subsets = Counter(tuple(row) for row in chosen.tolist())
    assert set(subsets) == set(combinations(range(6), 3))
    expected = draws / 20
    chi2 = sum((count - expected) ** 2 / expected for count in subsets.values())
    assert chi2 < 50  # 19 degrees of freedom: P(χ² > 50) ≈ 1e-4


def test_floyd_subset_distinct_and_independent_of_the_batch():
    positions = torch.tensor([7, 2**40 + 1, 0, 123456])
    whole = floyd_subset(3, positions, 10**6, 10)
    assert all(len(set(row)) == 10 for row in whole.tolist())
    assert int(whole.max()) < 10**6 and int(whole.min()) >= 0
    for row in range(4):
        assert torch.equal(floyd_subset(3, positions[row : row + 1], 10**6, 10)[0], whole[row])


def _floyd_reference(seed: int, position: int, num_memories: int, k: int) -> list[int]:
    """Floyd's algorithm with hashed draws, in plain Python integers."""
    state = _query_state_reference(seed, position)
    kept: set[int] = set()
    for j in range(num_memories - k, num_memories):
        high = fmix32_reference(fmix32_reference(state ^ (j % 2**32)) ^ (j >> 32) ^ 0x3C6EF372)
        low = fmix32_reference(high ^ 0xBB67AE85)
        draw = ((high // 2) * 2**31 + low // 2) % (j + 1)
        kept.add(j if draw in kept else draw)
    return sorted(kept)


def _query_state_reference(seed: int, position: int) -> int:
    state = fmix32_reference((seed % 2**32) ^ 0x6A09E667)
    state = fmix32_reference(state ^ (seed >> 32))
    state = fmix32_reference(state ^ (position % 2**32))
    return fmix32_reference(state ^ (position >> 32))


def test_random_mask_small_k_is_floyds_draw():
    positions = [0, 3, 2**35 + 1]
    mask = random_mask(7, torch.tensor(positions), 1000, 12)  # 64·k ≤ M: Floyd
    for row, position in zip(mask.tolist(), positions, strict=True):
        kept = [m for m, keep in enumerate(row) if keep]
        assert kept == _floyd_reference(7, position, 1000, 12)


def test_random_model_with_floyds_mask_equals_the_formula():
    generator = torch.Generator().manual_seed(2)
    keys = torch.randn(1000, 5, generator=generator, dtype=torch.float64)
    queries = torch.randn(6, 5, generator=generator, dtype=torch.float64)
    out = create_model("random", k=12, seed=7, beta=0.8).retrieve(queries, keys).patterns
    keep = torch.zeros(6, 1000, dtype=torch.bool)
    for row in range(6):
        keep[row, _floyd_reference(7, row, 1000, 12)] = True
    weights = torch.softmax((0.8 * queries @ keys.T).masked_fill(~keep, -torch.inf), dim=1)
    torch.testing.assert_close(out, weights @ keys, rtol=0, atol=1e-12)
