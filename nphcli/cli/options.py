"""Options that mean the same in every command, declared once (typer `Annotated` types).

A command uses one as a parameter annotation, e.g. `as_json: JsonOutput = False`; its flag and
help text then match everywhere. Options whose meaning differs (sweep's comma lists) stay with
their command.
"""

from __future__ import annotations

from typing import Annotated

import typer

from nphcli.schema.fields import get_field

JsonOutput = Annotated[
    bool, typer.Option("--json", help="Print JSON (one object) instead of a table.")
]
Seed = Annotated[
    int,
    typer.Option(
        "--seed",
        help="Seed of every random choice the command makes (samples, queries, corruption, "
        "the model's own randomness); same seed, same output.",
    ),
]
Mask = Annotated[float, typer.Option("--mask", help="Fraction of each query to hide, in [0, 1].")]
Noise = Annotated[
    float,
    typer.Option("--noise", help="Gaussian noise standard deviation σ (for a variance v: √v)."),
]
QueryCount = Annotated[
    int | None,
    typer.Option("--queries", help="Use N queries drawn with the seed [default: all]."),
]
Force = Annotated[bool, typer.Option("--force", help="Replace output files that exist.")]
# The retrieval field `threads`, for commands whose options are not generated from the fields
# (retrieve's is); checked and applied by `nphcli.app.threads.use_threads`.
Threads = Annotated[
    int | None,
    typer.Option("--threads", help=get_field("threads").help, show_default=False),
]
