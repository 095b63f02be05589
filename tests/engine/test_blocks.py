"""The blockwise accumulators equal their one-shot counterparts."""

from __future__ import annotations

import pytest
import torch

from nphcli.engine.blocks import SoftmaxAccumulator, TopKAccumulator
from nphcli.engine.planning import plan_rows
from nphcli.memory.bank import TensorBank


@pytest.mark.parametrize("rows", [1, 3, 7, 50])
def test_online_softmax_equals_softmax(rows):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(5, 23, generator=g, dtype=torch.float64) * 30  # (Q, M)
    scores[0, :] = -torch.inf
    scores[0, 17] = 2.0  # a row keeping a single memory, late in the order
    scores[1, ::2] = -torch.inf
    values = torch.randn(23, 4, generator=g, dtype=torch.float64)  # (M, d_v)
    bank = TensorBank(torch.zeros(23, 2, dtype=torch.float64), values)
    acc = SoftmaxAccumulator(5, 4, device="cpu", dtype=torch.float64)
    for start, _, value_block in bank.blocks(rows):
        acc.add(scores[:, start : start + value_block.shape[0]].clone(), value_block)  # consumed
    expected = torch.softmax(scores, dim=1) @ values
    torch.testing.assert_close(acc.result(), expected, rtol=1e-12, atol=1e-12)
    assert acc.support.tolist() == torch.isfinite(scores).sum(1).tolist()


@pytest.mark.parametrize("rows", [1, 4, 9, 40])
def test_running_topk_breaks_ties_towards_lower_index(rows):
    scores = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 2.0, 3.0, 1.0]])  # (1, 9)
    acc = TopKAccumulator(1, 4, device="cpu", dtype=torch.float64)
    for start in range(0, 9, rows):
        acc.add(scores[:, start : start + rows], start)
    assert acc.index.tolist() == [[1, 2, 4, 7]]
    one_shot = TopKAccumulator(1, 5, device="cpu", dtype=torch.float64)
    one_shot.add(scores, 0)
    assert one_shot.index.tolist() == [[1, 2, 4, 7, 3]]


def test_plan_rows_stays_in_bounds():
    assert plan_rows(1000, 10, 4, total=7) == 7
    assert plan_rows(1000, 10, 4, total=1000) == 25
    assert plan_rows(1, 10**6, 4, total=50) == 1
