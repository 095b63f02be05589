"""Train and test the time-series network (`timeseries_model`) on one CSV file: the paper's table
"mts-result" (MSE and MAE per model and horizon, mean of runs) and its time per epoch.

One training run: AdamW, cosine decay, MSE on standardised values, gradients clipped; the test
MSE and MAE (means over every predicted value of every test window) of the epoch with the lowest
validation MSE (the released trainer's model selection). Seeded by (seed, run, horizon), so every
model of a run sees the same batches. Results are JSON Lines, one line per (model, horizon, run),
rewritten atomically after each run; `resume` skips the runs already written (and refuses a file
made with another protocol or data file).
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own convention)
from torch import Tensor

from nphcli.core.atomic import check_writable
from nphcli.core.errors import NphError
from nphcli.core.notices import notice
from nphcli.experiments.presets import run_seed
from nphcli.experiments.records import read_records, write_records
from nphcli.experiments.timeseries import Prepared, Series, baselines, prepare, read_series
from nphcli.experiments.timeseries_config import VARIANTS, TSConfig, Variant, chosen_variants
from nphcli.experiments.timeseries_model import TSNet
from nphcli.version import __version__

Progress = Callable[..., None]


def build_net(config: TSConfig, variant: Variant, horizon: int, seed: int) -> TSNet:
    with torch.random.fork_rng(devices=[]):  # nn init draws from the global RNG: contain it
        torch.manual_seed(seed)
        return TSNet(config, variant, horizon)


def train_one(
    config: TSConfig,
    variant: Variant,
    horizon: int,
    run: int,
    data: Prepared,
    seed: int = 0,
    on_epoch: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Train one network for `config.epochs`; its record (see the module docstring). Dropout
    draws from torch's global generator, seeded here for the run and restored after it, so a
    record does not depend on what the process trained before."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(run_seed(seed, run, horizon))
        x_train, y_train = data.parts["train"]
        generator = torch.Generator().manual_seed(run_seed(seed, run, horizon))
        net = build_net(config, variant, horizon, run_seed(seed, run, horizon))
        optimiser = torch.optim.AdamW(
            net.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=config.epochs)
        best, best_state, history = math.inf, None, []
        for epoch in range(1, config.epochs + 1):
            started = time.perf_counter()
            train_mse = train_epoch(net, optimiser, x_train, y_train, config, generator)
            seconds = time.perf_counter() - started
            schedule.step()
            val_mse, _ = evaluate(net, *data.parts["val"], config.batch_size)
            history.append(
                {"epoch": epoch, "train_mse": train_mse, "val_mse": val_mse, "seconds": seconds}
            )
            if val_mse < best:
                best, best_epoch = val_mse, epoch
                best_state = copy.deepcopy(net.state_dict())
            if on_epoch is not None:
                on_epoch(epoch)
        if best_state is None:
            raise NphError(
                f"{variant.label} (horizon {horizon}, run {run}) never reached a finite "
                "validation error"
            )
        net.load_state_dict(best_state)
        test_mse, test_mae = evaluate(net, *data.parts["test"], config.batch_size)
        return {
            "model": variant.label,
            "horizon": horizon,
            "run": run,
            "best_epoch": best_epoch,
            "val_mse": best,
            "test_mse": test_mse,
            "test_mae": test_mae,
            "seconds_per_epoch": sum(h["seconds"] for h in history) / len(history),
            "epochs": history,
        }


def train_epoch(
    net: TSNet,
    optimiser: torch.optim.Optimizer,
    x: Tensor,
    y: Tensor,
    config: TSConfig,
    generator: torch.Generator,
    *,
    steps: int | None = None,
) -> float:
    """One pass over the training windows in a seeded order (or its first `steps` batches);
    the mean training MSE."""
    net.train()
    loss_sum = seen = 0.0
    batches = torch.randperm(x.shape[0], generator=generator).split(config.batch_size)
    for rows in batches[:steps]:
        loss = F.mse_loss(net(x[rows]), y[rows])
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), config.clip)
        optimiser.step()
        loss_sum += float(loss.detach()) * rows.numel()
        seen += rows.numel()
    return loss_sum / seen


@torch.no_grad()
def evaluate(net: TSNet, x: Tensor, y: Tensor, batch_size: int) -> tuple[float, float]:
    """MSE and MAE over every predicted value of every window (inputs (N, L), targets (N, H))."""
    net.eval()
    squared = absolute = 0.0
    for rows in torch.arange(x.shape[0]).split(batch_size):
        error = (net(x[rows]) - y[rows]).double()  # (b, H)
        squared += float(error.square().sum())
        absolute += float(error.abs().sum())
    return squared / y.numel(), absolute / y.numel()


def protocol(config: TSConfig, series: Series, seed: int) -> dict[str, Any]:
    """What a record came from: the data file (name and hash), the protocol, nph's version."""
    return {
        "data": Path(series.path).name,
        "sha256": series.sha256,
        "config": {
            **asdict(config),
            "horizons": list(config.horizons),
            "variants": list(config.variants),
        },
        "dropout": {v.label: [v.dropout, v.pool_dropout] for v in VARIANTS if v.pool_dropout},
        "seed": seed,
        "nph": __version__,
    }


def read_results(path: Path) -> list[dict[str, Any]]:
    return read_records(path, "time-series results")


write_results = write_records


def _same_protocol(old: dict[str, Any], new: dict[str, Any]) -> bool:
    keep = ("horizons", "runs", "variants")  # the grid may grow on resume; the rest may not
    strip = lambda p: {**p, "config": {k: v for k, v in p["config"].items() if k not in keep}}  # noqa: E731
    return strip(old) == strip(new)


def finished_runs(
    config: TSConfig, data: str | Path, out: str | Path, *, seed: int = 0
) -> tuple[Series, dict[str, Any], list[dict[str, Any]]]:
    """The series of `data`, the protocol `config` makes on it, and the runs already in `out`
    (refused when they were made with another protocol or data file)."""
    series = read_series(data, config.target)
    made = protocol(config, series, seed)
    records = read_results(Path(out))
    for record in records:
        if not _same_protocol(record["protocol"], made):
            raise NphError(f"{out} was made with another protocol or data file; choose --out")
    return series, made, records


def run_experiment(
    config: TSConfig,
    data: str | Path,
    out: str | Path,
    *,
    seed: int = 0,
    resume: bool = False,
    progress: Progress | None = None,
    jobs: int = 1,
    ray: str | None = None,
) -> list[dict[str, Any]]:
    """Train every (variant, horizon, run) of `config` on the CSV file `data`, writing records
    to `out` (JSON Lines) after each training run, in `jobs` processes or on the Ray cluster
    `ray` (`parallel.run_tasks`): the file is the one a single process writes, new records in
    the grid's order after those already there. With `resume`, runs already in `out` are kept
    and skipped; without it an existing `out` is an error. `progress`, if given, is called as
    progress(total steps) once and progress(None, label) after each step: an epoch in one
    process, a training otherwise."""
    from nphcli.experiments.parallel import run_tasks

    out = Path(out)
    if out.exists() and not resume:
        raise NphError(f"{out} already exists; pass --resume to continue it or choose --out")
    check_writable(out, force=True)
    variants = chosen_variants(config)
    series, made, records = finished_runs(config, data, out, seed=seed)
    records = records if resume else []
    done = {(r["model"], r["horizon"], r["run"]) for r in records}
    todo = [
        (variant, horizon, run)
        for horizon in config.horizons
        for run in range(config.runs)
        for variant in variants
        if (variant.label, horizon, run) not in done
    ]
    prepared = {
        h: prepare(series, input_len=h, horizon=h, split=config.split)
        for h in sorted({h for _, h, _ in todo})
    }
    notice(
        f"time series {made['data']} ({config.target}, {config.split} split): "
        f"{len(todo)} training runs of {config.epochs} epochs to do"
    )
    tick = progress or (lambda *_: None)
    serial = jobs == 1 and ray is None
    tick(len(todo) * (config.epochs if serial else 1))

    def each_epoch(label: str) -> Callable[[int], None] | None:
        return (lambda _: tick(None, label)) if serial else None

    tasks = [
        (train_one, (config, v, h, r, prepared[h], seed, each_epoch(f"{v.label} H={h} run {r}")))
        for v, h, r in todo
    ]
    new: dict[int, dict[str, Any]] = {}
    for index, record in run_tasks(tasks, jobs=jobs, ray=ray):
        new[index] = {**record, "protocol": made}
        write_results(out, records + [new[i] for i in sorted(new)])
        if not serial:
            tick(None, f"{record['model']} H={record['horizon']} run {record['run']}")
    return records + [new[i] for i in sorted(new)]


def per_seed(records: list[dict[str, Any]], dataset: str) -> dict[tuple[str, str], list[float]]:
    """Test MSE and MAE of every run, keyed as the paper's table "mts-result" keys its cells:
    (model, "DATASET/HORIZON/MSE") and (model, "DATASET/HORIZON/MAE")."""
    from nphcli.experiments.paper_table import ts_column

    cells: dict[tuple[str, str], list[float]] = {}
    for r in records:
        for metric in ("MSE", "MAE"):
            key = (r["model"], ts_column(dataset, r["horizon"], metric))
            cells.setdefault(key, []).append(r[f"test_{metric.lower()}"])
    return cells


def compare_with_paper(
    records: list[dict[str, Any]], dataset: str, config: TSConfig, series: Series | None = None
) -> list:
    """The paper's table "mts-result" beside nph's runs: one `paper_table.Cell` per model of
    `config` and (horizon, metric) of `config`, over the runs of `config`'s grid (a results
    file may hold more), then the trivial predictors (`timeseries.baselines`) on `series`'s
    test windows when given. A data set or horizon the paper does not print has paper None."""
    from nphcli.experiments.paper_table import PAPER_TABLES, compare, ts_column

    mine = [r for r in records if r["run"] < config.runs and r["horizon"] in config.horizons]
    cells = per_seed(mine, dataset)
    rows = list(config.variants)
    for horizon in config.horizons if series is not None else ():
        data = prepare(series, input_len=horizon, horizon=horizon, split=config.split)
        for name, errors in baselines(data).items():
            for metric, value in zip(("MSE", "MAE"), errors, strict=True):
                cells[name, ts_column(dataset, horizon, metric)] = [value]
            rows += [name] if name not in rows else []
    columns = [ts_column(dataset, h, m) for h in config.horizons for m in ("MSE", "MAE")]
    return compare(PAPER_TABLES["mts-result"], cells, columns=columns, rows=rows)


def comparison_meta(
    records: list[dict[str, Any]], results: Path, options: dict[str, Any], seconds: float
) -> dict[str, Any]:
    """What a comparison came from: the options given, the results file, the runs' protocol
    (data file and hash, grid, seed, nph version), the machine and this call's wall time."""
    import platform

    return {
        "options": {k: v for k, v in options.items() if v is not None},
        "results": str(results),
        "runs_compared": len(records),
        "protocol": records[0]["protocol"],
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
        "wall_seconds_this_call": round(seconds, 1),
    }
