"""The random model's large-k path: the hashed keys in 32-bit words, each query's k smallest
formed directly (`masks.random_keep`), on the CPU (numpy) and along a GPU's route (torch, the
whole batch at once), and the fused-kernel retrieval against the blockwise one
and the masked-softmax formula."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import fmix32_reference
from torch import Tensor

import nphcli.engine.hashing as hashing
import nphcli.engine.masks as masks
from nphcli.engine.planning import Plan
from nphcli.memory.bank import as_bank
from nphcli.models import create_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from one_query import count_ops  # noqa: E402


def test_fmix32_in_torch_int32_matches_plain_python_hash():
    # ordered_keys hashes with numpy on the CPU; torch's int32 kernels (other devices) are
    # checked here on CPU tensors against the plain-integer reference.
    words = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 0x6A09E667, 123456789])
    x = hashing.to_int32(words)
    hashed = hashing._fmix32_(x, torch.empty_like(x)).to(torch.int64) & 0xFFFFFFFF
    assert hashed.tolist() == [fmix32_reference(w) for w in words.tolist()]


def _mask_forms(positions: Tensor, num_memories: int, k: float) -> tuple[Tensor, ...]:
    k = masks.resolve_k(k, num_memories)
    return (
        hashing.random_keys(5, positions, torch.arange(num_memories)),
        masks.random_keep(5, positions, num_memories, k),
        masks.random_bias(5, positions, num_memories, k, torch.float32),
        masks.random_bias(5, positions, num_memories, k, torch.bfloat16),
    )


def test_torch_hashing_equals_numpys(monkeypatch):
    """The hashes, keep masks and additive masks of torch's kernels over the whole batch (the
    GPU's route, run here on CPU tensors) equal, bit for bit, those of numpy's (the CPU's,
    here in several chunks and groups of queries)."""
    positions = torch.arange(11) * 5 + 2**32 - 3
    monkeypatch.setattr(hashing, "_HASH_CHUNK", 1000)  # chunks of 256 columns
    monkeypatch.setattr(masks, "_KEEP_CHUNK", 2000)  # groups of 2 queries
    want = _mask_forms(positions, 900, 150)
    monkeypatch.setattr(hashing, "NUMPY_DEVICES", ())
    for got, expected in zip(_mask_forms(positions, 900, 150), want, strict=True):
        assert got.dtype == expected.dtype
        assert torch.equal(got.view(-1).view(torch.uint8), expected.view(-1).view(torch.uint8))


# Ops random's hashed mask may queue along a GPU's route: the seed and positions' hash state
# (about 50 ops on (Q,) vectors), the pairs' hash in place (about 15), the selection and the mask.
MOST_MASK_OPS = 120


@pytest.mark.parametrize(
    ("num_queries", "num_memories"), [(64, 20_000), (256, 20_000), (256, 5000)]
)
def test_whole_batch_mask_queues_a_fixed_few_ops(monkeypatch, num_queries, num_memories):
    """Along the route a GPU takes (counted on the CPU), random k = 0.2·M hashes the whole batch
    at once: as many ops as for 2 queries and 100 memories, whatever Q and M are. Before,
    `_each_kth` took 4 queries (at M = 60,000) at a time, each group hashed in chunks: 5,406 ops
    for Q = 200, 2,166 for Q = 256 and M = 20,000."""
    want = _mask_forms(torch.arange(num_queries) + 2**32 - 7, num_memories, 0.2)[1:]
    monkeypatch.setattr(hashing, "NUMPY_DEVICES", ())

    def counted(num_queries: int, num_memories: int) -> tuple[list[int], tuple[Tensor, ...]]:
        positions = torch.arange(num_queries) + 2**32 - 7
        k = masks.resolve_k(0.2, num_memories)
        calls = (
            lambda: masks.random_keep(5, positions, num_memories, k),
            lambda: masks.random_bias(5, positions, num_memories, k, torch.float32),
        )
        return [sum(count_ops(call).ops.values()) for call in calls], tuple(c() for c in calls)

    counts, got = counted(num_queries, num_memories)
    assert counts == counted(2, 100)[0]
    assert max(counts) <= MOST_MASK_OPS, counts
    assert torch.equal(got[0], want[0])  # the CPU's route's (numpy) masks, bit for bit
    assert torch.equal(got[1].view(torch.int32), want[1].view(torch.int32))


def test_working_set_counts_the_whole_batch_keys_off_the_cpu(monkeypatch):
    """On the CPU the keys are hashed a few queries at a time; elsewhere the whole batch's keys,
    their scratch and the selection's are held at once: `mask_key_bytes` per query."""
    keys = torch.randn(3000, 8)
    model = create_model("random", k=0.5)
    row_bytes, cell_bytes = model.working_set(as_bank(keys))
    assert masks.mask_key_bytes(torch.device("cpu"), 3000) == 0
    monkeypatch.setattr(hashing, "NUMPY_DEVICES", ())
    assert model.working_set(as_bank(keys)) == (row_bytes + 12 * 3000, cell_bytes)


def test_ordered_keys_keep_the_hash_order():
    positions = torch.arange(9) + 2**32 - 4
    keys = hashing.random_keys(7, positions, torch.arange(300))  # int64 in [0, 2³²)
    ordered = hashing.ordered_keys(7, positions, torch.arange(300))  # int32
    assert torch.equal(ordered.to(torch.int64) + 2**31, keys)
    assert torch.equal(ordered.argsort(dim=1), keys.argsort(dim=1))


@pytest.mark.parametrize("chunk", [1, 3000, 2**20])
def test_random_keep_is_the_k_smallest_hashes(monkeypatch, chunk):
    monkeypatch.setattr(masks, "_KEEP_CHUNK", chunk)  # one query per group, several, all at once
    positions = torch.arange(23) * 7 + 2**33
    for num_memories, k in ((5, 2), (700, 1), (700, 700), (3000, 600)):
        keys = hashing.random_keys(4, positions, torch.arange(num_memories))  # (Q, M)
        expected = keys <= torch.kthvalue(keys, k, dim=1, keepdim=True).values
        assert torch.equal(masks.random_keep(4, positions, num_memories, k), expected)


def test_random_large_k_fused_and_blockwise_agree_with_the_formula():
    generator = torch.Generator().manual_seed(3)
    keys = torch.randn(400, 16, generator=generator, dtype=torch.float64)
    queries = torch.randn(30, 16, generator=generator, dtype=torch.float64)
    model = create_model("random", k=0.2, seed=11, beta=0.7, steps=1)
    positions = torch.arange(30)
    keep = masks.random_keep(11, positions, 400, 80)  # (Q, M)
    scores = (0.7 * queries @ keys.T).masked_fill(~keep, -torch.inf)
    expected = torch.softmax(scores, dim=1) @ keys  # (Q, d)
    whole = model.retrieve(queries, keys)
    bank = as_bank(keys)
    assert model.plan(30, bank, 2**30).memory_rows == 400  # the fused kernel's plan
    blockwise = model.retrieve(queries, keys, plan=Plan(query_rows=7, memory_rows=64))
    torch.testing.assert_close(whole.patterns, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(blockwise.patterns, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_random_bias_is_zero_on_the_k_smallest_hashes_and_minus_inf_elsewhere(
    monkeypatch, threads, dtype
):
    # Several groups of queries (shared among threads when there are several), each row's
    # k smallest hashes against a plain sort of `random_keys`.
    monkeypatch.setattr(masks, "_KEEP_CHUNK", 2000)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        positions = torch.arange(37) * 3 + 2**32 - 5
        for num_memories, k in ((5, 2), (700, 1), (700, 700), (1000, 200)):
            keys = hashing.random_keys(9, positions, torch.arange(num_memories))  # (Q, M)
            kept = keys <= keys.sort(dim=1).values[:, k - 1 : k]  # (Q, M)
            expected = torch.zeros(kept.shape, dtype=dtype).masked_fill(~kept, -torch.inf)
            bias = masks.random_bias(9, positions, num_memories, k, dtype)
            assert bias.dtype == dtype
            assert torch.equal(bias, expected)
            assert torch.equal(masks.random_keep(9, positions, num_memories, k), kept)
    finally:
        torch.set_num_threads(previous)
