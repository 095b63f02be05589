"""Options that mean the same in every command, declared once from their fields
(`nphcli.schema.fields`), for commands whose options `with_fields` does not generate, e.g.
`as_json: JsonOutput = False`; besides `field_options` and the global flags, the only place an
option is declared by hand (`tests/schema/test_one_schema.py` checks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nphcli.schema.fields import get_field
from nphcli.schema.option import Field

JsonOutput = Annotated[bool, typer.Option("--json", help=get_field("json").help)]
# Checked and applied by `nphcli.app.threads.use_threads`.
Threads = Annotated[
    int | None, typer.Option("--threads", help=get_field("threads").help, show_default=False)
]

# Choosing and splitting result rows, for the commands that present them (nph plot, nph report).
Where = Annotated[
    list[str] | None,
    typer.Option(
        "--where",
        help="Keep only rows with COLUMN=VALUE[,VALUE...], e.g. model=topk or k=5,10; repeat "
        "for several conditions.",
    ),
]
FACET_HELP = "One panel per value of this setting (e.g. model, M, noise)."
FACET = Field("facet", "str", None, FACET_HELP, group="output")

# Pictures shown in a report (nph report): repeatable, so not a field's comma list.
Grids = Annotated[
    list[Path] | None,
    typer.Option("--grid", help="A --save-grid picture to show; repeat for several."),
]
