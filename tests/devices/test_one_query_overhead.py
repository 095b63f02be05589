"""One query: what `retrieve` asks of the host. At Q = 1 a GPU's time goes to the
host's per-call work, so the common path must not sync with the device before its work is
queued, and Floyd's draws for a few queries run on the host. Counted with a dispatch mode on
the CPU, with the block selection CUDA takes (`selection.GROUP_DEVICES`); speed is measured by
`benchmarks/one_query.py`, never here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from nphcli.engine import blocks, masks, selection
from nphcli.models import create_model
from nphcli.models.random_mask import floyd_host

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from one_query import count_ops  # noqa: E402


@pytest.fixture
def memories():
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(20_000, 16, generator=generator)
    keys /= keys.norm(dim=1, keepdim=True)
    return keys[:1] + 0.01 * torch.randn(1, 16, generator=generator), keys


@pytest.mark.parametrize(
    ("name", "params", "most_ops"),
    [("topk", {"k": 10}, 70), ("sparse", {}, 100), ("random", {"k": 10}, 60)],
)
def test_one_query_syncs_once_at_the_end(monkeypatch, memories, name, params, most_ops):
    """Before: sparse synced 8 times (overflow check, boolean masks, `nonzero`) and random
    queued 254 ops (Floyd's steps as tensor ops); the check of the result is the one sync left
    for topk and random, and sparse adds one, asking whether any query needs more candidates."""
    monkeypatch.setattr(selection, "GROUP_DEVICES", ("cuda", "cpu"))
    # The eager selection (the fused kernels' fallback): under Triton's CPU interpreter the
    # kernels' own bookkeeping would be counted as torch ops; on CUDA they are two launches.
    monkeypatch.setitem(blocks._SELECT, "failed", "counting the eager path")
    monkeypatch.setenv("NPH_EXACT_SEARCH", "torch")  # torch's ops: FAISS, if installed, is one call
    query, keys = memories
    model = create_model(name, beta=10.0, **params)
    expected = model.retrieve(query, keys).patterns
    counted = count_ops(lambda: model.retrieve(query, keys))
    assert sum(counted.syncs.values()) == (2 if name == "sparse" else 1), counted.syncs
    assert sum(counted.ops.values()) <= most_ops, counted.ops
    monkeypatch.setattr(selection, "GROUP_DEVICES", ())  # the CPU's own selection agrees
    assert torch.equal(model.retrieve(query, keys).patterns, expected)


@pytest.mark.parametrize("seed", [0, 3, 2**40 + 17, 2**64 - 1])
@pytest.mark.parametrize(("num_memories", "k"), [(10**6, 10), (640, 10), (70, 1), (2**34, 5)])
def test_floyd_on_the_host_draws_what_the_tensor_steps_draw(seed, num_memories, k):
    positions = torch.tensor([7, 2**40 + 1, 0, 123456, 2**33])
    host = floyd_host(seed, positions, num_memories, k)
    assert torch.equal(host, masks.floyd_subset(seed, positions, num_memories, k))
