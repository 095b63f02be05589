"""`nph mil`: the paper's multiple-instance-learning experiment on MNIST bags.

Parsing and rendering only; `nphcli.experiments.mil` does the work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nphcli.cli.app import app
from nphcli.cli.options import Threads
from nphcli.cli.progress import ProgressBar
from nphcli.cli.render import print_json, print_table


@app.command("mil")
def mil_command(
    preset: Annotated[
        str,
        typer.Option(
            "--preset",
            help="quick: bag sizes 5-30, 20 epochs, 1 run (about 10 minutes on 2 CPU cores); "
            "paper: the paper's grid (days on a CPU).",
        ),
    ] = "quick",
    out: Annotated[Path, typer.Option("--out", help="Per-epoch results as JSON Lines.")] = Path(
        "mil.jsonl"
    ),
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Also draw accuracy vs bag size and convergence (PNG)."),
    ] = None,
    models: Annotated[
        str | None,
        typer.Option(
            "--models",
            help="Comma-separated subset of: dense, sparse, topk-20%, topk-50%, topk-80%, "
            "random-feature, random-masked, linear.",
        ),
    ] = None,
    bag_sizes: Annotated[
        str | None, typer.Option("--bag-sizes", help="Comma-separated bag sizes M.")
    ] = None,
    epochs: Annotated[int | None, typer.Option("--epochs", help="Override the epochs.")] = None,
    runs: Annotated[int | None, typer.Option("--runs", help="Override the runs per cell.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of bags, weights, batches.")] = 0,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue --out, skipping finished training runs.")
    ] = False,
    root: Annotated[
        Path | None,
        typer.Option("--root", help="MNIST root (else $NPH_DATA, else the bundled 5,000 digits)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    threads: Threads = None,
) -> None:
    """Train NPHPooling networks on MNIST bags; print final test accuracy per model and size.

    The paper's MIL table on real data sets (Elephant, UCSB, ...) is `nph paper mil`."""
    from nphcli.app.threads import use_threads
    from nphcli.experiments import mil

    use_threads(threads)
    config = mil.configure(preset, models=models, bag_sizes=bag_sizes, epochs=epochs, runs=runs)
    with ProgressBar("mil") as progress:
        records = mil.run_experiment(
            config, out, seed=seed, resume=resume, root=root, progress=progress
        )
    if plot is not None:
        mil.plot_results(records, plot, convergence_bag_size=config.convergence_bag_size)
    summary = mil.summarise(records)
    if as_json:
        print_json({"preset": preset, "results": str(out), **mil.summary_json(summary)})
        return
    sizes = sorted({size for row in summary.values() for size in row})
    rows = [
        (model, *(f"{row[s][0]:.3f}" if s in row else "" for s in sizes))
        for model, row in summary.items()
    ]
    print_table(
        "MIL test accuracy (final epoch, mean over runs)", ["model", *map(str, sizes)], rows
    )
