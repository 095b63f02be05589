"""The paper's time-series efficiency figure: seconds per training epoch of the time-series
network (`nphcli.experiments.timeseries_model`) per model on ETTh1, for each horizon (= input
length), with each model's ratio to dense measured in the same run.

    python benchmarks/timeseries_epoch.py ETTh1.csv --horizons 96,192,336 --steps 10 \
        --out benchmarks/results/timeseries-epoch-ci-2core.json --plot docs/img/timeseries-epoch.png

An epoch is timed on a freshly built network after one untimed warm-up step; with `--steps` only
its first N batches are timed and the time is scaled to all of its batches (the result says how
many were measured). `--repeats` averages several epochs, each on its own network.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit, provenance  # noqa: E402

from nphcli.core.errors import NphError  # noqa: E402
from nphcli.experiments.presets import run_seed  # noqa: E402
from nphcli.experiments.timeseries import prepare, read_series  # noqa: E402
from nphcli.experiments.timeseries_config import (  # noqa: E402
    TSConfig,
    chosen_variants,
    configure,  # noqa: E402
)
from nphcli.experiments.timeseries_run import build_net, train_epoch  # noqa: E402


def epoch_times(
    config: TSConfig, data: str | Path, *, steps: int | None = None, repeats: int = 1, seed: int = 0
) -> list[dict[str, Any]]:
    """Seconds per training epoch of every (variant, horizon) of `config` on `data` (the paper's
    efficiency figure): each epoch on a freshly built network after one untimed warm-up step;
    the models take turns within each repeat, so a busy spell of the machine falls on all of
    them alike. With `steps`, an epoch is timed over its first `steps` batches and scaled to all
    of its batches (`measured_steps` says so). Per row: the mean and the fastest of `repeats`."""
    series = read_series(data, config.target)
    variants = chosen_variants(config)
    rows = []
    for horizon in config.horizons:
        x, y = prepare(series, input_len=horizon, horizon=horizon, split=config.split).parts[
            "train"
        ]
        batches = math.ceil(x.shape[0] / config.batch_size)
        timed = batches if steps is None else min(steps, batches)
        seconds: dict[str, list[float]] = {v.label: [] for v in variants}
        for repeat in range(repeats):
            for variant in variants:
                net = build_net(config, variant, horizon, run_seed(seed, repeat, horizon))
                optimiser = torch.optim.AdamW(net.parameters(), lr=config.lr)
                generator = torch.Generator().manual_seed(run_seed(seed, repeat, horizon))
                train_epoch(net, optimiser, x, y, config, generator, steps=1)  # warm-up
                started = time.perf_counter()
                train_epoch(net, optimiser, x, y, config, generator, steps=timed)
                seconds[variant.label].append((time.perf_counter() - started) * batches / timed)
        rows += [
            {
                "model": label,
                "horizon": horizon,
                "seconds_per_epoch": sum(times) / repeats,
                "fastest_seconds_per_epoch": min(times),
                "repeats": repeats,
                "steps_per_epoch": batches,
                "measured_steps": timed,
            }
            for label, times in seconds.items()
        ]
    return rows


def plot(rows: list[dict], path: str, title: str) -> None:
    """Seconds per epoch against the horizon, one line per model (log scale)."""
    from nphcli.presentation.plot import _matplotlib

    figure_cls, canvas_cls = _matplotlib()
    figure = figure_cls(figsize=(7.5, 4.5), layout="constrained")
    canvas_cls(figure)
    axes = figure.subplots()
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        axes.plot(
            [r["horizon"] for r in mine], [r["seconds_per_epoch"] for r in mine], "o-", label=model
        )
    axes.set_xlabel("horizon = input length (time steps)")
    axes.set_ylabel("seconds per training epoch")
    axes.set_yscale("log")
    axes.set_xticks(sorted({r["horizon"] for r in rows}))
    axes.legend(fontsize=8)
    axes.set_title(title, fontsize=9)
    figure.savefig(path, format="png", dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="the ETTh1 CSV file")
    parser.add_argument("--horizons", default="96,192,336,720")
    parser.add_argument("--models", default=None)
    parser.add_argument("--steps", type=int, default=None, help="batches timed per epoch")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--machine", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    try:
        config = configure("paper", horizons=args.horizons, models=args.models)
        load = os.getloadavg()[0]
        started = time.perf_counter()
        rows: list[dict] = []
        for horizon in config.horizons:  # written after each horizon: a stopped run keeps them
            one = replace(config, horizons=(horizon,))
            rows += with_ratios(epoch_times(one, args.data, steps=args.steps, repeats=args.repeats))
            result = {
                "benchmark": "timeseries_epoch",
                **provenance(args.machine),
                "data": Path(args.data).name,
                "batch_size": config.batch_size,
                "d_model": config.d_model,
                "heads": config.heads,
                "steps": args.steps,
                "repeats": args.repeats,
                "load_average_before": round(load, 2),
                "load_average_after": round(os.getloadavg()[0], 2),
                "wall_seconds": round(time.perf_counter() - started, 1),
                "rows": rows,
            }
            if args.out:
                Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    except NphError as error:
        sys.stderr.write(f"Error: {error}\n")
        raise SystemExit(2) from None
    emit(result, args.out)
    if args.plot:
        plot(
            rows,
            args.plot,
            f"time per epoch, {result['data']}, {result['machine']}, "
            f"{args.threads} thread(s), batch {config.batch_size}",
        )


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row's time over dense's at the same horizon (mean and fastest), same run."""
    dense = {r["horizon"]: r for r in rows if r["model"] == "dense"}
    for r in rows:
        if r["horizon"] in dense:
            base = dense[r["horizon"]]
            r["ratio_to_dense"] = r["seconds_per_epoch"] / base["seconds_per_epoch"]
            r["fastest_ratio_to_dense"] = (
                r["fastest_seconds_per_epoch"] / base["fastest_seconds_per_epoch"]
            )
    return rows


if __name__ == "__main__":
    main()
