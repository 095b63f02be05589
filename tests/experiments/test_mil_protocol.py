"""The paper's MIL protocol: search space draws, stratified splits, ROC-AUC (mil_protocol)."""

from __future__ import annotations

import itertools
import sys

import pytest
import torch

from nphcli.core.errors import NphError
from nphcli.experiments.mil_protocol import (
    PROTOCOLS,
    SEARCH_SPACE,
    Hyper,
    roc_auc,
    search_draws,
    stratified_folds,
    stratified_holdout,
)


def _pairwise_auc(scores: list[float], labels: list[int]) -> float:
    """The definition: over all (positive, negative) pairs, 1 if the positive scores higher,
    ½ on a tie."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y == 1]
    neg = [s for s, y in zip(scores, labels, strict=True) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_the_pairwise_definition_with_ties(seed):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(2, (40,), generator=gen)
    labels[:2] = torch.tensor([0, 1])
    scores = torch.randint(6, (40,), generator=gen).float()  # many ties
    expected = _pairwise_auc(scores.tolist(), labels.tolist())
    assert roc_auc(scores, labels.float()) == pytest.approx(expected, abs=1e-12)
    assert roc_auc(-scores, labels.float()) == pytest.approx(1 - expected, abs=1e-12)


def test_auc_extremes_and_one_class():
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert roc_auc(torch.tensor([0.1, 0.2, 0.3, 0.4]), labels) == 1.0
    assert roc_auc(torch.tensor([0.4, 0.3, 0.2, 0.1]), labels) == 0.0
    assert roc_auc(torch.zeros(4), labels) == 0.5
    with pytest.raises(NphError, match="positive and negative"):
        roc_auc(torch.rand(3), torch.ones(3))


def test_search_draws_are_seeded_and_in_the_papers_space():
    pytest.importorskip("optuna")
    draws = search_draws(50, seed=3)
    fresh = search_draws.__wrapped__  # a new study each call, past the cache
    assert draws == fresh(50, seed=3) and draws != fresh(50, seed=4)
    for hyper in draws:
        for name, value in vars(hyper).items():
            assert value in SEARCH_SPACE[name] and type(value) is type(SEARCH_SPACE[name][0])
    # 50 uniform draws reach every value of every parameter (probability of a miss < 1e-8)
    for name, values in SEARCH_SPACE.items():
        assert {getattr(h, name) for h in draws} == set(values), name


def test_the_search_without_optuna_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` raises ImportError
    search_draws.cache_clear()  # draws asked earlier in this process would hide the import
    with pytest.raises(
        NphError, match=r"^the full protocol needs Optuna: pip install 'nph\[search\]'$"
    ):
        search_draws(2, seed=0)


@pytest.mark.parametrize(
    ("positives", "negatives", "folds"), [(100, 100, 10), (26, 32, 10), (7, 5, 5)]
)
def test_stratified_folds_partition_and_balance(positives, negatives, folds):
    labels = torch.cat([torch.ones(positives), torch.zeros(negatives)])[
        torch.randperm(positives + negatives, generator=torch.Generator().manual_seed(9))
    ]
    parts = stratified_folds(labels, folds, seed=1)
    assert len(parts) == folds
    everything = torch.cat(parts).sort().values
    assert torch.equal(everything, torch.arange(labels.numel()))  # a partition
    sizes = [p.numel() for p in parts]
    assert max(sizes) - min(sizes) <= 1
    for c, n in ((1, positives), (0, negatives)):
        counts = [int((labels[p] == c).sum()) for p in parts]
        assert set(counts) <= {n // folds, -(-n // folds)}, (c, counts)
    assert all(
        torch.equal(a, b) for a, b in zip(parts, stratified_folds(labels, folds, 1), strict=True)
    )
    assert not all(
        torch.equal(a, b) for a, b in zip(parts, stratified_folds(labels, folds, 2), strict=True)
    )


def test_too_few_bags_of_a_class_for_the_folds():
    with pytest.raises(NphError, match="≥ 10 bags of each class"):
        stratified_folds(torch.tensor([1.0] * 9 + [0.0] * 20), 10, seed=0)


def test_holdout_is_stratified_and_disjoint():
    labels = torch.tensor([1.0] * 21 + [0.0] * 29)
    index = torch.arange(3, 50)  # a fold's training part
    train, held = stratified_holdout(index, labels, 0.1, seed=5)
    assert not set(train.tolist()) & set(held.tolist())
    assert sorted(train.tolist() + held.tolist()) == index.tolist()
    positives = int((labels[index] == 1).sum())  # 18 → 2 held out
    assert int((labels[held] == 1).sum()) == round(0.1 * positives)
    assert int((labels[held] == 0).sum()) == 3  # 29 → round(2.9)
    few = stratified_holdout(torch.arange(4), torch.tensor([1.0, 1.0, 0.0, 0.0]), 0.1, seed=0)[1]
    assert sorted(labels.new_tensor([1.0, 1.0, 0.0, 0.0])[few].tolist()) == [0.0, 1.0]


def test_protocols_are_the_documented_ones():
    full, reduced, quick = PROTOCOLS["full"], PROTOCOLS["reduced"], PROTOCOLS["quick"]
    assert (full.folds, full.seeds, full.trials, full.epochs, full.search) == (
        10,
        5,
        50,
        50,
        "per-fold",
    )
    assert full.datasets == ("tiger", "fox", "elephant", "ucsb")
    assert (reduced.folds, reduced.seeds, reduced.search) == (10, 5, "fixed")
    assert (quick.folds, quick.seeds, quick.search) == (5, 2, "fixed")
    assert quick.fixed == reduced.fixed
    assert all(getattr(quick.fixed, n) in v for n, v in SEARCH_SPACE.items())
    assert Hyper(**vars(quick.fixed)).key() == quick.fixed.key()
