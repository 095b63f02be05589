"""Text from outside read within bounds (docs/errors.md): an endless input (`/dev/zero`, a pipe
that never ends, a line with no end, a zip member that inflates to gigabytes) is refused in one
line instead of being read until memory runs out. Torch-free. A line is at most `MAX_LINE_BYTES`;
a whole text input at most `text_input_limit()`, each line counted `LINE_COST` bytes more; a NUL
byte marks a file that is not text; a text to embed is cut to `MAX_TEXT_CHARS` characters.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from typing import BinaryIO

from nphcli.core.errors import NphError
from nphcli.core.notices import notice
from nphcli.core.resources import human_bytes, physical_memory

MAX_LINE_BYTES = 16 << 20  # one line: a 65,536-value embedding in JSON is about 1.3 MiB
MAX_TEXT_CHARS = 100_000  # one text to embed (a 20 MB line took minutes and 2.5 GB)
# What a line costs beyond its bytes once read into rows (a dict, a str, a list of cells): an
# input of many short lines is bounded by what it takes in memory, not by its size on disk.
LINE_COST = 256
_CHUNK = 1 << 20


def text_input_limit() -> int:
    """Bytes of one text input: a sixteenth of this machine's memory, at most 4 GiB."""
    memory = physical_memory() or (16 << 30)
    return min(4 << 30, max(64 << 20, memory // 16))


def read_bytes(path: str | os.PathLike, *, what: str, limit: int | None = None) -> bytes:
    """A text file's bytes, read in chunks: refused at its first NUL byte or beyond `limit`
    (default `text_input_limit()`), whatever size the file claims (a device or a pipe claims 0)."""
    limit = text_input_limit() if limit is None else limit
    chunks, total = [], 0
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                _check_chunk(chunk, total + len(chunk), limit, path, what)
                chunks.append(chunk)
                total += len(chunk)
    except OSError as error:
        raise NphError(f"cannot read {what} {path}: {error.strerror or error}") from None
    return b"".join(chunks)


def read_stream(stream: BinaryIO, *, what: str, limit: int) -> bytes:
    """`read_bytes` of an open binary stream (a zip member): at most `limit` bytes are read."""
    chunks, total = [], 0
    while chunk := stream.read(min(_CHUNK, limit + 1 - total)):
        total += len(chunk)
        if total > limit:
            raise NphError(f"{what} is larger than the {human_bytes(limit)} nph reads of it")
        chunks.append(chunk)
    return b"".join(chunks)


def _check_chunk(chunk: bytes, total: int, limit: int, path, what: str) -> None:
    if b"\0" in chunk:
        raise NphError(f"{what} {path} holds a NUL byte: it is not a text file")
    if total > limit:
        raise NphError(
            f"{what} {path} is larger than the {human_bytes(limit)} nph reads of a text input "
            "(docs/errors.md); store large tables as .npy or Parquet"
        )


def read_lines(
    path: str | os.PathLike | BinaryIO,
    *,
    what: str,
    max_line: int | None = None,
    truncate: bool = False,
    limit: int | None = None,
    encoding: str = "utf-8",
) -> Iterator[tuple[int, str]]:
    """(number from 1, text with its ending) of each line of a UTF-8 text file (or an open binary
    stream), one at a time. A line over `max_line` bytes (default `MAX_LINE_BYTES`) is refused,
    or with `truncate` cut to them (the rest skipped unread); a NUL byte or more than `limit`
    bytes in all (default `text_input_limit()`, with `LINE_COST` a line) is refused."""
    limit = text_input_limit() if limit is None else limit
    max_line = MAX_LINE_BYTES if max_line is None else max_line
    total = 0
    if hasattr(path, "readline"):  # an open binary stream (stdin), left open
        handle, path = contextlib.nullcontext(path), getattr(path, "name", what)
    else:
        try:
            handle = open(path, "rb")  # noqa: SIM115  (closed below; a generator holds it)
        except OSError as error:
            raise NphError(f"cannot read {what} {path}: {error.strerror or error}") from None
    with handle as handle:
        for number in itertools.count(1):
            line = handle.readline(max_line + 1)
            if not line:
                return
            total += len(line) + LINE_COST
            _check_chunk(line, total, limit, path, what)
            if len(line) > max_line and not line.endswith(b"\n"):
                long = f"{what} {path}: line {number} is longer than {human_bytes(max_line)}"
                if not truncate:
                    raise NphError(long)
                total += _skip_line(handle, total, limit, path, what)
                notice(f"{long}; its start is kept")
                line = line[:max_line]
                line = line[: len(line) - _cut_character(line)] + b"\n"
            try:
                text = line.decode(encoding if number == 1 else "utf-8")
            except UnicodeDecodeError:
                raise NphError(f"{what} {path}: line {number} is not UTF-8 text") from None
            yield number, text


def _skip_line(handle: BinaryIO, total: int, limit: int, path, what: str) -> int:
    """Read past the rest of a line, a chunk at a time; the bytes skipped."""
    skipped = 0
    while chunk := handle.readline(_CHUNK):
        skipped += len(chunk)
        _check_chunk(chunk, total + skipped, limit, path, what)
        if chunk.endswith(b"\n"):
            break
    return skipped


def _cut_character(data: bytes) -> int:
    """How many bytes at the end of `data` belong to a UTF-8 character cut short (0 to 3)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the first byte of the last character
            needed = 4 if byte >= 0xF0 else 3 if byte >= 0xE0 else 2 if byte >= 0xC0 else 1
            return back if needed > back else 0
    return 0


def cut_texts(texts: list[str]) -> tuple[list[str], int]:
    """`texts` each cut to `MAX_TEXT_CHARS` characters, and how many were cut."""
    cut = sum(len(text) > MAX_TEXT_CHARS for text in texts)
    if not cut:
        return texts, 0
    return [text[:MAX_TEXT_CHARS] for text in texts], cut
