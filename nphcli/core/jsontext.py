"""JSON read from files and lines nph did not necessarily write: one parser, with bounds.

Python's `json` turns hostile text into exceptions a user should never see as a traceback:
deep nesting raises RecursionError, an integer of more than 4,300 digits a ValueError, and a
huge document costs minutes and gigabytes before any check of what it holds runs. Every reader
of JSON from outside (manifests, memory-file and index metadata, results files, batch lines)
goes through `parse_json` or `read_json_file`, so all of them refuse such text with one NphError
naming the file, and bound its size before parsing it. Torch-free.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from nphcli.core.errors import NphError

# Bytes of one JSON document (a manifest, a metadata value, a results line, a batch job).
# nph's own documents are a few KiB; a 100,000-shard manifest is about 20 MiB.
MAX_JSON_BYTES = 32 << 20


def parse_json(text: str | bytes, *, what: str, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The value of JSON `text`; NphError saying `what` it is for text that is too long, too
    deeply nested, malformed, or holds an integer Python refuses to parse."""
    if len(text) > max_bytes:
        raise NphError(
            f"{what} is {len(text):,} bytes of JSON, more than the {max_bytes:,} nph reads"
        )
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise NphError(f"{what} is not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise NphError(f"{what} is not valid JSON ({error.msg}, line {error.lineno})") from None
    except RecursionError:
        raise NphError(f"{what} nests JSON too deeply for nph to read") from None
    except ValueError as error:  # e.g. an integer of more than 4,300 digits
        raise NphError(f"{what} holds JSON nph cannot read ({error})") from None


def read_json_file(path: str | os.PathLike, *, what: str, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """`parse_json` of a file's contents, its size checked before it is read."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > max_bytes:
                raise NphError(
                    f"{what} {path} is {size:,} bytes, more than the {max_bytes:,} nph reads"
                )
            data = handle.read(max_bytes + 1)
    except OSError as error:
        raise NphError(f"cannot read {what} {path}: {error.strerror or error}") from None
    return parse_json(data, what=f"{what} {path}", max_bytes=max_bytes)
