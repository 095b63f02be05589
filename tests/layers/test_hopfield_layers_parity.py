"""nph's layers against hopfield-layers' Hopfield, HopfieldPooling and HopfieldLayer in their
default configurations, reimplemented here from the published formulas (Ramsauer et al. 2021,
"Hopfield Networks is All You Need", and the hopfield-layers documentation), and docs/porting.md's
examples run as written.

The reference, per head h with d_h = hidden width and β = 1/√d_h unless given:
    Q = LN_state(R) W_Q + b_Q,  K = LN_stored(Y) W_K + b_K,  V = LN_proj(V_in) W_V + b_V
    ξ ← softmax(β ξ Kᵀ) K   `update_steps` times, starting at ξ = Q
    out = concat_h softmax(β ξ Kᵀ) V  W_O + b_O
with padded keys and excluded pairs at −∞ before every softmax. Parameters carry hopfield-layers'
names (stacked in_proj for W_Q, W_K, W_V) and are moved onto nph's layers by `_port`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from nphcli.core.errors import NphError
from nphcli.layers import NPH, NPHLayer, NPHPooling, hopfield_layers_options
from nphcli.models import create_model

D, HEADS = 8, 2  # input width, heads: d_h = 4
DT = torch.float64
TOL = {"rtol": 1e-12, "atol": 1e-12}


def _hopfield_params(gen: torch.Generator, *, learned: str | None = None, rows: int = 0) -> dict:
    """Random parameters under hopfield-layers' state-dict names (non-trivial norms and biases,
    so that each of them matters), as leaves that take gradients."""
    width = D  # H · d_h = d in the default configuration

    def randn(*shape, scale=0.3):
        return (scale * torch.randn(*shape, generator=gen, dtype=DT)).requires_grad_(True)

    params = {
        "association_core.in_proj_weight": randn(3 * width, D),
        "association_core.in_proj_bias": randn(3 * width, scale=0.1),
        "association_core.out_proj.weight": randn(D, width),
        "association_core.out_proj.bias": randn(D, scale=0.1),
    }
    for norm in ("norm_stored_pattern", "norm_state_pattern", "norm_pattern_projection"):
        params[f"{norm}.weight"] = (1 + randn(D, scale=0.2)).detach().requires_grad_(True)
        params[f"{norm}.bias"] = randn(D, scale=0.1)
    if learned:
        params[learned] = randn(1, rows, D, scale=1.0)  # pooling_weights or lookup_weights
    return params


def _reference(
    params: dict,
    state: torch.Tensor,
    stored: torch.Tensor,
    values: torch.Tensor,
    *,
    scaling: float | torch.Tensor | None = None,
    update_steps: int = 0,
    padding: torch.Tensor | None = None,
    excluded: torch.Tensor | None = None,
) -> torch.Tensor:
    """hopfield-layers' association from the formulas: state (B, N, d), stored and values
    (B, M, d), padding (B, M), excluded (B|1, H|1, N, M) -> (B, N, d). `update_steps` is
    update_steps_max, with update_steps_eps small enough that no head stops earlier."""

    def norm(x, name):
        return F.layer_norm(x, (D,), params[f"{name}.weight"], params[f"{name}.bias"], 1e-5)

    w_q, w_k, w_v = params["association_core.in_proj_weight"].chunk(3)
    b_q, b_k, b_v = params["association_core.in_proj_bias"].chunk(3)

    def heads(x):  # (B, rows, H·w) -> (B, H, rows, w)
        return x.unflatten(-1, (HEADS, -1)).transpose(1, 2)

    q = heads(norm(state, "norm_state_pattern") @ w_q.T + b_q)
    k = heads(norm(stored, "norm_stored_pattern") @ w_k.T + b_k)
    v = heads(norm(values, "norm_pattern_projection") @ w_v.T + b_v)
    head_dim = q.shape[-1]
    beta = 1 / math.sqrt(head_dim) if scaling is None else scaling
    if isinstance(beta, torch.Tensor):
        beta = beta.view(-1, 1, 1)  # one per head
    blocked = torch.zeros(1, 1, 1, 1, dtype=torch.bool)
    if padding is not None:
        blocked = blocked | padding[:, None, None, :]
    if excluded is not None:
        blocked = blocked | excluded
    xi = q
    for step in range(update_steps + 1):
        association = torch.softmax(
            (beta * xi @ k.transpose(-1, -2)).masked_fill(blocked, -math.inf), -1
        )
        if step < update_steps:
            xi = association @ k
    out = (association @ v).transpose(1, 2).flatten(-2)  # (B, N, H·d_v)
    return (
        out @ params["association_core.out_proj.weight"].T
        + params["association_core.out_proj.bias"]
    )


# nph's parameter name -> (hopfield-layers' name, which third of a stacked in_proj tensor).
_NAMES = {
    "query.weight": ("association_core.in_proj_weight", 0),
    "key.weight": ("association_core.in_proj_weight", 1),
    "value.weight": ("association_core.in_proj_weight", 2),
    "query.bias": ("association_core.in_proj_bias", 0),
    "key.bias": ("association_core.in_proj_bias", 1),
    "value.bias": ("association_core.in_proj_bias", 2),
    "out.weight": ("association_core.out_proj.weight", None),
    "out.bias": ("association_core.out_proj.bias", None),
    "norm_stored.weight": ("norm_stored_pattern.weight", None),
    "norm_stored.bias": ("norm_stored_pattern.bias", None),
    "norm_state.weight": ("norm_state_pattern.weight", None),
    "norm_state.bias": ("norm_state_pattern.bias", None),
    "norm_values.weight": ("norm_pattern_projection.weight", None),
    "norm_values.bias": ("norm_pattern_projection.bias", None),
    "prototypes": ("pooling_weights", None),
    "memories": ("lookup_weights", None),
}


def _theirs(tensors: dict, name: str, shape: torch.Size) -> torch.Tensor:
    """hopfield-layers' tensor (a parameter or its gradient) for nph's parameter `name`."""
    source, third = _NAMES[name]
    tensor = tensors[source] if third is None else tensors[source].chunk(3)[third]
    return tensor.reshape(shape)


def _port(params: dict, layer: torch.nn.Module) -> None:
    """Copy hopfield-layers' parameters onto an nph layer (docs/porting.md's table)."""
    with torch.no_grad():
        for name, param in layer.named_parameters():
            param.copy_(_theirs(params, name, param.shape))


def _check(layer, params, out, ref, inputs: list[torch.Tensor]) -> None:
    """Equal outputs, and equal gradients for the inputs and for every parameter."""
    torch.testing.assert_close(out, ref, **TOL)
    named = dict(layer.named_parameters())
    weights = torch.linspace(-1, 1, out.numel(), dtype=DT).view(out.shape)
    ours = torch.autograd.grad((out * weights).sum(), [*inputs, *named.values()])
    theirs = torch.autograd.grad((ref * weights).sum(), [*inputs, *params.values()])
    for a, b in zip(ours[: len(inputs)], theirs[: len(inputs)], strict=True):
        torch.testing.assert_close(a, b, **TOL)
    their_grads = dict(zip(params, theirs[len(inputs) :], strict=True))
    for (name, param), grad in zip(named.items(), ours[len(inputs) :], strict=True):
        torch.testing.assert_close(grad, _theirs(their_grads, name, param.shape), **TOL)


def _inputs(gen: torch.Generator, batch: int, rows: int) -> torch.Tensor:
    return torch.randn(batch, rows, D, generator=gen, dtype=DT).requires_grad_(True)


def _masks(kind: str, gen: torch.Generator, batch: int, queries: int, keys: int):
    """(padding (B, M), nph's association mask, the reference's (B|1, H|1, N, M) form)."""
    if kind == "none":
        return None, None, None
    padding = torch.zeros(batch, keys, dtype=torch.bool)
    padding[1, keys - 2 :] = True
    if kind == "padding":
        return padding, None, None
    shape = {"pairs": (queries, keys), "batch": (batch, queries, keys)}.get(
        kind, (batch, HEADS, queries, keys)
    )
    mask = torch.rand(*shape, generator=gen) < 0.3
    mask[..., 0] = False  # every query keeps a key
    full = {2: mask[None, None], 3: mask[:, None], 4: mask}[mask.ndim]  # (B|1, H|1, N, M)
    return padding, mask, full


MASKS = ["none", "padding", "pairs", "batch", "heads"]


@pytest.mark.parametrize("masks", MASKS)
@pytest.mark.parametrize("update_steps", [0, 2])
def test_hopfield_default_equals_reference(masks, update_steps):
    """Hopfield(input_size=8, num_heads=2, scaling=0.5, update_steps_max=...) on the tuple
    (stored, state, projection) = (Y, R, V), with padding and association masks."""
    gen = torch.Generator().manual_seed(1)
    params = _hopfield_params(gen)
    rule = create_model("dense", beta=0.5, steps=update_steps + 1)
    layer = NPH(D, heads=HEADS, rule=rule, **hopfield_layers_options()).double()
    _port(params, layer)
    r, y, v = _inputs(gen, 3, 4), _inputs(gen, 3, 6), _inputs(gen, 3, 6)
    padding, mask, full = _masks(masks, gen, 3, 4, 6)
    out = layer(r, y, padding, values=v, association_mask=mask)
    ref = _reference(
        params, r, y, v, scaling=0.5, update_steps=update_steps, padding=padding, excluded=full
    )
    _check(layer, params, out, ref, [r, y, v])


def test_hopfield_single_input_and_default_scaling():
    """Hopfield(8, num_heads=2)(X): X is stored, state and projection; β = 1/√d_h."""
    gen = torch.Generator().manual_seed(2)
    params = _hopfield_params(gen)
    layer = NPH(D, heads=HEADS, **hopfield_layers_options()).double()
    _port(params, layer)
    x = _inputs(gen, 2, 5)
    _check(layer, params, layer(x), _reference(params, x, x, x), [x])


def test_hopfield_per_head_scaling_learns():
    """scaling as a tensor of one β per head: head_beta, learnable with learn_beta."""
    gen = torch.Generator().manual_seed(3)
    params = _hopfield_params(gen)
    scaling = torch.tensor([0.3, 1.7], dtype=DT)
    layer = NPH(D, heads=HEADS, head_beta=scaling, **hopfield_layers_options()).double()
    _port(params, layer)
    r, y = _inputs(gen, 2, 3), _inputs(gen, 2, 5)
    _check(layer, params, layer(r, y), _reference(params, r, y, y, scaling=scaling), [r, y])
    learned = NPH(D, heads=HEADS, head_beta=scaling, learn_beta=True).double()
    learned(r, y).sum().backward()
    assert learned.log_beta.shape == (HEADS,) and bool((learned.log_beta.grad != 0).all())


@pytest.mark.parametrize("masks", MASKS)
@pytest.mark.parametrize("update_steps", [0, 1])
def test_hopfield_pooling_default_equals_reference(masks, update_steps):
    """HopfieldPooling(8, num_heads=2, quantity=3): learned state patterns (S, d) through the
    state norm and W_Q; nph returns (B, S, d) where hopfield-layers flattens to (B, S·d)."""
    gen = torch.Generator().manual_seed(4)
    params = _hopfield_params(gen, learned="pooling_weights", rows=3)
    rule = create_model("dense", beta=0.5, steps=update_steps + 1)
    layer = NPHPooling(D, prototypes=3, heads=HEADS, rule=rule, **hopfield_layers_options())
    layer = layer.double()
    _port(params, layer)
    y = _inputs(gen, 3, 6)
    padding, mask, full = _masks(masks, gen, 3, 3, 6)
    out = layer(y, padding, association_mask=mask)
    state = params["pooling_weights"].expand(3, -1, -1)
    ref = _reference(
        params, state, y, y, scaling=0.5, update_steps=update_steps, padding=padding, excluded=full
    )
    assert layer.folds() == (update_steps == 0)
    _check(layer, params, out, ref, [y])


@pytest.mark.parametrize("masks", ["none", "pairs", "heads"])
def test_hopfield_layer_default_equals_reference(masks):
    """HopfieldLayer(8, num_heads=2, quantity=5): learned stored patterns (M, d), keys through
    the stored norm and W_K, values through the projection norm and W_V."""
    gen = torch.Generator().manual_seed(5)
    params = _hopfield_params(gen, learned="lookup_weights", rows=5)
    layer = NPHLayer(D, memories=5, heads=HEADS, **hopfield_layers_options()).double()
    _port(params, layer)
    r = _inputs(gen, 3, 4)
    _, mask, full = _masks(masks, gen, 3, 4, 5)
    stored = params["lookup_weights"].expand(3, -1, -1)
    ref = _reference(params, r, stored, stored, excluded=full)
    _check(layer, params, layer(r, association_mask=mask), ref, [r])


def test_update_steps_are_retrieval_steps():
    """With identity projections and values through W_K, a layer with a rule of s steps is
    `rule.retrieve` with s steps (tol 0), for a sparse rule too."""
    gen = torch.Generator().manual_seed(6)
    queries = torch.randn(4, D, generator=gen, dtype=DT)
    stored = torch.randn(7, D, generator=gen, dtype=DT)
    for name in ("dense", "sparse"):
        rule = create_model(name, beta=0.8, steps=3)
        layer = NPH(D, rule=rule).double().identity_()
        expected = rule.retrieve(queries, stored).patterns
        torch.testing.assert_close(layer(queries[None], stored[None])[0], expected, **TOL)


def test_update_tol_freezes_each_query():
    """With tol > 0 a query whose state moved by ≤ tol keeps it: a huge tol gives one update."""
    gen = torch.Generator().manual_seed(7)
    r, y = (
        torch.randn(2, 3, D, generator=gen, dtype=DT),
        torch.randn(2, 5, D, generator=gen, dtype=DT),
    )
    torch.manual_seed(0)
    frozen = NPH(D, rule=create_model("dense", steps=4, tol=1e6)).double()
    torch.manual_seed(0)
    two = NPH(D, rule=create_model("dense", steps=2)).double()
    torch.testing.assert_close(frozen(r, y), two(r, y), **TOL)


def test_association_mask_needs_weights_and_an_allowed_key():
    layer = NPH(D, rule=create_model("linear"))
    r, y = torch.randn(2, 3, D), torch.randn(2, 5, D)
    with pytest.raises(NphError, match="no association_mask"):
        layer(r, y, association_mask=torch.zeros(3, 5, dtype=torch.bool))
    dense = NPH(D)
    with pytest.raises(NphError, match="at least one allowed key"):
        dense(r, y, association_mask=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(NphError, match="association_mask must be"):
        dense(r, y, association_mask=torch.zeros(5, 3, dtype=torch.bool))


def _examples() -> list[str]:
    text = (Path(__file__).resolve().parents[2] / "docs" / "porting.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_porting_page_has_an_example_per_class():
    names = " ".join(_examples())
    assert len(_examples()) >= 3
    for cls in ("NPH(", "NPHPooling(", "NPHLayer("):
        assert cls in names


@pytest.mark.parametrize("index", range(3))
def test_porting_page_examples_run(index, tmp_path, monkeypatch):
    """docs/porting.md's examples run as written; each asserts its equality with the formula."""
    monkeypatch.chdir(tmp_path)
    code = _examples()[index]
    exec(compile(code, f"docs/porting.md example {index + 1}", "exec"), {})
