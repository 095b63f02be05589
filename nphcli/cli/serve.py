"""`nph serve MEMORY`: the memory as a Model Context Protocol server for agents."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from nphcli.cli.app import app
from nphcli.cli.field_options import own_values, with_fields
from nphcli.schema.fields import Field

SERVE_FIELDS = (
    Field(
        "port",
        "int",
        None,
        "Serve streamable HTTP on this port instead of stdio.",
        group="output",
        minimum=1,
        maximum=65535,
    ),
    Field("host", "str", "127.0.0.1", "Address the HTTP server listens on.", group="output"),
)


@app.command("serve")
@with_fields((), params=False, own=SERVE_FIELDS)
def serve_command(
    memory: Annotated[Path, typer.Argument(help="Memory file of items (`nph store`).")],
    *,
    given: dict[str, Any],
) -> None:
    """Serve a memory to agents over the Model Context Protocol (stdio, or HTTP with --port):
    tools remember, recall, forget and info. The memory and its embedder load once; what
    remember and forget acknowledge is on disk (docs/agents.md). Needs `pip install
    'nph[serve]'`."""
    from nphcli.app.serve import serve
    from nphcli.sources.embedders import quiet_libraries

    o = own_values(given, SERVE_FIELDS)
    quiet_libraries()  # stdout carries the protocol
    serve(memory, port=o["port"], host=o["host"])
