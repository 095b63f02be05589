"""`nph add`, `nph forget`, `nph compact`: a memory that grows without being rewritten."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from nphcli.cli.app import app
from nphcli.cli.field_options import own_values, with_fields
from nphcli.cli.render import print_json, print_table
from nphcli.schema.fields import Field, get_field
from nphcli.schema.option import options_of, setting

MEMORY = Annotated[Path, typer.Argument(help="Memory file (written by `nph store`).")]


@dataclass(frozen=True)
class AddOptions:
    ids: Path | None = setting(
        None,
        "For a .npy SOURCE: a file of its rows' ids (one a line, or .jsonl with id and text).",
        group="input",
    )
    upsert: bool = setting(
        False, "Replace a stored item that has an added id (without it, such an id is refused)."
    )


ADD_FIELDS = (*options_of(AddOptions, "output"), get_field("json"))
FORGET_FIELDS = (
    Field("ids", "str", None, "Comma list of the ids to forget.", group="input"),
    get_field("json"),
)
COMPACT_FIELDS = (get_field("json"),)


@app.command("add")
@with_fields((), params=False, own=ADD_FIELDS)
def add_command(
    memory: MEMORY,
    source: Annotated[Path, typer.Argument(help="Rows to add: .jsonl, .txt, Parquet, .npy.")],
    *,
    given: dict[str, Any],
) -> None:
    """Append items to a memory as a new segment, without rewriting what it stores; texts are
    embedded with the memory's own embedder. Every command given MEMORY then sees them
    (docs/agents.md)."""
    from nphcli.app.grow import add_items

    o = own_values(given, ADD_FIELDS)
    _show(add_items(memory, source, upsert=o["upsert"], ids=o["ids"]), o["json"])


@app.command("forget")
@with_fields((), params=False, own=FORGET_FIELDS)
def forget_command(memory: MEMORY, *, given: dict[str, Any]) -> None:
    """Forget items by id: no reader sees them from then on; `nph compact` drops their rows."""
    from nphcli.app.grow import forget_items

    o = own_values(given, FORGET_FIELDS)
    ids = [key.strip() for key in (o["ids"] or "").split(",") if key.strip()]
    _show(forget_items(memory, ids), o["json"])


@app.command("compact")
@with_fields((), params=False, own=COMPACT_FIELDS)
def compact_command(memory: MEMORY, *, given: dict[str, Any]) -> None:
    """Merge a memory's segments into one memory file and drop its forgotten rows."""
    from nphcli.app.grow import compact_memory

    _show(compact_memory(memory), own_values(given, COMPACT_FIELDS)["json"])


def _show(change: Any, as_json: bool) -> None:
    fields = {**asdict(change), "memory": str(change.memory)}
    if as_json:
        print_json(fields)
        return
    print_table(f"{change.memory}", ["field", "value"], list(fields.items())[1:])
