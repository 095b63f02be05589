"""Reading every results file nph writes, for the commands that present them (`nph report`,
`nph plot`): sweep rows (.jsonl, .csv), `nph retrieve --csv` rows, and the JSON Lines of
`nph retrieve --json` / `nph batch` (one object with `config` and `metrics` per setting)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nphcli.core.errors import NphError
from nphcli.sweeps.results import read_results


def read_inputs(paths: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(flat result rows, one record per input file saying what it held)."""
    rows: list[dict[str, Any]] = []
    sources = []
    for path in paths:
        if not path.is_file():
            raise NphError(f"results file {path} not found")
        records = _retrieve_records(path)
        if records is not None:
            found = [_flat(record) for record in records]
            kind, config = "nph retrieve / nph batch JSON Lines", records[0].get("config")
        else:
            found = read_results(path).rows
            kind, config = "results rows (nph sweep, nph retrieve --csv)", None
        if not found:
            raise NphError(f"{path} holds no results")
        rows += found
        sources.append({"path": str(path), "kind": kind, "rows": len(found), "config": config})
    return rows, sources


def _retrieve_records(path: Path) -> list[dict[str, Any]] | None:
    """The objects of a JSON Lines file of `nph retrieve --json` / `nph batch`, or None when the
    file is something else (sweep rows)."""
    if path.suffix.lower() not in (".jsonl", ".ndjson", ".json"):
        return None
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        first = json.loads(lines[0]) if lines else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not (isinstance(first, dict) and "config" in first and "metrics" in first):
        return None
    try:
        return [json.loads(line) for line in lines]
    except json.JSONDecodeError as error:
        raise NphError(f"{path}: a line is not JSON ({error.msg})") from None


def _flat(record: dict[str, Any]) -> dict[str, Any]:
    """A results row of one `nph retrieve --json` object: its settings and metric means."""
    config = record["config"]
    row: dict[str, Any] = {"model": config["model"], **config.get("params", {})}
    row.update({key: config["corruption"].get(key) for key in ("mask", "noise")})
    memory = config.get("memory") or {}
    row.update(
        {
            "seed": config.get("seed"),
            "device": config.get("device"),
            "dtype": config.get("dtype"),
            "memory": memory.get("file"),
            "M": memory.get("M"),
            "nph_version": config.get("nph_version"),
        }
    )
    for name, stats in (record.get("metrics") or {}).items():
        row[f"{name}_mean"] = None if stats is None else stats.get("mean")
    row["us_per_query"] = (record.get("timing") or {}).get("us_per_query")
    return row
