"""Top-k under a small `--memory-budget`: memory blocks are never smaller than k, so the running
top-k does one merge per k memories at most, whatever the budget (at k = M and 64 KiB, blocks of
one row made a step 50× slower); results equal those of the default budget."""

from __future__ import annotations

import logging
import math

import torch

from nphcli.engine import blocks
from nphcli.engine.planning import plan_blocks
from nphcli.memory.bank import TensorBank
from nphcli.models import create_model

SMALL = 64 * 2**10  # bytes


def _memory(rows: int = 300, dim: int = 24):
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(rows, dim, generator=generator, dtype=torch.float64)
    queries = keys[:20] + 0.3 * torch.randn(20, dim, generator=generator, dtype=torch.float64)
    return queries, keys


def test_blocks_hold_at_least_k_memories_under_a_small_budget(caplog):
    queries, keys = _memory()
    bank = TensorBank(keys)
    budget = SMALL // 4  # blocks of a resident bank are views and cost no budget: go smaller
    blind_rows = {}
    for k in (300, 120, 3):
        model = create_model("topk", k=k, beta=1.0)
        row_bytes, cell_bytes = model.working_set(bank)
        blind = plan_blocks(20, bank, budget, row_bytes=row_bytes, cell_bytes=cell_bytes)
        with caplog.at_level(logging.WARNING, logger="nph"):
            plan = model.plan(20, bank, budget)
        assert plan.memory_rows >= k  # so at most ⌈M / k⌉ merges per query batch
        assert math.ceil(300 / plan.memory_rows) <= math.ceil(300 / k)
        if blind.memory_rows < k:  # the budget alone would have cut smaller blocks
            assert f"smallest efficient block ({k} memories)" in caplog.text
        blind_rows[k] = blind.memory_rows
    assert blind_rows[300] < 300  # the case that needed it: the budget alone gives tiny blocks


def test_a_budget_that_fits_k_is_planned_as_before(caplog):
    _, keys = _memory(rows=5000)
    bank = TensorBank(keys)
    model = create_model("topk", k=10, beta=1.0)
    row_bytes, cell_bytes = model.working_set(bank)
    with caplog.at_level(logging.WARNING, logger="nph"):
        plan = model.plan(100, bank, 2**20)
    assert plan == plan_blocks(100, bank, 2**20, row_bytes=row_bytes, cell_bytes=cell_bytes)
    assert caplog.text == ""


def test_k_equal_m_under_64_kib_equals_the_default_budget_in_few_merges(monkeypatch):
    queries, keys = _memory()
    model = create_model("topk", k=300, beta=0.5, steps=2)
    expected = model.retrieve(queries, keys)
    merges = []
    real_add = blocks.TopKAccumulator.add
    monkeypatch.setattr(blocks.TopKAccumulator, "add", lambda *a: merges.append(1) or real_add(*a))
    got = model.retrieve(queries, keys, memory_budget=SMALL)
    torch.testing.assert_close(got.patterns, expected.patterns, rtol=0, atol=1e-12)
    assert torch.equal(got.support, expected.support)
    plan = model.plan(20, TensorBank(keys), SMALL)
    batches = math.ceil(20 / plan.query_rows)
    assert len(merges) <= 2 * batches  # two steps, each one block of all M per batch
