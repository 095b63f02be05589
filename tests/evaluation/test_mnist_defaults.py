"""The first experiment means something: images are stored centred by default, `unit` is now
`minmax` (the old name warns), and a memory holding patterns no β retrieves says so in one line."""

from __future__ import annotations

import csv
import io

import torch
from conftest import write_memory

from nphcli.core.normalize import normalize
from nphcli.memory.file import load_memory
from nphcli.theory.retrievable import count_unretrievable


def _reference_count(x: torch.Tensor) -> int:
    """Δ_μ < 0 written from the definition with the whole Gram matrix in float64."""
    gram = x.double() @ x.double().T  # (M, M)
    own = gram.diagonal().clone()
    gram.fill_diagonal_(-float("inf"))
    return int((own - gram.max(dim=1).values < 0).sum())


def test_the_count_matches_the_definition():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, 6, generator=g) * torch.rand(40, 1, generator=g)  # norms differ a lot
    found = count_unretrievable(x)
    assert found == {"count": _reference_count(x), "checked": 40, "of": 40}
    assert found["count"] > 0
    assert count_unretrievable(torch.nn.functional.normalize(x, dim=1))["count"] == 0


def test_unit_is_an_alias_of_minmax_that_warns(caplog):
    raw = torch.tensor([[0.0, 255.0], [51.0, 102.0]])
    old, info_old = normalize(raw, "unit", pixel_range=(0, 255))
    new, info_new = normalize(raw, "minmax", pixel_range=(0, 255))
    assert torch.equal(old, new) and torch.equal(new, raw / 255)
    assert info_old["method"] == info_new["method"] == "minmax"


def _success(invoke, memory) -> list[float]:
    result = invoke(
        "retrieve", "--memory", memory, "--noise", "0", "--beta", "0.3,10,1000", "--csv"
    )
    assert result.exit_code == 0, result.output
    return result, [float(r["success_mean"]) for r in csv.DictReader(io.StringIO(result.stdout))]


def test_first_mnist_experiment_default_and_paper_scaling(invoke, tmp_path):
    default = tmp_path / "default.safetensors"
    result = invoke("store", "mnist", "--n", "300", "--out", default)
    assert result.exit_code == 0 and "cannot be retrieved" not in result.stderr
    assert load_memory(default).meta["normalize"]["method"] == "centered"
    result, success = _success(invoke, default)
    assert min(success) >= 0.95 and "cannot be retrieved" not in result.stderr

    paper = tmp_path / "paper.safetensors"
    result = invoke("store", "mnist", "--n", "300", "--normalize", "unit", "--out", paper)
    assert result.exit_code == 0
    lines = [line for line in result.stderr.splitlines() if "cannot be retrieved" in line]
    patterns = load_memory(paper).patterns
    count = _reference_count(patterns)
    assert count > 50 and lines == [lines[0]] and lines[0].startswith(f"note: {count} of 300")
    assert "now called minmax" in result.stderr
    result, success = _success(invoke, paper)
    assert max(success) <= 1 - count / 300 + 1e-9  # no β gets past the unretrievable ones
    assert sum("cannot be retrieved" in line for line in result.stderr.splitlines()) == 1


def test_retrieve_counts_an_unrecorded_memory(invoke, tmp_path):
    path = tmp_path / "m.safetensors"
    x = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]])  # row 0 lies under row 1
    write_memory(path, x)
    result = invoke("retrieve", "--memory", path, "--csv")
    assert result.exit_code == 0
    assert "note: 1 of 3 stored patterns cannot be retrieved by any β" in result.stderr
