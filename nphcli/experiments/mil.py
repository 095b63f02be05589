"""The paper's multiple-instance-learning experiment on MNIST bags (§"Multiple Instance Learning";
setup, protocol and why in docs/reproduction.md). A bag of M digits is positive when it holds the
signal digit (the paper's 9), exactly once: the hard case, where a dense average dilutes it as 1/M.

    digit (784) → Linear(784, 256) → ReLU → LayerNorm → NPHPooling(2 prototypes, 4 heads × 64,
    β = 0.1, the model under test) → LayerNorm → Linear(2·256, 1)

Seeded by (seed, run, bag size): every model sees the same bags and starting embedding. Results
are JSON Lines, one line per (model, bag size, run, epoch), rewritten atomically after each
finished training run, so `resume` skips the runs already in it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own convention)
from torch import Tensor, nn

from nphcli.core.errors import NphError
from nphcli.core.notices import notice
from nphcli.experiments.mil_config import PRESETS, MILConfig, Variant, chosen_variants, configure  # noqa: F401  (PRESETS, configure: re-exported)
from nphcli.experiments.mil_results import (  # noqa: F401  (re-exported for `nph mil`)
    plot_results,
    read_results,
    summarise,
    summary_json,
    write_results,
)
from nphcli.experiments.presets import run_seed
from nphcli.layers import NPHPooling
from nphcli.models import create_model


class MILNet(nn.Module):
    """Embed each digit, pool the bag with `NPHPooling`, classify (one logit per bag)."""

    def __init__(self, config: MILConfig, variant: Variant, in_dim: int = 784) -> None:
        super().__init__()
        self.embed = nn.Linear(in_dim, config.embed_dim)
        self.norm_in = nn.LayerNorm(config.embed_dim)
        self.pool = NPHPooling(
            config.embed_dim,
            prototypes=config.prototypes,
            rule=create_model(variant.model, beta=config.beta, **variant.params),
            heads=config.heads,
            head_dim=config.head_dim,
        )
        self.norm_out = nn.LayerNorm(config.embed_dim)
        self.classify = nn.Linear(config.prototypes * config.embed_dim, 1)

    def forward(self, digits: Tensor, bags: Tensor) -> Tensor:
        """digits (P, 784) a pool, bags (B, M) indices into it -> logits (B,).

        When the batch holds more instances than the pool, the pool is embedded once and
        gathered: the same function of the weights, for less work."""
        if bags.numel() > digits.shape[0]:
            embedded = self.norm_in(F.relu(self.embed(digits)))[bags]  # (B, M, D)
        else:
            embedded = self.norm_in(F.relu(self.embed(digits[bags])))  # (B, M, D)
        pooled = self.pool(embedded)  # (B, S, D)
        return self.classify(self.norm_out(pooled).flatten(1)).squeeze(1)  # (B,)


def load_pools(root: Path | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, str]:
    """Train and test digits (P, 784) in [0, 1] with labels (P,), and where they came from.

    MNIST's own train and test splits when the full dataset is on disk, else the bundled 5,000
    training digits split into disjoint pools: the first 4,000 train, the last 1,000 test."""
    from nphcli.sources import SourceOptions, load_source

    train = load_source("mnist", SourceOptions(split="train", root=root))
    if not train.meta.get("fallback"):
        test = load_source("mnist", SourceOptions(split="test", root=root))
        origin = "MNIST train / test splits"
        pools = (train.patterns, train.labels, test.patterns, test.labels)
    else:
        cut = train.patterns.shape[0] * 4 // 5
        origin = f"bundled MNIST sample: {cut} train / {train.patterns.shape[0] - cut} test digits"
        pools = (train.patterns[:cut], train.labels[:cut], train.patterns[cut:], train.labels[cut:])
    train_x, train_y, test_x, test_y = pools
    return train_x / 255, train_y, test_x / 255, test_y, origin


def make_bags(
    labels: Tensor, count: int, bag_size: int, signal: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """`count` bags (count, M) of pool indices and their labels (count,) in {0, 1}: the first
    half positive (one signal digit at a random place), the rest negative, then shuffled."""
    signal_index = torch.nonzero(labels == signal).squeeze(1)  # (S,)
    other_index = torch.nonzero(labels != signal).squeeze(1)  # (O,)
    if signal_index.numel() == 0 or other_index.numel() < bag_size:
        raise NphError(f"the digit pool has too few digits for bags of {bag_size}")
    picks = torch.randint(other_index.numel(), (count, bag_size), generator=generator)
    bags = other_index[picks]  # (count, M)
    positive = torch.arange(count) < (count + 1) // 2  # (count,)
    places = torch.randint(bag_size, (count,), generator=generator)
    signals = signal_index[torch.randint(signal_index.numel(), (count,), generator=generator)]
    rows = torch.nonzero(positive).squeeze(1)
    bags[rows, places[rows]] = signals[rows]
    order = torch.randperm(count, generator=generator)
    return bags[order], positive[order].to(torch.float32)


def train_one(
    config: MILConfig,
    variant: Variant,
    bag_size: int,
    run: int,
    pools: tuple[Tensor, Tensor, Tensor, Tensor],
    *,
    seed: int = 0,
    on_epoch: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Train one network; one record per epoch (train loss and accuracy as measured during the
    epoch, test loss and accuracy after it)."""
    train_x, train_y, test_x, test_y = pools
    generator = torch.Generator().manual_seed(run_seed(seed, run, bag_size))
    train_bags, train_labels = make_bags(
        train_y, config.train_bags, bag_size, config.signal, generator
    )
    test_bags, test_labels = make_bags(test_y, config.test_bags, bag_size, config.signal, generator)
    with torch.random.fork_rng(devices=[]):  # nn init draws from the global RNG: contain it
        torch.manual_seed(run_seed(seed, run, bag_size))
        net = MILNet(config, variant, in_dim=train_x.shape[1])
    optimiser = torch.optim.AdamW(net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    steps_per_epoch = math.ceil(config.train_bags / config.batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimiser, T_max=config.epochs * steps_per_epoch
    )
    records = []
    for epoch in range(1, config.epochs + 1):
        started = time.perf_counter()
        net.train()
        loss_sum = correct = 0.0
        batches = torch.randperm(config.train_bags, generator=generator).split(config.batch_size)
        for batch in batches:
            logits = net(train_x, train_bags[batch])  # (b,)
            loss = F.binary_cross_entropy_with_logits(logits, train_labels[batch])
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            schedule.step()
            loss_sum += float(loss.detach()) * batch.numel()
            correct += float(((logits > 0).float() == train_labels[batch]).sum())
        test_loss, test_accuracy = evaluate(net, test_x, test_bags, test_labels, config.batch_size)
        records.append(
            {
                "model": variant.label,
                "bag_size": bag_size,
                "run": run,
                "epoch": epoch,
                "train_loss": loss_sum / config.train_bags,
                "train_accuracy": correct / config.train_bags,
                "test_loss": test_loss,
                "test_accuracy": test_accuracy,
                "seconds": time.perf_counter() - started,
            }
        )
        if on_epoch is not None:
            on_epoch(epoch)
    return records


@torch.no_grad()
def evaluate(
    net: MILNet, digits: Tensor, bags: Tensor, labels: Tensor, batch_size: int
) -> tuple[float, float]:
    """Mean binary cross-entropy and accuracy of `net` on the bags."""
    net.eval()
    loss = correct = 0.0
    for rows in torch.arange(bags.shape[0]).split(batch_size):
        logits = net(digits, bags[rows])
        loss += float(F.binary_cross_entropy_with_logits(logits, labels[rows], reduction="sum"))
        correct += float(((logits > 0).float() == labels[rows]).sum())
    return loss / bags.shape[0], correct / bags.shape[0]


def run_experiment(
    config: MILConfig,
    out: str | os.PathLike,
    *,
    seed: int = 0,
    resume: bool = False,
    root: Path | None = None,
    progress: Callable[..., None] | None = None,
) -> list[dict[str, Any]]:
    """Train every (variant, bag size, run) of `config`, writing records to `out` (JSON Lines)
    after each training run. With `resume`, runs already complete in `out` are kept and skipped;
    without it an existing `out` is an error. `progress`, if given, is called as
    progress(total epochs) once and progress(None, label) after each epoch."""
    out = Path(out)
    if out.exists() and not resume:
        raise NphError(f"{out} already exists; pass --resume to continue it or choose --out")
    variants = chosen_variants(config)
    records = read_results(out) if resume else []
    done = {
        (r["model"], r["bag_size"], r["run"])
        for r in records
        if r["epoch"] == config.epochs  # a run is complete once its last epoch is written
    }
    records = [r for r in records if (r["model"], r["bag_size"], r["run"]) in done]
    jobs = [
        (variant, size, run)
        for run in range(config.runs)
        for size in config.bag_sizes
        for variant in variants
        if (variant.label, size, run) not in done
    ]
    *pools, origin = load_pools(root)
    notice(f"MIL on {origin}: {len(jobs)} training runs of {config.epochs} epochs to do")
    tick = progress or (lambda *_: None)
    tick(len(jobs) * config.epochs)
    for variant, size, run in jobs:
        label = f"{variant.label} M={size} run {run}"
        on_epoch = lambda _, label=label: tick(None, label)  # noqa: E731
        records += train_one(config, variant, size, run, tuple(pools), seed=seed, on_epoch=on_epoch)
        write_results(out, records)
    return records
