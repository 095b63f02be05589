"""`nph recall MEMORY "text"`: the items a text recalls from a memory, and nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from nphcli.cli.app import app
from nphcli.cli.field_options import own_values, with_fields
from nphcli.cli.render import format_value, print_json, print_table
from nphcli.schema.fields import get_field
from nphcli.schema.option import options_of, setting


@dataclass(frozen=True)
class RecallOptions:
    top: int = setting(5, "Items listed at most (k).", minimum=1)
    model: str | None = setting(
        None, "Retrieval rule [default: the memory's `recall` record, else sparse]."
    )
    beta: float | None = setting(
        None, "Inverse temperature β [default: the model's].", above=0, group="run"
    )
    verbose: bool = setting(
        False, "Let the embedding libraries print their own progress and load reports."
    )


RECALL_FIELDS = (*options_of(RecallOptions, "output"), get_field("json"))


@app.command("recall")
@with_fields((), params=False, own=RECALL_FIELDS)
def recall_command(
    memory: Annotated[Path, typer.Argument(help="Memory file of items (`nph store`, `nph add`).")],
    query: Annotated[str, typer.Argument(help="The text to recall from.")],
    *,
    given: dict[str, Any],
) -> None:
    """Print the query and the stored items it recalls, heaviest first: id, text, weight (the
    rule's w_j) and score (⟨x, ξ_j⟩, a cosine for texts). The model and β default to what the
    memory records (sparse at β = 30 for tables and texts: docs/agents.md)."""
    from nphcli.app.recall import Recaller
    from nphcli.sources.embedders import quiet_libraries

    o = own_values(given, RECALL_FIELDS)
    if not o["verbose"]:
        quiet_libraries()
    found = Recaller.open(memory).recall(query, k=o["top"], model=o["model"], beta=o["beta"])
    if o["json"]:
        print_json(found.to_json())
        return
    params = ", ".join(f"{key} {format_value(value)}" for key, value in found.params.items())
    print_table(
        f"{query!r}: {found.model} ({params}), support {found.support}",
        ["id", "text", "weight", "score"],
        [
            (i["id"], i["text"] or "", format_value(i["weight"]), format_value(i["score"]))
            for i in found.items
        ],
    )
