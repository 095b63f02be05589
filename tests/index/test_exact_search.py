"""Exact top-k search: FAISS's flat inner-product kernel against the torch one and a reference
written from the definition (stable sort of all M scores: score descending, index ascending)."""

from __future__ import annotations

import pytest
import torch

from nphcli.core.errors import NphError
from nphcli.engine import exact_search
from nphcli.engine.exact_search import exact_topk, faiss_topk, torch_topk
from nphcli.engine.planning import Plan
from nphcli.memory.bank import TensorBank
from nphcli.models import create_model

needs_faiss = pytest.mark.skipif(
    not exact_search.faiss_available(), reason="FAISS (the ann extra) is not installed"
)


def reference_topk(queries, keys, k):
    """All M scores, one stable descending sort: ties go to the lower index by construction."""
    scores = queries.double() @ keys.double().T  # (Q, M)
    order = torch.sort(scores, dim=1, descending=True, stable=True)
    return order.values[:, :k], order.indices[:, :k]


def tied_inputs(seed=0, queries=40, memories=300, dim=6):
    """Entries in {−1, 0, 1}: scores are small integers, exact in float32, with many ties."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.randint(-1, 2, (memories, dim), generator=g).float()  # (M, d)
    x = torch.randint(-1, 2, (queries, dim), generator=g).float()  # (Q, d)
    return x, keys


@needs_faiss
@pytest.mark.parametrize("k", [1, 5, 17, 299, 300])
def test_faiss_matches_reference_with_ties(k):
    x, keys = tied_inputs()
    scores, index = faiss_topk(x, keys, k)
    ref_scores, ref_index = reference_topk(x, keys, k)
    assert torch.equal(index, ref_index)
    assert torch.equal(scores.double(), ref_scores)


@needs_faiss
def test_faiss_matches_torch_kernel_on_continuous_scores():
    g = torch.Generator().manual_seed(3)
    keys = torch.nn.functional.normalize(torch.randn(2000, 32, generator=g), dim=1)
    x = torch.nn.functional.normalize(torch.randn(50, 32, generator=g), dim=1)
    bank = TensorBank(keys)
    f_scores, f_index = faiss_topk(x, keys, 10)
    t_scores, t_index = torch_topk(x, bank, 10, block_rows=333)
    assert torch.equal(f_index, t_index)
    torch.testing.assert_close(f_scores, t_scores)


def test_torch_kernel_matches_reference_with_ties():
    x, keys = tied_inputs(seed=1)
    scores, index = torch_topk(x, TensorBank(keys), 9, block_rows=64)
    assert torch.equal(index, reference_topk(x, keys, 9)[1])


@needs_faiss
def test_topk_model_identical_under_both_kernels(monkeypatch):
    x, keys = tied_inputs(seed=2)
    model = create_model("topk", k=7, beta=2.0)
    monkeypatch.setenv("NPH_EXACT_SEARCH", "torch")
    torch_out = model.retrieve(x, keys)
    monkeypatch.setenv("NPH_EXACT_SEARCH", "faiss")
    faiss_out = model.retrieve(x, keys)
    assert torch.equal(torch_out.patterns, faiss_out.patterns)
    assert torch.equal(torch_out.support, faiss_out.support)


def test_choice_is_checked(monkeypatch):
    x, keys = tied_inputs()
    monkeypatch.setenv("NPH_EXACT_SEARCH", "gpu-magic")
    with pytest.raises(NphError, match="NPH_EXACT_SEARCH"):
        exact_topk(x, TensorBank(keys), 3, block_rows=100)


def test_faiss_choice_refuses_what_it_cannot_search(monkeypatch):
    x, keys = tied_inputs()
    monkeypatch.setenv("NPH_EXACT_SEARCH", "faiss")
    with pytest.raises(NphError, match="faiss"):
        exact_topk(x.double(), TensorBank(keys.double()), 3, block_rows=100)


def test_without_faiss_auto_uses_torch(monkeypatch):
    x, keys = tied_inputs()
    monkeypatch.setattr(exact_search, "faiss_available", lambda: False)
    monkeypatch.setenv("NPH_EXACT_SEARCH", "auto")
    assert not exact_search.use_faiss(x, TensorBank(keys))
    scores, index = exact_topk(x, TensorBank(keys), 4, block_rows=50)
    assert torch.equal(index, reference_topk(x, keys, 4)[1])
    monkeypatch.setenv("NPH_EXACT_SEARCH", "faiss")
    with pytest.raises(NphError, match="pip install"):
        exact_topk(x, TensorBank(keys), 4, block_rows=50)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("queries", "k"), [(40, 1), (40, 9), (1, 5), (1, 300), (7, 300), (3, 299)])
def test_running_topk_matches_reference_with_ties(device, dtype, queries, k):
    """Blocks of 7 memories (ties across every block edge), k up to M, one query, float64."""
    x, keys = tied_inputs(seed=4, queries=queries)
    x, keys = x.to(device, dtype), keys.to(device, dtype)
    scores, index = torch_topk(x, TensorBank(keys), k, block_rows=7)
    ref_scores, ref_index = reference_topk(x.cpu(), keys.cpu(), k)
    assert torch.equal(index.cpu(), ref_index)
    assert torch.equal(scores.cpu().double(), ref_scores)


def test_running_topk_blocks_equal_one_block_on_continuous_scores(device):
    g = torch.Generator().manual_seed(5)
    keys = torch.nn.functional.normalize(torch.randn(3000, 24, generator=g, dtype=torch.float64))
    x = torch.nn.functional.normalize(torch.randn(12, 24, generator=g, dtype=torch.float64))
    keys, x = keys.to(device), x.to(device)
    whole = torch_topk(x, TensorBank(keys), 10, block_rows=3000)
    blocked = torch_topk(x, TensorBank(keys), 10, block_rows=50)
    assert torch.equal(whole[1], blocked[1])
    torch.testing.assert_close(whole[0], blocked[0], rtol=0, atol=1e-14)  # products' rounding


def test_sparse_and_topk_models_unchanged_by_blocks(monkeypatch, device):
    """The models' results do not depend on the memory blocks (beyond float rounding)."""
    x, keys = tied_inputs(seed=6, queries=9)
    x, keys = x.to(device), keys.to(device)
    monkeypatch.setenv("NPH_EXACT_SEARCH", "torch")
    for model in (create_model("topk", k=7, beta=2.0), create_model("sparse", beta=0.5)):
        whole = model.retrieve(x, keys)
        blocked = model.retrieve(x, keys, plan=Plan(query_rows=4, memory_rows=7))
        torch.testing.assert_close(whole.patterns, blocked.patterns, rtol=0, atol=1e-6)
        assert torch.equal(whole.support, blocked.support)


@needs_faiss
@pytest.mark.parametrize("queries", [1, 2, 3, 40])
def test_faiss_scan_and_tiles_match_reference(queries):
    """FAISS scans for Q ≤ FAISS_SCAN_MAX_QUERIES and multiplies in tiles above: the same k
    either way, and its global threshold is left as it was."""
    import faiss

    before = faiss.cvar.distance_compute_blas_threshold
    x, keys = tied_inputs(seed=7, queries=queries)
    for k in (1, 6, 300):
        scores, index = faiss_topk(x, keys, k)
        ref_scores, ref_index = reference_topk(x, keys, k)
        assert torch.equal(index, ref_index)
        assert torch.equal(scores.double(), ref_scores)
    assert faiss.cvar.distance_compute_blas_threshold == before


@needs_faiss
def test_auto_takes_faiss_at_any_query_count(monkeypatch):
    monkeypatch.setenv("NPH_EXACT_SEARCH", "auto")
    x, keys = tied_inputs()
    for rows in (1, 2, 40):
        assert exact_search.use_faiss(x[:rows], TensorBank(keys))
