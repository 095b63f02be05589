"""The random model's large-k path: the hashed keys in 32-bit words, each query's k smallest
formed directly (`masks.random_keep`), and the fused-kernel retrieval against the blockwise one
and the masked-softmax formula."""

from __future__ import annotations

import pytest
import torch
from conftest import fmix32_reference

import nphcli.engine.masks as masks
from nphcli.engine.planning import Plan
from nphcli.memory.bank import as_bank
from nphcli.models import create_model


def test_fmix32_in_torch_int32_matches_plain_python_hash():
    # ordered_keys hashes with numpy on the CPU; torch's int32 kernels (other devices) are
    # checked here on CPU tensors against the plain-integer reference.
    words = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 0x6A09E667, 123456789])
    x = masks._to_int32(words)
    hashed = masks._fmix32_(x, torch.empty_like(x)).to(torch.int64) & 0xFFFFFFFF
    assert hashed.tolist() == [fmix32_reference(w) for w in words.tolist()]


def test_torch_hashing_equals_numpys(monkeypatch):
    """The hashes, keep masks and additive masks of torch's kernels (the GPU's path, run here on
    CPU tensors in several chunks and groups) equal those of numpy's (the CPU's)."""
    positions = torch.arange(11) * 5 + 2**32 - 3

    def forms():
        return (
            masks.random_keys(5, positions, torch.arange(900)),
            masks.random_keep(5, positions, 900, 150),
            masks.random_bias(5, positions, 900, 150, torch.float32),
        )

    want = forms()
    monkeypatch.setattr(masks, "NUMPY_DEVICES", ())
    monkeypatch.setattr(masks, "_HASH_CHUNK", 1000)  # chunks of 256 columns
    monkeypatch.setattr(masks, "_KEEP_CHUNK", 2000)  # groups of 2 queries
    for got, expected in zip(forms(), want, strict=True):
        assert torch.equal(got, expected)


def test_ordered_keys_keep_the_hash_order():
    positions = torch.arange(9) + 2**32 - 4
    keys = masks.random_keys(7, positions, torch.arange(300))  # int64 in [0, 2³²)
    ordered = masks.ordered_keys(7, positions, torch.arange(300))  # int32
    assert torch.equal(ordered.to(torch.int64) + 2**31, keys)
    assert torch.equal(ordered.argsort(dim=1), keys.argsort(dim=1))


@pytest.mark.parametrize("chunk", [1, 3000, 2**20])
def test_random_keep_is_the_k_smallest_hashes(monkeypatch, chunk):
    monkeypatch.setattr(masks, "_KEEP_CHUNK", chunk)  # one query per group, several, all at once
    positions = torch.arange(23) * 7 + 2**33
    for num_memories, k in ((5, 2), (700, 1), (700, 700), (3000, 600)):
        keys = masks.random_keys(4, positions, torch.arange(num_memories))  # (Q, M)
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
            keys = masks.random_keys(9, positions, torch.arange(num_memories))  # (Q, M)
            kept = keys <= keys.sort(dim=1).values[:, k - 1 : k]  # (Q, M)
            expected = torch.zeros(kept.shape, dtype=dtype).masked_fill(~kept, -torch.inf)
            bias = masks.random_bias(9, positions, num_memories, k, dtype)
            assert bias.dtype == dtype
            assert torch.equal(bias, expected)
            assert torch.equal(masks.random_keep(9, positions, num_memories, k), kept)
    finally:
        torch.set_num_threads(previous)
