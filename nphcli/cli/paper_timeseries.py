"""`nph paper timeseries`: the paper's table "mts-result" (univariate time-series prediction).

Parsing and rendering only; `nphcli.experiments.timeseries_run` does the work.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from nphcli.cli.field_options import own_values, with_fields
from nphcli.cli.paper import paper_app, paper_fields, render_comparison, wrote
from nphcli.cli.progress import ProgressBar
from nphcli.core.errors import NphError
from nphcli.experiments.timeseries_config import PRESETS, SPLITS, VARIANTS, TSConfig
from nphcli.schema.fields import get_field
from nphcli.schema.option import Field


def _grid(config: TSConfig) -> str:
    """A preset's grid as its help says it: horizons, runs, epochs."""
    horizons = ",".join(map(str, config.horizons))
    return f"horizons {horizons}, runs {config.runs}, epochs {config.epochs}"


# The grid's options take comma lists of their own, so they sit in a group whose values are
# not split into settings ("analysis"; the run and model groups are).
TS_FIELDS = (
    Field(
        "preset",
        "str",
        "quick",
        f"quick (a smoke test): {_grid(PRESETS['quick'])}; paper: {_grid(PRESETS['paper'])}.",
        group="analysis",
        choices=tuple(sorted(PRESETS)),
    ),
    Field(
        "dataset",
        "str",
        None,
        "The paper's name of the data (default: the file's stem).",
        group="input",
    ),
    Field(
        "models",
        "str",
        None,
        "Comma-separated subset of: " + ", ".join(v.label for v in VARIANTS) + ".",
        group="analysis",
    ),
    Field(
        "horizons",
        "str",
        None,
        "Comma-separated horizons (= input lengths), e.g. 96,192.",
        group="analysis",
    ),
    Field("epochs", "int", None, "Override the epochs.", group="analysis"),
    Field("runs", "int", None, "Override the runs per cell.", group="analysis"),
    Field(
        "target", "str", None, f"The predicted column (default {TSConfig.target}).", group="input"
    ),
    Field(
        "split",
        "str",
        None,
        "ratio (70/10/20 % of the rows: the paper's released code) or months (12/4/4 of 30 "
        f"days: Informer's) [default: {TSConfig.split}].",
        group="input",
        choices=SPLITS,
    ),
    *paper_fields("paper-results"),
    get_field("seed"),
    get_field("json"),
    get_field("threads"),
)
GRID = ("models", "horizons", "epochs", "runs", "target", "split")


@paper_app.command("timeseries")
@with_fields((), params=False, own=TS_FIELDS)
def timeseries_command(
    data: Annotated[Path, typer.Argument(help="CSV file: a date column, then numeric columns.")],
    *,
    given: dict[str, Any],
) -> None:
    """Train the paper's time-series network per model; print MSE / MAE beside the paper's."""
    from nphcli.app.threads import use_threads
    from nphcli.experiments import paper_files, paper_table, timeseries_run
    from nphcli.experiments.timeseries_config import configure

    o = own_values(given, TS_FIELDS)
    out, no_train, no_plot = o["out"], o["no_train"], o["no_plot"]
    use_threads(o["threads"])
    config = configure(o["preset"], **{name: o[name] for name in GRID})
    name = o["dataset"] or data.stem
    results, started = out / f"timeseries-{name}.jsonl", time.perf_counter()
    series, _, records = timeseries_run.finished_runs(config, data, results, seed=o["seed"])
    if no_train:
        if not records:
            raise NphError(f"{results} holds no finished runs; run without --no-train first")
    else:
        if out.exists() and not out.is_dir():
            raise NphError(f"--out {out} is a file; name a folder for the results")
        out.mkdir(parents=True, exist_ok=True)
        with ProgressBar("paper timeseries") as progress:
            records = timeseries_run.run_experiment(
                config, data, results, seed=o["seed"], resume=True, progress=progress,
                jobs=o["jobs"], ray=o["ray"],
            )  # fmt: skip
    cells = timeseries_run.compare_with_paper(records, name, config, series)
    options = {k: o[k] for k in ("preset", *GRID, "seed")}
    meta = timeseries_run.comparison_meta(records, results, options, time.perf_counter() - started)
    table = paper_table.get_table("mts-result")
    wrote(paper_files.write_comparison(out, table, cells, meta, picture=not no_plot))
    render_comparison(table, cells, meta, as_json=o["json"])
