"""A whole `nph sweep`: the grid resolved, its outputs checked before any work, every run not
yet in the results file done, then the summary and the plot.

The command line only parses options into a `SweepRequest` and renders the `SweepReport`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nphcli.core.errors import NphError
from nphcli.schema.option import output_field_setting, setting
from nphcli.sweeps.config import list_presets

DEFAULT_OUT = Path("sweep.jsonl")
SWEEP_THREADS = 1  # torch threads of a sweep unless --threads or $NPH_THREADS says otherwise


@dataclass(frozen=True, kw_only=True)
class SweepRequest:
    """What `nph sweep` was asked for; the fields declared with `setting` are its own options."""

    preset: str | None = setting(
        None,
        f"A shipped grid: {', '.join(list_presets())} (the paper's experiments; "
        "--print-config shows one to copy and edit).",
        group="input",
    )
    config: Path | None = setting(
        None, 'A sweep grid in the presets\' TOML format (README, "Sweeps").', group="input"
    )
    root: Path | None = setting(None, "Dataset root folder, as in nph store.", group="input")
    out: Path = output_field_setting(
        "Results file, one row per run: .jsonl (JSON Lines) or .csv.", DEFAULT_OUT
    )
    resume: bool = setting(False, "Continue --out: skip the runs already in it.")
    force: bool = setting(
        False,
        "Replace an existing --out (and --plot); the old file stays until the sweep completes.",
    )
    plot: Path | None = setting(
        None, "Also draw mean SSE against the varying axis to this file (.png, .svg or .pdf)."
    )
    theory: bool = setting(
        False,
        "Add the paper's §4 checks to every row (separation, "
        'Theorem 4.1 bound, Corollary 4.1; README, "Sweeps").',
    )
    given: dict[str, Any] = field(default_factory=dict)  # keys given as options (file values)
    threads: int | None = None  # CPU threads for torch; None: $NPH_THREADS, else SWEEP_THREADS


@dataclass
class SweepReport:
    """What a sweep did: its grid, its runs and the per-setting summary."""

    request: SweepRequest
    outcome: Any  # nphcli.sweeps.runner.Outcome
    summary: list[Any]  # nphcli.sweeps.summary.SummaryRow, in grid order
    threads: int  # torch's CPU threads the runs used

    def to_json(self) -> dict[str, Any]:
        """The object of `nph sweep --json`."""
        outcome, request = self.outcome, self.request
        return {
            "config": outcome.config.to_dict(),
            "results": str(request.out),
            "plot": None if request.plot is None else str(request.plot),
            "runs": {
                "total": outcome.ran + outcome.skipped,
                "ran": outcome.ran,
                "skipped": outcome.skipped,
            },
            "wall_s": outcome.wall_s,
            "threads": self.threads,
            "summary": [row.to_json() for row in self.summary],
        }


def run_sweep(
    request: SweepRequest, progress: Callable[[int | None], None] | None = None
) -> SweepReport:
    """Resolve the grid, check the outputs, run, summarise and plot (`progress` as in
    `nphcli.sweeps.runner.execute`)."""
    from nphcli.evaluation.settings import build_model
    from nphcli.sweeps.config import load, resolve
    from nphcli.sweeps.grid import distinct_models

    data, origin = load(request.preset, request.config)
    grid = resolve(data, origin, request.given, root=request.root)
    for settings in distinct_models(grid):  # each model's own checks, before data is read
        build_model(settings)
    _check_outputs(request, grid.dataset)
    from nphcli.app.threads import use_threads

    # Runs are small (at most a few hundred queries of one trial's memory): one thread does each
    # as fast on a quiet machine and many times faster on a busy one (docs/performance.md).
    threads = use_threads(request.threads, default=SWEEP_THREADS)

    from nphcli.sweeps.results import Results
    from nphcli.sweeps.runner import execute
    from nphcli.sweeps.summary import summarize_settings

    results = Results(request.out, resume=request.resume, force=request.force)
    outcome = execute(grid, results, theory=request.theory, progress=progress)
    summary = summarize_settings(outcome.rows, outcome.settings)
    if request.plot is not None:
        from nphcli.presentation.plot import plot_results

        keys = {s.key for s in outcome.settings}
        rows = [row for row in outcome.rows if row.get("setting") in keys]
        plot_results(rows, request.plot, force=request.force)
    return SweepReport(request, outcome, summary, threads)


def _check_outputs(request: SweepRequest, dataset: str) -> None:
    """Refuse, before the grid runs, outputs that replace an input or cannot be written."""
    from nphcli.core.atomic import check_not_input, check_output

    named = (dataset, request.config)
    inputs = [path for path in named if path is not None and Path(path).exists()]
    check_not_input(request.out, inputs)  # results are appended to, so --force does not apply
    if request.plot is not None:
        if request.plot.resolve() == request.out.resolve():
            raise NphError("--out and --plot name the same file")
        check_output(request.plot, force=request.force, protect=inputs)
        from nphcli.presentation.plot import check_plot_output

        check_plot_output(request.plot)  # matplotlib present, format known: before the grid runs
