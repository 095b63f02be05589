"""The results file of a sweep: its formats, reading it back, appending rows, resuming.

Rows are appended as they finish, each written whole, flushed and fsynced; with `force` they go
to NAME.partial.EXT, renamed over the old file when the sweep completes (docs/sweeps.md,
"Results"). Every other file nph writes is replaced atomically; this one grows row by row on
purpose.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nphcli.core.atomic import check_folder, fsync_folder, write_failure_reason
from nphcli.core.errors import NphError, NphRuntimeError
from nphcli.core.jsontext import parse_json
from nphcli.core.lock import WriterLock
from nphcli.core.normalize import canonical_method
from nphcli.core.notices import notice
from nphcli.sweeps.config import SweepConfig

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
PARTIAL = ".partial"  # inserted before the ending of a --force sweep's temporary file
_LINE_END = re.compile(rb"\r\n|\n|\r")
# The columns that tell runs apart in a (possibly merged) results file.
RUN_KEY = ("setting", "trial", "sweep_seed", "dataset", "normalize", "run_settings")


def results_format(path: str | os.PathLike) -> str:
    """ "jsonl" or "csv", from the file name's ending."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise NphError(
            f"results file {path}: use a .jsonl (JSON Lines) or .csv name, not {suffix or 'none'}"
        )
    return FORMATS[suffix]


@dataclass
class ResultsContents:
    """A results file as read back."""

    rows: list[dict[str, Any]]
    header: list[str] | None  # CSV only
    good_bytes: int  # length of the part made of complete rows
    dropped: bool  # True when a cut-short last line was left out
    duplicates: int = 0  # rows left out because the same run was already read


def read_results(
    path: str | os.PathLike, each_row: Callable[[dict[str, Any]], None] | None = None
) -> ResultsContents:
    """Rows of a JSON Lines or CSV results file, numbers parsed, empty cells as None.

    Lines end in \\n, \\r\\n or \\r. Files merged by concatenation (`cat a.csv b.csv`) or
    appended to twice read as one: a CSV header line repeated further down is skipped, and a run
    read twice (the same `setting`, `trial`, `sweep_seed`, `dataset`, `normalize` and
    `run_settings` for sweep rows, else an identical row) is kept once and counted in
    `duplicates`. A header with other columns in the middle of a CSV (rows of another grid or
    nph version) is an error naming its line. A last line cut short (no line ending, after at
    least one complete line) is left out and reported in `dropped`; any other line that is not
    a complete row (bytes that are not UTF-8, a stray \\r in a field, ...) is an error naming it.
    `each_row` sees every row kept as it is read, and may stop the reading by raising (a report
    refuses too many settings before it holds them all).
    """
    path = Path(path)
    fmt = results_format(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise NphError(f"cannot read results file {path}: {error.strerror or error}") from None
    good = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1  # where complete lines end
    tail = data[good:]
    dropped = bool(tail.strip())
    if dropped and not _cut_short(tail, fmt, after_lines=good > 0):
        complete = sum(1 for _ in _lines(data, good))
        raise NphError(
            f"{path}, line {complete + 1}: not a complete results row and not one cut short "
            "by an interruption; the file is not a results file nph wrote, or is damaged"
        )
    rows: list[dict[str, Any]] = []
    seen: set = set()
    duplicates = 0
    header = None
    for number, line in enumerate(_lines(data, good), start=1):
        parsed = _parse_line(line, fmt, header)
        if parsed == "":
            continue  # an empty line
        if fmt == "csv" and header is not None and isinstance(parsed, list):
            if parsed == header:  # the header again: files joined with cat, or a second writer
                continue
            raise NphError(
                f"{path}, line {number}: a second header with other columns than line "
                "1's; the file joins results of different grids or nph versions: split it "
                "there, or plot and resume each part on its own"
            )
        if parsed is None:
            raise NphError(
                f"{path}, line {number}: not a complete results row; the file is damaged "
                "(only a cut-short last line is repaired by --resume)"
            )
        if fmt == "csv" and header is None:
            header = parsed
            continue
        key = _run_key(parsed)
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        if each_row is not None:
            each_row(parsed)
        rows.append(parsed)
    if duplicates:
        notice(f"{path}: {duplicates} rows repeat runs read earlier in the file; each kept once")
    return ResultsContents(rows, header, good, dropped, duplicates)


def _lines(data: bytes, good: int) -> Iterator[bytes]:
    """The complete lines of `data[:good]`, one at a time (without their endings: \\n, \\r\\n
    or \\r), so a reader that stops early never holds a copy of every line."""
    start = 0
    for match in _LINE_END.finditer(data, 0, good):
        yield data[start : match.start()]
        start = match.end()


def _cut_short(tail: bytes, fmt: str, *, after_lines: bool) -> bool:
    """Whether a last line without an ending looks like a row that a kill cut short: text that
    starts a row of this format, after at least one complete line (never the whole file)."""
    if not after_lines or b"\0" in tail:
        return False
    try:  # a multi-byte character cut at the end is held back, not an error
        text = codecs.getincrementaldecoder("utf-8")().decode(tail, final=False).strip()
    except UnicodeDecodeError:
        return False
    return text.startswith("{") if fmt == "jsonl" else bool(text)


def _looks_like_header(cells: list[str], header: list[str]) -> bool:
    """Whether a CSV line is a header (of any grid): mostly names of this file's columns and
    no numbers, as a data row of nph is mostly numbers."""
    named = sum(1 for cell in cells if cell in header)
    numbers = sum(1 for cell in cells if isinstance(cell_value(cell), (int, float)))
    return numbers == 0 and named >= min(3, len(cells))


def _run_key(row: dict[str, Any]) -> Any:
    """What identifies a run: its setting, trial, seed, data and settings for sweep rows (so
    files of two seeds merged keep every row), else the whole row."""
    if "setting" in row and "trial" in row:
        return ("run", *(str(row.get(k)) for k in RUN_KEY))
    return json.dumps(row, sort_keys=True, default=str)


def _parse_line(line: bytes, fmt: str, header: list[str] | None):
    """A JSON object, a CSV line's cells (the header) or its row; "" for an empty line, None
    for a line that is not a complete row (not UTF-8, not valid JSON, NUL or stray \\r, ...)."""
    try:
        text = line.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    if not text:
        return ""
    if fmt == "jsonl":
        try:
            value = parse_json(text, what="a results line")
        except NphError:
            return None
        return value if isinstance(value, dict) else None
    if "\0" in text:  # Python's csv reads NUL as a character since 3.11; no row of nph holds one
        return None
    try:
        cells = next(csv.reader([text], strict=True))
    except csv.Error:
        return None
    if header is None or cells == header or _looks_like_header(cells, header):
        return cells
    if len(cells) != len(header):
        return None
    return {key: cell_value(value) for key, value in zip(header, cells, strict=True)}


def cell_value(text: str) -> Any:
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


class Results:
    """The results file of one sweep: rows already there, and appending new ones durably."""

    def __init__(
        self, path: str | os.PathLike, *, resume: bool = False, force: bool = False
    ) -> None:
        self._lock: WriterLock | None = None
        self.path = Path(path)
        self.format = results_format(self.path)
        self.write_path = self.path
        self.existing: list[dict[str, Any]] = []
        self.header: list[str] | None = None
        self.written = 0
        self._handle: io.TextIOBase | None = None
        if resume and force:
            raise NphError("choose one of --resume (continue the file) and --force (replace it)")
        if resume and self.path.is_file():  # appends to the file itself: its folder may be locked
            if not os.access(self.path, os.W_OK):
                raise NphError(f"cannot continue {self.path}: the file is not writable")
        else:
            check_folder(self.path)
        self._lock = WriterLock(self.path)  # one writer at a time, for the whole sweep
        try:
            self._open_existing(resume=resume, force=force)
        except BaseException:
            self._lock.release()
            raise

    def _open_existing(self, *, resume: bool, force: bool) -> None:
        if self.path.exists():
            if resume:
                self._load_existing()
            elif force:
                self.write_path = self.path.with_name(self.path.stem + PARTIAL + self.path.suffix)
                self.write_path.unlink(missing_ok=True)  # a partial file of an earlier --force
            else:
                raise NphError(
                    f"{self.path} already exists; pass --resume to continue it or --force to "
                    "replace it"
                )
        elif resume:
            notice(f"{self.path} does not exist yet: starting a new sweep")

    def _load_existing(self) -> None:
        loaded = read_results(self.path)
        self.existing, self.header = loaded.rows, loaded.header
        for row in self.existing:
            if row.get("setting") is None or not isinstance(row.get("trial"), int):
                raise NphError(
                    f"{self.path} holds rows that are not runs of nph sweep (no setting or "
                    "trial); resume only a file nph sweep wrote, or choose another --out"
                )
        if loaded.dropped:
            notice(f"{self.path}: dropping a cut-short last line; its run is done again")
            with open(self.path, "r+b") as handle:
                handle.truncate(loaded.good_bytes)
                handle.flush()
                os.fsync(handle.fileno())

    def done(self) -> set[tuple[str, int]]:
        """Keys (setting, trial) of the rows already in the file."""
        return {(str(row["setting"]), row["trial"]) for row in self.existing}

    def check_compatible(self, config: SweepConfig, pool_normalize: str, *, theory: bool):
        """A resumed file must come from the same sweep: dataset, seed, normalisation, and
        theory fields (present or not) as now, in every row (files may be merged ones)."""
        for row in self.existing:
            for key, value in (
                ("dataset", config.dataset),
                ("sweep_seed", config.seed),
                ("normalize", pool_normalize),
            ):
                had = row.get(key)
                if key == "normalize" and isinstance(had, str):
                    had = canonical_method(had, warn=False)  # rows of older nph: unit
                if had != value:
                    raise NphError(
                        f"{self.path} holds rows of another sweep ({key} {had!r}, "
                        f"now {value!r}); resume with the same settings or choose another --out"
                    )
            clips = config.values_of("noise_clip")  # several values: in the setting keys
            clipped = str(row.get("noise_clip", "")).lower() in ("true", "1")  # JSON or CSV
            if len(clips) == 1 and clipped != clips[0]:
                raise NphError(
                    f"{self.path} was written with noise_clip {clipped}; resume it the same way "
                    "or choose another --out"
                )
            if ("theory_m" in row) != theory:
                had = "with" if "theory_m" in row else "without"
                raise NphError(f"{self.path} was written {had} --theory; resume it the same way")

    def write(self, row: dict[str, Any]) -> None:
        """Append one row as one write, then flush and fsync."""
        if self._handle is None:
            try:
                self._handle = open(self.write_path, "a", encoding="utf-8", newline="")
            except OSError as error:
                raise NphError(
                    f"cannot write {self.write_path}: {error.strerror or error}"
                ) from None
            if self.write_path == self.path and self._lock is not None:
                self._lock.follow()  # created just now: lock it under every name it gets
            if self.format == "csv" and self.header is None:
                self.header = list(row)
                self._emit(_csv_line(self.header))
        if self.format == "csv":
            if list(row) != self.header:
                raise NphError(
                    f"{self.path} has other columns than this sweep's rows; it was written by "
                    "another version or grid of nph sweep: choose another --out"
                )
            self._emit(_csv_line(["" if v is None else v for v in row.values()]))
        else:
            clean = {k: (None if v == "" else _json_number(v)) for k, v in row.items()}
            self._emit(json.dumps(clean, allow_nan=False, ensure_ascii=False) + "\n")
        self.written += 1

    def _emit(self, line: str) -> None:
        assert self._handle is not None
        try:
            self._handle.write(line)
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as error:  # e.g. the disk filled up: not the input's fault
            raise NphRuntimeError(
                f"could not write {self.write_path}: {write_failure_reason(error)}"
            ) from error

    def finish(self) -> None:
        """Close; a --force sweep's partial file now replaces the old results file."""
        self.close()
        if self.write_path != self.path:
            if not self.write_path.exists():  # nothing to run: an empty replacement
                self.write_path.touch()
            os.replace(self.write_path, self.path)
            fsync_folder(self.path.parent)
            self.write_path = self.path
        self.release()

    def abandon(self) -> None:
        """Close after an interruption, saying where the finished rows are."""
        self.release()
        if self.write_path != self.path and self.write_path.exists():
            notice(
                f"interrupted: {self.path} is unchanged; the {self.written} rows finished are in "
                f"{self.write_path} (rename it to {self.path.name} and rerun with --resume to "
                "continue)"
            )
        elif self.written:
            notice(
                f"interrupted: {self.written} new rows are in {self.path}; rerun with --resume "
                "to continue"
            )

    def close(self) -> None:
        """Close the file if open (a later write opens it again)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def release(self) -> None:
        """Close, and let another writer have the file."""
        self.close()
        if self._lock is not None:
            self._lock.release()


def _csv_line(values: list[Any]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(values)
    return buffer.getvalue()


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
