"""Separation statistics m, R, Δ_μ: hand-checked examples, blocked vs reference, sampling."""

from __future__ import annotations

import math

import pytest
import torch

from nphcli.memory.file import Memory
from nphcli.theory.separation import (
    describe,
    max_norm,
    nearest_competitors,
    pattern_summary,
    reference_separation,
    separation,
)


def test_hand_checked_three_points(device):
    # ξ1 = e1, ξ2 = e2, ξ3 = e1 + e2. Norms 1, 1, √2. Distances √2, 1, 1.
    # Δ1 = 1 − max(0, 1) = 0, Δ2 = 0, Δ3 = 2 − max(1, 1) = 1.
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], device=device)
    sep = separation(x)
    assert sep.m == pytest.approx(math.sqrt(2))
    assert sep.R == pytest.approx(0.5)
    assert sep.delta.tolist() == pytest.approx([0.0, 0.0, 1.0])
    assert sep.delta_summary() == pytest.approx(
        {"min": 0.0, "mean": 1 / 3, "median": 0.0, "max": 1.0}
    )
    assert not sep.sampled and sep.rows.tolist() == [0, 1, 2]


def test_hand_checked_scaled_orthonormal_basis(device):
    x = 3 * torch.eye(4, device=device)  # norms 3, distances 3√2, ⟨ξ, ξ⟩ = 9, others 0
    sep = separation(x)
    assert sep.m == pytest.approx(3.0)
    assert sep.R == pytest.approx(1.5 * math.sqrt(2))
    assert sep.delta.tolist() == pytest.approx([9.0] * 4)


def test_duplicates_give_exactly_zero(device):
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(1)).to(device) * 100
    x[4] = x[1]
    sep = separation(x)
    assert sep.R == 0.0
    assert sep.delta[1] == 0.0 and sep.delta[4] == 0.0


def test_single_pattern_has_no_pairwise_statistics():
    sep = separation(torch.tensor([[3.0, 4.0]]))
    assert sep.m == 5.0 and sep.R is None and sep.delta_summary() is None
    with pytest.raises(ValueError):
        nearest_competitors(torch.ones(1, 2))


@pytest.mark.parametrize("block_elements", [1, 7, 64, 1 << 20])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
def test_blocked_matches_reference(block_elements, dtype, device):
    generator = torch.Generator().manual_seed(block_elements)
    x = torch.randn(23, 6, generator=generator).to(device, dtype)
    sep = separation(x, block_elements=block_elements)
    m, R, delta = reference_separation(x.cpu())
    tolerance = 1e-9 if dtype == torch.float64 else 1e-4
    assert sep.m == pytest.approx(m, abs=tolerance)
    assert sep.R == pytest.approx(R, abs=tolerance)
    assert torch.allclose(sep.delta, delta, atol=tolerance)


def test_sampling_is_seeded_exact_per_row_and_bounds_r(device):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(40, 4, generator=generator, dtype=torch.float64).to(device)
    m, R, delta = reference_separation(x.cpu())
    sep = separation(x, max_rows=10, seed=7)
    again = separation(x, max_rows=10, seed=7)
    assert sep.sampled and sep.seed == 7 and sep.rows.numel() == 10
    assert torch.equal(sep.rows, again.rows) and torch.equal(sep.rows, sep.rows.sort().values)
    assert torch.allclose(sep.delta, delta[sep.rows], atol=1e-9)  # exact for the sampled rows
    assert sep.R >= R - 1e-12 and sep.m == pytest.approx(m)  # R over fewer pairs; m over all
    assert not separation(x, max_rows=None).sampled


def test_pattern_summary_and_max_norm():
    x = torch.tensor([[3.0, -4.0], [0.0, 1.0]])
    summary = pattern_summary(x, block_rows=1)
    assert summary["value_range"] == [-4.0, 3.0]
    assert summary["norms"] == pytest.approx({"min": 1.0, "mean": 3.0, "max": 5.0})
    assert max_norm(x) == 5.0


def test_describe_reports_everything_info_needs():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    memory = Memory(patterns=x, labels=torch.tensor([0, 1, 1]), meta={"item_shape": [1, 1, 2]})
    report = describe(memory)
    assert report["M"] == 3 and report["d"] == 2 and report["item_shape"] == [1, 1, 2]
    assert report["labels"] == {"count": 3, "distinct": 2}
    assert report["separation"]["R"] == pytest.approx(0.5)
    assert report["separation"]["rows_used"] == 3 and report["separation"]["sampled"] is False
