"""The kernel models' memory summary is built once per memory and reused, never stale."""

from __future__ import annotations

import pytest
import torch
from conftest import write_memory

from nphcli.engine import features, summary_cache
from nphcli.memory.streamed import StreamedBank
from nphcli.models import create_model

MODELS = [("linear", {}), ("random-feature", {"features": 32})]


@pytest.fixture
def builds(monkeypatch):
    """Counts the summaries actually built (each one folds the memory blocks)."""
    summary_cache.clear()
    calls = []
    original = features.summarise_keys

    def counting(blocks):
        calls.append(1)
        return original(blocks)

    monkeypatch.setattr("nphcli.models.linear.summarise_keys", counting)  # both models' build
    yield calls
    summary_cache.clear()


def _data(device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    queries = torch.randn(7, 5, generator=generator, dtype=torch.float64)
    keys = torch.randn(40, 5, generator=generator, dtype=torch.float64)
    return queries.to(device), keys.to(device)


def _fresh(name, params, queries, keys):
    """The result with nothing reused: on copies no cache entry can know."""
    return create_model(name, beta=0.7, **params).retrieve(queries.clone(), keys.clone()).patterns


@pytest.mark.parametrize(("name", "params"), MODELS)
def test_summary_built_once_per_memory(device, builds, name, params):
    queries, keys = _data(device)
    model = create_model(name, beta=0.7, **params)
    first = model.retrieve(queries, keys).patterns
    again = model.retrieve(queries[:3], keys).patterns  # another call, other queries
    assert len(builds) == 1
    torch.testing.assert_close(again, first[:3], rtol=0, atol=1e-12)
    other = create_model(name, beta=0.9, **params).retrieve(queries, keys)  # other β: rebuilt
    assert len(builds) == 2
    assert not torch.allclose(other.patterns, first)


@pytest.mark.parametrize(("name", "params"), MODELS)
def test_changed_memory_is_rebuilt(device, builds, name, params):
    queries, keys = _data(device)
    model = create_model(name, beta=0.7, **params)
    model.retrieve(queries, keys)
    keys.mul_(-1.5)  # in place: same tensor, new contents
    changed = model.retrieve(queries, keys).patterns
    assert len(builds) == 2
    torch.testing.assert_close(changed, _fresh(name, params, queries, keys), rtol=0, atol=1e-12)


def test_freed_memory_is_forgotten(device, builds):
    queries, keys = _data(device)
    create_model("linear", beta=0.7).retrieve(queries, keys)
    assert summary_cache.size() == 1
    del keys
    assert summary_cache.size() == 0


def test_memory_needing_gradients_is_not_cached(device, builds):
    queries, keys = _data(device)
    keys.requires_grad_(True)
    model = create_model("linear", beta=0.7)
    model.retrieve(queries, keys).patterns.sum().backward()
    model.retrieve(queries, keys)
    assert len(builds) == 2 and keys.grad is not None


def test_streamed_file_rewritten_is_rebuilt(device, builds, tmp_path):
    queries, keys = _data(device)
    path = tmp_path / "m.safetensors"
    write_memory(path, keys.cpu(), dtype=torch.float64)
    model = create_model("random-feature", beta=0.7, features=32)
    first = model.retrieve(queries, StreamedBank(path, device=device)).patterns
    model.retrieve(queries, StreamedBank(path, device=device))
    assert len(builds) == 1
    write_memory(path, 2 * keys.cpu(), dtype=torch.float64, force=True)
    second = model.retrieve(queries, StreamedBank(path, device=device)).patterns
    assert len(builds) == 2
    expected = _fresh("random-feature", {"features": 32}, queries, 2 * keys)
    torch.testing.assert_close(second, expected)
    assert not torch.allclose(first, second)
