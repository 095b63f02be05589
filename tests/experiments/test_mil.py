"""The MIL experiment: bag construction, reproducibility, interruption and resume, the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_one_error_line

from nphcli.core.errors import NphError
from nphcli.experiments import mil

TINY = mil.MILConfig(
    bag_sizes=(3, 6),
    train_bags=12,
    test_bags=6,
    epochs=2,
    runs=1,
    batch_size=5,
    embed_dim=8,
    heads=2,
    head_dim=4,
    variants=("dense", "sparse"),
)


def _pools():
    gen = torch.Generator().manual_seed(0)
    train_x, test_x = torch.rand(60, 20, generator=gen), torch.rand(30, 20, generator=gen)
    return train_x, torch.arange(60) % 10, test_x, torch.arange(30) % 10


@pytest.fixture
def synthetic_pools(monkeypatch):
    monkeypatch.setattr(mil, "load_pools", lambda root=None: (*_pools(), "synthetic"))


def test_bags_hold_one_signal_when_positive_and_none_otherwise():
    labels = torch.arange(100) % 10
    bags, positive = mil.make_bags(labels, 41, 7, 9, torch.Generator().manual_seed(1))
    assert bags.shape == (41, 7) and positive.sum() == 21
    signals = (labels[bags] == 9).sum(dim=1)  # (41,)
    assert torch.equal(signals, positive.to(torch.int64))
    again, _ = mil.make_bags(labels, 41, 7, 9, torch.Generator().manual_seed(1))
    assert torch.equal(bags, again)


def test_the_pool_must_hold_the_signal():
    with pytest.raises(NphError, match="too few"):
        mil.make_bags(torch.zeros(50, dtype=torch.int64), 4, 3, 9, torch.Generator())


# Training builds a torch optimiser, whose first use imports torch._dynamo (seconds): slow.
@pytest.mark.slow
def test_experiment_writes_whole_runs_resumes_reproducibly_and_plots(
    tmp_path, synthetic_pools, monkeypatch
):
    """One reference run; an interrupted run keeps only finished training runs; resuming it
    retrains the rest to the reference's exact numbers (seeded); summary and plot read it."""
    reference = mil.run_experiment(TINY, tmp_path / "ref.jsonl")
    lines = (tmp_path / "ref.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 2 * 2  # models × sizes × epochs
    assert [json.loads(line) for line in lines] == reference
    with pytest.raises(NphError, match="--resume"):
        mil.run_experiment(TINY, tmp_path / "ref.jsonl")

    out = tmp_path / "mil.jsonl"
    real_train = mil.train_one
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(args[1].label)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_train(*args, **kwargs)

    monkeypatch.setattr(mil, "train_one", interrupted)
    with pytest.raises(KeyboardInterrupt):
        mil.run_experiment(TINY, out)
    assert len(mil.read_results(out)) == 2 * TINY.epochs  # the two finished runs, nothing partial
    monkeypatch.setattr(mil, "train_one", real_train)
    resumed = mil.run_experiment(TINY, out, resume=True)

    def key(r):
        return (r["model"], r["bag_size"], r["epoch"], r["test_loss"], r["train_loss"])

    assert sorted(map(key, resumed)) == sorted(map(key, reference))

    summary = mil.summarise(resumed)
    assert set(summary) == {"dense", "sparse"} and set(summary["dense"]) == {3, 6}
    mean, std, runs = summary["sparse"][6]
    assert 0 <= mean <= 1 and std == 0 and runs == 1
    pytest.importorskip("matplotlib")
    mil.plot_results(resumed, tmp_path / "mil.png", convergence_bag_size=6)
    assert (tmp_path / "mil.png").read_bytes()[:4] == b"\x89PNG"


def test_configure_overrides_and_rejects():
    config = mil.configure("quick", models="sparse,linear", bag_sizes="5,9", epochs=3, runs=2)
    assert config.variants == ("sparse", "linear") and config.bag_sizes == (5, 9)
    assert config.convergence_bag_size == 9  # the run size nearest the paper's 50
    assert mil.configure("quick", bag_sizes="20,30").convergence_bag_size == 30  # the preset's
    assert mil.configure("quick", bag_sizes="40,60").convergence_bag_size == 40
    assert (config.epochs, config.runs) == (3, 2)
    for bad in ({"models": "nope"}, {"bag_sizes": "a"}, {"epochs": 0}):
        with pytest.raises(NphError):
            mil.configure("quick", **bad)
    with pytest.raises(NphError, match="preset"):
        mil.configure("huge")
    paper = mil.PRESETS["paper"]
    assert (paper.train_bags, paper.test_bags, paper.epochs, paper.runs) == (2000, 500, 150, 10)


@pytest.mark.slow
def test_cli_mil_json(invoke, tmp_path, synthetic_pools, monkeypatch):
    monkeypatch.setitem(mil.PRESETS, "quick", TINY)
    out = tmp_path / "cli.jsonl"
    result = invoke("mil", "--models", "sparse", "--bag-sizes", "4", "--out", out, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["final_test_accuracy"]
    assert list(summary) == ["sparse"] and list(summary["sparse"]) == ["4"]
    again = invoke("mil", "--models", "sparse", "--bag-sizes", "4", "--out", out)
    assert again.exit_code != 0 and "Error:" in again.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--models", "dense,bogus"], ["unknown MIL model 'bogus'"]),
        (["--bag-sizes", "5,x"], ["--bag-sizes"]),
        (["--epochs", "1,2"], ["--epochs takes a whole number, got '1,2'"]),
    ],
)
def test_comma_lists_reach_the_experiment(invoke, tmp_path, args, words):
    """The MIL options that take comma lists hand the whole list on (they once crashed with a
    traceback when split like a setting's values); a bad entry is one error line."""
    result = invoke("mil", *args, "--out", tmp_path / "mil.jsonl")
    assert_one_error_line(result, *words)
    assert not (tmp_path / "mil.jsonl").exists()
