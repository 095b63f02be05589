"""Reading every results file nph writes, for the commands that present them (`nph report`,
`nph plot`): sweep rows (.jsonl, .csv), `nph retrieve --csv` rows, and the JSON Lines of
`nph retrieve --json` / `nph batch` (one object with `config` and `metrics` per setting)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nphcli.core.errors import NphError
from nphcli.core.jsontext import parse_json
from nphcli.core.notices import notice
from nphcli.evaluation.report import provenance_columns
from nphcli.presentation.plot_data import is_setting, matching, short
from nphcli.sweeps.results import cell_value, read_results


def read_inputs(
    paths: list[Path], *, max_settings: int | None = None, where: list[str] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(flat result rows, one record per input file saying what it held). With `max_settings`,
    more distinct settings than that among the rows matching `where` (all rows without it), over
    all the files, are refused as soon as a row brings the count past it, before the rest is
    read (`SettingsCount`)."""
    count = SettingsCount(max_settings, where or [])
    rows: list[dict[str, Any]] = []
    sources = []
    for path in paths:
        if not path.is_file():
            raise NphError(f"results file {path} not found")
        if _holds_retrieve_records(path):
            records, found, failed = [], [], []
            for number, line in _numbered_lines(path):  # counted as read: too many stop it
                record = _record(line, f"{path} line {number}")
                if _is_failed_job(record):
                    failed.append(number)
                    continue
                records.append(record)
                found.append(count.add(_flat(record)))
            if failed:
                lines = f"line {', '.join(map(str, failed[:5]))}{', ...' if failed[5:] else ''}"
                if not records:
                    raise NphError(f"{path} holds no results: every nph batch job failed ({lines})")
                notice(f"{path}: {len(failed)} failed nph batch jobs left out ({lines})")
            kind = "nph retrieve / nph batch JSON Lines"
            config = _shared([record.get("config") for record in records]) if records else None
        else:
            first: list[bool] = []  # the first row is looked at before any row is taken

            def take(row: dict[str, Any], path: Path = path, first: list = first) -> dict:
                if not first:
                    refuse_foreign(path, row)
                    first.append(True)
                return count.add(row)

            found = read_results(path, each_row=take).rows
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
    names them) among the rows `add`ed that match `where`; past `limit` (None: no limit) the
    row that brings the count over it is refused in one line."""

    def __init__(self, limit: int | None, where: list[str]):
        self.limit, self.where = limit, where
        self.seen: set[frozenset] = set()

    def add(self, row: dict[str, Any]) -> dict[str, Any]:
        if self.limit is None or not matching([row], self.where):
            return row
        key = frozenset((c, short(v)) for c, v in row.items() if is_setting(c) and v is not None)
        self.seen.add(key)
        if len(self.seen) > self.limit:
            chosen = " matching --where" if self.where else ""
            raise NphError(
                f"the results hold more than {self.limit:,} distinct settings{chosen}; a report "
                "shows at most that many: choose fewer with --where or report a part of the file"
            )
        return row


def refuse_foreign(path: Path, row: dict[str, Any]) -> None:
    """Refuse, in one line saying what the file looks like instead, a results file whose first
    row is not one nph writes: a row of `nph sweep` or `nph retrieve --csv` names its model
    (`model`, or a sweep's `label`) and holds at least one metric (`success_mean`, ...)."""
    from nphcli.models.registry import model_names
    from nphcli.presentation.plot_data import METRIC_LABELS

    columns = [str(c) for c in row]
    metrics = {*METRIC_LABELS, *(f"{m}_mean" for m in METRIC_LABELS)}
    if ("model" in columns or "label" in columns) and metrics & set(columns):
        return
    if columns and columns[0] in model_names():
        raise NphError(
            f"{path} has no header row: its first line is data (e.g. written only with `nph "
            "retrieve --csv --no-header`); put the header first: write the first run with "
            "`nph retrieve --csv > FILE` and append the others with --no-header"
        )
    if columns and all(isinstance(cell_value(c), (int, float)) for c in columns):
        looks = f"a table of numbers without a header row (its first line: {','.join(columns)})"
    elif path.suffix.lower() == ".csv":
        looks = f"a CSV file with the columns {', '.join(columns[:8])}"
        looks += ", ..." if columns[8:] else ""
    else:
        looks = f"JSON Lines of objects with the keys {', '.join(columns[:8])}"
        looks += ", ..." if columns[8:] else ""
    raise NphError(
        f"{path} is not a results file of nph (sweep, retrieve or batch): it looks like {looks}"
    )


def _holds_retrieve_records(path: Path) -> bool:
    """Whether `path` is JSON Lines of `nph retrieve --json` / `nph batch` (one object with
    `config` and `metrics` per line, or a failed job's error) rather than sweep rows; only its
    first line that is not a failed job is read to tell."""
    if path.suffix.lower() not in (".jsonl", ".ndjson", ".json"):
        return False
    failed = False
    try:
        for number, line in _numbered_lines(path):
            record = parse_json(line, what=f"{path} line {number}")
            if not _is_failed_job(record):  # a failed batch job tells nothing: the next line
                return isinstance(record, dict) and "config" in record and "metrics" in record
            failed = True
    except NphError:
        return False
    return failed  # only failed jobs: batch output holding no results


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-empty line, read one at a time; lines end in \\n,
    \\r\\n or \\r, and a line that is not UTF-8 is refused by its number."""
    try:
        with open(path, "rb") as handle:
            number = 0
            for chunk in handle:  # ends at \\n; a \\r inside ends a line too
                for raw in chunk.splitlines() or [b""]:
                    number += 1
                    try:
                        text = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        raise NphError(f"{path} line {number}: not UTF-8 text") from None
                    if text.strip():
                        yield number, text
    except OSError as error:
        raise NphError(f"cannot read results file {path}: {error.strerror or error}") from None


def _is_failed_job(record: Any) -> bool:
    """Whether `record` is `nph batch`'s line for a job that failed: {"job": N, "error": ...}."""
    return isinstance(record, dict) and "error" in record and "config" not in record


def _record(line: str, where: str) -> dict[str, Any]:
    """One `nph retrieve --json` object or failed batch job, refused in one line where it is
    neither."""
    record = parse_json(line, what=where)
    if not (_is_failed_job(record) or _is_retrieve_result(record)):
        raise NphError(
            f"{where}: not an `nph retrieve --json` result (its config, model or metrics are "
            "missing or not objects)"
        )
    return record


def _is_retrieve_result(record: Any) -> bool:
    """Whether `record` has the shape `_flat` reads: a config object naming its model, and an
    object (or null) wherever `_flat` looks inside one."""
    if not (isinstance(record, dict) and isinstance(record.get("config"), dict)):
        return False
    config, metrics = record["config"], record.get("metrics")
    if not isinstance(config.get("model"), str) or not isinstance(metrics, (dict, type(None))):
        return False
    inner = [config.get(key) for key in ("params", "corruption", "memory")]
    inner += [record.get("timing"), *(metrics or {}).values()]
    return all(value is None or isinstance(value, dict) for value in inner)


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
    row: dict[str, Any] = {"model": config["model"], **(config.get("params") or {})}
    row.update({key: (config.get("corruption") or {}).get(key) for key in ("mask", "noise")})
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
