"""The fused α-entmax threshold (`nphcli.engine.triton_entmax`, α = 1.5 and 2): on a CPU through
Triton's interpreter, on CUDA compiled. Checked against the eager iteration it mirrors
(`thresholds.solve`) and, through the model, against a float64 reference by bisection."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from conftest import entmax_reference

from nphcli.engine import blocks, entmax_block, thresholds
from nphcli.models import create_model

pytest.importorskip("triton", reason="the kernels need Triton (installed with CUDA torch)")


def _patterns(num: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.rand(num, 64, generator=generator), dim=1)


@pytest.fixture
def kernels(device, monkeypatch):
    """The kernel module, compiled on CUDA or interpreted on a CPU, with the fused route
    enabled on `device` for batches of any size."""
    from nphcli.engine import triton_entmax

    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter must be chosen before Triton is imported")
    monkeypatch.setattr(blocks, "KERNEL_DEVICES", (device.type,))
    monkeypatch.setattr(entmax_block, "FUSED_MIN_ROWS", 1)
    monkeypatch.setitem(entmax_block._FUSED, "failed", None)
    return triton_entmax


def _shifted(rows: int, width: int, beta: float, dtype, device, seed: int = 0) -> torch.Tensor:
    """β·scores of unit-norm queries against unit-norm memories, shifted to row max 0."""
    generator = torch.Generator().manual_seed(seed)
    keys = torch.nn.functional.normalize(torch.randn(width, 24, generator=generator), dim=1)
    queries = torch.nn.functional.normalize(torch.randn(rows, 24, generator=generator), dim=1)
    scores = (beta * queries.to(dtype) @ keys.to(dtype).T).to(device)
    return scores - scores.amax(dim=1, keepdim=True)


@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.25])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("width", "beta"),
    [
        (1, 1.0),
        (7, 1.0),
        (1500, 1.0),
        pytest.param(1500, 10.0, marks=pytest.mark.slow),
        pytest.param(1500, 100.0, marks=pytest.mark.slow),
    ],
)
def test_fused_weights_equal_the_eager_iteration(kernels, device, alpha, dtype, width, beta):
    """Weights, sums and counts of `weigh_rows` against `thresholds.solve` on the same scores:
    one and a few memories, rows that are not a multiple of the kernel's block, and supports
    from wide (β = 1) to a single memory (β = 100); the active-set kernel (α = 1.5, 2) and the
    Newton one (other α)."""
    z = _shifted(3, width, beta, dtype, device)
    z[0, -1] = 0.0  # a second top in row 0: ties at the maximum
    weights, total, count, _ = thresholds.solve(z.cpu().clone(), alpha)
    written = z.clone()
    sums, counts = kernels.weigh_rows(written, alpha, 3)
    tolerance = {torch.float32: 2e-6, torch.float64: 1e-14}[dtype]
    torch.testing.assert_close((written / sums).cpu(), weights / total, rtol=0, atol=tolerance)
    assert torch.equal(counts.cpu().long(), count.long())
    assert bool((written >= 0).all())  # weights, written over the scores


@pytest.mark.parametrize("alpha", [1.5, pytest.param(2.0, marks=pytest.mark.slow), 1.25])
@pytest.mark.parametrize(
    "beta", [pytest.param(1.0, id="wide", marks=pytest.mark.slow), pytest.param(30.0, id="narrow")]
)
def test_fused_route_matches_float64_reference(kernels, device, alpha, beta):
    """The model's one-block path on the fused route, within 1e-12 of the bisection reference
    in float64, supports equal."""
    keys = _patterns(3000, 2).double().to(device)
    queries = torch.nn.functional.normalize(keys[:20] + 0.05 * _patterns(20, 3).double(), dim=1)
    weights = entmax_reference(beta * queries.cpu() @ keys.cpu().T, alpha)  # (Q, M)
    result = create_model("entmax", alpha=alpha, beta=beta).retrieve(queries, keys)
    assert entmax_block._FUSED["failed"] is None
    torch.testing.assert_close(result.patterns.cpu(), weights @ keys.cpu(), rtol=0, atol=1e-12)
    assert torch.equal(result.support.cpu(), (weights > 0).sum(dim=1))


def test_fused_route_is_taken(kernels, device, monkeypatch):
    """Where it applies the eager solver is not called; below `FUSED_MIN_ROWS` queries it is."""
    calls = []
    monkeypatch.setattr(entmax_block, "_starts", lambda *a: calls.append(a) or 1 / 0)
    keys = _patterns(500, 2).to(device)
    for alpha in (1.5, 1.25):
        create_model("entmax", alpha=alpha, beta=1.0).retrieve(keys[:4], keys)
    assert not calls
    monkeypatch.setattr(entmax_block, "FUSED_MIN_ROWS", 5)
    with pytest.raises(ZeroDivisionError):
        create_model("entmax", alpha=1.5, beta=1.0).retrieve(keys[:4], keys)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_newton_near_softmax(kernels, device, dtype):
    """α = 1 + 1e-9: the λ form keeps the weights within 1e-6 of softmax's in float32."""
    z = _shifted(5, 3000, 1.0, dtype, device)
    written = z.clone()
    sums, _ = kernels.weigh_rows(written, 1 + 1e-9, 3)
    expected = torch.softmax(z.double(), dim=1)
    assert ((written / sums).double() - expected).abs().max().item() <= 1e-6


def test_fused_route_issues_few_operations_and_syncs(kernels, device, monkeypatch):
    """The point of the kernel: a batch costs a fixed handful of operations and host syncs
    (the overflow check), where the eager route on a GPU issues hundreds, and syncs per step.
    Counted through torch's dispatcher (the interpreter's own argument copies included)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from one_query import count_ops

    keys = _patterns(2000, 2).to(device)
    queries = torch.nn.functional.normalize(keys[:32] + 0.3 * _patterns(32, 3).to(device), dim=1)
    model = create_model("entmax", alpha=1.5, beta=1.0)
    fused = count_ops(lambda: model.retrieve(queries, keys))
    monkeypatch.setattr(blocks, "KERNEL_DEVICES", ())
    monkeypatch.setattr(entmax_block, "_single_chunk", lambda z: True)  # the GPU's eager route
    eager = count_ops(lambda: model.retrieve(queries, keys))
    assert sum(fused.syncs.values()) <= 2 < sum(eager.syncs.values())
    assert sum(fused.ops.values()) <= 80 and sum(eager.ops.values()) >= 300
