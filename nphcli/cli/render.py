"""Rendering results for people (rich tables) and scripts (JSON, CSV). stdout only carries these."""

from __future__ import annotations

import csv
import json
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

# Characters of nph's tables and texts that a narrow encoding (ASCII, cp1252) may lack.
_WIDE = "━│σ‖"


def can_encode(stream: Any, text: str = _WIDE) -> bool:
    """Whether `stream`'s encoding can write `text` (a redirected Windows console under cp1252,
    or PYTHONIOENCODING=ascii, cannot write box lines or Greek letters)."""
    try:
        text.encode(getattr(stream, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def plain_streams() -> None:
    """On streams that cannot encode nph's characters, write what they lack as `?` rather than
    stop with a traceback; tables switch to ASCII lines (`print_table`)."""
    for stream in (sys.stdout, sys.stderr):
        if not can_encode(stream) and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")


def stdout_console() -> Console:
    """A console for results; colour only on a terminal, and never when NO_COLOR is set."""
    return Console(file=sys.stdout, no_color=bool(os.environ.get("NO_COLOR")), soft_wrap=False)


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


def print_table(
    title: str | None,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    width: int | None = None,
) -> None:
    """A table on stdout. `width`: the line width to use when stdout is not a terminal (rich
    assumes 80 columns there, which squeezes wide tables into unreadable cells). Numbers are
    never cut to "0.…": a table whose numeric columns do not fit the width is printed at its
    natural width (the terminal wraps its lines), text columns still wrap."""
    ascii_only = not can_encode(sys.stdout)
    table = Table(
        title=title, title_justify="left", box=box.ASCII if ascii_only else box.HEAVY_HEAD
    )
    rows = [list(row) for row in rows]
    numeric = 0  # width of the table with every numeric column whole and its header unbroken
    for i, column in enumerate(columns):
        numbers = [format_value(row[i]) for row in rows if isinstance(row[i], (int, float))]
        longest = max(map(len, numbers), default=0)
        numeric += max(longest, len(column) if numbers else 1) + 3  # padding and a border
        table.add_column(column, min_width=longest or None)
    for row in rows:
        table.add_row(*(format_value(v) for v in row))
    console = stdout_console()
    if width is not None and not console.is_terminal:
        console.width = width
    if numeric + 1 > console.width:  # squeezing would cut numbers to "0.…": print it whole
        console.width = console.measure(table, options=console.options.update_width(10_000)).maximum
    console.print(table)


def format_value(value: Any) -> str:
    if isinstance(value, float):
        if value == 0 or (1e-3 <= abs(value) < 1e5):
            return f"{value:.4g}"
        return f"{value:.3e}"
    return "" if value is None else str(value)
