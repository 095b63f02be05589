"""The layers (`nphcli.layers`) against memory retrieval, the formula, padding and gradcheck."""

from __future__ import annotations

import pytest
import torch

from nphcli.core.errors import NphError
from nphcli.engine.functional import sparsemax
from nphcli.layers import (
    NPH,
    Norms,
    NPHLayer,
    NPHPooling,
    hopfield_layers_options,
    load_layer,
    save_layer,
)
from nphcli.models import create_model, layer_model_names

# Parameters per model that make every rule non-trivial on a handful of keys.
PARAMS = {
    "entmax": {"alpha": 1.5},
    "topk": {"k": 0.4},
    "random": {"k": 3, "seed": 7},
    "window": {"window": 1},
    "random-feature": {"features": 32, "seed": 3},
    "multihead": {"heads": 2},
}


def _params(name: str) -> dict:
    return dict(PARAMS.get(name, {}))


def _rule(name: str, **given):
    """The model `name` with this file's parameters (β as given, else the model's default)."""
    return create_model(name, **_params(name), **given)


@pytest.mark.parametrize("name", layer_model_names())
def test_identity_nph_is_memory_retrieval(name, device):
    gen = torch.Generator().manual_seed(1)
    queries = torch.randn(5, 8, generator=gen, dtype=torch.float64).to(device)  # (N, d)
    stored = torch.randn(9, 8, generator=gen, dtype=torch.float64).to(device)  # (M, d)
    layer = NPH(8, rule=_rule(name, beta=0.7)).double().to(device).identity_()
    out = layer(queries[None], stored[None])[0]  # (N, d)
    expected = create_model(name, beta=0.7, **_params(name)).retrieve(queries, stored).patterns
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["dense", "sparse", "topk", "linear"])
def test_identity_pooling_and_stored_layer_are_memory_retrieval(name):
    gen = torch.Generator().manual_seed(2)
    queries = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    stored = torch.randn(7, 6, generator=gen, dtype=torch.float64)
    expected = create_model(name, beta=0.4, **_params(name)).retrieve(queries, stored).patterns
    pooling = NPHPooling(6, prototypes=3, rule=_rule(name, beta=0.4)).double()
    with torch.no_grad():
        pooling.prototypes.copy_(queries)
    torch.testing.assert_close(pooling.identity_()(stored[None])[0], expected)
    layer = NPHLayer(6, memories=7, rule=_rule(name, beta=0.4)).double()
    with torch.no_grad():
        layer.memories.copy_(stored)
    torch.testing.assert_close(layer.identity_()(queries[None])[0], expected)


@pytest.mark.parametrize("name", ["sparse", "topk", "linear", "entmax"])
def test_heads_are_retrievals_on_slices(name):
    """With identity weights, H heads are H retrievals on contiguous slices, concatenated."""
    gen = torch.Generator().manual_seed(3)
    queries = torch.randn(4, 12, generator=gen, dtype=torch.float64)
    stored = torch.randn(10, 12, generator=gen, dtype=torch.float64)
    layer = NPH(12, rule=_rule(name, beta=0.9), heads=3).double().identity_()
    model = create_model(name, beta=0.9, **_params(name))
    expected = torch.cat(
        [
            model.retrieve(q, k).patterns
            for q, k in zip(queries.split(4, 1), stored.split(4, 1), strict=True)
        ],
        1,
    )
    torch.testing.assert_close(layer(queries[None], stored[None])[0], expected)


def test_dense_layer_matches_the_formula_with_learned_weights():
    """W_O · concat_h softmax(β R W_Q,h (Y W_K)_hᵀ) (Y W_K W_V)_h, written out per head."""
    torch.manual_seed(4)
    rule = create_model("dense", beta=0.6)
    layer = NPH(8, rule=rule, heads=2, head_dim=3, value_dim=5, out_dim=7).double()
    r = torch.randn(2, 4, 8, dtype=torch.float64)  # (B, N, d)
    y = torch.randn(2, 6, 8, dtype=torch.float64)  # (B, M, d)
    q = r @ layer.query.weight.T  # (B, N, 6)
    k = y @ layer.key.weight.T  # (B, M, 6)
    v = k @ layer.value.weight.T  # (B, M, 10)
    heads = []
    for h in range(2):
        scores = 0.6 * q[..., 3 * h : 3 * h + 3] @ k[..., 3 * h : 3 * h + 3].transpose(1, 2)
        heads.append(torch.softmax(scores, -1) @ v[..., 5 * h : 5 * h + 5])
    expected = torch.cat(heads, -1) @ layer.out.weight.T  # (B, N, 7)
    torch.testing.assert_close(layer(r, y), expected)


@pytest.mark.parametrize("name", layer_model_names())
def test_padded_keys_get_no_weight_and_no_gradient(name):
    """A padded set gives what its unpadded rows alone give; padded rows get gradient exactly 0
    (their contents, however large, change nothing)."""
    torch.manual_seed(5)
    layer = NPH(8, rule=_rule(name)).double()
    queries = torch.randn(2, 3, 8, dtype=torch.float64)
    stored = torch.randn(2, 7, 8, dtype=torch.float64)
    stored[1, 5:] = 50.0  # padding that would dominate every score if it were seen
    stored.requires_grad_(True)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    out = layer(queries, stored, key_padding_mask=pad)
    alone = layer(queries[1:], stored[1:, :5].detach())
    torch.testing.assert_close(out[1:], alone)
    torch.testing.assert_close(out[:1], layer(queries[:1], stored[:1].detach()))
    out.square().sum().backward()
    assert torch.equal(stored.grad[1, 5:], torch.zeros(2, 8, dtype=torch.float64))
    assert stored.grad[1, :5].abs().sum() > 0


@pytest.mark.parametrize("name", layer_model_names())
def test_padded_set_is_the_model_on_its_keys_alone(name):
    """With identity weights a set of 130 keys padded to 140 gives `retrieve` on its 130 keys, for
    every model: parameters that depend on M use 130, and the random subset is the one the model
    draws for M = 130 (Floyd's algorithm here: k = 2, 64·k ≤ 130), not a subset of 140 keys."""
    gen = torch.Generator().manual_seed(13)
    queries = torch.randn(5, 8, generator=gen, dtype=torch.float64)  # (N, d)
    stored = torch.randn(2, 140, 8, generator=gen, dtype=torch.float64)  # (B, M, d)
    pad = torch.zeros(2, 140, dtype=torch.bool)
    pad[1, 130:] = True
    params = {**_params(name), **({"k": 2} if name == "random" else {})}
    rule = create_model(name, beta=0.7, **params)
    layer = NPH(8, rule=rule).double().identity_()
    out = layer(queries.expand(2, -1, -1), stored, key_padding_mask=pad)  # (B, N, d)
    for b, size in enumerate((140, 130)):
        expected = rule.retrieve(queries, stored[b, :size]).patterns
        torch.testing.assert_close(out[b], expected, rtol=1e-12, atol=1e-12)


def test_multihead_rule_cuts_every_layer_head_again():
    """`multihead` with h heads inside a layer of H heads is dense with H·h heads of d_h / h."""
    torch.manual_seed(14)
    split = NPH(12, rule=create_model("multihead", heads=2, beta=0.5), heads=3).double()
    torch.manual_seed(14)
    dense = NPH(12, rule=create_model("dense", beta=0.5), heads=6).double()
    r, y = torch.randn(2, 4, 12, dtype=torch.float64), torch.randn(2, 5, 12, dtype=torch.float64)
    torch.testing.assert_close(split(r, y), dense(r, y), rtol=1e-12, atol=1e-12)
    with pytest.raises(NphError, match="does not divide"):
        NPH(12, rule=create_model("multihead", heads=5), heads=3).double()(r, y)


@pytest.mark.parametrize("name", layer_model_names())
def test_gradcheck_every_model_in_layer_form(name):
    torch.manual_seed(6)
    layer = NPH(4, rule=_rule(name, beta=0.8), learn_beta=True).double()
    queries = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    stored = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    pad = torch.tensor([[False] * 5, [False] * 4 + [True]])
    assert torch.autograd.gradcheck(
        lambda r, y: layer(r, y, key_padding_mask=pad), (queries, stored), atol=1e-6
    )
    layer(queries, stored).sum().backward()
    assert all(p.grad is not None for p in layer.parameters())


# The rules that form weights from each head's scores (not the feature rules, not multihead,
# which splits every head again).
@pytest.mark.parametrize(
    "name", [n for n in layer_model_names() if n not in ("linear", "random-feature", "multihead")]
)
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"bias": True, "head_beta": (0.4, 1.1), "learn_beta": True},
        {
            "bias": True,
            "separate_values": True,
            "learned": "input",
            "norms": Norms(stored="affine", state="plain", values="affine"),
        },
        {"norms": Norms(values="plain"), "association_mask": True},
    ],
    ids=["plain", "biases", "hopfield", "value-norm-mask"],
)
def test_pooling_with_folded_keys_equals_projecting_every_row(name, options):
    """NPHPooling's folded path (W_K moved onto the prototypes) gives the same outputs and the same
    gradients as projecting every stored row, with learned weights, heads and padding, and with
    biases, per-head β, norms, separate values and an association mask."""
    torch.manual_seed(12)
    options = dict(options)
    pairs = options.pop("association_mask", False)
    pooling = NPHPooling(
        8,
        prototypes=2,
        rule=_rule(name, beta=0.6),
        heads=2,
        head_dim=5,
        value_dim=3,
        out_dim=7,
        **options,
    ).double()
    assert pooling.folds()
    with torch.no_grad():
        for param in pooling.parameters():  # biases and norms away from their zeros and ones
            param.add_(0.1 * torch.randn_like(param))
    stored = torch.randn(3, 9, 8, dtype=torch.float64, requires_grad=True)
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[2, 6:] = True
    mask = None
    if pairs:
        mask = torch.rand(3, 2, 9, generator=torch.Generator().manual_seed(1)) < 0.3
        mask[..., :3] = False  # keys enough for every rule's support (window: positions 0, 1)

    def run(fold: bool):
        pooling.folds = lambda: fold  # instance attribute: this test's switch between paths
        out = pooling(stored, key_padding_mask=pad, association_mask=mask)
        grads = torch.autograd.grad(out.square().sum(), [stored, *pooling.parameters()])
        return out, grads

    folded, folded_grads = run(True)
    projected, projected_grads = run(False)
    torch.testing.assert_close(folded, projected, rtol=1e-12, atol=1e-12)
    for a, b in zip(folded_grads, projected_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_pooling_folds_only_where_it_is_exact_and_cheaper():
    assert NPHPooling(64, prototypes=2, rule=create_model("topk", k=0.5), heads=4).folds()
    linear = create_model("linear")
    assert not NPHPooling(64, prototypes=2, rule=linear, heads=4).folds()  # features of keys
    assert NPHPooling(64, prototypes=2, heads=4, bias=True).folds()  # biases fold exactly
    assert not NPHPooling(64, prototypes=32, heads=4).folds()  # S ≥ d_h
    steps = create_model("dense", steps=2)  # update steps move each set's state
    assert not NPHPooling(64, prototypes=2, rule=steps, heads=4).folds()
    split = create_model("multihead", heads=2)  # heads within each head: not one head's scores
    assert not NPHPooling(64, prototypes=2, rule=split, heads=4).folds()


def test_sparsemax_backward_is_the_closed_form_jacobian():
    """J = diag(1_S) − 1_S 1_Sᵀ / |S| on the support S (written out), not autograd's sort path."""
    scores = torch.tensor([[0.3, 1.2, -0.5, 1.0, 0.9]], dtype=torch.float64, requires_grad=True)
    p = sparsemax(scores)
    support = (p[0] > 0).to(torch.float64)
    expected = torch.diag(support) - torch.outer(support, support) / support.sum()
    jacobian = torch.autograd.functional.jacobian(lambda s: sparsemax(s)[0], scores)[:, 0]
    torch.testing.assert_close(jacobian, expected)
    assert 1 < support.sum() < 5


def test_dropout_acts_in_training_only():
    torch.manual_seed(7)
    layer = NPH(8, rule=create_model("topk", k=0.5), dropout=0.5)
    r, y = torch.randn(2, 4, 8), torch.randn(2, 6, 8)
    layer.eval()
    torch.testing.assert_close(layer(r, y), layer(r, y))
    layer.train()
    assert not torch.equal(layer(r, y), layer(r, y))


def test_learnable_beta_stays_positive_and_learns():
    layer = NPHPooling(8, rule=create_model("sparse", beta=0.1), learn_beta=True)
    assert layer.beta.item() == pytest.approx(0.1)
    layer(torch.randn(3, 5, 8)).sum().backward()
    assert layer.log_beta.grad is not None and layer.log_beta.grad != 0


def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(8)
    rule = create_model("topk", k=0.5, beta=0.3)
    layer = NPHPooling(8, prototypes=2, rule=rule, heads=2, learn_beta=True)
    with torch.no_grad():
        layer.log_beta.add_(0.25)  # a "trained" β must survive too
    path = tmp_path / "pool.safetensors"
    save_layer(layer, path)
    loaded = load_layer(path)
    assert type(loaded) is NPHPooling and loaded.config == layer.config
    y = torch.randn(3, 6, 8)
    torch.testing.assert_close(loaded(y), layer(y))
    with pytest.raises(NphError, match="exists"):
        save_layer(layer, path)
    (tmp_path / "junk.safetensors").write_bytes(b"not a file")
    with pytest.raises(NphError, match="cannot read"):
        load_layer(tmp_path / "junk.safetensors")


def test_save_and_load_round_trip_with_the_porting_options(tmp_path):
    torch.manual_seed(16)
    layer = NPHLayer(
        8, memories=3, heads=2, head_beta=(0.5, 2.0), learn_beta=True,
        rule=create_model("sparse", steps=2), **hopfield_layers_options(),
    )  # fmt: skip
    with torch.no_grad():
        layer.log_beta.add_(torch.tensor([0.1, -0.2], dtype=torch.float64))
        layer.norm_state.weight.mul_(1.5)
    path = tmp_path / "layer.safetensors"
    save_layer(layer, path)
    loaded = load_layer(path)
    assert loaded.config == layer.config
    r = torch.randn(2, 4, 8)
    torch.testing.assert_close(loaded(r), layer(r))


def _old_file_loads_the_same(layer, path, metadata: dict, inputs: torch.Tensor) -> None:
    """Write `layer`'s weights with an older format's metadata; load_layer must rebuild it."""
    from safetensors.torch import save_file

    save_file(dict(layer.state_dict()), str(path), metadata=metadata)
    loaded = load_layer(path)
    assert loaded.config == layer.config
    torch.testing.assert_close(loaded(inputs), layer(inputs))


def test_version_2_layer_files_still_load(tmp_path):
    """Format nph-layer/2: the config without the porting fields, which take their defaults."""
    import json

    torch.manual_seed(17)
    layer = NPH(8, rule=create_model("topk", k=0.5, beta=0.3), heads=2, learn_beta=True)
    config = {
        "d_model": 8, "rule": {"name": "topk", "beta": 0.3, "steps": 1, "tol": 0.0, "k": 0.5},
        "heads": 2, "head_dim": 4, "value_dim": 4, "out_dim": 8, "learn_beta": True,
        "dropout": 0.0, "bias": False,
    }  # fmt: skip
    metadata = {"format": "nph-layer/2", "class": "NPH", "config": json.dumps(config)}
    metadata["arguments"] = "{}"
    _old_file_loads_the_same(layer, tmp_path / "v2.safetensors", metadata, torch.randn(2, 3, 8))


def test_version_1_layer_files_still_load(tmp_path):
    """Format nph-layer/1 kept the model's name, β and parameters among the layer's keywords."""
    import json

    torch.manual_seed(15)
    layer = NPHPooling(8, prototypes=2, rule=create_model("topk", k=0.5, beta=0.3), heads=2)
    flat = {
        "d_model": 8, "model": "topk", "heads": 2, "head_dim": 4, "value_dim": 4, "out_dim": 8,
        "beta": 0.3, "learn_beta": False, "dropout": 0.0, "bias": False, "k": 0.5,
        "prototypes": 2,
    }  # fmt: skip
    metadata = {"format": "nph-layer/1", "class": "NPHPooling", "config": json.dumps(flat)}
    _old_file_loads_the_same(layer, tmp_path / "v1.safetensors", metadata, torch.randn(3, 6, 8))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: NPH(8, rule=create_model("nope")), "unknown model"),
        (lambda: NPH(8, rule=create_model("dense", k=3)), "does not take"),
        (lambda: NPH(8, head_beta=[1.0, 2.0]), "one per head"),
        (lambda: NPH(8, heads=2, head_beta=[1.0, -2.0]), "one per head"),
        (lambda: NPH(8, learned="raw"), "learned"),
        (lambda: NPH(8, norms=Norms(state="yes")), "norms.state"),
        (lambda: NPHPooling(8, norms=Norms(state="affine")), "learned='input'"),
        (lambda: NPHLayer(8, memories=2, separate_values=True), "learned='input'"),
        (lambda: NPH(8, rule="dense"), "rule must be a model"),
        (lambda: NPH(8, k=3), "belong to the rule"),
        (lambda: NPH(8, dropout=1.0), "dropout"),
        (lambda: NPHPooling(8, prototypes=0), "prototypes"),
    ],
)
def test_bad_configuration_is_a_user_error(build, message):
    with pytest.raises(NphError, match=message):
        build()


def test_bad_inputs_are_user_errors():
    layer = NPH(8, rule=create_model("topk", k=4))
    r, y = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    with pytest.raises(NphError, match="shape"):
        layer(r[0], y[0])
    with pytest.raises(NphError, match="whole set"):
        layer(r, y, key_padding_mask=torch.tensor([[True] * 5, [False] * 5]))
    with pytest.raises(NphError, match="exceeds"):  # k = 4 but a set holds 3 keys
        layer(r, y, key_padding_mask=torch.tensor([[False] * 5, [False] * 3 + [True] * 2]))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", layer_model_names())
def test_cuda_layer_matches_cpu_retrieval(name):
    gen = torch.Generator().manual_seed(9)
    queries = torch.randn(5, 8, generator=gen, dtype=torch.float64)
    stored = torch.randn(9, 8, generator=gen, dtype=torch.float64)
    layer = NPH(8, rule=_rule(name, beta=0.7)).double().identity_().cuda()
    out = layer(queries[None].cuda(), stored[None].cuda())[0].cpu()
    expected = create_model(name, beta=0.7, **_params(name)).retrieve(queries, stored).patterns
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_docs_example_runs(tmp_path, monkeypatch):
    """docs/layers.md's Python example runs as written (and checks itself with asserts)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "layers.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    exec(compile(code, "docs/layers.md", "exec"), {})
    assert (tmp_path / "pool.safetensors").is_file()


def test_the_typed_layer_keywords_are_the_config_fields():
    """`LayerOptions` (what a type checker sees of the layers' keywords) lists `LayerConfig`."""
    import dataclasses
    import typing

    from nphcli.layers.config import LayerConfig, LayerOptions

    fields = {f.name for f in dataclasses.fields(LayerConfig)} - {"d_model"}
    assert set(typing.get_type_hints(LayerOptions)) == fields
