"""`nph sweep`: run a grid of retrieval evaluations and summarise it (`nph plot` draws results).

The retrieval options (models, their parameters, corruption, device, ...) are those of
`nph retrieve`, generated from the same fields (`nphcli.cli.field_options`); the others are the
sweep's own. Parsing and rendering only; `nphcli.sweeps` does the work.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Annotated, Any

import typer

from nphcli.cli.app import app
from nphcli.cli.field_options import field_values, own_values, with_fields
from nphcli.cli.progress import ProgressBar
from nphcli.cli.render import format_value, print_json, print_table
from nphcli.schema.fields import fields, get_field
from nphcli.schema.option import Field, arguments, options_of
from nphcli.sweeps.config import own_field
from nphcli.sweeps.grid import KEYED
from nphcli.sweeps.session import SweepRequest

# The retrieval fields a sweep takes: every one that no reason in `Field.refused` rules out.
SWEEP_FIELDS = [f.name for f in fields(surface="sweep")]


# The grid's own keys the command line overrides (their defaults are the grid's, else the
# field's), then the options of the command alone.
GRID_OPTIONS = tuple(
    dataclasses.replace(f, default=None, help=f"{f.help} [default: the grid's, else {f.default}].")
    for f in (own_field(name) for name in ("dataset", "sizes", "trials", "normalize"))
)
REQUEST_FIELDS = options_of(SweepRequest, "output")  # --preset, --config, --root, --out, ...
PRINT_CONFIG = Field(
    "print_config",
    "bool",
    False,
    "Print the --preset or --config file and exit, to copy it.",
    group="output",
)
COMMAND_FIELDS = (
    *REQUEST_FIELDS[:2],  # --print-config shows their file
    PRINT_CONFIG,
    *REQUEST_FIELDS[2:],
    get_field("threads"),
    get_field("json"),
)
OWN_OPTIONS = (*GRID_OPTIONS, *COMMAND_FIELDS)


@app.command("sweep")
@with_fields(
    SWEEP_FIELDS,
    own=OWN_OPTIONS,
    help={
        "model": "Retrieval models of the grid (`nph models` lists them; their parameters are "
        "options too). Any setting option takes a comma list (e.g. --model dense,topk --k 1,5 "
        "--noise 0,0.5): every combination is a setting, run on fresh memories each trial.  "
        "[default: the --preset or --config grid's, else dense]"
    },
)
def sweep_command(
    models: Annotated[str | None, typer.Option("--models", hidden=True)] = None,
    *,
    given: dict[str, Any],
) -> None:
    """Run a grid of retrievals: models × their parameters × memory sizes × masks × noise × ...,
    over trials.

    Each trial draws fresh memories from the dataset; every run is one `nph retrieve`
    self-evaluation, and the retrieval options are retrieve's: any of them takes a comma list
    (e.g. --model dense,topk --k 0.2,0.5 --noise 0,0.5), every combination is a setting.
    Rows are appended to --out as they finish; the summary (mean ± std over trials per setting)
    goes to stdout. Options override the --preset or --config grid.
    """
    from nphcli.core.errors import NphError
    from nphcli.sweeps.config import source_text
    from nphcli.sweeps.session import run_sweep

    if models is not None:
        raise NphError(
            "--models is gone: name the models with --model and each parameter with its own "
            "option, e.g. --model dense,topk --k 0.2,0.5"
        )
    o = own_values(given, COMMAND_FIELDS)
    if o["print_config"]:
        sys.stdout.write(source_text(o["preset"], o["config"]))
        return
    values: dict[str, Any] = {**field_values(given, among=OWN_OPTIONS)}
    for f in GRID_OPTIONS:  # one value each, but sizes a list
        if f.name in given:
            parsed = f.from_text(str(given[f.name]))
            values[f.name] = parsed if f.setting else parsed[0]
    request = SweepRequest(**arguments(SweepRequest, o), given=values, threads=o["threads"])
    with ProgressBar("sweep") as progress:
        report = run_sweep(request, progress)
    if o["json"]:
        print_json(report.to_json())
        return
    title = f"Sweep summary ({o['out']}, mean ± std over trials)"
    _print_summary(report.summary, theory=o["theory"], title=title)


def _print_summary(summary, *, theory: bool, title: str) -> None:
    """One row per setting. Grid axes with a single value go into the title, not a column."""
    titles = {"M": "M", **KEYED}  # the grid's axes, each a column where it varies
    # A model without the axis (β of a baseline) has None there: it varies nothing.
    seen = {name: {i.setting.axes[name] for i in summary} - {None} for name in titles}
    varying = [name for name in titles if len(seen[name]) > 1]
    fixed = [
        f"{titles[name]} {format_value(next(iter(seen[name])))}"
        for name in titles
        if name not in varying and seen[name]
    ]
    columns = ["model setting", *(titles[n] for n in varying), "trials", "SSE", "success"]
    columns.append("µs/query")
    if theory:
        columns += ["Thm 4.1 premises", "Thm 4.1 support", "Cor 4.1"]
    rows = []
    for item in summary:
        axes = item.setting.axes
        row = [_shown_label(item.setting), *(axes[name] for name in varying), item.trials]
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


def _shown_label(setting) -> str:
    """The setting's label as a table shows it: `topk k=10` for the k = 10.0 that its key (and a
    results row's `label`) writes as `k=10.0`, which `--resume` matches, so that stays."""
    return " ".join([setting.model, *(f"{k}={format_value(v)}" for k, v in setting.shown)])


def _pm(stats) -> str:
    if not stats:
        return ""
    return f"{format_value(stats['mean'])} ± {format_value(stats['std'])}"


def _ratio(holds, of) -> str:
    if holds is None or of is None:
        return "n/a"
    return f"{holds}/{of}"
