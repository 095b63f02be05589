"""Rendering results for people (rich tables) and scripts (JSON, CSV). stdout only carries these."""

from __future__ import annotations

import codecs
import csv
import json
import math
import os
import re
import sys
import textwrap
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

# Characters of nph's tables and texts that a narrow encoding (ASCII, cp1252) may lack.
_WIDE = "━│σ‖"

# ASCII for the symbols nph writes, where the output's encoding lacks them; Greek letters take
# their names (β → beta), superscripts and subscripts their digits (² → ^2), the rest `?`.
_ASCII = {
    "ᵀ": "^T", "·": "*", "×": "x", "−": "-", "–": "-", "—": "-", "‖": "||", "⟨": "<",
    "⟩": ">", "≤": "<=", "≥": ">=", "≠": "!=", "≈": "~", "→": "->", "←": "<-", "↔": "<->",
    "↦": "|->", "…": "...", "√": "sqrt", "∈": " in ", "±": "+-", "∞": "inf", "⌊": "floor(",
    "⌋": ")", "⌈": "ceil(", "⌉": ")", "½": "1/2", "§": "S", "≫": ">>", "≪": "<<", "µ": "u",
    "━": "-", "│": "|", "𝓜": "M", "∂": "d", "∇": "grad ", "⊆": "<=", "∪": "u", "∝": "~",
}  # fmt: skip


def ascii_text(text: str) -> str:
    """`text` in ASCII, the symbols nph uses written out (`V^T softmax(beta K x)`)."""
    return text if text.isascii() else "".join(map(_ascii_char, text))


def _ascii_char(char: str) -> str:
    if char.isascii():
        return char
    if char in _ASCII:
        return _ASCII[char]
    name = unicodedata.name(char, "")
    plain = unicodedata.normalize("NFKD", char).encode("ascii", "ignore").decode()
    if name.startswith("GREEK"):
        letter = name.split()[-1].lower()
        return letter.capitalize() if "CAPITAL" in name else letter
    if plain and ("SUPERSCRIPT" in name or "SUBSCRIPT" in name):
        return ("^" if "SUPERSCRIPT" in name else "_") + plain
    if unicodedata.combining(char):
        return ""
    return plain or "?"


def _ascii_errors(error: UnicodeError) -> tuple[str, int]:
    """The codec error handler `nph-ascii`: what an encoding lacks, as `ascii_text` writes it."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    return ascii_text(error.object[error.start : error.end]), error.end


codecs.register_error("nph-ascii", _ascii_errors)


def can_encode(stream: Any, text: str = _WIDE) -> bool:
    """Whether `stream`'s encoding can write `text` (a redirected Windows console under cp1252,
    or PYTHONIOENCODING=ascii, cannot write box lines or Greek letters)."""
    try:
        text.encode(getattr(stream, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def plain_streams() -> None:
    """On streams that cannot encode nph's characters, write what they lack in ASCII (β as
    beta, Vᵀ as V^T) rather than stop with a traceback; tables switch to ASCII lines
    (`print_table`)."""
    for stream in (sys.stdout, sys.stderr):
        if not can_encode(stream) and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="nph-ascii")


class _Console(Console):
    """rich's console, except that a closed stdout (`nph ... | head`) raises BrokenPipeError
    for the CLI's one exit path (status 141) where rich would exit with status 1."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


def stdout_console() -> Console:
    """A console for results; colour only on a terminal, and never when NO_COLOR is set."""
    return _Console(file=sys.stdout, no_color=bool(os.environ.get("NO_COLOR")), soft_wrap=False)


def stderr_console() -> Console:
    return Console(file=sys.stderr, no_color=bool(os.environ.get("NO_COLOR")))


def _json_safe(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null rather than emitting invalid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def print_json(obj: Any) -> None:
    """Exactly one JSON object on stdout, one line."""
    sys.stdout.write(json.dumps(_json_safe(obj), allow_nan=False) + "\n")


def print_csv(rows: Sequence[Mapping[str, Any]], *, header: bool = True) -> None:
    """CSV with a header row (unless `header` is False, for appending to a file)."""
    if not rows:
        return
    writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]), lineterminator="\n")
    if header:
        writer.writeheader()
    writer.writerows(rows)


# Characters that act on a terminal rather than show: C0 and C1 controls and DEL (escape sequences,
# carriage return, bell) but the tab and line feed a cell may wrap at, line and paragraph
# separators, bidirectional overrides (they reorder what follows), and lone surrogates (which no
# encoding writes).
_ACTING = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def printable(text: str) -> str:
    """`text` with each character that would act on the terminal written as its escape
    (`\\x1b`, `\\r`, `\\u202e`, `\\ud800`): a stored text, id or label is shown, never obeyed."""
    return _ACTING.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"), text)


def print_table(
    title: str | None,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    width: int | None = None,
) -> None:
    """A table on stdout that fits the line width without hiding a value: text wraps at spaces,
    no column is narrower than its longest word or number, and where the columns cannot all
    fit so, each row is printed stacked instead (a line per column, `_print_stacked`).

    The width is the terminal's; piped, `COLUMNS` when set, else `width` (default 80: rich's
    assumption). Values are text, never rich markup, with `printable` escapes."""
    ascii_only = not can_encode(sys.stdout)

    def text(value: Any) -> str:
        shown = printable(str(value))
        return ascii_text(shown) if ascii_only else shown

    cells = [[text(format_value(value)) for value in row] for row in rows]
    columns = [text(column) for column in columns]
    title = None if title is None else text(title)
    console = stdout_console()
    if width is not None and not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = width
    table = Table(
        title=None if title is None else Text(title),
        title_justify="left",
        box=box.ASCII if ascii_only else box.HEAVY_HEAD,
    )
    for column in columns:
        table.add_column(Text(column), overflow="fold")  # never "…": a value too wide folds
    for row in cells:
        table.add_row(*map(Text, row))
    unbounded = console.options.update_width(10**6)  # (a measure is clamped to its width)
    if Measurement.get(console, unbounded, table).minimum > console.width:
        _print_stacked(console, title, columns, cells)
    else:
        console.print(table)


def _print_stacked(console: Console, title: str | None, columns: list[str], rows) -> None:
    """Each row as a block of `column  value` lines, blocks apart by a blank line: a table too
    wide for the line. Values wrap at spaces under their own column, never cut. A table of two
    columns (a name and its value, as `nph info` prints) keeps a line per row instead: the
    header, then each name and its value, the value wrapping under the values."""
    lines = textwrap.wrap(title, console.width, break_long_words=False) if title else []
    if len(columns) == 2:
        label = min(max(len(row[0]) for row in [columns, *rows]), console.width // 3) + 2
        room = max(console.width - label, 20)
        for name, value in [columns, *rows]:
            parts = textwrap.wrap(value, room, break_long_words=False) or [""]
            names = textwrap.wrap(name, label - 2, break_long_words=False) or [""]
            for i in range(max(len(parts), len(names))):
                left = names[i] if i < len(names) else ""
                right = parts[i] if i < len(parts) else ""
                lines.append(f"{left:<{label}}{right}".rstrip())
        console.file.write("\n".join(lines) + "\n")
        return
    label = max(map(len, columns), default=0) + 2
    room = max(console.width - label, 20)
    for i, row in enumerate(rows):
        if i or lines:
            lines.append("")
        for column, value in zip(columns, row, strict=True):
            parts = textwrap.wrap(value, room, break_long_words=False) or [""]
            lines.append(f"{column:<{label}}{parts[0]}".rstrip())
            lines.extend(" " * label + part for part in parts[1:])
    console.file.write("\n".join(lines) + "\n")


def format_value(value: Any) -> str:
    if isinstance(value, float):
        if value == 0 or (1e-3 <= abs(value) < 1e5):
            return f"{value:.4g}"
        return f"{value:.3e}"
    return "" if value is None else str(value)
