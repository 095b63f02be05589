"""Attractor diagnostics: the kind of state iterated retrieval reached, on memories where the
answer is known, against a reference count written from the definition."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_one_error_line

from nphcli.evaluation.attractors import classify, diagnose, mass_size
from nphcli.evaluation.metrics import nearest
from nphcli.memory.bank import as_bank
from nphcli.models import create_model


def mass_reference(weights):
    out = []
    for row in weights.tolist():
        total, k = 0.0, 0
        for w in sorted(row, reverse=True):
            total += w
            k += 1
            if total >= 0.9 * sum(row):
                break
        out.append(k)
    return torch.tensor(out)


def test_mass_size_is_the_reference():
    g = torch.Generator().manual_seed(0)
    weights = torch.softmax(torch.randn(20, 30, generator=g, dtype=torch.float64) * 3, dim=1)
    assert torch.equal(mass_size(weights), mass_reference(weights))
    assert mass_size(torch.full((1, 10), 0.1, dtype=torch.float64)).item() == 9
    assert mass_size(torch.tensor([[1.0, 0.0, 0.0]])).item() == 1


def _clusters():
    """8 orthogonal directions; rows 0-2 a tight cluster around direction 0, rows 3-7 alone."""
    eye = torch.eye(8, dtype=torch.float64) * 4
    g = torch.Generator().manual_seed(1)
    cluster = eye[0] + 0.3 * torch.randn(3, 8, generator=g, dtype=torch.float64)
    return torch.cat([cluster, eye[3:]])  # (8, 8)


def test_each_kind_on_constructed_states():
    memories = _clusters()
    bank = as_bank(memories)
    states = torch.stack(
        [
            memories[5],  # a stored pattern
            memories[:3].mean(0),  # the average of the 3-pattern cluster
            memories.mean(0) * 0,  # the origin: every memory equally likely
        ]
    )
    near = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)  # cosines to the nearest pattern
    out = classify(states, bank, beta=0.4, nearest_cosine=near)
    assert out["attractor"].tolist() == [0, 1, 2]
    assert out["attractor_size"].tolist()[:2] == [1, 3]
    assert out["attractor_size"].tolist()[2] == 8  # uniform over 8: 0.9·8 → 8


@pytest.mark.parametrize(
    ("beta", "kind"), [(5.0, "pattern"), (0.4, "metastable"), (0.05, "global")]
)
def test_dense_iteration_reaches_each_kind(beta, kind):
    memories = _clusters()
    query = memories[1] + 0.1  # inside the cluster
    result = create_model("dense", beta=beta, steps=100, tol=1e-10).retrieve(query[None], memories)
    index, _ = nearest(result.patterns, memories)
    out = diagnose(
        create_model("dense", beta=beta, steps=100),
        result.patterns,
        as_bank(memories),
        index,
        torch.tensor([1]),
    )
    from nphcli.evaluation.attractors import ATTRACTOR_KINDS

    assert ATTRACTOR_KINDS[int(out["attractor"][0])] == kind, out
    if kind == "metastable":
        assert int(out["attractor_size"][0]) == 3
    assert torch.isfinite(out["energy"]).all()


def test_one_step_and_hetero_runs_have_no_diagnostics():
    memories = _clusters()
    empty = diagnose(
        create_model("dense"), memories, as_bank(memories), torch.arange(8), torch.arange(8)
    )
    assert empty == {}
    hetero = as_bank(memories, torch.randn(8, 3, dtype=torch.float64))
    assert (
        diagnose(create_model("dense", steps=3), memories, hetero, torch.arange(8), torch.arange(8))
        == {}
    )


def test_classical_energy_never_rises_under_async_updates():
    g = torch.Generator().manual_seed(3)
    patterns = torch.where(torch.rand(12, 60, generator=g) < 0.5, -1.0, 1.0).double()
    x = torch.where(torch.rand(5, 60, generator=g) < 0.5, -1.0, 1.0).double()
    for name in ("hebbian", "pseudoinverse"):
        model = create_model(name, order="async", order_seed=2)
        energy = model.energy(x, patterns, torch.arange(5))
        state = x
        for _ in range(4):
            state = model.retrieve(state, patterns).patterns
            after = model.energy(state, patterns, torch.arange(5))
            assert bool((after <= energy + 1e-9).all())
            energy = after
        # E = −½ sᵀ W s by hand for the Hebbian rule
        if name == "hebbian":
            w = (patterns.T @ patterns).fill_diagonal_(0) / 60
            torch.testing.assert_close(
                model.energy(x, patterns, torch.arange(5)), -0.5 * ((x @ w) * x).sum(1)
            )


def test_cli_json_and_csv_carry_the_diagnostics(invoke, mnist):
    result = invoke(
        "retrieve",
        "--memory",
        mnist,
        "--queries",
        "6",
        "--steps",
        "10",
        "--beta",
        "0.001,5",
        "--per-query",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    low, high = rows
    assert (
        low["metrics"]["at_global"]["mean"] == 1.0 and high["metrics"]["at_pattern"]["mean"] == 1.0
    )
    assert set(high["per_query"]["attractor"]) == {"pattern"}
    assert len(high["per_query"]["energy"]) == 6 and high["metrics"]["energy"]["mean"] < 0
    one = json.loads(invoke("retrieve", "--memory", mnist, "--queries", "2", "--json").stdout)
    assert one["metrics"]["attractor_size"] is None  # one step: nothing iterated
    csv_out = invoke("retrieve", "--memory", mnist, "--queries", "2", "--steps", "3", "--csv")
    header = csv_out.stdout.splitlines()[0].split(",")
    assert {"at_pattern_mean", "attractor_size_median", "energy_mean"} <= set(header)


def test_attractors_command_writes_pictures_and_numbers(invoke, mnist, tmp_path):
    result = invoke(
        "attractors",
        "--memory",
        mnist,
        "--queries",
        "5",
        "--steps",
        "6",
        "--beta",
        "0.001,5",
        "--resolution",
        "7",
        "--traced",
        "3",
        "--pictures",
        str(tmp_path),
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    low, high = out["settings"]
    assert low["at_global"] == 1.0 and high["at_pattern"] == 1.0
    assert len(high["energy_trace"]) == 7 and len(high["energy_trace"][0]) == 3
    for name in ("sizes.png", "energy.png", "basins.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / "attractors.json").read_text())
    labels = saved["settings"][1]["basin"]["labels"]
    assert len(labels) == 7 and labels[1][1] == saved["settings"][1]["basin"]["corners"][0]


def test_basin_corners_go_to_their_own_patterns():
    """At large β every stored corner of the plane is its own fixed point."""
    from nphcli.app.attractors import basin

    memories = _clusters()[3:]  # 5 orthogonal patterns
    labels = basin(create_model("dense", beta=5.0, steps=20), as_bank(memories), (0, 1, 2), 7)
    grid = labels["labels"]  # u, v from −¼ to 1¼ in 7 cells: u = 0 at column 1, u = 1 at 5
    assert (grid[1][1], grid[1][5], grid[5][1]) == (0, 1, 2)


def test_attractors_command_refusals(invoke, mnist, tmp_path):
    one = invoke("attractors", "--memory", mnist, "--pictures", str(tmp_path))
    assert_one_error_line(one, "give --steps > 1")
    bad = invoke(
        "attractors",
        "--memory",
        mnist,
        "--steps",
        "3",
        "--basin",
        "0,0,1",
        "--pictures",
        str(tmp_path),
    )
    assert_one_error_line(bad, "three different stored rows")


def test_every_attractor_label_names_its_model(invoke, mnist, tmp_path, monkeypatch):
    """`--model dense,sparse`: the setting column, the JSON and each picture's title name the
    model of what they show (they read `beta=0.1` twice, and sizes.png `dense:` over sparse);
    the texts of each picture do not overlap."""
    from matplotlib.text import Text

    from nphcli.presentation import attractor_plots
    from nphcli.presentation.plot import overlapping_texts

    drawn = {}
    save = attractor_plots._save

    def keep(figure, out):
        drawn[out.name] = figure
        save(figure, out)

    monkeypatch.setattr(attractor_plots, "_save", keep)
    args = ["--memory", mnist, "--model", "dense,sparse", "--beta", "0.1,10", "--steps", "3"]
    args += ["--queries", "4", "--resolution", "5", "--traced", "2", "--pictures", tmp_path]
    table = invoke("attractors", *args, terminal_width=200)
    assert table.exit_code == 0, table.stderr
    settings = [line.split("│")[1].strip() for line in table.stdout.splitlines() if "beta=" in line]
    assert settings == ["dense beta=0.1", "dense beta=10", "sparse beta=0.1", "sparse beta=10"]
    for name in ("sizes.png", "energy.png", "basins.png"):
        texts = [t.get_text() for t in drawn[name].findobj(Text)]
        assert any(t.startswith("dense, sparse:") for t in texts), name
        assert overlapping_texts(drawn[name]) == [], name
    energy = [t.get_text() for t in drawn["energy.png"].findobj(Text)]
    assert {"dense beta=0.1", "sparse beta=10"} <= set(energy)
