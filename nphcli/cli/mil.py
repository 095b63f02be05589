"""`nph mil`: the paper's multiple-instance-learning experiment on MNIST bags.

Parsing and rendering only; `nphcli.experiments.mil` does the work.
"""

from __future__ import annotations

from typing import Any

from nphcli.cli.app import app
from nphcli.cli.field_options import own_values, with_fields
from nphcli.cli.progress import ProgressBar
from nphcli.cli.render import print_json, print_table
from nphcli.experiments.measured import estimate
from nphcli.experiments.mil_config import PRESETS, VARIANTS, MILConfig
from nphcli.schema.fields import get_field
from nphcli.schema.option import Field, output_field


def _grid(config: MILConfig) -> str:
    """A preset's grid as its help says it: bag sizes, epochs, runs."""
    sizes = ",".join(map(str, config.bag_sizes))
    return f"bag sizes {sizes}, epochs {config.epochs}, runs {config.runs}"


MIL_FIELDS = (
    Field(
        "preset",
        "str",
        "quick",
        f"quick: {_grid(PRESETS['quick'])} ({estimate('mil-quick')}); paper: "
        f"{_grid(PRESETS['paper'])} (days on a CPU).",
        group="run",
        choices=tuple(sorted(PRESETS)),
    ),
    output_field("Per-epoch results as JSON Lines.", "mil.jsonl"),
    Field(
        "plot",
        "path",
        None,
        "Also draw accuracy vs bag size and convergence (PNG).",
        group="output",
    ),
    Field(
        "models",
        "str",
        None,
        "Comma-separated subset of: " + ", ".join(v.label for v in VARIANTS) + ".",
        group="model",
    ),
    Field("bag_sizes", "str", None, "Comma-separated bag sizes M.", group="run"),
    Field("epochs", "int", None, "Override the epochs.", group="run"),
    Field("runs", "int", None, "Override the runs per cell.", group="run"),
    get_field("seed"),
    Field(
        "resume", "bool", False, "Continue --out, skipping finished training runs.", group="output"
    ),
    Field(
        "root",
        "path",
        None,
        "MNIST root (else $NPH_DATA, else the bundled 5,000 digits).",
        group="input",
    ),
    get_field("json"),
    get_field("threads"),
)


@app.command("mil")
@with_fields((), params=False, own=MIL_FIELDS)
def mil_command(*, given: dict[str, Any]) -> None:
    """Train NPHPooling networks on MNIST bags; print final test accuracy per model and size.

    The paper's MIL table on real data sets (Elephant, UCSB, ...) is `nph paper mil`."""
    from nphcli.app.threads import use_threads
    from nphcli.experiments import mil

    o = own_values(given, MIL_FIELDS)
    use_threads(o["threads"])
    grid = {name: o[name] for name in ("models", "bag_sizes", "epochs", "runs")}
    config = mil.configure(o["preset"], **grid)
    with ProgressBar("mil") as progress:
        records = mil.run_experiment(
            config, o["out"], seed=o["seed"], resume=o["resume"], root=o["root"], progress=progress
        )
    if o["plot"] is not None:
        mil.plot_results(records, o["plot"], convergence_bag_size=config.convergence_bag_size)
    summary = mil.summarise(records)
    if o["json"]:
        print_json({"preset": o["preset"], "results": str(o["out"]), **mil.summary_json(summary)})
        return
    sizes = sorted({size for row in summary.values() for size in row})
    rows = [
        (model, *(f"{row[s][0]:.3f}" if s in row else "" for s in sizes))
        for model, row in summary.items()
    ]
    print_table(
        "MIL test accuracy (final epoch, mean over runs)", ["model", *map(str, sizes)], rows
    )
