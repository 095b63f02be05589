"""The paper's printed tables as data (`PAPER_TABLES`: MIL ROC-AUC, "mil_benchmark"; time-series
MSE / MAE, "mts-result"), and nph's per-seed results set beside them as `Cell`s with a verdict
(docs/paper-tables.md describes the columns, verdicts and files).

The spread is the sample standard deviation over seeds (ddof = 1); "within" means
|nph mean − paper| ≤ spread. One seed has no spread: its spread and "within" are None, shown as
"n/a (1 seed)", never as a spread of 0 that only an exact match would be within.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from nphcli.core.atomic import atomic_write
from nphcli.core.errors import NphError
from nphcli.experiments.mil_config import PAPER_MIL_MODELS
from nphcli.experiments.timeseries_config import VARIANTS as TS_VARIANTS


@dataclass(frozen=True)
class PaperTable:
    """One table of the paper: values[(row, column)] as printed (None where unreadable)."""

    name: str  # the table's LaTeX label, e.g. "mil_benchmark"
    title: str  # what it shows, in words
    metric: str  # the unit of its cells, e.g. "ROC-AUC" or "MSE / MAE"
    higher_is_better: bool  # True for AUC, False for errors
    rows: tuple[str, ...]  # nph's model labels (dense, sparse, topk-20%, ...)
    columns: tuple[str, ...]  # data sets, or "dataset/horizon/metric"
    values: Mapping[tuple[str, str], float | None]
    source: str  # where in the paper's source the numbers are
    notes: tuple[str, ...] = field(default=())  # typos and caveats of the printed table
    not_comparable: Mapping[str, str] = field(default_factory=dict)  # row -> the code's defect


@dataclass(frozen=True)
class Cell:
    """One (model, column) of a reproduction beside the paper's value."""

    table: str
    row: str
    column: str
    paper: float | None  # the printed value; None where the paper prints none
    mean: float | None  # nph's mean over seeds; None where nph has no result
    std: float | None  # sample standard deviation over seeds; None with fewer than two
    seeds: int  # how many seeds nph's mean is over
    difference: float | None  # mean − paper
    within: bool | None  # |difference| ≤ std; None when either side or the spread is missing
    better: bool | None  # nph's mean beats the paper's value (in the table's direction)
    verdict: str | None = None  # one of VERDICTS; None: no paper value, no result or one seed
    reason: str | None = None  # why a cell is not comparable (the released code's defect)


VERDICTS = ("within", "outside", "not comparable", "baseline")


# nph's model labels (the experiments' variant labels) → the paper's row names.
MODEL_NAMES = {
    "dense": "Dense",
    "sparse": "Sparse",
    "topk-20%": "Top-20%",
    "topk-50%": "Top-50%",
    "topk-80%": "Top-80%",
    "window": "Window",
    "random-feature": "Random feature",
    "linear": "Linear",
    "repeat-last": "Repeat last (baseline)",
    "input-mean": "Input mean (baseline)",
    "least-squares": "Least squares (baseline)",
    "bag-size": "Bag size (baseline)",
}
# Trivial predictors printed beside the models (time series: `timeseries.baselines`; MIL:
# `mil_paper.bag_size_aucs`): what a table's numbers mean is where they sit above this floor.
BASELINES = ("repeat-last", "input-mean", "least-squares", "bag-size")

_MIL_ROWS = PAPER_MIL_MODELS
_MIL_COLUMNS = ("Tiger", "Fox", "Elephant", "UCSB")
_MIL_PRINTED = {  # paper lines 2431-2465, Tiger / Fox / Elephant / UCSB
    "dense": (0.813, 0.563, 0.877, 0.524),
    "sparse": (0.830, 0.573, 0.893, 0.585),
    "topk-20%": (0.824, 0.562, 0.848, 0.586),
    "topk-50%": (0.812, 0.566, 0.852, 0.572),
    "topk-80%": (0.812, 0.560, 0.872, 0.551),
    "random-feature": (0.802, 0.508, 0.875, 0.566),
    "linear": (0.797, 0.571, 0.869, 0.561),
}

_TS_ROWS = tuple(v.label for v in TS_VARIANTS)
_TS_HORIZONS = (96, 192, 336, 720)
# Paper lines 2493-2521 as printed: data set, horizon, then (MSE, MAE) of each row of _TS_ROWS
# in order. The ETTm1/96 Top-80% MAE is printed "0.31o": written "-" (missing), not guessed.
_TS_PRINTED = """
ETTh1 96  .137 .307 .144 .314 .148 .319 .153 .321 .147 .318 1.043 .881 .147 .312 .149 .320
ETTh1 192 .153 .326 .152 .325 .146 .318 .161 .333 .150 .320 1.003 .870 .158 .332 .141 .313
ETTh1 336 .148 .319 .146 .319 .156 .327 .122 .286 .160 .333 .889 .767 .151 .322 .138 .307
ETTh1 720 .169 .331 .148 .314 .184 .345 .161 .327 .123 .287 .756 .761 .141 .271 .171 .333
ETTm1 96  .148 .301 .147 .301 .144 .311 .151 .310 .142 -    .943 .854 .151 .314 .155 .319
ETTm1 192 .189 .350 .187 .340 .191 .347 .185 .338 .188 .341 1.054 .893 .190 .347 .192 .348
ETTm1 336 .163 .320 .165 .322 .168 .331 .161 .312 .169 .330 .873 .334 .175 .333 .176 .337
ETTm1 720 .159 .300 .161 .303 .165 .313 .167 .313 .169 .320 .764 .731 .162 .309 .165 .310
ECL 96  .378 .371 .373 .370 .384 .382 .386 .386 .383 .376 .989 .854 .390 .403 .365 .378
ECL 192 .486 .426 .535 .507 .502 .427 .501 .464 .519 .481 1.000 .843 .543 .438 .549 .464
ECL 336 .748 .693 .760 .688 .650 .549 .674 .571 .638 .545 1.012 .849 .767 .588 .672 .578
ECL 720 .961 .711 .993 .758 1.145 .843 1.166 .847 1.211 .872 1.061 .865 1.362 .896 1.052 .770
WTH 96  .347 .474 .347 .477 .348 .474 .348 .474 .356 .479 .952 .819 .345 .470 .355 .476
WTH 192 .399 .505 .386 .497 .360 .482 .370 .490 .361 .482 .977 .828 .368 .487 .354 .478
WTH 336 .407 .512 .387 .501 .376 .489 .397 .503 .403 .505 .931 .808 .392 .504 .407 .514
WTH 720 .669 .631 .632 .623 .590 .604 .569 .593 .618 .618 .564 .595 .564 .595 .747 .676
Traffic 96  1.466 .654 1.489 .638 1.483 .645 1.517 .630 1.477 .638 1.520 .625 1.515 .635 1.489 .644
Traffic 192 1.551 .654 1.550 .657 1.557 .649 1.548 .657 1.551 .652 1.570 .637 1.551 .654 1.551 .653
Traffic 336 1.595 .663 1.595 .662 1.599 .663 1.592 .665 1.604 .657 1.612 .646 1.613 .646 1.614 .646
Traffic 720 1.660 .681 1.671 .671 1.664 .674 1.676 .663 1.682 .661 1.683 .661 1.682 .661 1.681 .660
"""


def ts_column(dataset: str, horizon: int, metric: str) -> str:
    """The column label of the time-series table, e.g. `ETTh1/96/MSE`."""
    return f"{dataset}/{horizon}/{metric}"


def _time_series_values() -> dict[tuple[str, str], float | None]:
    values: dict[tuple[str, str], float | None] = {}
    for line in _TS_PRINTED.strip().splitlines():
        dataset, horizon, *printed = line.split()
        assert len(printed) == 2 * len(_TS_ROWS), line  # a mistyped line must not load
        for i, row in enumerate(_TS_ROWS):
            for metric, text in (("MSE", printed[2 * i]), ("MAE", printed[2 * i + 1])):
                value = None if text == "-" else float(text)
                values[row, ts_column(dataset, int(horizon), metric)] = value
    return values


_TS_DATASETS = ("ETTh1", "ETTm1", "ECL", "WTH", "Traffic")


PAPER_TABLES: dict[str, PaperTable] = {
    "mil_benchmark": PaperTable(
        name="mil_benchmark",
        title="MIL benchmarks, ROC-AUC",
        metric="ROC-AUC",
        higher_is_better=True,
        rows=_MIL_ROWS,
        columns=_MIL_COLUMNS,
        values={
            (row, column): value
            for row, printed in _MIL_PRINTED.items()
            for column, value in zip(_MIL_COLUMNS, printed, strict=True)
        },
        source="paper source lines 2431-2465 (Table mil_benchmark)",
        notes=(
            "The paper says its MIL network is simpler, and its search space smaller, than the "
            "earlier Hopfield papers', so its numbers do not match theirs.",
        ),
        not_comparable=dict.fromkeys(
            ("random-feature", "linear"),
            "the released code pools with an inverted padding mask, so a bag's logit depends "
            "only on its size (0.61-0.63 AUC from that code)",
        ),
    ),
    "mts-result": PaperTable(
        name="mts-result",
        title="Univariate time-series prediction, MSE and MAE",
        metric="MSE / MAE",
        higher_is_better=False,
        rows=_TS_ROWS,
        columns=tuple(
            ts_column(d, h, m) for d in _TS_DATASETS for h in _TS_HORIZONS for m in ("MSE", "MAE")
        ),
        values=_time_series_values(),
        source="paper source lines 2493-2521 (Table mts-result)",
        notes=(
            "ETTm1/96 Top-80% MAE is printed '0.31o'; kept as missing.",
            "The text names horizons 96, 196, 336, 720; the table 96, 192, 336, 720.",
        ),
        not_comparable={
            "sparse": "the released 'sparsemax' mode computes softmax",
            **dict.fromkeys(
                ("topk-20%", "topk-50%", "topk-80%"),
                "the released top-k sets unselected scores to 0, not -inf: a soft top-k",
            ),
            "window": "the released layer returns a sequence-first tensor that its caller reads "
            "batch-first, mixing samples across the batch (about a constant prediction's error)",
        },
    ),
}


def get_table(name: str) -> PaperTable:
    if name not in PAPER_TABLES:
        raise NphError(f"unknown paper table {name!r}; choose {', '.join(PAPER_TABLES)}")
    return PAPER_TABLES[name]


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (ddof = 1; None for one value, which has none)."""
    if not values:
        raise ValueError("mean_std needs at least one value")
    mean = math.fsum(values) / len(values)
    if len(values) == 1:
        return mean, None
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def compare(
    table: PaperTable,
    per_seed: Mapping[tuple[str, str], Sequence[float]],
    *,
    columns: Sequence[str] | None = None,
    rows: Sequence[str] | None = None,
) -> list[Cell]:
    """One cell per (row, column) of `table` (or of the `rows` / `columns` given, in their
    order), row-major: the paper's value beside nph's per-seed results `per_seed[(row, column)]`
    (one number per seed; missing or empty where nph has none). A row or column the paper does
    not print (a data set it did not run) has paper None."""
    rows = table.rows if rows is None else tuple(rows)
    columns = table.columns if columns is None else tuple(columns)
    cells = []
    for row in rows:
        for column in columns:
            paper = table.values.get((row, column))
            seeds = list(per_seed.get((row, column), ()))
            mean = std = difference = within = better = verdict = None
            reason = table.not_comparable.get(row)
            if seeds:
                mean, std = mean_std(seeds)
                if paper is not None:
                    difference = mean - paper
                    within = None if std is None else abs(difference) <= std
                    better = mean > paper if table.higher_is_better else mean < paper
                    verdict = {True: "within", False: "outside", None: None}[within]
            if reason and paper is not None:  # whether or not nph has run it
                verdict = "not comparable"
            verdict = "baseline" if row in BASELINES else verdict
            cells.append(
                Cell(
                    table.name, row, column, paper, mean, std, len(seeds), difference, within,
                    better, verdict, reason if paper is not None else None,
                )
            )  # fmt: skip
    return cells


def summary(cells: Iterable[Cell]) -> dict[str, Any]:
    """How many comparable cells lie within the spread, and which do not; cells the released
    code makes not comparable, and cells of one seed (no spread to be within), counted apart."""
    cells = list(cells)
    compared = [c for c in cells if c.verdict in ("within", "outside")]
    outside = [f"{c.row} {c.column}" for c in compared if c.verdict == "outside"]
    return {
        "compared": len(compared),
        "within": len(compared) - len(outside),
        "outside": outside,
        "not_comparable": sum(1 for c in cells if c.verdict == "not comparable"),
        "one_seed": sum(
            1 for c in cells if c.verdict is None and c.seeds == 1 and c.paper is not None
        ),
    }


NO_SPREAD = "n/a (1 seed)"


def spread_text(cell: Cell, digits: int = 3) -> str:
    """`mean ± spread` of a cell, `mean ± n/a (1 seed)` for one seed, the mean alone for a
    deterministic baseline, "" without a result."""
    if cell.mean is None:
        return ""
    if cell.std is None and cell.verdict == "baseline":  # deterministic: nothing to spread
        return f"{cell.mean:.{digits}f}"
    spread = NO_SPREAD if cell.std is None else f"{cell.std:.{digits}f}"
    return f"{cell.mean:.{digits}f} ± {spread}"


def seeds_text(cells: Iterable[Cell]) -> str:
    """How many seeds the models' results in `cells` average: `1 seed`, `2 seeds`, `1–2 seeds`
    (a deterministic baseline's one evaluation is not a seed)."""
    counts = sorted({c.seeds for c in cells if c.seeds and c.verdict != "baseline"})
    if not counts:
        return "no seeds"
    low, high = counts[0], counts[-1]
    return f"{low} seed" if high == 1 else f"{low}–{high} seeds" if low < high else f"{low} seeds"


def markdown(cells: Sequence[Cell], *, digits: int = 3) -> str:
    """The comparison as a Markdown table for the docs: a row per model, a column per table
    column, each cell `nph mean ± spread (paper value)`, in bold where the paper's value is
    outside nph's spread, in italics where the cell is not comparable."""
    columns = list(dict.fromkeys(c.column for c in cells))
    rows = list(dict.fromkeys(c.row for c in cells))
    by_key = {(c.row, c.column): c for c in cells}
    lines = ["| model | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]
    for row in rows:
        texts = []
        for column in columns:
            cell = by_key[row, column]
            text = spread_text(cell, digits)
            if cell.paper is not None:
                text = f"{text} ({cell.paper:.{digits}f})".strip()
            marks = {"outside": "**", "not comparable": "*"}.get(cell.verdict or "", "")
            texts.append(f"{marks}{text}{marks}" if text else text)
        lines.append(f"| {MODEL_NAMES.get(row, row)} | " + " | ".join(texts) + " |")
    return "\n".join(lines) + "\n"


def cells_json(table: PaperTable, cells: Sequence[Cell], meta: Mapping[str, Any]) -> dict:
    """The comparison as one JSON-ready object: what it came from (`meta`), the table, the cells."""
    return {
        "table": table.name,
        "title": table.title,
        "metric": table.metric,
        "higher_is_better": table.higher_is_better,
        "paper_source": table.source,
        "paper_notes": list(table.notes),
        **dict(meta),
        "summary": summary(cells),
        "cells": [asdict(c) for c in cells],
    }


def write_json(
    path: str | os.PathLike, table: PaperTable, cells: Sequence[Cell], meta: Mapping[str, Any]
) -> None:
    """The comparison as JSON (`cells_json`), written atomically; NaN/inf become null."""
    text = json.dumps(_finite(cells_json(table, cells, meta)), indent=1, allow_nan=False)
    with atomic_write(path, force=True) as tmp:
        tmp.write_text(text + "\n")


CSV_FIELDS = tuple(Cell.__dataclass_fields__)


def write_csv(path: str | os.PathLike, cells: Sequence[Cell]) -> None:
    """One CSV row per cell (`CSV_FIELDS`), written atomically; a missing value is empty."""
    with atomic_write(path, force=True) as tmp:
        with open(tmp, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS, lineterminator="\n")
            writer.writeheader()
            for cell in cells:
                writer.writerow({k: "" if v is None else v for k, v in asdict(cell).items()})


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
