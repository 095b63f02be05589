"""α-entmax for every α in (1, 2]: the threshold's routes in `thresholds.solve` (the active set
for α = 1.5 and 2, Newton with a binomial series in units of the scores for 1 + 1/16 ≤ α < 2,
the λ form below) against a float64 bisection reference written here from the formula, against
each other, and through retrieval on both one-block paths."""

from __future__ import annotations

import pytest
import torch

import nphcli.engine.entmax_block as entmax_block
import nphcli.engine.thresholds as thresholds
from nphcli.engine.functional import entmax
from nphcli.models import create_model


def _reference(scores: torch.Tensor, alpha: float) -> torch.Tensor:
    """Row-wise α-entmax in float64: p = [x − τ]_+^{1/(α−1)}, x = (α−1)·(s − max s), with τ
    halved 80 times on [−1, 0] so that Σ p = 1, then renormalised."""
    x = (alpha - 1) * (scores.double() - scores.double().amax(dim=-1, keepdim=True))
    lo, hi = torch.full_like(x[:, :1], -1.0), torch.zeros_like(x[:, :1])
    for _ in range(80):
        mid = (lo + hi) / 2
        mass = (x - mid).clamp(min=0).pow(1 / (alpha - 1)).sum(dim=-1, keepdim=True)
        lo, hi = torch.where(mass >= 1, mid, lo), torch.where(mass >= 1, hi, mid)
    p = (x - lo).clamp(min=0).pow(1 / (alpha - 1))
    return p / p.sum(dim=-1, keepdim=True)


def _patterns(num: int, seed: int, dim: int = 48) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.rand(num, dim, generator=generator), dim=1)


def test_routes_by_alpha():
    assert not thresholds.power_form(1.5) and not thresholds.power_form(2.0)  # active set
    assert thresholds.power_form(1.0625) and thresholds.power_form(1.3)
    assert not thresholds.power_form(1.06)  # k > 16: the λ form
    assert thresholds._power_of(1.1) == 10.0 and thresholds._power_of(1.25) == 4.0
    assert thresholds._power_of(1.3) == pytest.approx(10 / 3, abs=1e-12)
    assert not thresholds._power_of(1.3).is_integer()


@pytest.mark.parametrize("alpha", [1.0001, 1.06, 1.0625, 1.1, 1.3, 1.7])
@pytest.mark.parametrize("beta", [1.0, 30.0], ids=["wide", "narrow"])
@pytest.mark.parametrize("dense_share", [0.0, 1.0], ids=["whole-block", "candidates"])
def test_one_block_retrieval_matches_reference(monkeypatch, alpha, beta, dense_share):
    """Near 1 (the λ form), either side of the series route's edge (k = 16), a whole k = 10 and
    fractional k on both sides of 2, on both one-block paths, forced, at wide and narrow
    supports: within 1e-12 of the
    reference in float64 (1e-9 for α = 1.0001, where the reference's own power of 10⁴ loses
    digits) with the same supports, and within 1e-5 in float32."""
    monkeypatch.setattr(entmax_block, "DENSE_SHARE", dense_share)
    keys = _patterns(3000, 2).double()
    queries = torch.nn.functional.normalize(keys[:24] + 0.05 * _patterns(24, 3).double(), dim=1)
    weights = _reference(beta * queries @ keys.T, alpha)  # (Q, M)
    model = create_model("entmax", alpha=alpha, beta=beta)
    result = model.retrieve(queries, keys)
    atol = 1e-12 if alpha - 1 >= 1e-3 else 1e-9
    torch.testing.assert_close(result.patterns, weights @ keys, rtol=0, atol=atol)
    if alpha - 1 >= 1e-3:
        assert torch.equal(result.support, (weights > 0).sum(dim=1))
    single = model.retrieve(queries.float(), keys.float()).patterns
    assert (single.double() - weights @ keys).abs().max().item() <= 1e-5


@pytest.mark.parametrize("alpha", [1.0625, 1.1, 1.3, 1.7, 1.9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_series_route_agrees_with_the_lambda_form(alpha, dtype):
    """`solve`'s series route and `functional.entmax` (the λ-form Newton iteration, an
    independent implementation) on rows of very different spreads, so that rows reach their
    level after different numbers of passes, with −inf padding as the candidate path leaves."""
    generator = torch.Generator().manual_seed(7)
    spreads = torch.tensor([0.05, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 1000.0], dtype=torch.float64)
    scores = torch.randn(8, 500, generator=generator, dtype=torch.float64) * spreads[:, None]
    scores[::2, 450:] = -torch.inf
    z = (scores - scores.amax(dim=1, keepdim=True)).to(dtype)  # (Q, n), row max 0
    weights, total, count, level = thresholds.solve(z.clone(), alpha)
    expected = _reference(z, alpha)
    limit = 1e-12 if dtype == torch.float64 else 2e-6
    torch.testing.assert_close((weights / total).double(), expected, rtol=0, atol=limit)
    torch.testing.assert_close(entmax(z, alpha).double(), expected, rtol=0, atol=limit)
    if dtype == torch.float64:
        assert torch.equal(count.squeeze(1).long(), (expected > 0).sum(dim=1))
        # The level in units of z: every weight is (α−1)^k·[z − t]_+^k, k = 1/(α−1).
        k = 1 / (alpha - 1)
        torch.testing.assert_close(weights, (z - level).clamp(min=0) ** k, rtol=1e-12, atol=0)


@pytest.mark.parametrize("alpha", [1.1, 1.3, 1.7])
def test_series_route_from_either_side_and_in_place(alpha):
    """Starts below, at and above the level, and far off it, give the same weights; with
    `out=z` the weights replace the scores."""
    z = _patterns(16, 5).double() @ _patterns(3000, 6).double().T * 20.0  # (Q, n)
    z = z - z.amax(dim=1, keepdim=True)
    weights, total, count, level = thresholds.solve(z, alpha)
    for shift in (-1.0, -1e-3, 0.0, 1e-3, 0.5, 50.0):
        start = level + shift  # (Q, 1), some at or above 0: no weight there
        got = thresholds.solve(z, alpha, start=start)
        torch.testing.assert_close(got[0] / got[1], weights / total, rtol=0, atol=1e-13)
    scores = z.clone()
    got = thresholds.solve(scores, alpha, out=scores)
    assert got[0].data_ptr() == scores.data_ptr()
    torch.testing.assert_close(scores / got[1], weights / total, rtol=0, atol=1e-13)


@pytest.mark.parametrize("alpha", [1.1, 1.3, 1.7])
def test_weighted_scores_count_as_repeats(alpha):
    """`weight` counts a score that many times: the level of rows with whole weights equals
    that of the rows with each score repeated (the start's sample relies on it)."""
    generator = torch.Generator().manual_seed(9)
    z = -torch.rand(4, 200, generator=generator, dtype=torch.float64) * 3
    z[:, 0] = 0.0
    weight = torch.randint(1, 4, (4, 200), generator=generator).double()
    level = thresholds.solve(z, alpha, weight=weight, mass=2.0)[3]
    for row in range(4):
        repeated = z[row].repeat_interleave(weight[row].long())[None]  # (1, Σw)
        alone = thresholds.solve(repeated, alpha, mass=2.0)[3]
        torch.testing.assert_close(level[row : row + 1], alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("exponent", [1 / 3, 0.5, 10 / 3 - 3, 2.5, 2.0, 3.0])
def test_raise_matches_pow(dtype, exponent):
    """`_raise` on the CPU (2^(e·log2 d) for a fractional e, products for a whole one) against
    float64 pow: zeros stay exactly 0; from 10⁻⁶ to 10³ within (4 + |e·log2 d|) ulps (the
    rounding of the product e·log2 d, carried by exp2); below the smallest normal number, at
    most its power."""
    tiny = torch.finfo(dtype).tiny
    generator = torch.Generator().manual_seed(1)
    normal = torch.cat(
        [torch.tensor([1e-6, 0.3, 1.0, 2.5, 1e3]), torch.rand(500, generator=generator)]
    )
    d = torch.cat([torch.tensor([0.0, tiny / 4, tiny]), normal.clamp(min=1e-6)]).to(dtype)[None]
    got = thresholds._raise(d, exponent, torch.empty_like(d), torch.empty_like(d)).double()[0]
    expected = d.double().pow(exponent)[0]
    assert got[0] == 0
    assert (got[1:3] <= tiny**exponent * (1 + 1e-6)).all()
    ulps = (4 + (exponent * d.double()[0, 3:].log2()).abs()) * torch.finfo(dtype).eps
    assert ((got[3:] - expected[3:]).abs() <= ulps * expected[3:]).all()
