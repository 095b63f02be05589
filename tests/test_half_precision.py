"""Half precision: products in bfloat16/float16, normalisation and sums in float32, output in the
input's dtype; every model within a stated tolerance of float64 on the same (rounded) inputs."""

from __future__ import annotations

import pytest
import torch

from nphcli.core.errors import NphError
from nphcli.engine.planning import Plan
from nphcli.engine.precision import accumulation_dtype, matmul, scale_queries
from nphcli.models import create_model
from nphcli.models.registry import model_names

# Relative error ‖out − ref‖ / ‖ref‖ allowed against float64 on the same rounded inputs: the
# output's own rounding is 2⁻⁹ (bf16) and 2⁻¹² (fp16) per entry, the products' a few times that.
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


# topk keeps the single best memory here: with more, the k-th and (k+1)-th scores of these random
# memories lie within half rounding of each other, and the half run may keep the other one (an
# exact but different selection; measured 1.3e-2 bf16 at k = 0.2, β = 1). In docs/retrieving.md.
PARAMS = {"multihead": {"heads": 4}, "topk": {"k": 1}}


def _data(device, dtype):
    generator = torch.Generator().manual_seed(0)
    keys = torch.nn.functional.normalize(
        torch.randn(2000, 64, generator=generator, dtype=torch.float64), dim=1
    )
    queries = keys[:40] + 0.05 * torch.randn(40, 64, generator=generator, dtype=torch.float64)
    return queries.to(device=device, dtype=dtype), keys.to(device=device, dtype=dtype)


@pytest.mark.parametrize("name", model_names())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("beta", [1.0, 10.0])
def test_half_within_tolerance_of_float64(device, name, dtype, beta):
    queries, keys = _data(device, dtype)
    model = create_model(name, beta=beta, **PARAMS.get(name, {}))
    out = model.retrieve(queries, keys).patterns
    reference = model.retrieve(queries.double(), keys.double()).patterns
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    error = (out.double() - reference).norm() / reference.norm()
    assert error <= TOLERANCE[dtype], float(error)


@pytest.mark.parametrize("name", ["dense", "topk", "sparse"])
def test_half_iterated_and_blockwise(device, name):
    queries, keys = _data(device, torch.bfloat16)
    model = create_model(name, beta=4.0, steps=3, **PARAMS.get(name, {}))
    out = model.retrieve(queries, keys, memory_budget=2**18).patterns  # many small blocks
    reference = model.retrieve(queries.double(), keys.double()).patterns
    assert out.dtype == torch.bfloat16 and bool(torch.isfinite(out).all())
    assert (out.double() - reference).norm() / reference.norm() <= TOLERANCE[torch.bfloat16]


def test_products_in_half_and_results_in_float32():
    a = torch.randn(5, 8, dtype=torch.bfloat16)
    b = torch.randn(8, 3, dtype=torch.bfloat16)
    assert matmul(a, b).dtype == torch.float32
    torch.testing.assert_close(matmul(a, b), (a @ b).float())
    weights = torch.rand(5, 8)  # float32 weights meet bfloat16 values in bfloat16
    torch.testing.assert_close(matmul(weights, b), (weights.bfloat16() @ b).float())
    assert matmul(a.float(), b.float()).dtype == torch.float32
    assert accumulation_dtype(torch.float16) == torch.float32
    assert accumulation_dtype(torch.float64) == torch.float64


# -- large β and large norms: half precision overflows only where float32 does ---------------


# Memory blocks of 128 rows: dense and multihead then take the blockwise path they take on a GPU
# or on streamed memories (no fused kernel), entmax its candidate rounds.
BLOCKWISE = Plan(query_rows=40, memory_rows=128)


def _gaussian(device, dtype, *, scale=1.0):
    """600 Gaussian patterns of 32 dimensions (issue 26's case) and 40 noisy queries."""
    generator = torch.Generator().manual_seed(1)
    keys = scale * torch.randn(600, 32, generator=generator, dtype=torch.float64)
    queries = keys[:40] + 0.1 * scale * torch.randn(40, 32, generator=generator)
    return queries.to(device=device, dtype=dtype), keys.to(device=device, dtype=dtype)


@pytest.mark.parametrize("name", model_names())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("plan", [None, BLOCKWISE], ids=["planned", "blockwise"])
def test_large_beta_does_not_overflow_half(device, name, dtype, plan):
    """β = 3000 puts the scores β⟨x, ξ⟩ near 10⁵, beyond float16 (65504) but far inside
    float32: every model runs, as dense does, and matches float64 on the same inputs. Blockwise
    is what dense does on a GPU and on streamed memories (no fused kernel)."""
    queries, keys = _gaussian(device, dtype)
    params = PARAMS.get(name, {})
    model = create_model(name, beta=3000.0, **params)
    out = model.retrieve(queries, keys, plan=plan).patterns
    reference = model.retrieve(queries.double(), keys.double(), plan=plan).patterns
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    rows = _decided(queries, keys, params.get("heads", 1))
    assert rows.float().mean() >= 0.75  # the comparison covers most queries
    error = (out[rows].double() - reference[rows]).norm() / reference[rows].norm()
    assert error <= TOLERANCE[dtype], float(error)


def _decided(queries, keys, heads):
    """Queries (Q,) bool whose best memory in every head leads the runner-up by more than the
    half rounding of the scores. At β = 3000 retrieval is an argmax, and two memories whose
    ⟨x, ξ⟩ differ by less than that rounding may trade places: an exact answer to the rounded
    scores, not an overflow (measured: a gap of 0.005 on scores near 10 swaps in bfloat16)."""
    x = queries.double().unflatten(1, (heads, -1))  # (Q, H, d/H)
    k = keys.double().unflatten(1, (heads, -1))  # (M, H, d/H)
    scores = torch.einsum("qhd,mhd->qhm", x, k)  # (Q, H, M)
    best = scores.topk(2, dim=2).values  # (Q, H, 2)
    rounding = torch.finfo(queries.dtype).eps * scores.abs().amax(dim=2)  # (Q, H): 2 × ½ ulp
    return ((best[..., 0] - best[..., 1]) > rounding).all(dim=1)  # (Q,)


@pytest.mark.parametrize("name", model_names())
def test_float16_products_beyond_its_range_are_redone_in_float32(device, name):
    """Entries near 300 fit float16, but their inner products (~3·10⁶) do not: the products are
    taken again in float32, so every model stays finite and close to float64, as dense does."""
    queries, keys = _gaussian(device, torch.float16, scale=300.0)
    model = create_model(name, beta=1e-5, **PARAMS.get(name, {}))
    out = model.retrieve(queries, keys, plan=BLOCKWISE).patterns
    reference = model.retrieve(queries.double(), keys.double(), plan=BLOCKWISE).patterns
    assert bool(torch.isfinite(out).all())
    error = (out.double() - reference).norm() / reference.norm()
    assert error <= TOLERANCE[torch.float16], float(error)


@pytest.mark.parametrize("name", model_names())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_score_overflow_names_float32(device, name, dtype):
    """Half inputs keep their scores in float32, so scores beyond float32 are reported as a
    float32 overflow, whatever path the model takes (or the model stays finite)."""
    queries, keys = _gaussian(device, dtype)
    model = create_model(name, beta=1e37, **PARAMS.get(name, {}))
    try:
        result = model.retrieve(queries, keys, plan=BLOCKWISE)
    except NphError as error:
        assert "overflow float32" in str(error), str(error)
        return
    assert bool(torch.isfinite(result.patterns).all())  # e.g. the kernel models' log domain


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_beta_scales_the_float32_product_of_half_operands(dtype):
    """scale_queries leaves half queries unscaled and β multiplies the float32 product; for
    float32 and float64 it scales the queries, as before (so their results are unchanged)."""
    a = torch.randn(5, 8).to(dtype)
    b = torch.randn(8, 3).to(dtype)
    scaled, rest = scale_queries(a, 3000.0)
    assert scaled is a and rest == 3000.0
    torch.testing.assert_close(matmul(scaled, b, scale=rest), 3000.0 * (a @ b).float())
    full = a.double()
    scaled, rest = scale_queries(full, 3000.0)
    assert rest == 1.0 and torch.equal(scaled, 3000.0 * full)
    assert torch.equal(matmul(scaled, b.double(), scale=rest), scaled @ b.double())


def test_float16_product_past_its_range_equals_the_float32_product():
    a = torch.full((2, 4), 200.0, dtype=torch.float16)  # each product: 4 · 200² = 160000
    b = torch.full((4, 3), 200.0, dtype=torch.float16)
    assert bool(torch.isinf(a @ b).all())  # what torch's float16 product gives
    torch.testing.assert_close(matmul(a, b), torch.full((2, 3), 160000.0))


@pytest.fixture(scope="module")
def gaussian_memory(tmp_path_factory):
    from typer.testing import CliRunner

    from nphcli.cli import app

    path = tmp_path_factory.mktemp("half") / "gaussian.safetensors"
    args = ["store", "random", "--n", "600", "--dim", "32", "--distribution", "gaussian"]
    result = CliRunner().invoke(app, [*args, "--out", str(path)])
    assert result.exit_code == 0, result.stderr
    return path


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", model_names())
def test_cli_retrieves_at_large_beta_in_half(invoke, gaussian_memory, name, dtype):
    """Issue 26's case: sparse and entmax stopped with 'overflow float32', random and window
    with 'overflow float16', where dense retrieved every pattern."""
    args = ["retrieve", "--memory", gaussian_memory, "--model", name, "--beta", "3000"]
    result = invoke(*args, "--dtype", dtype, "--json")
    assert result.exit_code == 0, result.stderr
