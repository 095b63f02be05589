"""`nph serve MEMORY`: a memory as a long-lived Model Context Protocol server for agents.

Tools `remember`, `recall`, `forget` and `info`. `remember` and `forget` go through `app.grow`
(new files, the manifest switched atomically under the writer's lock), so whatever a call
acknowledged survives a crash of the server. A bad request is answered with a one-line tool
error; the server keeps serving. Built on the `mcp` SDK (`MCPServer`, or `FastMCP` in mcp 1).
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from nphcli.app.grow import add_items, forget_items
from nphcli.app.recall import DEFAULT_K, Recaller
from nphcli.core.errors import NphError

INSTRUCTIONS = (
    "A memory of items (id, text). Call `recall` with a text to get the stored items it "
    "recalls, heaviest first, with their weights; `remember` stores a new item, `forget` "
    "removes items by id, `info` says what the memory holds."
)


def _sdk() -> tuple[type, type]:
    """The SDK's server class and its anticipated-error type."""
    try:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:
        try:  # mcp 1.x
            from mcp.server.fastmcp import FastMCP as MCPServer
            from mcp.server.fastmcp.exceptions import ToolError
        except ImportError:
            raise NphError("nph serve needs the MCP SDK: pip install 'nph[serve]'") from None
    return MCPServer, ToolError


class Served:
    """The memory a server answers from: reopened after each change it makes, with the same
    embedder (a model loads once)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.recaller = Recaller.open(self.path)

    def reload(self) -> None:
        """After a change this server made. The segments' checksums are not read again (a
        memory of 10^5 rows would hash 150 MB at every `remember`): they were checked when the
        server started or written by it; one another process added meanwhile is trusted."""
        embedder = self.recaller._embedder
        self.recaller = Recaller.open(self.path, verify=False)
        self.recaller._embedder = embedder


def build_server(path: str | os.PathLike):
    """An MCP server over the memory file at `path`, its tools registered; `.run()` serves."""
    server_class, tool_error = _sdk()
    served = Served(path)
    server = server_class("nph", instructions=INSTRUCTIONS)

    def one_line(tool):
        @functools.wraps(tool)
        def call(*args, **kwargs):
            try:
                return tool(*args, **kwargs)
            except NphError as error:
                raise tool_error(" ".join(str(error).split())) from None

        return server.tool()(call)

    @one_line
    def remember(
        text: str | None = None,
        embedding: list | None = None,
        id: str | None = None,  # noqa: A002  (the item's id, as agents name it)
        meta: dict[str, Any] | None = None,
        upsert: bool = False,
    ) -> dict[str, Any]:
        """Store an item: a text (embedded as the memory's items are) or an embedding, with an
        optional id (default: a new one) and meta. An id stored already is refused unless
        upsert, which replaces it. Saved to disk before the call returns."""
        if text is None and embedding is None:
            raise NphError("remember needs a text or an embedding")
        if embedding is None:
            if not isinstance(text, str) or not text.strip():
                raise NphError("the text to remember is empty")
            embedding = served.recaller.embed(text)[0].tolist()  # (d,)
        key = str(uuid.uuid4().hex[:12]) if id is None else id
        row = {"id": key, "embedding": embedding, "text": text, "meta": meta}
        with tempfile.TemporaryDirectory() as folder:
            table = Path(folder) / "remembered.jsonl"
            table.write_text(json.dumps({k: v for k, v in row.items() if v is not None}) + "\n")
            change = add_items(served.path, table, upsert=upsert)
        served.reload()
        return {"id": key, "replaced": change.forgotten, "items": change.items}

    # Arguments are typed loosely (int | str, list) and checked here: the SDK's own validation
    # errors are several lines of pydantic; ours are one.
    @one_line
    def recall(
        query: str | None = None,
        embedding: list | None = None,
        k: int | str = DEFAULT_K,
        model: str | None = None,
        beta: float | str | None = None,
    ) -> dict[str, Any]:
        """The stored items a query (a text, or an embedding) recalls, heaviest first: id,
        text, weight (the retrieval rule's) and score (cosine). model and beta default to the
        memory's own (sparse, β = 30 for texts)."""
        given = embedding if query is None else query
        if given is None:
            raise NphError("recall needs a query text or an embedding")
        found = served.recaller.recall(
            given, k=_number(k, "k", whole=True), model=model, beta=_number(beta, "beta")
        )
        return found.to_json()

    @one_line
    def forget(ids: list | str) -> dict[str, Any]:
        """Forget the items with these ids (a list, or a comma list): no recall returns them
        from now on."""
        keys = ids.split(",") if isinstance(ids, str) else ids
        change = forget_items(served.path, [str(key) for key in keys])
        served.reload()
        return {"forgotten": change.forgotten, "items": change.items}

    @one_line
    def info() -> dict[str, Any]:
        """What the memory holds: its items, their dimension, embedder and recall defaults."""
        memory = served.recaller.memory
        return {
            "memory": str(served.path),
            "items": memory.num_memories,
            "dim": memory.dim,
            "embedder": (memory.meta.get("embedder") or {}).get("name"),
            "recall_defaults": served.recaller.defaults(),
            "segments": memory.meta.get("segments"),
        }

    return server


def _number(value: Any, what: str, *, whole: bool = False) -> Any:
    """A number an agent gave, perhaps as text; one NphError line when it is none."""
    if value is None or isinstance(value, bool):
        return value if value is None else _refuse(value, what, whole)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return _refuse(value, what, whole)
    if whole and number != int(number):
        return _refuse(value, what, whole)
    return int(number) if whole else number


def _refuse(value: Any, what: str, whole: bool) -> None:
    raise NphError(f"{what} must be a {'whole ' if whole else ''}number, got {value!r}")


def serve(path: str | os.PathLike, *, port: int | None = None, host: str = "127.0.0.1") -> None:
    """Serve the memory at `path` over stdio, or over streamable HTTP on `host`:`port`."""
    server = build_server(path)
    if port is None:
        server.run("stdio")
        return
    try:
        server.run("streamable-http", host=host, port=port)
    except TypeError:  # mcp 1.x: the address is a setting
        server.settings.host, server.settings.port = host, port
        server.run("streamable-http")
