"""The paper's MIL benchmark on real bags (Table "mil_benchmark"), on nph's layers: the released
model's network (`NETWORK`, `PaperMILNet`), Adam on binary cross-entropy with cosine decay and
gradients clipped to norm 1, the checkpoint of the highest validation ROC-AUC tested (ties broken
by the lower validation loss: on UCSB's ~5 validation bags most epochs tie at AUC 1), features
standardised by the training instances (raw UCSB features run into the thousands). The protocol
(folds, seeds, search) is `mil_protocol`'s; each choice and its source: docs/paper-tables.md.

Every training is one line of `runs.jsonl` in the results folder, keyed by (data set, model,
seed, fold, hyper-parameters) and appended as soon as it ends, so an interrupted run continues
where it stopped; runs on the same folder (one per data set, say) share it.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own convention)
from torch import Tensor, nn

from nphcli.core.errors import NphError
from nphcli.core.jsontext import parse_json
from nphcli.experiments.datasets import MILData
from nphcli.experiments.mil_config import PAPER_MIL_MODELS, VARIANTS, Variant
from nphcli.experiments.mil_protocol import (
    Hyper,
    Protocol,
    roc_auc,
    search_draws,
    stratified_folds,
    stratified_holdout,
)
from nphcli.experiments.presets import chosen
from nphcli.layers import NPHPooling
from nphcli.models import create_model
from nphcli.version import __version__


def variant(label: str) -> Variant:
    """The paper's MIL model called `label` (one of PAPER_MIL_MODELS)."""
    (found,) = chosen([v for v in VARIANTS if v.label in PAPER_MIL_MODELS], [label], "MIL model")
    return found


# What a record's network was (part of its key, so that runs of an earlier network are not
# mixed in): the released model's layer norms, GELU, clipping and cosine schedule.
NETWORK = "layernorm-gelu-clip1-cosine"


class PaperMILNet(nn.Module):
    """Embedding → LayerNorm → bag dropout → NPHPooling → GELU → LayerNorm → bag dropout →
    linear: one logit per bag."""

    def __init__(self, in_dim: int, hyper: Hyper, model: Variant, *, seed: int = 0) -> None:
        super().__init__()
        if hyper.width % hyper.heads:
            raise NphError(f"width {hyper.width} is not a multiple of {hyper.heads} heads")
        params = dict(model.params)
        if model.model == "random-feature":
            params["seed"] = seed  # its projection, drawn once from the run's seed
        self.embed = nn.Linear(in_dim, hyper.width)
        self.norm_embed, self.norm_pool = nn.LayerNorm(hyper.width), nn.LayerNorm(hyper.width)
        self.drop = nn.Dropout(hyper.dropout)
        self.pool = NPHPooling(
            hyper.width,
            rule=create_model(model.model, beta=hyper.beta, **params),
            heads=hyper.heads,
            head_dim=hyper.width // hyper.heads,
        )
        self.classify = nn.Linear(hyper.width, 1)

    def forward(self, bags: Tensor, padding: Tensor) -> Tensor:
        """bags (B, M, d) zero-padded, padding (B, M) True at padded rows -> logits (B,)."""
        embedded = self.drop(self.norm_embed(self.embed(bags)))  # (B, M, width)
        pooled = self.pool(embedded, key_padding_mask=padding)[:, 0]  # (B, width)
        return self.classify(self.drop(self.norm_pool(F.gelu(pooled)))).squeeze(1)  # (B,)


class Bags:
    """All bags padded once (N, M_max, d) with their mask; a batch is cut to its longest bag."""

    def __init__(self, data: MILData) -> None:
        self.sizes = torch.tensor([b.shape[0] for b in data.bags])  # (N,)
        if int(self.sizes.min()) < 1:
            raise NphError("a bag has no instances")
        width = int(self.sizes.max())
        self.x = torch.zeros(len(data.bags), width, data.bags[0].shape[1])  # (N, M_max, d)
        for i, bag in enumerate(data.bags):
            self.x[i, : bag.shape[0]] = bag
        self.padding = torch.arange(width)[None, :] >= self.sizes[:, None]  # (N, M_max)
        self.labels = data.labels

    def standardised(self, train: Tensor) -> Bags:
        """A copy with features standardised by the instances of bags `train`."""
        rows = self.x[train][~self.padding[train]]  # (n, d) real instances only
        mean, std = rows.mean(0), rows.std(0).clamp(min=1e-6)
        out = copy.copy(self)
        out.x = ((self.x - mean) / std).masked_fill(self.padding[..., None], 0.0)
        return out

    def batch(self, index: Tensor) -> tuple[Tensor, Tensor]:
        width = int(self.sizes[index].max())
        return self.x[index, :width], self.padding[index, :width]  # (b, m, d), (b, m)


def _scores(net: PaperMILNet, bags: Bags, index: Tensor) -> Tensor:
    net.eval()
    with torch.no_grad():
        return torch.cat([net(*bags.batch(part)) for part in index.split(64)])


def train_fold(
    bags: Bags, split: tuple[Tensor, Tensor, Tensor], hyper: Hyper, model: Variant, *,
    seed: int, epochs: int,
) -> dict[str, Any]:  # fmt: skip
    """Train on split[0], keep the epoch with the best AUC on split[1] (ties: the lower loss),
    test it on split[2]."""
    train, val, test = split
    bags = bags.standardised(train)
    with torch.random.fork_rng(devices=[]):  # init and dropout draw from the global RNG
        torch.manual_seed(seed)
        net = PaperMILNet(bags.x.shape[2], hyper, model, seed=seed)
        optimiser = torch.optim.Adam(net.parameters(), lr=hyper.lr, weight_decay=hyper.weight_decay)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=epochs)
        order = torch.Generator().manual_seed(seed)
        best, best_epoch, best_state = (-1.0, 0.0), 0, None
        for epoch in range(1, epochs + 1):
            net.train()
            shuffled = train[torch.randperm(train.numel(), generator=order)]
            for part in shuffled.split(hyper.batch_size):
                loss = F.binary_cross_entropy_with_logits(net(*bags.batch(part)), bags.labels[part])
                optimiser.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
                optimiser.step()
            schedule.step()
            scores = _scores(net, bags, val)
            loss = F.binary_cross_entropy_with_logits(scores, bags.labels[val])
            score = (roc_auc(scores, bags.labels[val]), -float(loss))
            if score > best:
                best, best_epoch = score, epoch
                best_state = copy.deepcopy(net.state_dict())
        net.load_state_dict(best_state)
        test_auc = roc_auc(_scores(net, bags, test), bags.labels[test])
    return {
        "val_auc": best[0],
        "val_loss": -best[1],
        "best_epoch": best_epoch,
        "test_auc": test_auc,
    }


def splits(labels: Tensor, protocol: Protocol, seed: int) -> list[tuple[Tensor, Tensor, Tensor]]:
    """(train, validation, test) bag indices of each fold of `seed`."""
    folds = stratified_folds(labels, protocol.folds, seed)
    everything = torch.arange(labels.numel())
    out = []
    for k, test in enumerate(folds):
        rest = everything[~torch.isin(everything, test)]
        train, val = stratified_holdout(rest, labels, protocol.validation, seed * 1_000 + k)
        out.append((train, val, test))
    return out


class RunLog:
    """runs.jsonl: one finished training a line; read back to skip what is done."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: dict[tuple, dict[str, Any]] = {}
        text = path.read_text() if path.exists() else ""
        if text and not text.endswith("\n"):  # a run killed mid-line: drop the cut line
            os.truncate(path, len(text[: text.rfind("\n") + 1].encode()))
            text = text[: text.rfind("\n") + 1]
        for number, line in enumerate(text.splitlines(), 1):
            try:
                record = parse_json(line, what=f"{path}, line {number}")  # bounded
                self.done[_key(record)] = record
            except (NphError, KeyError, TypeError):
                raise NphError(f"{path}, line {number}: not a MIL training record") from None

    def add(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as handle:  # one short line per append: a kill loses ≤ 1
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.done[_key(record)] = record


def _key(record: dict[str, Any]) -> tuple:
    hyper = Hyper(**record["hyper"]).key()
    where = (record["dataset"], record["model"], record["seed"], record["folds"], record["fold"])
    return (*where, hyper, record["epochs"], record["validation"], record.get("network"))


def _record(dataset: str, label: str, protocol: Protocol, seed: int, fold: int, hyper: Hyper):
    """What a training of the log is keyed by, before it has results."""
    return {
        "dataset": dataset, "model": label, "seed": seed, "folds": protocol.folds,
        "fold": fold, "hyper": json.loads(hyper.key()), "epochs": protocol.epochs,
        "validation": protocol.validation, "network": NETWORK,
    }  # fmt: skip


def _draws(protocol: Protocol, seed: int, fold: int) -> tuple[Hyper, ...]:
    """The hyper-parameters a fold of `seed` trains: the fixed point, or the search's draws."""
    if protocol.search == "fixed":
        return (protocol.fixed,)
    return search_draws(protocol.trials, seed=1 + seed * 1_000 + fold)


def train_record(record: dict[str, Any], bags: Bags, split: tuple, hyper: Hyper) -> dict:
    """`record` with the results of its training (a task of `parallel.run_tasks`)."""
    started = time.perf_counter()
    seed = record["seed"] * 1_000 + record["fold"]
    done = record | train_fold(
        bags, split, hyper, variant(record["model"]), seed=seed, epochs=record["epochs"]
    )
    return done | {"seconds": round(time.perf_counter() - started, 3)}


def _chosen(log: RunLog, dataset: str, label: str, protocol: Protocol, seed: int) -> list | None:
    """The chosen training of each fold of one model, data set and seed: the one with the best
    validation AUC, then the lower validation loss; None while one is missing from `log`."""
    chosen = []
    for fold in range(protocol.folds):
        draws = _draws(protocol, seed, fold)
        keys = [_key(_record(dataset, label, protocol, seed, fold, h)) for h in draws]
        records = [log.done.get(key) for key in keys]
        if any(r is None for r in records):
            return None
        chosen.append(max(records, key=lambda r: (r["val_auc"], -r.get("val_loss", 0.0))))
    return chosen


def bag_size_auc(bags: Bags, split: tuple[Tensor, Tensor, Tensor]) -> float:
    """The test AUC of a bag's size as its score (the trivial baseline: what a logit that
    depends only on the size can reach), its sign chosen on the training bags."""
    train, _, test = split
    sizes = bags.sizes.double()
    sign = 1.0 if roc_auc(sizes[train], bags.labels[train]) >= 0.5 else -1.0
    return roc_auc(sign * sizes[test], bags.labels[test])


def run(
    protocol: Protocol,
    data: str | os.PathLike,
    out: str | os.PathLike,
    *,
    datasets: Iterable[str] | None = None,
    models: Iterable[str] = PAPER_MIL_MODELS,
    train: bool = True,
    progress: Callable[..., None] | None = None,
    jobs: int = 1,
    ray: str | None = None,
) -> tuple[dict[tuple[str, str], list[float]], dict[str, Any]]:
    """Run (or continue) `protocol`, logging every training in `out`/runs.jsonl as it ends
    (seed by seed with one job, so an interrupted run has whole seeds of every model), in
    `jobs` processes or on the Ray cluster `ray` (`parallel.run_tasks`). Without `train`, only
    reads the log. Without `datasets`, the paper's that `data` holds. Returns the per-seed test
    AUCs {(model, paper column): [mean over folds, one per seed finished]}, the bag-size
    baseline's beside them, and what they came from (data, protocol, counts, machine, seconds)."""
    from nphcli.experiments.mil_data import get_source, load_present
    from nphcli.experiments.parallel import run_tasks

    out = Path(out)
    if not out.is_dir() and (out.exists() or not out.resolve().parent.is_dir() or not train):
        raise NphError(f"results folder {out} does not exist, and cannot be created here")
    models = list(models)
    for label in models:
        variant(label)
    loaded = load_present(datasets, protocol.datasets, data)  # refuse a missing file first
    out.mkdir(exist_ok=True)
    log = RunLog(out / "runs.jsonl")
    bags = {name: Bags(mil) for name, mil in loaded.items()}
    folds = {
        (n, s): splits(b.labels, protocol, s)
        for n, b in bags.items()
        for s in range(protocol.seeds)
    }
    tasks = [
        (train_record, (record, bags[name], folds[name, seed][fold], hyper))
        for seed in range(protocol.seeds)
        for name in bags
        for label in models
        for fold in range(protocol.folds)
        for hyper in _draws(protocol, seed, fold)
        if _key(record := _record(name, label, protocol, seed, fold, hyper)) not in log.done
    ]
    tick = progress or (lambda *_: None)
    started = time.perf_counter()
    if train:
        tick(len(tasks))
        for _, record in run_tasks(tasks, jobs=jobs, ray=ray):
            log.add(record)
            tick(None, f"{record['dataset']} {record['model']} seed {record['seed']}")
    per_seed: dict[tuple[str, str], list[float]] = {}
    for (name, seed), split in folds.items():
        column = get_source(name).label
        sizes = [bag_size_auc(bags[name], fold) for fold in split]
        per_seed.setdefault(("bag-size", column), []).append(sum(sizes) / len(sizes))
        for label in models:
            if (picked := _chosen(log, name, label, protocol, seed)) is not None:
                mean = sum(r["test_auc"] for r in picked) / len(picked)
                per_seed.setdefault((label, column), []).append(mean)
    meta = _meta(protocol, models, loaded, log, time.perf_counter() - started)
    return per_seed, meta


def paper_cells(per_seed: dict[tuple[str, str], list[float]], models: list[str]):
    """The paper's table and the comparison cells of `run`'s per-seed AUCs, the bag-size
    baseline last: the paper's columns in its order, then data sets it does not print (Musk1,
    Musk2)."""
    from nphcli.experiments.paper_table import compare, get_table

    table = get_table("mil_benchmark")
    ran = {column for _, column in per_seed}
    columns = [c for c in table.columns if c in ran] + sorted(ran - set(table.columns))
    return table, compare(table, per_seed, rows=[*models, "bag-size"], columns=columns)


def _meta(protocol, models, loaded, log, seconds) -> dict[str, Any]:
    from dataclasses import asdict

    from nphcli.experiments.mil_data import check_statistics, content_hash, get_source, statistics

    names = ("instances", "features", "bags", "positive", "negative")
    return {
        "nph_version": __version__,
        "machine": machine(),
        "protocol": asdict(protocol),
        "models": models,
        "data": {
            get_source(n).label: {
                "statistics": dict(zip(names, statistics(d), strict=True)),
                "differs_from_paper": check_statistics(n, d),
                "content_sha256": content_hash(d),
            }
            for n, d in loaded.items()
        },
        "trainings_logged": len(log.done),
        "seconds_this_call": round(seconds, 1),
        "seconds_all_trainings": round(sum(r["seconds"] for r in log.done.values()), 1),
    }


def machine() -> dict[str, Any]:
    """The machine a result came from, in words and numbers."""
    import platform

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }
