"""What a report says about its rows: one section per input file and memory (rows of different
memories or inputs are never averaged together), each with a compact table of the settings that
vary and the metrics; what every row of a section shares is stated once above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nphcli.core.errors import NphError
from nphcli.presentation.plot_data import (
    filter_rows,
    is_setting,
    matching,
    natural,
    partition,
    short,
)
from nphcli.schema.metrics import shown_in

# table columns: metric → True when larger is better (`nphcli.schema.metrics`)
METRICS = {m.name: m.better == "higher" for m in shown_in("report")}
# Settings that say where a row came from rather than what was run: the section's provenance
# (when the same in every row), not its settings line.
PROVENANCE = ("dataset", "memory", "memory_sha256", "memory_normalize", "memory_shape", "normalize")
PROVENANCE += ("nph_version", "device", "dtype", "tf32", "stream", "memory_budget", "sweep_seed")
# Identifies a memory, in order of preference (the content hash, else its name).
MEMORY_KEYS = ("memory_sha256", "dataset", "memory")


@dataclass
class Section:
    """Rows of one input file and one memory, with what the reader is told about them."""

    title: str
    rows: list[dict[str, Any]]
    source: dict[str, Any]  # the input file's record (`sweeps.reading.read_inputs`)
    memory: str  # the memory, in words ("" when the rows do not say)
    split: int = 1  # how many memories the input file held (sections made of it)


@dataclass
class Table:
    """A section's compact table: `columns` (varying settings), then `count` when the number of
    rows per setting varies, then `metrics`; `body` holds one list of cells per setting."""

    columns: list[str]
    metrics: list[str]
    body: list[list[Any]]  # settings as text, count, metric means (None: no value)
    count: bool  # whether a "rows" column is shown
    constants: list[tuple[str, str]] = field(default_factory=list)  # settings, same in every row
    provenance: list[tuple[str, str]] = field(default_factory=list)  # the same, of provenance
    follows: dict[str, str] = field(default_factory=dict)  # column left out → the one it follows


def sections(
    rows: list[dict[str, Any]], sources: list[dict[str, Any]], where: list[str] | None = None
) -> list[Section]:
    """The sections of `rows` read from `sources` (in order, `source["rows"]` each), keeping the
    rows that match `where` (`COLUMN=VALUE[,VALUE...]`, as `nph plot --where`)."""
    if where:
        filter_rows(rows, where)  # a column no row has, or no row matching: an error, as in plot
    out: list[Section] = []
    start = 0
    for source in sources:
        own = rows[start : start + source["rows"]]
        start += source["rows"]
        groups: dict[str, list[dict[str, Any]]] = {}
        for row in own:
            groups.setdefault(memory_key(row), []).append(row)
        for key, members in groups.items():
            kept = matching(members, where or [])
            if not kept:
                continue
            title = source["path"] + (f" · memory {key}" if len(groups) > 1 else "")
            out.append(Section(title, kept, source, _memory_words(kept), len(groups)))
    return out


def memory_key(row: dict[str, Any]) -> str:
    """What tells the row's memory apart: its content hash (12 digits), else its name."""
    return next((short(row[c]) for c in MEMORY_KEYS if row.get(c) not in (None, "")), "")


def _memory_words(rows: list[dict[str, Any]]) -> str:
    first = rows[0]
    name = first.get("dataset") or first.get("memory")
    parts = [str(name)] if name else []
    for column, word in (("memory_shape", "shape"), ("memory_normalize", "normalised")):
        values = {short(row.get(column)) for row in rows}
        if len(values) == 1 and first.get(column) not in (None, ""):
            parts.append(f"{word} {short(first[column])}")
    if first.get("memory_sha256"):
        parts.append(f"sha256 {short(first['memory_sha256'])}")
    return ", ".join(parts)


def compact_table(rows: list[dict[str, Any]], first: str | None = None) -> Table:
    """The table of `rows` (one section): one line per setting (rows that differ only in trial
    columns are averaged), a column per setting that varies (`first` leading when it is one),
    a column per metric; constants listed apart. A column that follows another one to one (Q
    and batch_size follow M) is left out and named in `follows`."""
    settings = [c for c in dict.fromkeys(c for row in rows for c in row) if is_setting(c)]
    varying = [c for c in settings if len({short(row.get(c)) for row in rows}) > 1]
    # what was run first, where it came from after: M leads, memory_shape follows it
    varying.sort(key=lambda c: (c != first, c in PROVENANCE))
    columns, follows = [], {}
    for column in varying:
        lead = next((c for c in columns if _one_to_one(rows, c, column)), None)
        if lead is None:
            columns.append(column)
        else:
            follows[column] = lead
    groups = partition(rows, columns)
    metrics = [m for m in METRICS if any(metric_value(row, m) is not None for row in rows)]
    body = []
    for key in sorted(groups, key=lambda k: tuple(natural(v) for v in k)):
        members = groups[key]
        means = []
        for metric in metrics:
            values = [v for v in (metric_value(row, metric) for row in members) if v is not None]
            means.append(sum(values) / len(values) if values else None)
        body.append([*("" if v == "none" else v for v in key), len(members), *means])
    table = Table(columns, metrics, body, count=len({line[len(columns)] for line in body}) > 1)
    table.follows = follows
    for column in settings:
        if column not in varying and rows[0].get(column) not in (None, ""):
            value = rows[0][column]  # provenance in full (the whole content hash)
            shown = (column, str(value) if column in PROVENANCE else short(value))
            (table.provenance if column in PROVENANCE else table.constants).append(shown)
    if not table.count:
        runs = body[0][len(columns)]
        table.constants.append(("runs per line", f"{runs} (trials averaged)" if runs > 1 else "1"))
    return _constant_metrics_out(table)


def _constant_metrics_out(table: Table) -> Table:
    """A metric with one value on every line is said once (with the constants), not as a
    column; with a single line, every metric is."""
    at = len(table.columns) + 1
    kept = []
    for i, metric in enumerate(table.metrics):
        values = {line[at + i] for line in table.body}
        if len(values) == 1 and (len(table.body) == 1 or None not in values):
            (value,) = values
            if value is not None:
                table.constants.append((metric, f"{value:.4g}"))
        else:
            kept.append(i)
    table.metrics = [table.metrics[i] for i in kept]
    table.body = [line[:at] + [line[at + i] for i in kept] for line in table.body]
    return table


def _one_to_one(rows: list[dict[str, Any]], a: str, b: str) -> bool:
    pairs = {(short(row.get(a)), short(row.get(b))) for row in rows}
    return len(pairs) == len({p[0] for p in pairs}) == len({p[1] for p in pairs})


def metric_value(row: dict[str, Any], metric: str) -> float | None:
    """The row's mean of `metric` (`<metric>_mean`, else the column `metric`), if a number."""
    value = row.get(f"{metric}_mean", row.get(metric))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def check_facet(facet: str | None, found: list[Section]) -> None:
    """`--facet` must name a setting of at least one section (as `nph plot` asks)."""
    if facet is None:
        return
    settings = {c for s in found for row in s.rows for c in row if is_setting(c)}
    if facet not in settings:
        raise NphError(f"--facet {facet!r}: choose a setting: {', '.join(sorted(settings))}")
