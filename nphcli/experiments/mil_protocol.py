"""The protocol of the paper's MIL benchmark (appendix "Multiple Instance Learning on Real World
Datasets"): its search space, the three protocols nph runs, the seeded stratified splits and
ROC-AUC. No training here (`nphcli.experiments.mil_paper`), so all of it is tested directly.

The paper: stratified 10-fold cross-validation; in each fold a stratified 10 % of the training
part validates; 50 random-search trials per fold from Table "hyperparameters", the one with the
best validation ROC-AUC kept; Adam, 50 epochs, the checkpoint with the best validation AUC;
ROC-AUC averaged over 5 seeds. That is `full`. `reduced` (the paper's folds and seeds) and
`quick` (fewer) take one point of the search space, fixed here before any run (`FIXED_HYPER`,
docs/reproduction.md says why), instead of searching.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from nphcli.core.errors import NphError

if TYPE_CHECKING:
    from torch import Tensor

# Table "hyperparameters": the random-search space, value lists as printed.
SEARCH_SPACE: dict[str, tuple[Any, ...]] = {
    "batch_size": (4, 8, 16),
    "lr": (1e-3, 1e-4, 1e-5),
    "weight_decay": (0.0, 1e-3, 1e-4),
    "width": (128, 256, 512),  # the embedding's hidden units
    "heads": (4, 8),
    "beta": (0.1, 1.0),  # the paper's "scaling factor"
    "dropout": (0.0, 0.3, 0.5),  # bag dropout after the embedding and after the pooling
}


@dataclass(frozen=True)
class Hyper:
    """One point of `SEARCH_SPACE`."""

    batch_size: int
    lr: float
    weight_decay: float
    width: int
    heads: int
    beta: float
    dropout: float

    def key(self) -> str:
        """A stable text for results files and caching."""
        return json.dumps(asdict(self), sort_keys=True)


@functools.cache  # asked once per (seed, fold), not again for every model that trains them
def search_draws(count: int, seed: int) -> tuple[Hyper, ...]:
    """`count` trials of a random search of `SEARCH_SPACE` (Optuna's RandomSampler, seeded), all
    asked up front: their draws do not depend on results. The caller trains and keeps the best."""
    try:
        import optuna
    except ImportError:
        raise NphError("the full protocol needs Optuna: pip install 'nph[search]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no line per study or trial
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    trials = [study.ask() for _ in range(count)]
    return tuple(
        Hyper(**{n: t.suggest_categorical(n, v) for n, v in SEARCH_SPACE.items()}) for t in trials
    )


@dataclass(frozen=True)
class Protocol:
    """How hyper-parameters are chosen and how many folds and seeds are run.

    search "per-fold" (the paper): `trials` random draws per (seed, fold), the one with the best
    validation AUC kept. search "fixed": the point `fixed` everywhere. Test AUCs never choose."""

    name: str
    folds: int  # stratified cross-validation folds
    seeds: int  # seeds 0 … seeds − 1: splits, initial weights, batch order, dropout
    search: str  # "per-fold" or "fixed"
    trials: int = 0  # with search "per-fold": random-search draws from SEARCH_SPACE per fold
    fixed: Hyper | None = None  # with search "fixed"
    epochs: int = 50  # Adam epochs; the checkpoint with the best validation AUC is kept
    validation: float = 0.1  # stratified share of each fold's training part that validates
    # The paper's data sets, those of them that --data holds, unless --datasets names others.
    datasets: tuple[str, ...] = ("tiger", "fox", "elephant", "ucsb")


# The reduced and quick protocols' point of the space, fixed before any run: the cheapest
# network (batch 16, width 128, 4 heads) with the largest learning rate, so that 50 epochs of
# few steps still train; the middle dropout and weight decay; β = 1. Why not a search: one
# search of 6 draws per model and data set, scored on 3 folds, was estimated at 3-4 CPU hours
# on the busy 2-core machine the reduced protocol was sized for.
FIXED_HYPER = Hyper(
    batch_size=16, lr=1e-3, weight_decay=1e-4, width=128, heads=4, beta=1.0, dropout=0.3
)

PROTOCOLS = {
    "full": Protocol("full", folds=10, seeds=5, search="per-fold", trials=50),
    # The paper's 10 folds × 5 seeds at FIXED_HYPER: 350 trainings per data set; Elephant and
    # UCSB took 22 CPU minutes.
    "reduced": Protocol("reduced", folds=10, seeds=5, search="fixed", fixed=FIXED_HYPER),
    # 5 folds × 2 seeds at FIXED_HYPER: 70 trainings per data set; Elephant and UCSB took 4.2
    # CPU minutes (docs/paper-tables.md).
    "quick": Protocol("quick", folds=5, seeds=2, search="fixed", fixed=FIXED_HYPER),
}  # fmt: skip


def stratified_folds(labels: Tensor, folds: int, seed: int) -> list[Tensor]:
    """Bag indices (sorted) of each of `folds` test folds: each class shuffled with `seed` and
    dealt round-robin, so every fold holds ⌊n_c / K⌋ or ⌈n_c / K⌉ bags of class c; the class of
    the larger remainder continues where the other left off, keeping fold sizes within one."""
    import torch

    counts = [int((labels == c).sum()) for c in (0, 1)]
    if min(counts) < folds:
        raise NphError(
            f"stratified {folds}-fold cross-validation needs ≥ {folds} bags of each class; "
            f"the data has {counts[1]} positive and {counts[0]} negative"
        )
    generator = torch.Generator().manual_seed(seed)
    members: list[list[int]] = [[] for _ in range(folds)]
    dealt = 0
    for c in (0, 1):
        index = torch.nonzero(labels == c).squeeze(1)  # (n_c,)
        for i in index[torch.randperm(index.numel(), generator=generator)].tolist():
            members[dealt % folds].append(i)
            dealt += 1
    return [torch.tensor(sorted(m)) for m in members]


def stratified_holdout(
    index: Tensor, labels: Tensor, share: float, seed: int
) -> tuple[Tensor, Tensor]:
    """Split bag indices `index` into (train, held out): of each class, max(1, round(share·n_c))
    bags drawn with `seed` are held out (so both classes are always in both parts)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    held = []
    for c in (0, 1):
        members = index[labels[index] == c]  # (n_c,)
        if members.numel() < 2:
            raise NphError("a fold's training part needs ≥ 2 bags of each class to validate")
        take = min(members.numel() - 1, max(1, math.floor(share * members.numel() + 0.5)))
        held.append(members[torch.randperm(members.numel(), generator=generator)[:take]])
    held_out = torch.cat(held).sort().values
    keep = ~torch.isin(index, held_out)
    return index[keep], held_out


def roc_auc(scores: Tensor, labels: Tensor) -> float:
    """ROC-AUC: P(score of a positive > score of a negative) + ½ P(tie), from the rank sums
    (Mann-Whitney U) with tied scores given their average rank. Needs both classes."""
    import torch

    scores, labels = scores.double().flatten(), labels.flatten() > 0.5
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        raise NphError("ROC-AUC needs positive and negative bags")
    order = scores.argsort()
    sorted_scores = scores[order]
    ranks = torch.empty_like(scores)
    start = 0
    n = scores.numel()
    while start < n:  # average rank over each run of tied scores
        stop = start + 1
        while stop < n and sorted_scores[stop] == sorted_scores[start]:
            stop += 1
        ranks[order[start:stop]] = (start + stop + 1) / 2  # ranks start at 1
        start = stop
    u = float(ranks[labels].sum()) - positives * (positives + 1) / 2
    return u / (positives * negatives)
