"""The JSON Lines files the trained experiments keep their runs in (one object per finished run,
appended as runs finish, so a stopped experiment resumes): read through the one guarded JSON
reader, written atomically."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nphcli.core.atomic import atomic_write
from nphcli.core.errors import NphError
from nphcli.core.jsontext import parse_json


def read_records(path: Path, what: str) -> list[dict[str, Any]]:
    """The records of `what` in `path` (none if it does not exist); a line that is not a JSON
    object is one error naming the line."""
    if not path.exists():
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise NphError(f"cannot read {what} {path}: {error}") from None
    records = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            record = parse_json(line, what=f"{what} {path} line {number}")
            if not isinstance(record, dict):
                raise NphError(f"{what} {path} line {number} is not a JSON object")
            records.append(record)
    return records


def write_records(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Replace `path` with `records`, one JSON object a line, atomically."""
    import json

    with atomic_write(path, force=True) as tmp:
        Path(tmp).write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
