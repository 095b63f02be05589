"""Time series for the paper's prediction experiment: read a CSV, split it, scale it, cut windows.

The layout of the ETT, Weather, ECL and Traffic files (Informer's): a header, a date column, then
numeric columns, one the target (ETT's `OT`). Only the target is used (univariate), but every
cell of every numeric column must be a finite number, so a damaged file is refused, not half-used.
The splits (`ratio`, the released code's and the default; `months`, Informer's), the scaler fitted
on the training part and why are in docs/reproduction-timeseries.md. Validation and test begin
`input_len` rows before their border, so their first window predicts the part's first row.
"""

from __future__ import annotations

import csv
import hashlib
import math
import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch
from torch import Tensor

from nphcli.core.bounded import read_bytes
from nphcli.core.errors import NphError

SPLITS = ("months", "ratio")
PARTS = ("train", "val", "test")
MONTH_DAYS = 30  # Informer's month
MONTHS = (12, 4, 4)  # train, validation, test
RATIOS = (0.7, 0.1, 0.2)


@dataclass(frozen=True)
class Series:
    """One univariate series read from a CSV file."""

    values: Tensor  # (T,) float64, the target column in file order
    step_seconds: float  # the median time between consecutive rows
    path: str
    target: str
    sha256: str  # of the file's bytes: what the results came from

    @property
    def rows_per_day(self) -> int:
        return max(1, round(86_400 / self.step_seconds))


def read_series(path: str | Path, target: str = "OT") -> Series:
    """The `target` column of a CSV file with a date column first and numeric columns after it.

    Refused with one line naming the place: a missing file, no header or no data rows, a target
    not among the columns, a row with the wrong number of cells, a cell that is not a finite
    number, a date that cannot be read, dates with and without a time zone, dates that do not
    increase."""
    path = Path(path)
    raw = read_bytes(path, what="time series")  # bounded: an endless input is refused
    try:
        rows = list(csv.reader(raw.decode("utf-8-sig").splitlines()))
    except (UnicodeDecodeError, csv.Error) as error:
        raise NphError(f"{path} is not a CSV text file: {error}") from None
    rows = [row for row in rows if row]
    if len(rows) < 2:
        raise NphError(f"{path} has no data rows; it needs a header and one row per time step")
    header = [name.strip() for name in rows[0]]
    if len(header) < 2:
        raise NphError(f"{path} needs a date column followed by numeric columns; got {header}")
    if target not in header[1:]:
        raise NphError(
            f"{path} has no column {target!r}; its columns after the date are "
            f"{', '.join(header[1:])} (choose one with --target)"
        )
    column = header.index(target)
    values, stamps = [], []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise NphError(f"{path} line {line}: {len(row)} cells, the header has {len(header)}")
        for name, cell in zip(header[1:], row[1:], strict=True):
            if _number(cell) is None:
                raise NphError(f"{path} line {line}, column {name!r}: {cell!r} is not a number")
        values.append(float(row[column]))
        stamps.append(_date(row[0], path, line))
        if (stamps[-1].tzinfo is None) != (stamps[0].tzinfo is None):
            raise NphError(
                f"{path} line {line}: {row[0].strip()!r} {_zone(stamps[-1])} where line 2's "
                f"date {_zone(stamps[0])}; give every date a time zone, or none"
            )
    return Series(
        values=torch.tensor(values, dtype=torch.float64),
        step_seconds=_step(stamps, path),
        path=str(path),
        target=target,
        sha256=hashlib.sha256(raw).hexdigest(),
    )


def _number(cell: str) -> float | None:
    try:
        number = float(cell)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _date(cell: str, path: Path, line: int) -> datetime:
    try:
        return datetime.fromisoformat(cell.strip())
    except ValueError:
        raise NphError(
            f"{path} line {line}: {cell!r} in the first column is not a date (YYYY-MM-DD HH:MM:SS)"
        ) from None


def _zone(stamp: datetime) -> str:
    return "has no time zone" if stamp.tzinfo is None else "has a time zone"


def _step(stamps: list[datetime], path: Path) -> float:
    steps = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:], strict=False)]
    if not steps:
        return 3600.0  # one row: no step to read; the length check refuses it anyway
    if min(steps) <= 0:
        at = next(i for i, s in enumerate(steps) if s <= 0) + 3
        raise NphError(f"{path} line {at}: the dates must increase, row after row")
    return statistics.median(steps)


def split_borders(series: Series, split: str, input_len: int) -> dict[str, tuple[int, int]]:
    """(start, end) rows of train, validation and test; validation and test start `input_len`
    rows early (see the module docstring)."""
    n = series.values.numel()
    if split == "months":
        day = series.rows_per_day
        train, val, test = (months * MONTH_DAYS * day for months in MONTHS)
        if train + val + test > n:
            raise NphError(
                f"{series.path} has {n} rows, fewer than the 20 months (12 / 4 / 4, "
                f"{train + val + test} rows at {day} a day) of the months split; "
                "use --split ratio"
            )
        ends = (train, train + val, train + val + test)
    elif split == "ratio":
        train, test = int(n * RATIOS[0]), int(n * RATIOS[2])
        ends = (train, n - test, n)
    else:
        raise NphError(f"unknown split {split!r}; choose {' or '.join(SPLITS)}")
    starts = (0, max(0, ends[0] - input_len), max(0, ends[1] - input_len))
    return dict(zip(PARTS, zip(starts, ends, strict=True), strict=True))


@dataclass(frozen=True)
class Scaler:
    """z = (x − mean) / std, fitted on the training part."""

    mean: float
    std: float

    @classmethod
    def fit(cls, values: Tensor) -> Scaler:
        std = float(values.std(unbiased=False))
        if not std > 0:
            raise NphError("the training part of the target is constant; it cannot be scaled")
        return cls(mean=float(values.mean()), std=std)

    def transform(self, values: Tensor) -> Tensor:
        return (values - self.mean) / self.std


def windows(
    values: Tensor, input_len: int, horizon: int, part: str = "series"
) -> tuple[Tensor, Tensor]:
    """Every window of a part: inputs (N, L) = values[i : i + L], targets (N, H) =
    values[i + L : i + L + H], for i = 0 … T − L − H (N = T − L − H + 1 ≥ 1)."""
    count = values.numel() - input_len - horizon + 1
    if count < 1:
        raise NphError(
            f"the {part} part has {values.numel()} rows, fewer than input + horizon = "
            f"{input_len} + {horizon}; use a shorter horizon or a longer series"
        )
    cut = values.unfold(0, input_len + horizon, 1)  # (N, L + H)
    return cut[:, :input_len], cut[:, input_len:]


@dataclass(frozen=True)
class Prepared:
    """The scaled windows of train, validation and test, float32, and where they came from."""

    parts: dict[str, tuple[Tensor, Tensor]]  # part -> (inputs (N, L), targets (N, H))
    scaler: Scaler
    borders: dict[str, tuple[int, int]]


def prepare(series: Series, *, input_len: int, horizon: int, split: str) -> Prepared:
    """Split the series, fit the scaler on the training rows, and cut each part's windows."""
    borders = split_borders(series, split, input_len)
    start, end = borders["train"]
    scaler = Scaler.fit(series.values[start:end])
    scaled = scaler.transform(series.values).to(torch.float32)  # (T,)
    parts = {
        part: windows(scaled[start:end], input_len, horizon, part)
        for part, (start, end) in borders.items()
    }
    return Prepared(parts=parts, scaler=scaler, borders=borders)


def baselines(data: Prepared) -> dict[str, tuple[float, float]]:
    """Test MSE and MAE of three trivial predictors on the same windows as the models: the last
    input value repeated, the input window's mean repeated, and least squares from the L inputs
    (and 1) to the H targets fitted on the training windows. Deterministic: no seeds."""
    x_train, y_train = (t.double() for t in data.parts["train"])
    x, y = (t.double() for t in data.parts["test"])

    def design(z: Tensor) -> Tensor:
        return torch.cat([z, torch.ones(z.shape[0], 1, dtype=z.dtype)], dim=1)  # (N, L + 1)

    weights = torch.linalg.lstsq(design(x_train), y_train).solution  # (L + 1, H)
    predictions = {
        "repeat-last": x[:, -1:].expand_as(y),
        "input-mean": x.mean(dim=1, keepdim=True).expand_as(y),
        "least-squares": design(x) @ weights,
    }
    return {
        name: (float((p - y).square().mean()), float((p - y).abs().mean()))
        for name, p in predictions.items()
    }
