"""`--memory-budget` holds: the working memory of `retrieve` beyond inputs and result stays within
it. Measured by tracking every tensor storage the call allocates (a dispatch mode sees each op's
outputs; a storage counts while it lives), so a (Q, M) score matrix made in one piece shows up
whatever the device. The same check on CUDA with torch.cuda.max_memory_allocated runs under
NPH_TEST_DEVICE=cuda.
"""

from __future__ import annotations

import pytest
import torch
from conftest import PeakTracker

from nphcli.models import create_model

NUM_QUERIES, NUM_MEMORIES, DIM, VALUE_DIM = 64, 3000, 32, 16
BUDGET = 256 * 2**10  # bytes; one (Q, M) float32 score matrix would take 750 KiB


pytestmark = pytest.mark.slow  # allocation tracking


# Models whose working set the budget bounds (all of them, with parameters that exercise the
# blockwise paths: hetero values keep dense and multihead off the fused kernel).
CASES = [
    ("dense", {}),
    ("multihead", {"heads": 4}),
    ("topk", {"k": 10}),
    ("random", {"k": 10}),
    ("random", {"k": 0.5}),
    ("sparse", {}),
    ("entmax", {}),
    ("window", {}),
    ("linear", {}),
    ("random-feature", {"features": 64}),
]


@pytest.mark.parametrize(("name", "params"), CASES)
def test_working_memory_within_budget_on_the_cpu(name, params):
    dtype = torch.float32
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(NUM_QUERIES, DIM, generator=generator, dtype=dtype)
    keys = torch.randn(NUM_MEMORIES, DIM, generator=generator, dtype=dtype)
    values = torch.randn(NUM_MEMORIES, VALUE_DIM, generator=generator, dtype=dtype)
    model = create_model(name, beta=0.5, **params)
    with PeakTracker() as tracker:
        result = model.retrieve(queries, keys, values, memory_budget=BUDGET)
    result_bytes = result.patterns.untyped_storage().nbytes() + result.steps.nbytes
    assert tracker.peak <= BUDGET + result_bytes, (tracker.peak, BUDGET)


# The feature models' planner counts the feature width F, the dimensions and the compute dtype
# apart: F far from d, wide or narrow values, and half memories summed in float32.
@pytest.mark.parametrize(
    ("name", "params", "dim", "value_dim", "dtype"),
    [
        ("linear", {}, 128, 4, torch.float32),
        ("linear", {}, 8, 64, torch.float16),
        ("random-feature", {"features": 256}, 16, 16, torch.float32),
        ("random-feature", {"features": 8}, 64, 32, torch.float64),
        ("random-feature", {"features": 64}, 32, 16, torch.bfloat16),
    ],
)
def test_feature_models_within_budget_across_shapes(name, params, dim, value_dim, dtype):
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(NUM_QUERIES, dim, generator=generator).to(dtype)
    keys = torch.randn(NUM_MEMORIES, dim, generator=generator).to(dtype)
    values = torch.randn(NUM_MEMORIES, value_dim, generator=generator).to(dtype)
    model = create_model(name, beta=0.5, **params)
    with PeakTracker() as tracker:
        result = model.retrieve(queries, keys, values, memory_budget=BUDGET)
    result_bytes = result.patterns.untyped_storage().nbytes() + result.steps.nbytes
    assert tracker.peak <= BUDGET + result_bytes, (tracker.peak, BUDGET)


@pytest.mark.parametrize(("name", "params"), CASES)
def test_peak_gpu_memory_within_budget(device, name, params):
    if device.type != "cuda":
        pytest.skip("torch.cuda.max_memory_allocated needs a CUDA device")
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(NUM_QUERIES, DIM, generator=generator).to(device)
    keys = torch.randn(NUM_MEMORIES, DIM, generator=generator).to(device)
    model = create_model(name, beta=0.5, **params)
    # cuBLAS allocates its workspace (32 MiB on Hopper) through torch's allocator at the first
    # matrix product of a process: the library's, once, not nph's working memory. Seen on an
    # H200: 33,578,496 bytes peak for dense, of which 33,554,432 the workspace.
    warm = torch.ones(8, 8, device=device)
    (warm @ warm).sum().item()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    result = model.retrieve(queries, keys, memory_budget=BUDGET)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    result_bytes = result.patterns.untyped_storage().nbytes() + result.steps.nbytes
    assert peak <= BUDGET + result_bytes, (peak, BUDGET)


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0])
@pytest.mark.parametrize(
    ("beta", "dense_share", "slots", "single"),
    [
        (1.0, 0.0, None, False),
        (200.0, 1.0, None, False),
        (1.0, 1.0, 4 * 3000, False),
        (1.0, 0.0, None, True),
        (1.0, 1.0, None, True),
    ],
    ids=["wide", "narrow", "narrow-halved", "wide-one-chunk", "narrow-one-chunk"],
)
def test_entmax_one_block_within_its_planned_budget(
    monkeypatch, alpha, beta, dense_share, slots, single
):
    """The one-block entmax path, planned at exactly its own count (fixed scratch plus all 200
    queries), stays within it on each route: the whole block's weights, the compacted candidates,
    and candidates in chunks halved until they fit (`slots` forces halving down to single rows
    at wide supports). Small chunks make the per-query terms dominate the fixed ones. `single`:
    the batch as one chunk, counted per query, as on a GPU (here on the CPU, where it is seen)."""
    import nphcli.engine.entmax_block as entmax_block
    from nphcli.engine import host_buffers
    from nphcli.memory.bank import as_bank

    monkeypatch.setattr(host_buffers, "HUGE_PAGE_MIN_BYTES", float("inf"))  # seen by the tracker
    monkeypatch.setattr(entmax_block, "CHUNK_BYTES", 2**16)
    monkeypatch.setattr(entmax_block, "DENSE_SHARE", dense_share)
    if slots is not None:
        limit = slots * entmax_block._slot_bytes(4)
        monkeypatch.setattr(entmax_block, "_slot_limit", lambda *_: limit)
    generator = torch.Generator().manual_seed(3)
    keys = torch.nn.functional.normalize(torch.rand(3000, 32, generator=generator), dim=1)
    queries = torch.nn.functional.normalize(keys[:200] + 0.05 * torch.rand(200, 32), dim=1)
    model = create_model("entmax", alpha=alpha, beta=beta)
    monkeypatch.setattr(entmax_block, "_single_chunk", lambda z: single)
    bank = as_bank(keys.to("meta") if single else keys)  # (only its device type is read)
    per_query, fixed = entmax_block.one_block_bytes(bank, 4)
    budget = fixed + 200 * per_query
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # chunks solved on this thread, where the tracker sees them
    try:
        if not single:  # (the plan counts a CPU bank's way)
            assert model.plan(200, as_bank(keys), budget).memory_rows == 3000
            assert model.plan(200, as_bank(keys), budget).query_rows == 200
        with PeakTracker() as tracker:
            result = model.retrieve(queries, keys, memory_budget=budget)
    finally:
        torch.set_num_threads(previous)
    result_bytes = result.patterns.untyped_storage().nbytes() + result.steps.nbytes
    assert tracker.peak <= budget + result_bytes, (tracker.peak, budget)
    assert tracker.peak >= 200 * 3000 * 4  # the (Q, M) scores were seen


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_entmax_candidate_slots_cover_a_narrow_chunk(alpha, dtype):
    """What solving one narrow chunk allocates stays within the slot bytes `one_block_bytes`
    counts for it: `SLOT_ITEMS` items and `SLOT_BYTES` bytes per slot of its compacted
    candidates (rows × widest count)."""
    import nphcli.engine.entmax_block as entmax_block

    generator = torch.Generator().manual_seed(4)
    scores = torch.randn(8, 3000, generator=generator, dtype=dtype)
    z = scores - scores.amax(dim=1, keepdim=True)  # (R, M) row max 0
    start = z.quantile(0.7, dim=1, keepdim=True)  # (R, 1): about 30% candidates
    safe = start - 1  # not needed: the level solved above the start lies above it
    keep = z > start
    widest = int(keep.sum(dim=1).max())
    item = z.element_size()
    with PeakTracker() as tracker:
        entmax_block._solve_candidates(z, alpha, keep, start, safe)
    slots = z.shape[0] * widest * entmax_block._slot_bytes(item)
    assert tracker.peak <= slots, (tracker.peak, slots)


@pytest.mark.parametrize("hetero", [False, True])
def test_random_whole_batch_mask_within_budget(monkeypatch, hetero):
    """Along a GPU's route (run on the CPU) random's mask hashes the whole batch's keys at once;
    the planner counts them (`masks.mask_key_bytes`), with the fused kernel's additive mask and
    (hetero values) the blockwise bool one."""
    from nphcli.engine import hashing

    monkeypatch.setattr(hashing, "NUMPY_DEVICES", ())
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(NUM_QUERIES, DIM, generator=generator)
    keys = torch.randn(NUM_MEMORIES, DIM, generator=generator)
    values = torch.randn(NUM_MEMORIES, VALUE_DIM, generator=generator) if hetero else None
    model = create_model("random", beta=0.5, k=0.5)
    with PeakTracker() as tracker:
        result = model.retrieve(queries, keys, values, memory_budget=BUDGET)
    result_bytes = result.patterns.untyped_storage().nbytes() + result.steps.nbytes
    assert tracker.peak <= BUDGET + result_bytes, (tracker.peak, BUDGET)
