"""`nph sweep`: run a grid of retrieval evaluations and summarise it; `nph plot`: draw results.

Parsing and rendering only; `nphcli.sweeps` and `nphcli.plot` do the work.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated

import typer

from nphcli.cli.app import app, quiet
from nphcli.cli.options import JsonOutput
from nphcli.cli.render import format_value, print_json, print_table, stderr_console
from nphcli.sweeps.config import list_presets

DEFAULT_OUT = Path("sweep.jsonl")


def _preset_help() -> str:
    return (
        f"A shipped grid: {', '.join(list_presets())} (the paper's experiments; "
        "--print-config shows one to copy and edit)."
    )


@app.command("sweep")
def sweep_command(
    preset: Annotated[str | None, typer.Option("--preset", help=_preset_help())] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", help='A sweep grid in the presets\' TOML format (README, "Sweeps").'
        ),
    ] = None,
    print_config: Annotated[
        bool,
        typer.Option(
            "--print-config", help="Print the --preset or --config file and exit, to copy it."
        ),
    ] = False,
    dataset: Annotated[
        str | None,
        typer.Option(
            "--dataset",
            help="mnist, cifar10, fashion-mnist, random, or a file `nph store` reads; memories "
            "are drawn from it [default: the grid's, else mnist].",
        ),
    ] = None,
    models: Annotated[
        str | None,
        typer.Option(
            "--models",
            help="Models and parameter values, e.g. dense,sparse,topk:k=0.2/0.5/0.8 "
            "(replaces the grid's models) [default: dense].",
        ),
    ] = None,
    sizes: Annotated[
        str | None,
        typer.Option("--sizes", help="Memory sizes M, e.g. 10,50,100 [default: 100]."),
    ] = None,
    trials: Annotated[
        int | None,
        typer.Option("--trials", help="Memories drawn per size, each a trial [default: 1]."),
    ] = None,
    beta: Annotated[
        str | None,
        typer.Option("--beta", help="Inverse temperatures β, e.g. 0.01,0.1 [default: 0.3]."),
    ] = None,
    mask: Annotated[
        str | None,
        typer.Option("--mask", help="Fractions of each query hidden, e.g. 0,0.5 [default: 0]."),
    ] = None,
    mask_mode: Annotated[
        str | None,
        typer.Option(
            "--mask-mode",
            help="bottom, top, left, right (images) or random, as in nph retrieve.",
        ),
    ] = None,
    noise: Annotated[
        str | None,
        typer.Option(
            "--noise",
            help="Gaussian noise standard deviations σ, e.g. 0.1,0.5 (a variance v is √v) "
            "[default: 0].",
        ),
    ] = None,
    noise_clip: Annotated[
        bool | None,
        typer.Option(
            "--noise-clip",
            help="Clamp noisy queries to [0, 1] after the noise, as the paper's released code "
            "does (config key noise_clip) [default: no].",
        ),
    ] = None,
    queries: Annotated[
        int | None,
        typer.Option("--queries", help="Queries per run [default: every stored pattern]."),
    ] = None,
    normalize: Annotated[
        str | None,
        typer.Option("--normalize", help="unit, centered, zscore, l2 or none, as in nph store."),
    ] = None,
    root: Annotated[
        Path | None,
        typer.Option("--root", help="Dataset root folder, as in nph store."),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed",
            help="The sweep's one seed; memories and corruptions derive from it and the trial "
            'number (README, "Sweeps") [default: 0].',
        ),
    ] = None,
    out: Annotated[
        Path,
        typer.Option("--out", help="Results file, one row per run: .jsonl (JSON Lines) or .csv."),
    ] = DEFAULT_OUT,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Continue --out: skip the runs already in it."),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Replace an existing --out (and --plot); the old file stays until the sweep "
            "completes.",
        ),
    ] = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Also draw mean SSE against the varying axis to this file (.png, .svg or .pdf).",
        ),
    ] = None,
    theory: Annotated[
        bool,
        typer.Option(
            "--theory",
            help="Add the paper's §4 checks to every row (separation, Theorem 4.1 bound, "
            'Corollary 4.1; README, "Sweeps").',
        ),
    ] = False,
    device: Annotated[
        str | None, typer.Option("--device", help="cpu, cuda, cuda:N, mps or auto.")
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option("--dtype", help="float32, float16, bfloat16 or float64 [default: float32]."),
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads",
            help="CPU threads for torch [default: torch's]; 1 is often fastest for the small "
            "memories of a sweep, and on a busy machine.",
        ),
    ] = None,
    as_json: JsonOutput = False,
) -> None:
    """Run a grid of retrievals: models × memory sizes × masks × noise × β, over trials.

    Each trial draws fresh memories from the dataset; every run is one `nph retrieve`
    self-evaluation. Rows are appended to --out as they finish; the summary (mean ± std over
    trials per setting) goes to stdout. Options override the --preset or --config grid.
    """
    from nphcli.atomic import check_not_input, check_writable
    from nphcli.errors import NphError
    from nphcli.sweeps import config as sweep_config

    if print_config:
        _print_config(preset, config)
        return
    data, origin = sweep_config.load(preset, config)
    overrides = _overrides(SimpleNamespace(**locals()))
    grid = sweep_config.resolve(data, origin, overrides)
    inputs = [path for path in (grid.dataset, config) if path is not None and Path(path).exists()]
    for written in (out, plot):
        if written is not None:
            check_not_input(written, inputs)
    if plot is not None:
        if plot.resolve() == out.resolve():
            raise NphError("--out and --plot name the same file")
        check_writable(plot, force=force)
        from nphcli.plot import check_plot_output

        check_plot_output(plot)  # matplotlib present, format known: before the grid runs

    from nphcli.sweeps.results import Results
    from nphcli.sweeps.runner import execute
    from nphcli.sweeps.summary import summarize_settings

    if threads is not None:
        if threads < 1:
            raise NphError(f"--threads must be ≥ 1, got {threads}")
        import torch

        torch.set_num_threads(threads)
    results = Results(out, resume=resume, force=force)
    with _Progress() as progress:
        outcome = execute(grid, results, theory=theory, progress=progress)
    summary = summarize_settings(outcome.rows, outcome.settings)
    if plot is not None:
        from nphcli.plot import plot_results

        keys = {s.key for s in outcome.settings}
        plot_results([row for row in outcome.rows if row.get("setting") in keys], plot, force=force)
    if as_json:
        print_json(
            {
                "config": grid.to_dict(),
                "results": str(out),
                "plot": None if plot is None else str(plot),
                "runs": {
                    "total": outcome.ran + outcome.skipped,
                    "ran": outcome.ran,
                    "skipped": outcome.skipped,
                },
                "wall_s": outcome.wall_s,
                "threads": threads,
                "summary": [row.to_json() for row in summary],
            }
        )
        return
    _print_summary(summary, theory=theory, title=f"Sweep summary ({out}, mean ± std over trials)")


def _print_config(preset: str | None, config: Path | None) -> None:
    """--print-config: the preset's or the config file's text, as the sweep would read it."""
    from nphcli.errors import NphError
    from nphcli.sweeps import config as sweep_config

    if preset is None and config is None:
        raise NphError("--print-config shows a --preset or --config file; name one")
    if preset is not None and config is not None:
        raise NphError("choose one of --preset and --config")
    text = (
        sweep_config.preset_text(preset) if preset is not None else sweep_config.config_text(config)
    )
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _overrides(opts) -> dict:
    """The grid keys the command line sets (None: keep the preset's or config's value)."""
    from nphcli.sweeps.parsing import parse_list

    def numbers(text, flag, kind):
        return None if text is None else parse_list(text, flag, kind)

    return {
        "dataset": opts.dataset,
        "models": opts.models,
        "sizes": numbers(opts.sizes, "--sizes", int),
        "trials": opts.trials,
        "beta": numbers(opts.beta, "--beta", float),
        "mask": numbers(opts.mask, "--mask", float),
        "mask_mode": opts.mask_mode,
        "noise": numbers(opts.noise, "--noise", float),
        "noise_clip": opts.noise_clip or None,
        "queries": opts.queries,
        "normalize": opts.normalize,
        "root": opts.root,
        "seed": opts.seed,
        "device": opts.device,
        "dtype": opts.dtype,
    }


def _print_summary(summary, *, theory: bool, title: str) -> None:
    """One row per setting. Grid axes with a single value go into the title, not a column."""
    axes = [("M", "size"), ("mask", "mask"), ("noise σ", "noise"), ("β", "beta")]
    varying = [
        (name, attr) for name, attr in axes if len({getattr(i.setting, attr) for i in summary}) > 1
    ]
    fixed = [
        f"{name} {format_value(getattr(summary[0].setting, attr))}"
        for name, attr in axes
        if (name, attr) not in varying and summary
    ]
    columns = ["model setting", *(name for name, _ in varying), "trials", "SSE", "success"]
    columns.append("µs/query")
    if theory:
        columns += ["Thm 4.1 premises", "Thm 4.1 support", "Cor 4.1"]
    rows = []
    for item in summary:
        s = item.setting
        row = [s.label, *(getattr(s, attr) for _, attr in varying), item.trials]
        row += [_pm(item.metrics.get("sse")), _pm(item.metrics.get("success")), item.us_per_query]
        if theory:
            t = item.theory
            row += [
                _ratio(t.get("stated_holds_premises"), t.get("premises")),
                _ratio(t.get("stated_holds"), t.get("in_support")),
                _ratio(t.get("corollary_holds"), t.get("in_support")),
            ]
        rows.append(row)
    if fixed:
        title = f"{title}; {', '.join(fixed)}"
    print_table(title, columns, rows, width=160)


def _pm(stats) -> str:
    if not stats:
        return ""
    return f"{format_value(stats['mean'])} ± {format_value(stats['std'])}"


def _ratio(holds, of) -> str:
    if holds is None or of is None:
        return "n/a"
    return f"{holds}/{of}"


class _Progress:
    """A rich progress bar with ETA on stderr, only when stderr is a terminal; else silent."""

    def __init__(self) -> None:
        self._bar = None
        self._task = None

    def __enter__(self) -> _Progress:
        if sys.stderr.isatty() and not quiet():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("sweep"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=stderr_console(),
                transient=True,
            )
            self._bar.__enter__()
        return self

    def __call__(self, total: int | None) -> None:
        if self._bar is None:
            return
        if self._task is None:
            self._task = self._bar.add_task("sweep", total=total)
        else:
            self._bar.advance(self._task)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
