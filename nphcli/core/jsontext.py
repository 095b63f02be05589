"""JSON read from files and lines nph did not necessarily write: one parser, with bounds.

Python's `json` turns hostile text into exceptions a user should never see as a traceback:
deep nesting raises RecursionError, an integer of more than 4,300 digits a ValueError, a lone
surrogate (`"\\ud800"`) a UnicodeEncodeError wherever the text is written again, and a
huge document costs minutes and gigabytes before any check of what it holds runs. Every reader
of JSON from outside (manifests, memory-file and index metadata, results files, batch lines)
goes through `parse_json` or `read_json_file`, so all of them refuse such text with one NphError
naming the file, and bound its size before parsing it. Torch-free.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from nphcli.core.errors import NphError

# Bytes of one JSON document (a manifest, a metadata value, a results line, a batch job).
# nph's own documents are a few KiB; a 100,000-shard manifest is about 20 MiB.
MAX_JSON_BYTES = 32 << 20
# `\uD800` to `\uDFFF`: a surrogate, which JSON decodes to a lone one unless it forms a pair.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


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
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise NphError(f"{what} is not valid JSON ({error.msg}, line {error.lineno})") from None
    except RecursionError:
        raise NphError(f"{what} nests JSON too deeply for nph to read") from None
    except ValueError as error:  # e.g. an integer of more than 4,300 digits
        raise NphError(f"{what} holds JSON nph cannot read ({error})") from None
    if _SURROGATE_ESCAPE.search(text):  # only an escape can make a lone surrogate
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as error:
            code = f"\\u{ord(error.object[error.start]):04x}"
            raise NphError(
                f"{what} holds a lone surrogate ({code}), half of a pair that is no character; "
                "write the character itself"
            ) from None
    return value


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
