"""The GPU fast paths, checked on the CPU: plans for memories resident on a device
(blocks are views, so one query takes all M memories in one block), the online softmax step in
place against the formula (its Triton kernel: tests/devices/test_triton_kernels.py), and the half
path's real peak memory within the budget. Speed is measured by `benchmarks/gpu_probe.py`,
never here."""

from __future__ import annotations

import pytest
import torch
from conftest import PeakTracker

from nphcli.core.defaults import DEFAULT_MEMORY_BUDGET
from nphcli.engine import precision
from nphcli.engine.blocks import SoftmaxAccumulator
from nphcli.engine.planning import bank_block_row_bytes
from nphcli.engine.precision import _float32_out, matmul
from nphcli.memory.bank import MemoryBank, TensorBank
from nphcli.models import create_model

MODELS = [("dense", {}), ("multihead", {"heads": 4}), ("topk", {"k": 10}), ("sparse", {})]


class _CopyingBank(MemoryBank):
    """A bank of the same shape whose blocks would be copies (as a streamed bank's are)."""

    def __init__(self, bank: TensorBank):
        self.num_memories, self.dim, self.value_dim = bank.num_memories, bank.dim, bank.value_dim
        self.device, self.dtype = bank.device, bank.dtype


def _large_bank(dtype: torch.dtype) -> TensorBank:
    """M = 10⁶, d = 784 on the meta device: shapes only, and not the CPU (no fused kernel)."""
    return TensorBank(torch.empty(10**6, 784, device="meta", dtype=dtype))


@pytest.fixture
def meta_as_cuda(monkeypatch):
    """The meta bank stands for a CUDA one: half products there write float32 themselves, so
    no float32 copy of a block is planned (`precision.widened_row_bytes`)."""
    monkeypatch.setattr(precision, "FLOAT32_OUT_DEVICES", ("cuda", "meta"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("name", "params"), MODELS)
def test_one_query_takes_a_resident_memory_in_one_block(meta_as_cuda, name, params, dtype):
    bank = _large_bank(dtype)
    budget = DEFAULT_MEMORY_BUDGET // (2 if dtype == torch.bfloat16 else 1)  # as `retrieve`
    model = create_model(name, beta=10.0, **params)
    assert model.plan(1, bank, budget).memory_rows == bank.num_memories
    # A bank that copies its blocks pays for them: the same query needs many blocks.
    assert model.plan(1, _CopyingBank(bank), budget).memory_rows < bank.num_memories // 8


def test_block_rows_cost_only_where_blocks_are_copies(meta_as_cuda):
    bank = _large_bank(torch.bfloat16)
    assert bank_block_row_bytes(bank) == 0
    assert bank_block_row_bytes(_CopyingBank(bank)) == 2 * (784 + 784) * 2


def test_half_blocks_off_cuda_count_their_float32_copy():
    """On the CPU a half block's products read a float32 copy of it: (d + d_v) · 4 per row,
    views or not; float32 banks copy nothing."""
    keys, values = torch.empty(10, 784, dtype=torch.bfloat16), torch.empty(10, 16).bfloat16()
    bank = TensorBank(keys, values)
    assert bank_block_row_bytes(bank) == (784 + 16) * 4
    assert bank_block_row_bytes(_CopyingBank(bank)) == 2 * (784 + 16) * 2 + (784 + 16) * 4
    assert bank_block_row_bytes(TensorBank(keys.float(), values.float())) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_plan_at_q16384_fits_its_real_temporaries(meta_as_cuda, dtype):
    """A block's scores (float32) and weights (a half copy, or float32 in place) per head fit the
    budget with room for the per-query rows: the H200's 61 GiB (Q, M) allocation cannot recur."""
    bank = _large_bank(dtype)
    for heads in (1, 4):
        model = create_model("multihead", heads=heads)
        budget = DEFAULT_MEMORY_BUDGET // (2 if dtype == torch.bfloat16 else 1)
        plan = model.plan(16384, bank, budget)
        cells = plan.query_rows * plan.memory_rows * heads
        real = cells * (4 + dtype.itemsize)  # float32 scores + weights in the values' dtype
        assert real <= DEFAULT_MEMORY_BUDGET
        assert plan.memory_rows < bank.num_memories


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("name", "params"), MODELS)
def test_half_working_memory_within_budget(name, params, dtype):
    """The half path's real temporaries (float32 scores, the half weights, the half product
    before its cast on the CPU) stay within the budget the planner was given."""
    budget = 256 * 2**10
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(64, 32, generator=generator).to(dtype)
    keys = torch.randn(3000, 32, generator=generator).to(dtype)
    values = torch.randn(3000, 16, generator=generator).to(dtype)  # hetero: never fused
    model = create_model(name, beta=0.5, **params)
    with PeakTracker() as tracker:
        result = model.retrieve(queries, keys, values, memory_budget=budget)
    result_bytes = result.patterns.untyped_storage().nbytes() + result.steps.nbytes
    assert tracker.peak <= budget + result_bytes, (tracker.peak, budget)


def _dense_reference(queries, keys, values, beta):
    scores = beta * queries.double() @ keys.double().T  # (Q, M)
    return torch.softmax(scores, dim=1) @ values.double()  # (Q, d_v)


def _data(dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    keys = torch.nn.functional.normalize(torch.randn(700, 48, generator=generator), dim=1)
    queries = keys[:30] + 0.1 * torch.randn(30, 48, generator=generator)
    values = torch.randn(700, 24, generator=generator)  # hetero: the blockwise path on the CPU
    return queries.to(dtype), keys.to(dtype), values.to(dtype)


# Relative error against float64 of blockwise dense in each dtype (observed on these data: float32
# ~1e-7; bfloat16 ~2e-3 and float16 ~3e-4, the output's own rounding and the weights rounded to
# the values' dtype for P·V). The weights stay in the values' dtype: float16 weights with bfloat16
# values would need a second copy of each value block and lose bfloat16's range.
ERROR = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


@pytest.mark.parametrize("dtype", list(ERROR))
@pytest.mark.parametrize("heads", [1, 4])
def test_blockwise_softmax_within_rounding_of_float64(dtype, heads):
    queries, keys, values = _data(dtype)
    model = create_model("multihead", beta=8.0, heads=heads)
    got = model.retrieve(queries, keys, values, memory_budget=2**16).patterns  # many blocks
    x, k, v = (t.double().reshape(t.shape[0], heads, -1) for t in (queries, keys, values))
    want = torch.cat(
        [_dense_reference(x[:, h], k[:, h], v[:, h], 8.0) for h in range(heads)], dim=1
    )
    error = (got.double() - want).norm() / want.norm()
    assert error <= ERROR[dtype], float(error)


def test_scores_with_a_gradient_are_not_overwritten():
    """The in-place step is for scores nobody else needs: with a gradient, autograd keeps its
    saved tensors intact and the gradient equals the formula's."""
    queries, keys, values = (t.double() for t in _data())
    queries.requires_grad_(True)
    out = create_model("dense", beta=3.0).retrieve(queries, keys, values, memory_budget=2**14)
    out.patterns.sum().backward()
    x = queries.detach().clone().requires_grad_(True)
    _dense_reference(x, keys, values, 3.0).sum().backward()
    torch.testing.assert_close(queries.grad, x.grad, rtol=1e-10, atol=1e-12)


def test_dense_blocks_skip_the_support_pass_and_match_masked_blocks():
    """`complete` blocks (dense) and the masked form with nothing masked agree to rounding."""
    generator = torch.Generator().manual_seed(3)
    scores = torch.randn(6, 90, generator=generator, dtype=torch.float64) * 20
    values = torch.randn(90, 5, generator=generator, dtype=torch.float64)
    results = []
    for complete in (True, False):
        acc = SoftmaxAccumulator(6, 5, device="cpu", dtype=torch.float64)
        for start in range(0, 90, 25):
            acc.add(
                scores[:, start : start + 25].clone(), values[start : start + 25], complete=complete
            )
        results.append(acc.result())
        assert acc.support.tolist() == [90] * 6
    torch.testing.assert_close(results[0], results[1], rtol=1e-13, atol=0)
    torch.testing.assert_close(results[0], torch.softmax(scores, 1) @ values, rtol=1e-12, atol=0)


def test_float32_out_only_where_torch_has_it():
    a, b = torch.ones(4, 8, dtype=torch.bfloat16), torch.ones(8, 3, dtype=torch.bfloat16)
    assert not _float32_out(a, b)  # the CPU has no mm with out_dtype
    meta = a.to("meta")
    assert not _float32_out(meta, b.to("meta"))


def test_half_scores_are_the_float32_accumulator_on_cuda(device):
    if device.type != "cuda":
        pytest.skip("torch.mm(..., out_dtype=float32) is a CUDA kernel")
    generator = torch.Generator().manual_seed(1)
    a = torch.randn(64, 784, generator=generator).to(device, torch.bfloat16)
    b = torch.randn(784, 300, generator=generator).to(device, torch.bfloat16)
    got = matmul(a, b)
    assert got.dtype == torch.float32
    exact = a.double() @ b.double()  # products of bfloat16 numbers are exact in float64
    # Far closer than the bfloat16 rounding (2⁻⁹ relative) the product had before.
    assert float((got.double() - exact).norm() / exact.norm()) < 1e-5


def test_matmul_falls_back_where_the_float32_out_kernel_is_missing(monkeypatch):
    """The CPU has no mm with out_dtype: taken for a GPU that lacks it, matmul rounds and
    casts and stops asking."""
    monkeypatch.setattr(precision, "FLOAT32_OUT_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(precision, "_float32_out", lambda a, b: True)
    monkeypatch.setitem(precision._FLOAT32_OUT, "failed", False)
    a, b = torch.randn(5, 8).bfloat16(), torch.randn(8, 3).bfloat16()
    torch.testing.assert_close(matmul(a, b), (a @ b).float(), rtol=0, atol=0)
    assert precision._FLOAT32_OUT["failed"]
