"""α-entmax in float32 and float64 across the whole documented range α ∈ [1, 2], and its limit
α → 1⁺ (softmax). Float32 used to raise a rounded (x − τ) to the power 1/(α − 1),
which for α − 1 ≤ 1e-5 lost every digit (error 0.53 at α = 1 + 1e-9)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nphcli.engine.functional import entmax_bisect

ALPHAS = [1 + 1e-12, 1 + 1e-9, 1 + 1e-7, 1 + 1e-5, 1 + 1e-3, 1.05, 1.25, 1.5, 1.75, 2.0]


def _scores(dtype: torch.dtype, scale: float = 4.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(11)
    return (torch.randn(16, 200, generator=generator, dtype=torch.float64) * scale).to(dtype)


def _reference(row: np.ndarray, alpha: float) -> np.ndarray:
    """Textbook α-entmax of one row, p_i = [(α−1)s_i − τ]_+^{1/(α−1)} with Σp = 1, by 200
    bisection halvings on τ in float64 (numpy; reliable for α − 1 ≥ 1e-3)."""
    x = (alpha - 1) * (row - row.max())
    lo, hi = x.max() - 1.0, x.max()
    for _ in range(200):
        mid = (lo + hi) / 2
        if (np.clip(x - mid, 0, None) ** (1 / (alpha - 1))).sum() >= 1:
            lo = mid
        else:
            hi = mid
    p = np.clip(x - lo, 0, None) ** (1 / (alpha - 1))
    return p / p.sum()


@pytest.mark.parametrize("alpha", [a for a in ALPHAS if a - 1 >= 1e-3])
def test_entmax_float64_matches_textbook_reference(alpha):
    scores = _scores(torch.float64)
    expected = np.stack([_reference(row, alpha) for row in scores.numpy()])
    np.testing.assert_allclose(entmax_bisect(scores, alpha).numpy(), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_entmax_float32_agrees_with_float64_across_the_range(alpha):
    scores = _scores(torch.float64)
    p64 = entmax_bisect(scores, alpha)
    p32 = entmax_bisect(scores.to(torch.float32), alpha)
    assert p32.dtype == torch.float32
    assert (p32.double() - p64).abs().max().item() < 2e-6
    torch.testing.assert_close(p32.sum(dim=-1), torch.ones(16), rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("delta", [1e-12, 1e-9, 1e-7, 1e-5, 1e-3])
def test_entmax_tends_to_softmax_as_alpha_tends_to_one(dtype, delta):
    """The limit α = 1 + δ → 1⁺ to second order. Expanding the closed form
    p_i ∝ [1 + δ·(s_i − τ')]^{1/δ} gives log p_i = ℓ_i − δ·ℓ_i²/2 + const + O(δ²) with
    ℓ = log softmax(s), so entmax_{1+δ}(s) = softmax(ℓ − δℓ²/2) + O(δ²): a reference that
    is not softmax itself (entmax differs from softmax by O(δ), checked too)."""
    scores = _scores(dtype)
    log_softmax = torch.log_softmax(scores.double(), dim=-1)  # (Q, M)
    first_order = torch.softmax(log_softmax - delta * log_softmax**2 / 2, dim=-1)
    p = entmax_bisect(scores, 1 + delta).double()
    rounding = 1e-6 if dtype == torch.float32 else 1e-13
    assert (p - first_order).abs().max().item() <= 10 * delta**2 + rounding
    gap = (p - torch.softmax(scores.double(), dim=-1)).abs().max().item()
    assert gap <= 10 * delta + rounding
    if delta >= 1e-5:  # not trivially: at this δ entmax is measurably not softmax
        assert gap > delta / 10


def test_entmax_near_one_keeps_softmax_support_and_order():
    scores = _scores(torch.float32)
    p = entmax_bisect(scores, 1 + 1e-9)
    assert bool((p > 0).all())  # softmax gives every memory weight
    assert torch.equal(p.argsort(dim=-1), torch.softmax(scores, dim=-1).argsort(dim=-1))
