"""Reading every results file nph writes, for the commands that present them (`nph report`,
`nph plot`): sweep rows (.jsonl, .csv), `nph retrieve --csv` rows, and the JSON Lines of
`nph retrieve --json` / `nph batch` (one object with `config` and `metrics` per setting)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nphcli.core.errors import NphError
from nphcli.core.jsontext import parse_json
from nphcli.evaluation.report import provenance_columns
from nphcli.presentation.plot_data import is_setting, short
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
            kind = "nph retrieve / nph batch JSON Lines"
            config = _shared([record.get("config") for record in records])
        else:
            found = read_results(path).rows
            kind, config = "results rows (nph sweep, nph retrieve --csv)", None
        if not found:
            raise NphError(f"{path} holds no results")
        rows += found
        sources.append({"path": str(path), "kind": kind, "rows": len(found), "config": config})
    return rows, sources


# Distinct settings a report shows at most: a table row and a plotted line each. Issue 40 timed
# 10⁵ of them at 428 s and 3.4 GB for a 26.5 MB page nobody can read.
MAX_REPORT_SETTINGS = 2000


def check_report_size(rows: list[dict[str, Any]], limit: int = MAX_REPORT_SETTINGS) -> None:
    """Refuse, before any rendering, results of more than `limit` distinct settings (rows that
    differ in more than their trial columns)."""
    columns = [c for c in dict.fromkeys(c for row in rows for c in row) if is_setting(c)]
    distinct = {tuple(short(row.get(c)) for c in columns) for row in rows}
    if len(distinct) > limit:
        raise NphError(
            f"the results hold {len(distinct):,} distinct settings; a report shows at most "
            f"{limit:,}: choose some with `nph plot --where` or report a part of the file"
        )


def _retrieve_records(path: Path) -> list[dict[str, Any]] | None:
    """The objects of a JSON Lines file of `nph retrieve --json` / `nph batch`, or None when the
    file is something else (sweep rows)."""
    if path.suffix.lower() not in (".jsonl", ".ndjson", ".json"):
        return None
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        first = parse_json(lines[0], what=f"{path} line 1") if lines else None
    except (OSError, UnicodeDecodeError, NphError):
        return None
    if not (isinstance(first, dict) and "config" in first and "metrics" in first):
        return None
    return [parse_json(line, what=f"{path} line {n}") for n, line in enumerate(lines, start=1)]


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
