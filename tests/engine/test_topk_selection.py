"""Per-block exact top-k (`nphcli.engine.selection`): group selection and the full topk against
a reference written from the definition (one stable descending sort of all B scores), and the
running top-k over blocks identical whichever selection cuts the blocks."""

from __future__ import annotations

import pytest
import torch

from nphcli.engine import selection
from nphcli.engine.blocks import TopKAccumulator
from nphcli.engine.candidates import candidate_update
from nphcli.engine.functional import sparsemax
from nphcli.engine.planning import BLOCK_ALIGN
from nphcli.engine.selection import full_topk, group_topk
from nphcli.memory.bank import TensorBank


def reference(scores, k):
    """Indices (Q, k), ascending, of the first k of a stable descending sort."""
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
    return order.sort(dim=1).values


def score_cases(device):
    """(name, scores (Q, B)) with distinct scores, many exact ties, duplicated memories, −inf
    and +inf entries, and rows that are all −inf."""
    g = torch.Generator().manual_seed(0)
    random = torch.randn(7, 203, generator=g, dtype=torch.float64)
    integers = torch.randint(-3, 4, (7, 203), generator=g).double()  # ties everywhere
    keys = torch.randn(20, 5, generator=g, dtype=torch.float64)
    keys = keys[torch.randint(0, 20, (203,), generator=g)]  # (B, d) memories repeated
    duplicated = torch.randn(7, 5, generator=g, dtype=torch.float64) @ keys.T
    infinite = integers.clone()
    infinite[:, ::3] = -torch.inf
    infinite[0] = -torch.inf  # nothing admitted
    infinite[1, :150] = -torch.inf  # the finite ones late, in the shorter last group
    infinite[2, 5::40] = torch.inf
    cases = {"random": random, "integers": integers, "dup": duplicated, "inf": infinite}
    return [(name, cases[name].to(device)) for name in cases]


@pytest.mark.parametrize("group", [1, 4, 7, 32])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_group_topk_equals_stable_sort(device, group, k):
    for name, scores in score_cases(device):
        if -(-scores.shape[1] // group) < k:
            continue  # fewer groups than k: group selection does not apply
        expected = reference(scores, k)
        assert torch.equal(group_topk(scores, k, group), expected), name
        assert torch.equal(full_topk(scores, k), expected), name


def test_group_topk_as_few_groups_as_k(device):
    """k close to the number of groups: every group is gathered, the tail group included."""
    scores = torch.randint(0, 3, (5, 22), generator=torch.Generator().manual_seed(1)).double()
    scores = scores.to(device)
    for k in (5, 6):  # 6 groups of ≤ 4
        assert torch.equal(group_topk(scores, k, 4), reference(scores, k))


def test_group_topk_puts_nan_first(device):
    """NaN ranks above every number, as in today's cut and in `torch.sort`; among NaNs the
    lowest index wins."""
    scores = torch.arange(40.0, device=device).repeat(3, 1)  # (3, 40)
    scores[0, [3, 17, 30]] = torch.nan
    scores[1, 25] = torch.nan
    scores[2, [2, 9, 11, 20, 33]] = torch.nan  # more NaNs than k
    chosen = group_topk(scores, 4, 4)
    assert torch.equal(chosen, reference(scores, 4))
    assert chosen.tolist()[:2] == [[3, 17, 30, 39], [25, 37, 38, 39]]
    assert torch.isnan(scores.gather(1, full_topk(scores, 4))).sum(1).tolist() == [3, 1, 4]


def _running(scores, k, rows):
    top = TopKAccumulator(scores.shape[0], k, device=scores.device, dtype=scores.dtype)
    for start in range(0, scores.shape[1], rows):
        top.add(scores[:, start : start + rows], start)
    return top.scores, top.index


@pytest.mark.parametrize("rows", [2, 5, 64, 203])
@pytest.mark.parametrize("k", [1, 4, 10])
def test_running_topk_identical_with_group_selection(device, monkeypatch, rows, k):
    """TopKAccumulator gives bit-identical results with group selection forced on (small
    groups, so that small blocks take it) and off, equal to the reference over all B."""
    for name, scores in score_cases(device):
        monkeypatch.setattr(selection, "GROUP_DEVICES", ())
        old_scores, old_index = _running(scores, k, rows)
        monkeypatch.setattr(selection, "GROUP_DEVICES", (device.type,))
        monkeypatch.setattr(selection, "group_size", lambda k: 4)
        monkeypatch.setattr(selection, "MIN_GROUPS_PER_K", 1)
        calls = []
        counted = lambda *a, c=calls: c.append(1) or group_topk(*a)  # noqa: E731
        monkeypatch.setattr(selection, "group_topk", counted)
        new_scores, new_index = _running(scores, k, rows)
        assert bool(calls) == (rows >= 4 * k), name  # taken exactly where it applies
        assert torch.equal(new_index, old_index), name
        assert torch.equal(new_scores, old_scores), name
        expected = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
        assert torch.equal(new_index, expected), name


def test_candidate_rounds_identical_with_group_selection(device, monkeypatch):
    """Sparsemax's candidate rounds (running top-c) give the same patterns and supports."""
    g = torch.Generator().manual_seed(3)
    keys = torch.randint(-2, 3, (700, 8), generator=g).double()  # ties in the scores
    keys = torch.cat([keys, keys[:100]]).to(device)  # duplicated memories
    x = torch.randint(-2, 3, (9, 8), generator=g).double().to(device)
    bank = TensorBank(keys)
    runs = []
    for devices in ((), (device.type,)):
        monkeypatch.setattr(selection, "GROUP_DEVICES", devices)
        monkeypatch.setattr(selection, "group_size", lambda k: 2)
        monkeypatch.setattr(selection, "MIN_GROUPS_PER_K", 1)
        runs.append(candidate_update(x, bank, beta=0.5, simplex_map=sparsemax, block_rows=300))
    assert torch.equal(runs[0][0], runs[1][0])
    assert torch.equal(runs[0][1], runs[1][1])


def test_topk_plans_blocks_that_group_selection_takes_on_cuda():
    """On CUDA the planner's smallest topk block is where group selection starts (so large query
    batches, which get the smallest blocks, are selected from group maxima); elsewhere k."""
    from nphcli.models import create_model

    keys = torch.empty(10**6, 784, device="meta", dtype=torch.bfloat16)
    model = create_model("topk", k=10)
    start = selection.MIN_GROUPS_PER_K * 10 * selection.group_size(10)
    assert selection.selection_block_rows(10, torch.device("cuda")) == start
    assert selection.selection_block_rows(10, torch.device("cpu")) == 10
    plan = model.plan(16384, TensorBank(keys), 2**28)  # meta: the CPU rule (k)
    assert plan.memory_rows < start
    cuda_like = TensorBank(keys)
    cuda_like.device = torch.device("cuda")  # the plan reads only shapes and the device
    plan = model.plan(16384, cuda_like, 2**28)
    assert plan.memory_rows >= start and plan.memory_rows % BLOCK_ALIGN == 0
