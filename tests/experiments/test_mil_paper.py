"""The paper's MIL network and its runs on real-layout bags (mil_paper, `nph paper mil`), on
tiny synthetic bags."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_one_error_line

from nphcli.core.errors import NphError
from nphcli.experiments import mil_paper, mil_protocol
from nphcli.experiments.datasets import MILData
from nphcli.experiments.mil_config import PAPER_MIL_MODELS
from nphcli.experiments.mil_data import load_present
from nphcli.experiments.mil_protocol import Hyper

HYPER = Hyper(batch_size=4, lr=1e-2, weight_decay=0.0, width=8, heads=2, beta=1.0, dropout=0.5)
TINY = mil_protocol.Protocol(
    "quick", folds=2, seeds=2, search="fixed", fixed=HYPER, epochs=3, datasets=("ucsb",)
)


def _bags(count: int = 20, dim: int = 5, seed: int = 0) -> MILData:
    """Bags of 1-6 instances; a positive bag holds one instance with a large first feature."""
    gen = torch.Generator().manual_seed(seed)
    bags, labels = [], []
    for i in range(count):
        bag = torch.randn(1 + i % 6, dim, generator=gen)
        if i % 2:
            bag[int(torch.randint(bag.shape[0], (1,), generator=gen)), 0] = 6.0
        bags.append(bag)
        labels.append(float(i % 2))
    return MILData(bags, torch.tensor(labels))


def _csv(folder, data: MILData) -> None:
    lines = [
        ",".join([str(int(label)), str(b + 1), *(f"{v:.6f}" for v in row.tolist())])
        for b, (bag, label) in enumerate(zip(data.bags, data.labels, strict=True))
        for row in bag
    ]
    (folder / "ucsb_breast_cancer.csv").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("model", PAPER_MIL_MODELS)
def test_a_padded_batch_scores_each_bag_as_alone(model):
    """Padding must not change a bag's logit, for every rule (top-k takes k of each bag's own
    size; the feature rules mask padded keys)."""
    data = _bags(8)
    torch.manual_seed(0)
    net = mil_paper.PaperMILNet(5, HYPER, mil_paper.variant(model)).eval()
    bags = mil_paper.Bags(data)
    x, padding = bags.batch(torch.arange(8))  # (8, 6, 5), (8, 6)
    together = net(x, padding)  # (8,)
    for i, bag in enumerate(data.bags):
        alone = net(bag[None], torch.zeros(1, bag.shape[0], dtype=torch.bool))
        torch.testing.assert_close(together[i], alone[0], rtol=1e-5, atol=1e-5)


def test_dropout_is_on_the_bag_not_on_the_attention():
    net = mil_paper.PaperMILNet(5, HYPER, mil_paper.variant("topk-20%"))
    assert net.pool.dropout == 0.0 and net.drop.p == 0.5
    x = torch.randn(3, 4, 5)
    padding = torch.zeros(3, 4, dtype=torch.bool)
    net.train()
    assert not torch.equal(net(x, padding), net(x, padding))
    net.eval()
    assert torch.equal(net(x, padding), net(x, padding))


def test_features_are_standardised_by_the_training_bags_only():
    data = _bags(10)
    bags = mil_paper.Bags(data)
    train = torch.tensor([0, 2, 3, 5])
    scaled = bags.standardised(train)
    rows = scaled.x[train][~scaled.padding[train]]  # (n, d)
    torch.testing.assert_close(rows.mean(0), torch.zeros(5), atol=1e-5, rtol=0)
    torch.testing.assert_close(rows.std(0), torch.ones(5), atol=1e-5, rtol=0)
    assert bool((scaled.x[scaled.padding] == 0).all())
    data.bags[9] = data.bags[9] * 100  # a bag outside the training part changes nothing
    again = mil_paper.Bags(data).standardised(train)
    torch.testing.assert_close(again.x[:9], scaled.x[:9])


def test_unknown_model_and_width():
    with pytest.raises(NphError, match="unknown MIL model 'random-masked'"):
        mil_paper.variant("random-masked")  # excluded by the paper
    with pytest.raises(NphError, match="multiple of 3 heads"):
        mil_paper.PaperMILNet(5, dataclasses.replace(HYPER, heads=3), mil_paper.variant("dense"))


# Training builds a torch optimiser, whose first use imports torch._dynamo (seconds): slow.
@pytest.mark.slow
def test_training_learns_separable_bags_reproducibly():
    data = _bags(40)
    bags = mil_paper.Bags(data)
    split = mil_paper.splits(data.labels, dataclasses.replace(TINY, folds=4), seed=0)[0]
    hyper = dataclasses.replace(HYPER, dropout=0.0)
    first = mil_paper.train_fold(bags, split, hyper, mil_paper.variant("sparse"), seed=1, epochs=15)
    again = mil_paper.train_fold(bags, split, hyper, mil_paper.variant("sparse"), seed=1, epochs=15)
    assert first == again
    assert first["test_auc"] >= 0.9 and 1 <= first["best_epoch"] <= 15
    assert first["val_loss"] > 0  # recorded: it breaks ties of validation AUC


def test_validation_auc_ties_are_broken_by_the_lower_loss(monkeypatch):
    """Three epochs with validation AUC 1, 1, 0.5 and losses 0.6, 0.2, 0.1: the second is kept
    (the first of equal AUCs would be chosen by the AUC alone)."""
    data = _bags(20)
    split = mil_paper.splits(data.labels, dataclasses.replace(TINY, folds=4), seed=0)[0]
    val = data.labels[split[1]]
    epochs = iter([(val * 2 - 1) * 0.4, (val * 2 - 1) * 3.0, (1 - val * 2) * 9.0, torch.zeros(5)])
    scores = []

    def fake_scores(net, bags, index):
        if index.numel() == split[1].numel() and bool((index == split[1]).all()):
            scores.append(next(epochs))
            return scores[-1]
        return torch.linspace(0, 1, index.numel())

    monkeypatch.setattr(mil_paper, "_scores", fake_scores)
    bags = mil_paper.Bags(data)
    result = mil_paper.train_fold(bags, split, HYPER, mil_paper.variant("dense"), seed=0, epochs=3)
    assert result["best_epoch"] == 2 and result["val_auc"] == 1.0


def test_the_network_has_the_released_layer_norms():
    net = mil_paper.PaperMILNet(5, HYPER, mil_paper.variant("dense"))
    assert isinstance(net.norm_embed, torch.nn.LayerNorm) and net.norm_pool.normalized_shape == (8,)


SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "mil"
needs_shared = pytest.mark.skipif(
    not (SHARED / "fox_100x100_matlab.mat").is_file(), reason="../shared/data/mil is not here"
)


@needs_shared
def test_fox_and_tiger_come_from_the_shared_folder_and_the_bag_size_baseline():
    pytest.importorskip("scipy")
    loaded = load_present(None, mil_protocol.PROTOCOLS["reduced"].datasets, SHARED)
    assert list(loaded)[:3] == ["tiger", "fox", "elephant"]  # UCSB: not in that folder
    assert [sum(b.shape[0] for b in loaded[n].bags) for n in ("tiger", "fox")] == [1220, 1320]
    bags = mil_paper.Bags(loaded["fox"])
    aucs = [mil_paper.bag_size_auc(bags, s) for s in mil_paper.splits(bags.labels, TINY, 0)]
    assert all(0.0 <= auc <= 1.0 for auc in aucs)


@pytest.mark.slow
def test_runs_resume_from_the_log_and_report_whole_seeds(tmp_path, monkeypatch):
    _csv(tmp_path, _bags(16))
    out = tmp_path / "out"
    per_seed, meta = mil_paper.run(TINY, tmp_path, out, models=["dense", "linear"])
    assert set(per_seed) == {("dense", "UCSB"), ("linear", "UCSB"), ("bag-size", "UCSB")}
    assert all(len(v) == 2 for v in per_seed.values())
    assert meta["trainings_logged"] == 2 * 2 * 2 and meta["data"]["UCSB"]["differs_from_paper"]
    lines = (out / "runs.jsonl").read_text().splitlines()
    per_fold = [json.loads(line)["test_auc"] for line in lines[:2]]  # dense, seed 0
    assert per_seed["dense", "UCSB"][0] == pytest.approx(sum(per_fold) / 2)

    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(mil_paper, "train_fold", no_training)
    assert mil_paper.run(TINY, tmp_path, out, models=["dense", "linear"])[0] == per_seed
    # a run killed while writing leaves a cut last line: that training is redone
    (out / "runs.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])
    partial = mil_paper.run(TINY, tmp_path, out, models=["dense", "linear"], train=False)[0]
    assert partial == {("dense", "UCSB"): per_seed["dense", "UCSB"],
                       ("linear", "UCSB"): per_seed["linear", "UCSB"][:1],
                       ("bag-size", "UCSB"): per_seed["bag-size", "UCSB"]}  # fmt: skip
    assert (out / "runs.jsonl").read_text() == "\n".join(lines[:-1]) + "\n"  # cut line dropped
    monkeypatch.undo()
    assert mil_paper.run(TINY, tmp_path, out, models=["dense", "linear"])[0] == per_seed
    assert len((out / "runs.jsonl").read_text().splitlines()) == len(lines)
    (out / "runs.jsonl").write_text("garbage\n" + "\n".join(lines) + "\n")
    with pytest.raises(NphError, match="line 1: not a MIL training record"):
        mil_paper.run(TINY, tmp_path, out, models=["dense"])


@pytest.mark.slow
def test_the_command_prints_and_writes_the_comparison(invoke, tmp_path, monkeypatch):
    monkeypatch.setitem(mil_protocol.PROTOCOLS, "quick", TINY)
    _csv(tmp_path, _bags(16))
    result = invoke(
        "paper", "mil", "--data", tmp_path, "--out", tmp_path / "res", "--models", "sparse",
        "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["table"] == "mil_benchmark" and shown["protocol"]["name"] == "quick"
    cell, baseline = shown["cells"]
    assert (baseline["row"], baseline["verdict"], baseline["seeds"]) == ("bag-size", "baseline", 2)
    assert (cell["row"], cell["column"], cell["paper"], cell["seeds"]) == (
        "sparse",
        "UCSB",
        0.585,
        2,
    )
    written = json.loads((tmp_path / "res" / "mil_benchmark.json").read_text())
    assert written["cells"] == shown["cells"]
    for ending in ("csv", "png"):
        assert (tmp_path / "res" / f"mil_benchmark.{ending}").stat().st_size > 0


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--protocol", "slow"], ["'slow' is not one of 'full', 'reduced', 'quick'"]),
        (["--datasets", "fox"], ["Fox is not in", "fox_100x100_matlab.mat"]),
        (["--models", "window"], ["unknown MIL model 'window'"]),
    ],
)
def test_the_command_refuses_bad_input_in_one_line(invoke, tmp_path, args, words):
    _csv(tmp_path, _bags(16))
    result = invoke("paper", "mil", "--data", tmp_path, "--out", tmp_path / "res", *args)
    assert_one_error_line(result, *words)
    assert not (tmp_path / "res").exists()


def test_the_command_needs_its_data_folder(invoke, tmp_path):
    result = invoke("paper", "mil", "--out", tmp_path / "res")
    assert_one_error_line(result, "nph paper mil needs --data")


def _fake_training(results):
    """A `train_fold` that returns `results[fold][hyper]` at once, fold read from its seed."""

    def train_fold(bags, split, hyper, model, *, seed, epochs):
        val_auc, val_loss, test_auc = results[seed % 1_000][hyper]
        return {"val_auc": val_auc, "val_loss": val_loss, "best_epoch": 1, "test_auc": test_auc}

    return train_fold


def test_the_full_protocols_search_keeps_the_best_validation_auc_ties_by_loss(
    tmp_path, monkeypatch
):
    """Each fold's 4 Optuna draws are all trained and logged; kept: the best validation AUC, of
    two equal ones the lower validation loss (test AUC 0.2 in fold 0, 0.6 in fold 1)."""
    pytest.importorskip("optuna")
    search = dataclasses.replace(TINY, name="full", seeds=1, search="per-fold", trials=4)
    draws = [mil_protocol.search_draws(4, seed=1 + fold) for fold in range(2)]
    assert all(len(set(d)) == 4 for d in draws)
    scored = [[(0.9, 0.5, 0.1), (0.9, 0.3, 0.2), (0.8, 0.1, 0.3), (0.5, 0.0, 0.4)],
              [(0.7, 0.1, 0.5), (1.0, 0.2, 0.6), (1.0, 0.4, 0.7), (0.2, 0.0, 0.8)]]  # fmt: skip
    results = [dict(zip(d, s, strict=True)) for d, s in zip(draws, scored, strict=True)]
    monkeypatch.setattr(mil_paper, "train_fold", _fake_training(results))
    _csv(tmp_path, _bags(16))
    per_seed, meta = mil_paper.run(search, tmp_path, tmp_path / "out", models=["dense"])
    assert per_seed["dense", "UCSB"] == [pytest.approx((0.2 + 0.6) / 2)]
    logged = [
        json.loads(line) for line in (tmp_path / "out" / "runs.jsonl").read_text().splitlines()
    ]
    assert meta["trainings_logged"] == 8
    assert {(r["fold"], Hyper(**r["hyper"])) for r in logged} == {
        (fold, hyper) for fold in range(2) for hyper in draws[fold]
    }


def test_only_the_full_protocol_needs_optuna(invoke, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` raises ImportError
    mil_protocol.search_draws.cache_clear()  # draws asked earlier would hide the import
    _csv(tmp_path, _bags(40))  # ≥ 10 bags of each class: the full protocol's 10 folds
    args = ("--data", tmp_path, "--out", tmp_path / "f", "--datasets", "ucsb")
    result = invoke("paper", "mil", *args, "--protocol", "full")
    assert_one_error_line(result, "the full protocol needs Optuna", "pip install 'nph[search]'")
    results = [{HYPER: (1.0, 0.1, 0.7)}] * 2
    monkeypatch.setattr(mil_paper, "train_fold", _fake_training(results))
    per_seed, _ = mil_paper.run(TINY, tmp_path, tmp_path / "q", models=["dense"])
    assert per_seed["dense", "UCSB"] == [pytest.approx(0.7)] * 2
