"""The MIL experiment's results: the JSON Lines file, the per-model summary and the plot.

Kept apart from the training loop so that reading, summarising and drawing a finished results
file needs no network code.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from nphcli.core.atomic import atomic_write
from nphcli.experiments.records import read_records, write_records


def read_results(path: Path) -> list[dict[str, Any]]:
    """The records of a results file (none if it does not exist)."""
    return read_records(path, "MIL results")


write_results = write_records


def summarise(records: list[dict[str, Any]]) -> dict[str, dict[int, tuple[float, float, int]]]:
    """Final-epoch test accuracy per model and bag size: (mean, std over runs, runs)."""
    last = max((r["epoch"] for r in records), default=0)
    table: dict[str, dict[int, list[float]]] = {}
    for r in records:
        if r["epoch"] == last:
            cell = table.setdefault(r["model"], {}).setdefault(r["bag_size"], [])
            cell.append(r["test_accuracy"])
    return {
        model: {size: _mean_std(values) for size, values in sorted(sizes.items())}
        for model, sizes in table.items()
    }


def _mean_std(values: list[float]) -> tuple[float, float, int]:
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)), len(values)


def plot_results(
    records: list[dict[str, Any]], path: str | os.PathLike, *, convergence_bag_size: int = 50
) -> None:
    """Three panels: final test accuracy vs bag size per model, then training loss and test
    accuracy per epoch at `convergence_bag_size` (means over runs). Training loss shows how fast a
    rule learns; test loss would mostly show over-confidence once it has. Written atomically."""
    from nphcli.presentation.plot import _matplotlib  # optional: imported where needed

    figure_cls, canvas_cls = _matplotlib()
    figure = figure_cls(figsize=(16, 4.5))
    canvas_cls(figure)
    accuracy, loss, test = figure.subplots(1, 3)
    for model, sizes in summarise(records).items():
        xs = list(sizes)
        means = [sizes[x][0] for x in xs]
        stds = [sizes[x][1] for x in xs]
        accuracy.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=model)
        for axes, key in ((loss, "train_loss"), (test, "test_accuracy")):
            epochs, values = _curve(records, model, convergence_bag_size, key)
            if epochs:
                axes.plot(epochs, values, label=model)
    accuracy.set(xlabel="bag size M", ylabel="test accuracy (final epoch)", title="MNIST bags")
    at = f"at bag size {convergence_bag_size}"
    loss.set(xlabel="epoch", ylabel="training loss", title=f"convergence {at}")
    test.set(xlabel="epoch", ylabel="test accuracy", title=f"test accuracy {at}")
    for axes in (accuracy, loss, test):
        axes.legend(fontsize=8)
    figure.tight_layout()
    with atomic_write(path, force=True) as tmp:
        figure.savefig(tmp, format="png", dpi=100)


def _curve(
    records: list[dict[str, Any]], model: str, bag_size: int, key: str
) -> tuple[list[int], list[float]]:
    """Epochs and the mean of `key` over runs, for one model and bag size."""
    by_epoch: dict[int, list[float]] = {}
    for r in records:
        if r["model"] == model and r["bag_size"] == bag_size:
            by_epoch.setdefault(r["epoch"], []).append(r[key])
    epochs = sorted(by_epoch)
    return epochs, [sum(by_epoch[e]) / len(by_epoch[e]) for e in epochs]


def summary_json(summary: dict[str, dict[int, tuple[float, float, int]]]) -> dict[str, Any]:
    """`summarise`'s table as JSON-ready dicts."""
    return {
        "final_test_accuracy": {
            model: {str(size): {"mean": m, "std": s, "runs": n} for size, (m, s, n) in row.items()}
            for model, row in summary.items()
        }
    }
