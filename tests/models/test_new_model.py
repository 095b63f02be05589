"""A model registered from outside the package works everywhere with no other edit: its parameter
is an option of `nph retrieve` and `nph analyze`, a `--models` setting of `nph sweep`, a column
of the CSV, it appears in `nph models` and the generated README reference, and it works as a
layer (`nphcli.layers`) that trains.

The throwaway model keeps the first J memories only (softmax over memories 0 … J − 1): a
sparse-structured rule, so the theory checks of `nph analyze` apply to it too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from conftest import assert_one_error_line, write_memory
from safetensors.torch import load_file

from nphcli.engine.attention import masked_attention
from nphcli.models import HopfieldModel, Update, create_model, registry
from nphcli.models.base import param
from nphcli.schema.catalog import cards_from_registry, models_markdown


@pytest.fixture
def first_j():
    """Register `first-j` (parameter `first`) for one test, then remove it."""

    @registry.register_model(
        "first-j",
        summary="softmax over the first J memories only",
        formula="T(x) = Σ_{μ<J} softmax(β K x)_μ v_μ",
        cost="time O(Q·M·d)",
    )
    @dataclass(kw_only=True)
    class FirstJ(HopfieldModel):
        first: int = param(2, "number J of leading memories every query may retrieve")

        def update(self, queries, bank, positions, prepared, *, block_rows):
            def keep(start, rows):
                index = torch.arange(start, start + rows, device=queries.device)  # (B,)
                return (index < self.first).expand(queries.shape[0], rows)  # (Q, B)

            patterns, support = masked_attention(
                queries, bank, keep, beta=self.beta, block_rows=block_rows
            )
            return Update(patterns, support=support)

        def support_mask(self, scores, positions):
            index = torch.arange(scores.shape[1], device=scores.device)
            return (index < self.first).expand_as(scores)

    yield FirstJ
    registry._MODELS.pop("first-j")


@pytest.fixture
def memory(tmp_path):
    generator = torch.Generator().manual_seed(0)
    path = tmp_path / "m.safetensors"
    write_memory(path, torch.randn(6, 4, generator=generator))
    return path


def _expected(keys: torch.Tensor, queries: torch.Tensor, beta: float, first: int) -> torch.Tensor:
    """Softmax over the first `first` memories, written from the formula."""
    weights = torch.softmax(beta * queries.double() @ keys[:first].double().T, dim=1)
    return (weights @ keys[:first].double()).float()


def test_retrieve_takes_the_new_parameter(first_j, memory, tmp_path, invoke):
    out = tmp_path / "r.safetensors"
    result = invoke(
        "retrieve", "--memory", memory, "--model", "first-j", "--first", "3", "--beta", "2",
        "--out", out, "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    config = json.loads(result.stdout)["config"]
    assert config["params"]["first"] == 3 and config["params"]["beta"] == 2.0
    saved = load_file(str(out))
    keys = load_file(str(memory))["patterns"]
    torch.testing.assert_close(
        saved["retrieved"], _expected(keys, saved["queries"], 2.0, 3), rtol=1e-5, atol=1e-6
    )
    csv = invoke("retrieve", "--memory", memory, "--model", "first-j", "--first", "3", "--csv")
    assert csv.exit_code == 0 and "first" in csv.stdout.splitlines()[0].split(",")


def test_other_models_refuse_the_new_parameter(first_j, memory, invoke):
    result = invoke("retrieve", "--memory", memory, "--model", "dense", "--first", "3")
    assert_one_error_line(result, "takes --first")


def test_analyze_takes_the_new_parameter(first_j, memory, invoke):
    result = invoke(
        "analyze", memory, "--model", "first-j", "--first", "4", "--beta", "1", "--json"
    )
    assert result.exit_code == 0, result.stderr
    queries = json.loads(result.stdout)["queries"]
    assert queries["params"]["first"] == 4


def test_sweep_takes_the_new_parameter(first_j, memory, tmp_path, invoke):
    out = tmp_path / "s.jsonl"
    result = invoke(
        "sweep", "--dataset", memory, "--model", "first-j", "--first", "2,5", "--sizes", "6",
        "--out", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(row["first"] for row in rows) == [2, 5]


def test_models_listing_and_readme_reference_show_it(first_j, invoke):
    listing = json.loads(invoke("models", "--json").stdout)["models"]
    entry = next(m for m in listing if m["name"] == "first-j")
    assert [p["name"] for p in entry["params"]][-1] == "first"
    text = models_markdown(cards_from_registry())
    assert "`first-j`" in text and "`--first`" in text
    assert "--first" in invoke("retrieve", "--help").stdout


def test_library_builds_it_by_name(first_j):
    model = create_model("first-j", first=1)
    keys = torch.eye(3)
    got = model.retrieve(torch.ones(2, 3), keys).patterns
    torch.testing.assert_close(got, keys[:1].expand(2, 3))


def test_it_works_as_a_layer_and_trains(first_j):
    """The model's `support_mask` is its layer form: with identity weights the layer is its
    retrieval (a padded set as the set alone), and one optimiser step lowers a loss."""
    from nphcli.layers import NPH

    generator = torch.Generator().manual_seed(1)
    queries = torch.randn(3, 4, generator=generator, dtype=torch.float64)  # (N, d)
    stored = torch.randn(2, 6, 4, generator=generator, dtype=torch.float64)  # (B, M, d)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True  # the second set holds 4 keys
    rule = create_model("first-j", first=3, beta=1.5)
    layer = NPH(4, rule=rule).double().identity_()
    out = layer(queries.expand(2, -1, -1), stored, key_padding_mask=pad)  # (B, N, d)
    for b, size in enumerate((6, 4)):
        expected = rule.retrieve(queries, stored[b, :size]).patterns
        torch.testing.assert_close(out[b], expected, rtol=1e-12, atol=1e-12)

    torch.manual_seed(2)
    layer = NPH(4, rule=create_model("first-j", first=2), heads=2, learn_beta=True).double()
    target = torch.randn(2, 3, 4, generator=generator, dtype=torch.float64)
    optimiser = torch.optim.SGD(layer.parameters(), lr=0.05)

    def loss() -> torch.Tensor:
        return (
            (layer(queries.expand(2, -1, -1), stored, key_padding_mask=pad) - target)
            .square()
            .mean()
        )

    before = loss()
    optimiser.zero_grad()
    before.backward()
    grads = [p.grad for p in layer.parameters()]
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    assert all(float(g.abs().sum()) > 0 for g in grads)
    optimiser.step()
    with torch.no_grad():
        assert float(loss()) < float(before)
