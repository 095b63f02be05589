"""The Triton kernels of softmax attention on CUDA (`nphcli.engine.triton_kernels`) against the
eager torch they replace: on a CPU through Triton's interpreter (float32, float16), on CUDA
compiled. And the fallback: a kernel that fails leaves eager torch to give the same result."""

from __future__ import annotations

import logging
import os
import sys
import types

import pytest
import torch

from nphcli.engine import attention, blocks
from nphcli.models import create_model

triton = pytest.importorskip("triton", reason="the kernels need Triton (installed with CUDA torch)")


@pytest.fixture
def kernels(device, monkeypatch):
    """The kernel module, compiled on CUDA or interpreted on a CPU (conftest sets
    TRITON_INTERPRET there), with both paths enabled on `device` for any block size."""
    from nphcli.engine import triton_kernels

    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter must be chosen before Triton is imported")
    monkeypatch.setattr(blocks, "KERNEL_DEVICES", (device.type,))
    monkeypatch.setattr(blocks, "KERNEL_MIN_CELLS", 0)
    monkeypatch.setitem(attention.DECODE_KERNELS, device.type, ("triton_kernels", 1, 0))
    monkeypatch.setitem(blocks._KERNEL, "failed", None)
    monkeypatch.setitem(attention._DECODE["triton_kernels"], "failed", None)
    monkeypatch.setattr(attention, "fused_attention_chosen", lambda bank, heads, **how: False)
    return triton_kernels


def _counted(monkeypatch, module, name: str) -> list:
    """Replace module.name by a wrapper that records each call; returns the record."""
    calls: list = []
    inner = getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(name)
        return inner(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def _scores(rows: int, columns: int, *, complete: bool, device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(rows * 7 + columns)
    scores = 3 * torch.randn(rows, columns, generator=generator)
    if not complete:
        scores[1] = -torch.inf  # a row with nothing admitted yet
        scores[2, ::3] = -torch.inf
    return scores.to(device)


@pytest.mark.parametrize("complete", [True, False])
@pytest.mark.parametrize("columns", [37, 3000, 40000])  # 40000 > 16384: read in chunks
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_step_kernel_equals_the_eager_step(kernels, device, complete, columns, dtype):
    """Rows that fit one program are shifted by their new max, as eager torch does. Wider rows
    may keep the running max as their reference while the block's max exceeds it by at most
    `step_lead(dtype)` (row 3 here: no block max above 30); rows further above it (rows 0 and 4) or
    with no reference yet are shifted by the new max. Either way weights are exp(s − shift)."""
    scores = _scores(5, columns, complete=complete, device=device)
    running = torch.tensor([0.5, -torch.inf, -torch.inf, 30.0, -20.0], device=device)
    new_max, shift, weights, sums = kernels.softmax_step(
        scores.clone(), running, dtype, complete, 2.5
    )
    want_max, want_shift, *_ = blocks._exp_math(2.5 * scores, running, dtype, complete, True)
    lead = 0.0 if columns <= kernels.STEP_MAX_BLOCK else kernels.step_lead(dtype)
    assert weights.dtype == dtype and weights.shape == scores.shape
    kept = torch.isfinite(want_max)
    assert bool((new_max[kept] <= want_max[kept]).all())
    assert bool((want_max[kept] - new_max[kept] <= lead).all())
    assert bool((new_max[~kept] == -torch.inf).all())
    if columns > kernels.STEP_MAX_BLOCK:
        assert new_max[3] == 30.0 and new_max[0] == want_max[0] and new_max[4] == want_max[4]
    torch.testing.assert_close(shift, torch.where(kept, new_max, want_shift), rtol=0, atol=0)
    exact = torch.exp(2.5 * scores.double() - shift.double()[:, None])  # (5, B)
    # Triton's exp on a GPU is the fast approximate one (relative error ≈ 1e-6 at exponents
    # near −40); weights below 1e-7 of the largest (≥ 1) count as equal.
    rtol = 1e-3 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(weights.double(), exact.to(dtype).double(), rtol=rtol, atol=1e-7)
    torch.testing.assert_close(sums.double(), exact.sum(dim=1), rtol=1e-5, atol=0)
    if not complete:  # nothing admitted: max −inf, shift 0, no weight
        assert new_max[1] == -torch.inf and shift[1] == 0 and sums[1] == 0


def test_wide_float16_weights_stay_within_float16(kernels, device):
    """A wide row whose block max lies 13.6 above its running max: within `STEP_LEAD` (16), but
    e^13.6 is beyond float16's 65504, so a float16 step must shift by the new max (its
    `step_lead` is 10.1) and give finite weights equal to the eager step's."""
    scores = torch.zeros(2, 20000, device=device)
    scores[:, 7] = 14.0
    running = torch.tensor([0.4, 0.4], device=device)
    new_max, shift, weights, sums = kernels.softmax_step(
        scores.clone(), running, torch.float16, True, 1.0
    )
    assert bool(torch.isfinite(weights).all()) and bool((new_max == 14.0).all())
    exact = torch.exp(scores.double() - 14.0)  # (2, B)
    torch.testing.assert_close(weights.double(), exact.half().double(), rtol=1e-3, atol=1e-7)
    torch.testing.assert_close(sums.double(), exact.sum(dim=1), rtol=1e-5, atol=0)


@pytest.mark.parametrize("num_queries", [1, 3])
@pytest.mark.parametrize("hetero", [False, True])
def test_decode_kernel_equals_the_softmax_formula(kernels, device, num_queries, hetero):
    generator = torch.Generator().manual_seed(num_queries)
    keys = torch.randn(1000, 50, generator=generator).to(device)
    values = torch.randn(1000, 20, generator=generator).to(device) if hetero else keys
    queries = torch.randn(num_queries, 50, generator=generator).to(device)
    best, norm, total = kernels.decode_partials(queries, keys, values, scale=0.7, programs=6)
    assert best.shape == norm.shape == (best.shape[0], num_queries) and 1 < best.shape[0] <= 6
    top = best.amax(dim=0)
    rescale = torch.exp(best - top)
    got = (total * rescale[..., None]).sum(0) / (norm * rescale).sum(0)[:, None]
    want = torch.softmax(0.7 * queries.double() @ keys.double().T, dim=1) @ values.double()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def _reference(queries, keys, values, beta, heads=1):
    x = queries.double().reshape(len(queries), heads, -1).transpose(0, 1)
    k = keys.double().reshape(len(keys), heads, -1).transpose(0, 1)
    v = values.double().reshape(len(values), heads, -1).transpose(0, 1)
    out = torch.softmax(beta * x @ k.transpose(1, 2), dim=-1) @ v
    return out.transpose(0, 1).reshape(len(queries), -1)


@pytest.mark.parametrize(
    ("name", "params", "num_queries"),
    [("dense", {}, 1), ("dense", {}, 150), ("multihead", {"heads": 2}, 70)],
)
def test_retrieval_through_the_kernels_equals_the_formula(
    kernels, device, monkeypatch, name, params, num_queries
):
    """Dense with one query takes the decode kernel; with more, the step kernel, its rows read
    in chunks (narrowed here to 32 scores)."""
    monkeypatch.setattr(kernels, "STEP_MAX_BLOCK", 32)  # blocks of ~100 memories: chunked rows
    names = ("softmax_step", "decode_partials")
    calls = {name: _counted(monkeypatch, kernels, name) for name in names}
    generator = torch.Generator().manual_seed(5)
    keys = torch.nn.functional.normalize(torch.randn(400, 32, generator=generator), dim=1)
    queries = keys[:num_queries] + 0.1 * torch.randn(num_queries, 32, generator=generator)
    model = create_model(name, beta=6.0, **params)
    got = model.retrieve(queries.to(device), keys.to(device), memory_budget=2**18).patterns
    want = _reference(queries, keys, keys, 6.0, params.get("heads", 1))
    torch.testing.assert_close(got.double().cpu(), want, rtol=1e-5, atol=1e-6)
    assert blocks._KERNEL["failed"] is None
    assert attention._DECODE["triton_kernels"]["failed"] is None
    used = "decode_partials" if num_queries <= 1 else "softmax_step"
    assert len(calls[used]) >= (1 if used == "decode_partials" else 2)  # several blocks


def _failing_kernels(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise RuntimeError("no compiler here")

    broken = types.SimpleNamespace(softmax_step=fail, decode_partials=fail)
    monkeypatch.setitem(sys.modules, "nphcli.engine.triton_kernels", broken)
    monkeypatch.setattr(sys.modules["nphcli.engine"], "triton_kernels", broken, raising=False)


@pytest.mark.parametrize("num_queries", [1, 150])
def test_a_failing_kernel_falls_back_to_eager(monkeypatch, caplog, num_queries):
    _failing_kernels(monkeypatch)
    monkeypatch.setattr(blocks, "KERNEL_DEVICES", ("cpu",))
    monkeypatch.setattr(blocks, "KERNEL_MIN_CELLS", 0)
    monkeypatch.setitem(attention.DECODE_KERNELS, "cpu", ("triton_kernels", 1, 0))
    monkeypatch.setitem(blocks._KERNEL, "failed", None)
    monkeypatch.setitem(attention._DECODE["triton_kernels"], "failed", None)
    monkeypatch.setattr(attention, "fused_attention_chosen", lambda bank, heads, **how: False)
    generator = torch.Generator().manual_seed(2)
    keys = torch.randn(300, 16, generator=generator)
    queries = torch.randn(num_queries, 16, generator=generator)
    with caplog.at_level(logging.WARNING, logger="nph"):
        got = create_model("dense", beta=2.0).retrieve(queries, keys, memory_budget=2**22)
    assert "no compiler here" in caplog.text
    want = _reference(queries, keys, keys, 2.0)
    torch.testing.assert_close(got.patterns.double(), want, rtol=1e-5, atol=1e-5)
