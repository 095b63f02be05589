"""`nph serve`: its server spoken to by the MCP SDK's own client, in this process and (slow) as
a real process over real stdio. remember → recall → forget → recall, bad requests answered with
one-line tool errors by a server that keeps serving, and what it acknowledged on disk after it
stops."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import pytest

import nphcli as nph
from nphcli.memory.items import open_items

pytest.importorskip("mcp")
anyio = pytest.importorskip("anyio")

from mcp import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

try:
    from mcp import Client  # the SDK's in-process client (mcp 2)
except ImportError:
    Client = None


def _error(result) -> bool:
    return bool(getattr(result, "is_error", None) or getattr(result, "isError", None))


def _json(result) -> dict:
    assert not _error(result), result.content[0].text
    return json.loads(result.content[0].text)


@contextlib.asynccontextmanager
async def _over_stdio(memory: Path):
    """A session with `nph serve` in a real process, over its stdin and stdout."""
    env = {"PYTHONPATH": str(Path(__file__).parents[2]), "OMP_NUM_THREADS": "1"}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "nphcli", "serve", str(memory)], env=env
    )
    with open(os.devnull, "w") as quiet:
        async with (
            stdio_client(params, errlog=quiet) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


@contextlib.asynccontextmanager
async def _in_process(memory: Path):
    """A session with the server `nph serve` runs, built in this process (the SDK's in-memory
    transport): the same tools and answers without starting Python and torch again."""
    from nphcli.app.serve import build_server

    async with Client(build_server(memory)) as session:
        yield session


async def _session_calls(memory: Path, connect) -> dict:
    seen: dict = {}
    async with connect(memory) as session:
        seen["tools"] = sorted(tool.name for tool in (await session.list_tools()).tools)
        call = session.call_tool
        seen["remembered"] = _json(
            await call("remember", {"text": "the dog barked at the mailman", "id": "dog"})
        )
        seen["first"] = _json(await call("recall", {"query": "a dog barked", "k": 3}))
        seen["empty"] = await call("recall", {"query": "  "})
        seen["bad k"] = await call("recall", {"query": "dog", "k": "many"})
        seen["twice"] = await call("remember", {"text": "again", "id": "dog"})
        seen["unknown"] = await call("forget", {"ids": ["nobody"]})
        seen["no tool"] = await call("dream", {})
        seen["forgot"] = _json(await call("forget", {"ids": ["dog"]}))
        seen["after"] = _json(await call("recall", {"query": "a dog barked", "k": 3}))
        seen["info"] = _json(await call("info", {}))
    return seen


@pytest.mark.parametrize(
    "connect",
    [
        pytest.param(_in_process, marks=pytest.mark.skipif(Client is None, reason="mcp 1")),
        pytest.param(_over_stdio, marks=pytest.mark.slow),  # a real process: seconds
    ],
    ids=["in-process", "stdio"],
)
def test_an_mcp_client_remembers_recalls_and_forgets(tmp_path, connect):
    (tmp_path / "notes.txt").write_text("the cat sat on the mat\nstock prices fell today\n")
    memory = tmp_path / "notes.safetensors"
    nph.store(tmp_path / "notes.txt", memory, embed="hash-256")
    seen = anyio.run(_session_calls, memory, connect)
    assert seen["tools"] == ["forget", "info", "recall", "remember"]
    assert seen["remembered"] == {"id": "dog", "replaced": 0, "items": 3}
    first = seen["first"]
    assert first["model"] == "sparse" and first["items"][0]["id"] == "dog"
    assert first["items"][0]["text"] == "the dog barked at the mailman"
    for bad, words in [
        ("empty", "the query is empty"),
        ("bad k", "k must be a whole number, got 'many'"),
        ("twice", "id 'dog' is stored"),
        ("unknown", "no item with id 'nobody'"),
        ("no tool", "dream"),
    ]:
        result = seen[bad]
        assert _error(result), bad
        text = result.content[0].text
        assert words in text and "\n" not in text.strip() and "Traceback" not in text, text
    assert seen["forgot"] == {"forgotten": 1, "items": 2}
    assert "dog" not in {item["id"] for item in seen["after"]["items"]}
    assert seen["info"]["items"] == 2 and seen["info"]["embedder"] == "hash-256"
    # What the server acknowledged is on disk: the dog remembered, then forgotten.
    opened = nph.open_memory(memory)
    items = open_items(memory, opened.meta).get(range(opened.num_memories))
    assert [item["id"] for item in items] == [1, 2]
    assert opened.meta["segments"]["generation"] == 2
