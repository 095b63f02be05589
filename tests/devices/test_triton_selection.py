"""The fused top-k selection (`nphcli.engine.triton_selection`) against one stable sort over
all scores: on a CPU through Triton's interpreter, on CUDA compiled. Ties, NaN, ±inf and −0 are
planted, since the kernels select by integer keys made from the floats' bits."""

from __future__ import annotations

import logging
import os
import sys
import types

import pytest
import torch

from nphcli.engine import blocks, selection
from nphcli.engine.blocks import TopKAccumulator
from nphcli.models import create_model

triton = pytest.importorskip("triton", reason="the kernels need Triton (installed with CUDA torch)")


@pytest.fixture
def kernels(device, monkeypatch):
    """The kernel module, compiled on CUDA or interpreted on a CPU, with the fused selection
    enabled on `device`."""
    from nphcli.engine import triton_selection

    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter must be chosen before Triton is imported")
    monkeypatch.setattr(selection, "GROUP_DEVICES", (device.type,))
    monkeypatch.setitem(blocks._SELECT, "failed", None)
    return triton_selection


NEGATIVE_NAN = torch.tensor([-4194304], dtype=torch.int32).view(torch.float32).item()  # 0xFFC00000


def _blocks(rows: int, width: int, count: int, seed: int, device) -> list[torch.Tensor]:
    """Score blocks of small integers (many ties, within and across blocks) with a NaN, ±inf,
    −0 and a row of equal scores planted."""
    generator = torch.Generator().manual_seed(seed)
    made = [torch.randint(-6, 7, (rows, width), generator=generator).float() for _ in range(count)]
    made[0][0, 5] = torch.nan
    made[-1][0, 2] = torch.nan  # two NaNs in one row: the lower index first
    made[-1][2, 4] = NEGATIVE_NAN  # sign bit set (what inf − inf gives on x86): above +inf too
    made[0][1, 7] = torch.inf
    made[-1][2, 9] = -torch.inf
    for block in made[1:-1]:
        block[3] = -1.0
    made[0][3] = -0.0  # a row of −0, then +0 in the last block: equal, so the −0 are kept
    made[-1][3] = 0.0
    made[0][4] = 1.5  # a row of equal scores: the k lowest indices
    return [block.to(device) for block in made]


def _reference(parts: list[torch.Tensor], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best of all scores by one stable descending sort (NaN first, ties to lower index)."""
    every = torch.cat([part.cpu() for part in parts], dim=1)
    order = torch.sort(every, dim=1, descending=True, stable=True).indices[:, :k]
    return every.gather(1, order), order


def _same(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]):
    scores, index = (part.cpu() for part in got)
    assert torch.equal(index, want[1])
    assert torch.equal(scores.nan_to_num(1e30), want[0].nan_to_num(1e30))  # −0 equals 0


SLOW = pytest.mark.slow  # interpreted programs of k·G lanes: seconds each on a CPU


@pytest.mark.parametrize(
    "k",
    [
        1,
        10,
        pytest.param(16, marks=SLOW),
        pytest.param(17, marks=SLOW),
        pytest.param(64, marks=SLOW),
    ],
)
def test_select_merge_equals_one_stable_sort(kernels, device, k):
    width = selection.selection_block_rows(k, device) + 37  # a shorter last group
    parts = _blocks(5, width, 3, seed=k, device=device)
    kept = (torch.empty(5, 0, device=device), torch.empty(5, 0, device=device, dtype=torch.int64))
    for number, part in enumerate(parts):
        kept = kernels.select_merge(part, number * width, k, *kept)
    _same(kept, _reference(parts, k))


@pytest.mark.parametrize("scale", [0.37, 3e-45])
def test_select_merge_scales_as_it_reads(kernels, device, monkeypatch, scale):
    """scale · scores, rounded as `Tensor.mul_` rounds them: the same keys, bit for bit, in the
    group maxima as in the scores. 3e-45 rounds the scores to a few subnormal steps, so scaling
    makes ties that the unscaled scores do not have; two blocks, each in column slices."""
    monkeypatch.setattr(kernels, "MAX_GROUPS", 32)
    k, width = 16, 40 * 128 + 5  # the 16th best ties with the best of several other groups
    generator = torch.Generator().manual_seed(2)
    parts = [3 * torch.randn(3, width, generator=generator).to(device) for _ in range(2)]
    kept = (torch.empty(3, 0, device=device), torch.empty(3, 0, device=device, dtype=torch.int64))
    for number, part in enumerate(parts):
        kept = kernels.select_merge(part, number * width, k, *kept, scale)  # 2 slices each
    _same(kept, _reference([part * scale for part in parts], k))


def test_select_merge_groups_by_scaled_maxima(kernels, device):
    """Groups are chosen by their scaled maxima: 5.0 and 5.1 both scale to 4 subnormal steps,
    so the tie goes to the lower index (group 0), which the unscaled maxima would pass over."""
    scores = torch.full((1, 8 * 128), -10.0)
    scores[0, 3], scores[0, 130] = 5.0, 5.1
    scale = 1e-45
    assert scores[0, 3] * scale == scores[0, 130] * scale  # the scaling makes the tie
    empty = (torch.empty(1, 0, device=device), torch.empty(1, 0, device=device, dtype=torch.int64))
    got = kernels.select_merge(scores.to(device), 0, 1, *empty, scale)
    _same(got, _reference([scores * scale], 1))
    assert got[1].item() == 3


def test_select_merge_at_the_last_packable_index(kernels, device):
    """Memory indices up to 2³² − 2 fit a key's low 32 bits (`FUSED_INDEX_LIMIT`)."""
    k, width = 10, 4 * 10 * 128
    parts = _blocks(6, width, 2, seed=11, device=device)
    start = selection.FUSED_INDEX_LIMIT - width  # the last block ends at the limit
    kept = (torch.empty(6, 0, device=device), torch.empty(6, 0, device=device, dtype=torch.int64))
    kept = kernels.select_merge(parts[0], 0, k, *kept)
    kept = kernels.select_merge(parts[1], start, k, *kept)
    scores, order = _reference(parts, k)
    index = torch.where(order < width, order, order - width + start)
    _same(kept, (scores, index))


def test_select_merge_in_column_slices(kernels, device, monkeypatch):
    monkeypatch.setattr(kernels, "MAX_GROUPS", 8)  # 3 slices of 7 groups for 20 groups
    k = 4  # groups of 128
    parts = _blocks(6, 20 * 128 - 50, 1, seed=3, device=device)
    empty = (torch.empty(6, 0, device=device), torch.empty(6, 0, device=device, dtype=torch.int64))
    _same(kernels.select_merge(parts[0], 0, k, *empty), _reference(parts, k))


def test_select_merge_with_fewer_kept_than_k(kernels, device):
    """An earlier block narrower than k left fewer than k kept entries."""
    k = 10
    small = torch.randint(-6, 7, (5, 6), generator=torch.Generator().manual_seed(8)).float()
    small = small.to(device)
    top = TopKAccumulator(5, k, device=device, dtype=torch.float32)
    top.add(small, 0)  # eager: 6 < k entries kept
    wide = _blocks(5, selection.selection_block_rows(k, device), 1, seed=9, device=device)[0]
    merged = kernels.select_merge(wide, 6, k, top.scores, top.index)
    _same(merged, _reference([small, wide], k))


def test_the_accumulator_takes_the_kernels_and_agrees_with_eager(kernels, device, monkeypatch):
    calls = []
    inner = kernels.select_merge
    monkeypatch.setattr(kernels, "select_merge", lambda *a: calls.append(1) or inner(*a))
    monkeypatch.setenv("NPH_EXACT_SEARCH", "torch")  # FAISS, where installed, takes CPU topk
    generator = torch.Generator().manual_seed(4)
    keys = torch.nn.functional.normalize(torch.randn(12000, 24, generator=generator), dim=1)
    queries = keys[:7] + 0.1 * torch.randn(7, 24, generator=generator)
    model = create_model("topk", beta=5.0, k=10)
    fused = model.retrieve(queries.to(device), keys.to(device), memory_budget=2**17)
    assert len(calls) >= 2  # several memory blocks
    monkeypatch.setitem(blocks._SELECT, "failed", "off for this comparison")
    eager = model.retrieve(queries.to(device), keys.to(device), memory_budget=2**17)
    assert len(calls) >= 2 and torch.equal(fused.patterns, eager.patterns)


def test_a_failing_selection_kernel_falls_back_to_eager(device, monkeypatch, caplog):
    def fail(*args, **kwargs):
        raise RuntimeError("no compiler here")

    broken = types.SimpleNamespace(select_merge=fail)
    monkeypatch.setitem(sys.modules, "nphcli.engine.triton_selection", broken)
    monkeypatch.setattr(selection, "GROUP_DEVICES", (device.type,))
    monkeypatch.setitem(blocks._SELECT, "failed", None)
    parts = _blocks(5, selection.selection_block_rows(10, device), 2, seed=6, device=device)
    top = TopKAccumulator(5, 10, device=device, dtype=torch.float32)
    with caplog.at_level(logging.WARNING, logger="nph"):
        for number, part in enumerate(parts):
            top.add(part, number * part.shape[1])
    assert "no compiler here" in caplog.text and blocks._SELECT["failed"]
    _same((top.scores, top.index), _reference(parts, 10))


@pytest.mark.parametrize("name", ["sparse", "entmax"])
def test_candidate_rounds_plan_blocks_for_group_selection(monkeypatch, name):
    """Where group selection runs, sparse and entmax blocks are wide enough for it (else each
    block falls back to a radix select), as top-k's are; the budget still holds."""
    from nphcli.engine.candidates import candidate_working_set
    from nphcli.memory.bank import TensorBank

    monkeypatch.setattr(selection, "GROUP_DEVICES", ("cpu",))
    bank = TensorBank(torch.zeros(100_000, 8))
    plan = create_model(name, beta=1.0).plan(16384, bank, 2**22)
    assert plan.memory_rows >= selection.selection_block_rows(64, torch.device("cpu")) == 16384
    row_bytes, cell_bytes = candidate_working_set(bank)
    used = plan.query_rows * (row_bytes + plan.memory_rows * cell_bytes)
    assert used <= 2**22, (plan, used)
    small = TensorBank(torch.zeros(10_000, 8))  # narrower than any group-selection block
    grouped = create_model(name, beta=1.0).plan(16384, small, 2**22)
    monkeypatch.setattr(selection, "GROUP_DEVICES", ())
    assert create_model(name, beta=1.0).plan(16384, bank, 2**22).memory_rows < 16384
    assert create_model(name, beta=1.0).plan(16384, small, 2**22) == grouped  # no wider minimum


def test_wide_k_takes_the_kernels_only_for_enough_queries(monkeypatch):
    """k ≤ SMALL_K: any number of queries; above it, one program per query taking 2k dependent
    steps leaves the GPU idle for a few queries, so those stay eager."""
    monkeypatch.setattr(selection, "GROUP_DEVICES", ("cpu",))
    device = torch.device("cpu")
    for k, rows, expected in [(10, 1, True), (64, 1, False), (64, 16, True), (65, 99, False)]:
        scores = torch.zeros(rows, selection.selection_block_rows(k, device))
        assert selection.fused_selection_applies(scores, scores[:, :0], 0, k) is expected, (k, rows)


def test_a_float64_accumulator_stays_eager(kernels, device, monkeypatch):
    """float64 kept scores merged with float32 blocks (float64 queries against half memories)
    are merged by eager torch, which keeps float64; the kernels hold float32 keys only."""
    calls = []
    monkeypatch.setattr(kernels, "select_merge", lambda *a: calls.append(1))
    first = torch.randint(-6, 7, (5, 6), generator=torch.Generator().manual_seed(13)).double()
    parts = _blocks(5, selection.selection_block_rows(10, device), 2, seed=12, device=device)
    top = TopKAccumulator(5, 10, device=device, dtype=torch.float64)
    top.add(first.to(device), 0)  # six float64 entries kept
    for number, part in enumerate(parts):
        top.add(part, 6 + number * part.shape[1])
    assert not calls and top.scores.dtype == torch.float64
    _same((top.scores.float(), top.index), _reference([first.float(), *parts], 10))
