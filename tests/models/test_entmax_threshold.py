"""α-entmax by Newton (`functional.entmax`) and the one-block retrieval path (`entmax_block.py`)
against an independent reference written from the formula (`conftest.entmax_reference`):
p_i = [(α−1)·s_i − τ]_+^{1/(α−1)} with τ set by bisection in float64 so that Σ p = 1
(α = 1 + 1e-9: softmax, its limit)."""

from __future__ import annotations

import pytest
import torch
from conftest import entmax_reference

from nphcli.engine.functional import entmax
from nphcli.models import create_model

ALPHAS = [1 + 1e-9, 1.1, 1.25, 1.5, 1.75, 2.0]


def _scores(scale: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(5)
    return torch.randn(12, 3000, generator=generator, dtype=torch.float64) * scale


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("scale", [0.05, 3.0, 300.0], ids=["wide", "mid", "narrow"])
def test_newton_entmax_matches_reference_float64_and_float32(alpha, scale):
    scores = _scores(scale)
    expected = entmax_reference(scores, alpha)
    limit = 1e-12 if alpha - 1 >= 1e-6 else 1e-7  # softmax stands in for α = 1 + 1e-9
    torch.testing.assert_close(entmax(scores, alpha), expected, rtol=0, atol=limit)
    got32 = entmax(scores.float(), alpha)
    assert got32.dtype == torch.float32
    assert (got32.double() - entmax_reference(scores.float(), alpha)).abs().max().item() <= 1e-5


def test_newton_entmax_near_one_is_softmax_in_float32():
    scores = _scores(3.0).float()
    error = (entmax(scores, 1 + 1e-9).double() - torch.softmax(scores.double(), -1)).abs().max()
    assert error.item() <= 1e-6


def _patterns(num: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.rand(num, 64, generator=generator), dim=1)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("beta", [1.0, 200.0], ids=["wide", "narrow"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_entmax_retrieval_one_block_and_many_blocks_match_reference(alpha, beta, dtype):
    keys = _patterns(3000, 0).to(dtype)
    queries = torch.nn.functional.normalize(keys[:40] + 0.05 * _patterns(40, 1).to(dtype), dim=1)
    weights = entmax_reference(beta * (queries.double() @ keys.double().T), alpha)  # (Q, M)
    expected = weights @ keys.double()
    model = create_model("entmax", alpha=alpha, beta=beta)
    atol = 1e-12 if dtype == torch.float64 else 1e-5
    atol = max(atol, 1e-7) if alpha - 1 < 1e-6 else atol  # softmax stands in for α = 1 + 1e-9
    one = model.retrieve(queries, keys)  # default budget: all memories in one block
    many = model.retrieve(queries, keys, memory_budget=2**16)  # blocks of a few rows
    for result in (one, many):
        assert result.patterns.dtype == dtype
        torch.testing.assert_close(result.patterns.double(), expected, rtol=0, atol=atol)
    if alpha - 1 > 1e-6:  # counts of weights > 0; in float32 a memory at the threshold may
        # round to either side of it
        assert (one.support - many.support).abs().max() <= (0 if dtype == torch.float64 else 1)


def test_entmax_plan_takes_all_memories_in_one_block_when_they_fit():
    keys = _patterns(3000, 0)
    model = create_model("entmax", alpha=1.5)
    assert model.plan(40, model_bank(keys), 2**29).memory_rows == 3000
    # Resident blocks are views and cost no budget: 2¹⁵ bytes is what no longer fits them.
    assert model.plan(40, model_bank(keys), 2**15).memory_rows < 3000


def model_bank(keys):
    from nphcli.memory.bank import as_bank

    return as_bank(keys)


@pytest.mark.parametrize("dense_share", [0.0, 1.0], ids=["whole-block", "candidates"])
@pytest.mark.parametrize("beta", [1.0, 30.0], ids=["wide", "narrow"])
@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0])
def test_one_block_paths_match_float64_reference(monkeypatch, dense_share, beta, alpha):
    """Both one-block paths (weights over the whole block, or on compacted candidates), forced
    at wide and narrow supports, within 1e-12 of the bisection reference in float64."""
    import nphcli.engine.entmax_block as entmax_block

    monkeypatch.setattr(entmax_block, "DENSE_SHARE", dense_share)
    keys = _patterns(20000, 2).double()
    queries = torch.nn.functional.normalize(keys[:24] + 0.05 * _patterns(24, 3).double(), dim=1)
    weights = entmax_reference(beta * queries @ keys.T, alpha)  # (Q, M)
    result = create_model("entmax", alpha=alpha, beta=beta).retrieve(queries, keys)
    torch.testing.assert_close(result.patterns, weights @ keys, rtol=0, atol=1e-12)
    assert torch.equal(result.support, (weights > 0).sum(dim=1))


@pytest.mark.parametrize("beta", [1.0, 10.0, 100.0])
def test_entmax15_matches_the_entmax_package_in_float32(beta):
    entmax_package = pytest.importorskip("entmax")
    keys = _patterns(20000, 4)
    queries = torch.nn.functional.normalize(keys[:32] + 0.05 * _patterns(32, 5), dim=1)
    expected = entmax_package.entmax15(beta * queries @ keys.T, dim=-1) @ keys
    got = create_model("entmax", alpha=1.5, beta=beta).retrieve(queries, keys).patterns
    assert (got - expected).abs().max().item() <= 1e-5


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0])
def test_whole_block_weights_in_row_chunks_match_float64_reference(monkeypatch, alpha, threads):
    """Weights solved a few rows at a time (here 1–2 rows per chunk, on one or two workers)
    and written into the score block in place: the same result as the reference."""
    import nphcli.engine.entmax_block as entmax_block

    monkeypatch.setattr(entmax_block, "DENSE_SHARE", 0.0)
    monkeypatch.setattr(entmax_block, "CHUNK_BYTES", 2 * 20000 * 8 - 1)  # one row per chunk
    keys = _patterns(20000, 2).double()
    queries = torch.nn.functional.normalize(keys[:7] + 0.05 * _patterns(7, 3).double(), dim=1)
    weights = entmax_reference(queries @ keys.T, alpha)  # (Q, M)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        result = create_model("entmax", alpha=alpha, beta=1.0).retrieve(queries, keys)
    finally:
        torch.set_num_threads(previous)
    assert torch.get_num_threads() == previous  # the workers' settings stay theirs
    torch.testing.assert_close(result.patterns, weights @ keys, rtol=0, atol=1e-12)
    assert torch.equal(result.support, (weights > 0).sum(dim=1))


def test_sampled_start_counts_a_far_top_once():
    """Queries that are stored patterns score one memory far above the rest; a sample that
    happens to hold that top must not weigh it like the stride of scores it stands for (it
    would put the estimate far above the threshold)."""
    import nphcli.engine.thresholds as thresholds

    keys = _patterns(20000, 6)
    scores = 3.0 * keys[:64] @ keys.T  # (Q, M): each row's top is its own pattern, at 3
    z = scores - scores.amax(dim=1, keepdim=True)
    stride = thresholds._sample_stride(20000)
    assert bool((z[:, ::stride] == 0).any(dim=1)[0])  # row 0's top (column 0) is sampled
    guess = thresholds._starts(z, 1.5)[0]  # (Q, 1)
    exact = thresholds.solve(z.double(), 1.5)[3]  # (Q, 1)
    assert (guess - exact).abs().max().item() < 0.05
