"""Half precision: products in bfloat16/float16, normalisation and sums in float32, output in the
input's dtype; every model within a stated tolerance of float64 on the same (rounded) inputs."""

from __future__ import annotations

import pytest
import torch
from conftest import beta_flag, family_params, real_valued_models

from nphcli.core.errors import NphError
from nphcli.engine.planning import Plan
from nphcli.engine.precision import accumulation_dtype, matmul, scale_queries
from nphcli.models import create_model

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


@pytest.mark.parametrize("name", real_valued_models())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("beta", [1.0, 10.0])
def test_half_within_tolerance_of_float64(device, name, dtype, beta):
    queries, keys = _data(device, dtype)
    model = create_model(name, **family_params(name, beta=beta), **PARAMS.get(name, {}))
    out = model.retrieve(queries, keys).patterns
    reference = model.retrieve(queries.double(), keys.double()).patterns
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    error = (out.double() - reference).norm() / reference.norm()
    assert error <= TOLERANCE[dtype], float(error)


@pytest.mark.parametrize("name", ["dense", "topk", "sparse"])
def test_half_iterated_and_blockwise(device, name):
    queries, keys = _data(device, torch.bfloat16)
    model = create_model(name, **family_params(name, beta=4.0, steps=3), **PARAMS.get(name, {}))
    out = model.retrieve(queries, keys, memory_budget=2**18).patterns  # many small blocks
    reference = model.retrieve(queries.double(), keys.double()).patterns
    assert out.dtype == torch.bfloat16 and bool(torch.isfinite(out).all())
    assert (out.double() - reference).norm() / reference.norm() <= TOLERANCE[torch.bfloat16]


def test_half_products_are_float32_sums_of_the_half_operands():
    """On the CPU (no float32-output kernel) the half operands are widened exactly and the
    product is float32's: never rounded to the half dtype."""
    a = torch.randn(5, 8, dtype=torch.bfloat16)
    b = torch.randn(8, 3, dtype=torch.bfloat16)
    assert matmul(a, b).dtype == torch.float32
    assert torch.equal(matmul(a, b), a.float() @ b.float())
    weights = torch.rand(5, 8)  # float32 weights meet bfloat16 values in float32
    assert torch.equal(matmul(weights, b), weights @ b.float())
    assert torch.equal(matmul(a.float(), b.float()), a.float() @ b.float())  # float32: as is
    assert accumulation_dtype(torch.float16) == torch.float32
    assert accumulation_dtype(torch.float64) == torch.float64


def test_half_product_is_not_rounded_to_half():
    """A product whose exact value lies between two bfloat16 numbers keeps it: 1 + 2⁻¹⁰ is
    1.0 in bfloat16 but exact in float32."""
    a = torch.tensor([[1.0, 2.0**-5]], dtype=torch.bfloat16)
    b = torch.tensor([[1.0], [2.0**-5]], dtype=torch.bfloat16)
    assert float((a @ b)[0, 0]) == 1.0  # torch's own bfloat16 product rounds it away
    assert float(matmul(a, b)[0, 0]) == 1.0 + 2.0**-10


# -- large β and large norms: half precision overflows only where float32 does ---------------


# Memory blocks of 128 rows: dense and multihead then take the blockwise path they take on a GPU
# or on streamed memories (no fused kernel), entmax its candidate rounds.
BLOCKWISE = Plan(query_rows=40, memory_rows=128)


def _gaussian(device, dtype, *, scale=1.0):
    """600 Gaussian patterns of 32 dimensions and 40 noisy queries."""
    generator = torch.Generator().manual_seed(1)
    keys = scale * torch.randn(600, 32, generator=generator, dtype=torch.float64)
    queries = keys[:40] + 0.1 * scale * torch.randn(40, 32, generator=generator)
    return queries.to(device=device, dtype=dtype), keys.to(device=device, dtype=dtype)


@pytest.mark.parametrize("name", real_valued_models())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("plan", [None, BLOCKWISE], ids=["planned", "blockwise"])
def test_large_beta_does_not_overflow_half(device, name, dtype, plan):
    """β = 3000 puts the scores β⟨x, ξ⟩ near 10⁵, beyond float16 (65504) but far inside
    float32: every model runs, as dense does, and matches float64 on the same inputs. Blockwise
    is what dense does on a GPU and on streamed memories (no fused kernel)."""
    queries, keys = _gaussian(device, dtype)
    params = PARAMS.get(name, {})
    model = create_model(name, **family_params(name, beta=3000.0), **params)
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


@pytest.mark.parametrize("name", real_valued_models())
def test_float16_products_beyond_its_range_are_redone_in_float32(device, name):
    """Entries near 300 fit float16, but their inner products (~3·10⁶) do not: the products are
    taken again in float32, so every model stays finite and close to float64, as dense does."""
    queries, keys = _gaussian(device, torch.float16, scale=300.0)
    model = create_model(name, **family_params(name, beta=1e-5), **PARAMS.get(name, {}))
    out = model.retrieve(queries, keys, plan=BLOCKWISE).patterns
    reference = model.retrieve(queries.double(), keys.double(), plan=BLOCKWISE).patterns
    assert bool(torch.isfinite(out).all())
    error = (out.double() - reference).norm() / reference.norm()
    assert error <= TOLERANCE[torch.float16], float(error)


@pytest.mark.parametrize("name", real_valued_models())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_score_overflow_names_float32(device, name, dtype):
    """Half inputs keep their scores in float32, so scores beyond float32 are reported as a
    float32 overflow, whatever path the model takes (or the model stays finite)."""
    queries, keys = _gaussian(device, dtype)
    model = create_model(name, **family_params(name, beta=1e37), **PARAMS.get(name, {}))
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
    torch.testing.assert_close(matmul(scaled, b, scale=rest), 3000.0 * (a.float() @ b.float()))
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
@pytest.mark.parametrize("name", real_valued_models())
def test_cli_retrieves_at_large_beta_in_half(invoke, gaussian_memory, name, dtype):
    """Sparse and entmax stopped with 'overflow float32', random and window
    with 'overflow float16', where dense retrieved every pattern."""
    args = ["retrieve", "--memory", gaussian_memory, "--model", name, *beta_flag(name, 3000)]
    result = invoke(*args, "--dtype", dtype, "--json")
    assert result.exit_code == 0, result.stderr


# -- two nearly tied patterns at β = 3000: float32 accumulation on every route ---------------

TIE_HEADS = 4  # multihead's heads; every head holds one swapped pair of coordinates
TIE_NUDGE = 2.0**-12  # ⟨x, ξ_a⟩ − ⟨x, ξ_b⟩ per head, exact in both half dtypes
TIE_PARAMS = {
    "multihead": {"heads": TIE_HEADS},
    "topk": {"k": 1},
    "window": {"window": 64},  # every memory inside the window: softmax over all
    "random": {"k": 32},  # every memory (M = 32) kept
    "entmax": {"alpha": 1.5},
}


def _tied(dtype, *, queries=6, memories=32, dim=32, value_dim=16):
    """Queries x_i each nearly tied between memories a = 2i + 1 and b = 2i, exact in `dtype`:
    ξ_b is ξ_a with coordinates (u, j) swapped in every head, where ξ_a holds (1, 0) and x_i
    holds (c + ν, c), so ⟨x, ξ_a⟩ − ⟨x, ξ_b⟩ = ν per head, H·ν = 2⁻¹⁰ in all, β·H·ν ≈ 2.9: both
    memories weigh in softmax (0.95 / 0.05), and the scores near 8 per head and 30 in all are
    rounded by 0.03 to 0.125 in half, 10 to 100 times the gap. The other memories are short and
    far behind. Values differ from keys (d_v = 16)."""
    generator = torch.Generator().manual_seed(3)
    keys = 0.3 * torch.randn(memories, dim, generator=generator, dtype=torch.float64)
    values = torch.randn(memories, value_dim, generator=generator, dtype=torch.float64)
    keys, values = keys.to(dtype).double(), values.to(dtype).double()  # exact in `dtype`
    x = torch.zeros(queries, dim, dtype=torch.float64)
    width = dim // TIE_HEADS
    for i in range(queries):
        a = torch.randn(dim, generator=generator, dtype=torch.float64).to(dtype).double()
        x[i] = a
        for head in range(TIE_HEADS):
            u, j = head * width, head * width + 1
            a[u], a[j] = 1.0, 0.0
            x[i, u], x[i, j] = 2.0**-6 + TIE_NUDGE, 2.0**-6
        b = a.clone()
        for head in range(TIE_HEADS):
            u, j = head * width, head * width + 1
            b[u], b[j] = a[j], a[u]
        keys[2 * i], keys[2 * i + 1] = b, a  # a rounded tie goes to the lower index: b
    cast = [t.to(dtype) for t in (x, keys, values)]
    assert all(torch.equal(t.double(), s) for t, s in zip(cast, (x, keys, values), strict=True))
    return cast


def _softmax_reference(scores, values):
    return torch.softmax(scores, dim=-1) @ values


def _entmax_reference(z, alpha):
    """α-entmax of each row of z (float64): p_i = [(α−1)z_i − τ]_+^{1/(α−1)}, Σ p = 1, τ by
    bisection (α = 2: sparsemax)."""
    x = (alpha - 1) * z
    lo, hi = x.amax(dim=-1, keepdim=True) - 1, x.amax(dim=-1, keepdim=True)
    for _ in range(200):
        mid = (lo + hi) / 2
        over = (x - mid).clamp(min=0).pow(1 / (alpha - 1)).sum(-1, keepdim=True) >= 1
        lo, hi = torch.where(over, mid, lo), torch.where(over, hi, mid)
    p = (x - lo).clamp(min=0).pow(1 / (alpha - 1))
    return p / p.sum(-1, keepdim=True)


def _formula(name, params, beta, x, keys, values):
    """T(x) of each model from its formula, in float64 on the (rounded) inputs."""
    x, keys, values = x.double(), keys.double(), values.double()
    scores = beta * x @ keys.T  # (Q, M)
    if name in ("dense", "window", "random"):  # (window and random keep every memory here)
        return _softmax_reference(scores, values)
    if name == "multihead":
        h = params["heads"]
        xs, ks, vs = (t.unflatten(-1, (h, -1)).transpose(0, 1) for t in (x, keys, values))
        out = _softmax_reference(beta * xs @ ks.transpose(1, 2), vs)  # (H, Q, d_v/H)
        return out.transpose(0, 1).flatten(1)
    if name == "topk":  # k = 1: the best memory's value
        return values[scores.argmax(dim=1)]
    if name in ("sparse", "entmax"):
        return _entmax_reference(scores, params.get("alpha", 2.0)) @ values
    if name == "linear":
        phi = lambda u: torch.nn.functional.elu(u) + 1  # noqa: E731
        kernel = phi(beta**0.5 * x) @ phi(beta**0.5 * keys).T  # (Q, M)
        return kernel @ values / kernel.sum(dim=1, keepdim=True)
    return None  # random-feature: its own float64 run (its projection W is the model's)


@pytest.mark.parametrize("name", real_valued_models())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("plan", [None, BLOCKWISE], ids=["planned", "blockwise"])
def test_nearly_tied_patterns_at_large_beta_in_half(device, name, dtype, plan):
    """At β = 3000 sparse, entmax and topk returned the other of two nearly tied
    patterns in half precision (0.5 to 0.9 relative) and multihead with values was off by 0.13,
    since their score products were rounded to the half dtype on the CPU. Every product now
    keeps float32, so each model is within the half tolerance of its formula in float64."""
    params = TIE_PARAMS.get(name, {})
    x, keys, values = (t.to(device) for t in _tied(dtype))
    model = create_model(name, **family_params(name, beta=3000.0), **params)
    out = model.retrieve(x, keys, values, plan=plan).patterns
    reference = _formula(name, params, 3000.0, x.cpu(), keys.cpu(), values.cpu())
    if reference is None:
        reference = model.retrieve(x.double(), keys.double(), values.double()).patterns
    assert out.dtype == dtype
    error = (out.double().cpu() - reference.cpu()).norm() / reference.norm()
    assert error <= TOLERANCE[dtype], float(error)
