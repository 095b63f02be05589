"""Reading every results file nph writes, for the commands that present them (`nph report`,
`nph plot`): sweep rows (.jsonl, .csv), `nph retrieve --csv` rows, and the JSON Lines of
`nph retrieve --json` / `nph batch` (one object with `config` and `metrics` per setting)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nphcli.core.errors import NphError
from nphcli.core.jsontext import parse_json
from nphcli.evaluation.report import provenance_columns
from nphcli.presentation.plot_data import is_setting, short
from nphcli.sweeps.results import read_results


def read_inputs(
    paths: list[Path], *, max_settings: int | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(flat result rows, one record per input file saying what it held). With `max_settings`,
    more distinct settings than that over all the files are refused as soon as a row brings the
    count past it, before the rest is read (`SettingsCount`)."""
    count = SettingsCount(max_settings)
    rows: list[dict[str, Any]] = []
    sources = []
    for path in paths:
        if not path.is_file():
            raise NphError(f"results file {path} not found")
        lines = _retrieve_lines(path)
        if lines is not None:
            records, found = [], []
            for number, line in lines:  # counted as read: too many settings stop the reading
                records.append(parse_json(line, what=f"{path} line {number}"))
                found.append(count.add(_flat(records[-1])))
            kind = "nph retrieve / nph batch JSON Lines"
            config = _shared([record.get("config") for record in records])
        else:
            found = read_results(path, each_row=count.add).rows
            kind, config = "results rows (nph sweep, nph retrieve --csv)", None
        if not found:
            raise NphError(f"{path} holds no results")
        rows += found
        sources.append({"path": str(path), "kind": kind, "rows": len(found), "config": config})
    return rows, sources


# Distinct settings a report shows at most: a table row and a plotted line each. Issue 40 timed
# 10⁵ of them at 428 s and 3.4 GB for a 26.5 MB page nobody can read.
MAX_REPORT_SETTINGS = 2000


class SettingsCount:
    """Distinct settings (rows that differ in more than their trial columns, values as a plot
    names them) among the rows `add`ed; past `limit` (None: no limit) the row that brings the
    count over it is refused in one line."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.seen: set[frozenset] = set()

    def add(self, row: dict[str, Any]) -> dict[str, Any]:
        if self.limit is None:
            return row
        key = frozenset((c, short(v)) for c, v in row.items() if is_setting(c) and v is not None)
        self.seen.add(key)
        if len(self.seen) > self.limit:
            raise NphError(
                f"the results hold more than {self.limit:,} distinct settings; a report shows "
                "at most that many: choose some with `nph plot --where` or report a part of "
                "the file"
            )
        return row


def _retrieve_lines(path: Path) -> Iterator[tuple[int, str]] | None:
    """The numbered non-empty lines of a JSON Lines file of `nph retrieve --json` / `nph batch`
    (one object with `config` and `metrics` each), read as they are asked for, or None when the
    file is something else (sweep rows). Only the first line is read to tell."""
    if path.suffix.lower() not in (".jsonl", ".ndjson", ".json"):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            line = next((line for line in handle if line.strip()), None)
        first = None if line is None else parse_json(line, what=f"{path} line 1")
    except (OSError, UnicodeDecodeError, NphError):
        return None
    if not (isinstance(first, dict) and "config" in first and "metrics" in first):
        return None
    return _numbered_lines(path)


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    yield number, line
    except (OSError, UnicodeDecodeError) as error:
        raise NphError(f"cannot read results file {path}: {error}") from None


def _shared(configs: list[Any]) -> Any:
    """What every one of `configs` records alike: keys of objects whose values agree in all of
    them, recursively (so one record's settings never pass for all)."""
    first = configs[0]
    if all(isinstance(c, dict) for c in configs):
        out = {}
        for key in first:
            if all(key in c for c in configs):
                value = _shared([c[key] for c in configs])
                if value is not _DIFFER:
                    out[key] = value
        return out
    return first if all(c == first for c in configs) else _DIFFER


_DIFFER = object()


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
        }
    )
    if "M" in memory and "d" in memory:
        row.update(provenance_columns(config))
    row.update({"M": memory.get("M"), "nph_version": config.get("nph_version")})
    for name, stats in (record.get("metrics") or {}).items():
        row[f"{name}_mean"] = None if stats is None else stats.get("mean")
    row["us_per_query"] = (record.get("timing") or {}).get("us_per_query")
    return row
