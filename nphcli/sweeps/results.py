"""The results file of a sweep: its formats, reading it back, appending rows, resuming.

Results files are JSON Lines (.jsonl, .ndjson) or CSV (.csv). Rows are appended as they finish,
each written whole, flushed and fsynced, so an interrupted sweep keeps every finished row and
`resume` continues it; a last line cut short by a kill is dropped and its run done again. An
existing file is replaced only with `force`: the new rows then go to NAME.partial.EXT beside
it (results.jsonl → results.partial.jsonl), renamed over the old file when the sweep completes,
so the old file survives an interruption (the notice says how to continue from the partial
file). Every other file nph writes is replaced atomically; this one grows row by row on purpose.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nphcli.atomic import check_folder, fsync_folder, write_failure_reason
from nphcli.errors import NphError, NphRuntimeError
from nphcli.notices import notice
from nphcli.sweeps.config import SweepConfig

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
PARTIAL = ".partial"  # inserted before the ending of a --force sweep's temporary file


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


def read_results(path: str | os.PathLike) -> ResultsContents:
    """Rows of a JSON Lines or CSV results file, numbers parsed, empty cells as None.

    A last line that is cut short (no newline, or not a complete row) is left out and reported
    in `dropped`; a damaged line elsewhere is an error.
    """
    path = Path(path)
    fmt = results_format(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise NphError(f"cannot read results file {path}: {error.strerror or error}") from None
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    dropped = bool(tail.strip())
    good = len(data) - len(tail)
    rows: list[dict[str, Any]] = []
    header = None
    offsets = []
    position = 0
    for line in lines:
        offsets.append(position)
        position += len(line) + 1
    for number, line in enumerate(lines):
        last = number == len(lines) - 1
        text = line.decode("utf-8", errors="replace").strip()
        if not text:
            continue
        parsed = _parse_line(text, fmt, header)
        if parsed is None:
            if last:
                dropped, good = True, offsets[number]
                break
            raise NphError(
                f"{path}, line {number + 1}: not a complete results row; the file is damaged "
                "(only a cut-short last line is repaired by --resume)"
            )
        if fmt == "csv" and header is None:
            header = parsed
            continue
        rows.append(parsed)
    return ResultsContents(rows, header, good, dropped)


def _parse_line(text: str, fmt: str, header: list[str] | None):
    if fmt == "jsonl":
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None
    cells = next(csv.reader([text]))
    if header is None:
        return cells
    if len(cells) != len(header):
        return None
    return {key: _cell(value) for key, value in zip(header, cells, strict=True)}


def _cell(text: str) -> Any:
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
        if loaded.dropped:
            notice(f"{self.path}: dropping a cut-short last line; its run is done again")
            with open(self.path, "r+b") as handle:
                handle.truncate(loaded.good_bytes)
                handle.flush()
                os.fsync(handle.fileno())

    def done(self) -> set[tuple[str, int]]:
        """Keys (setting, trial) of the rows already in the file."""
        return {(str(row.get("setting")), int(row.get("trial", -1))) for row in self.existing}

    def check_compatible(self, config: SweepConfig, pool_normalize: str, *, theory: bool) -> None:
        """A resumed file must come from the same sweep: dataset, seed, normalisation, and
        theory fields (present or not) as now."""
        for row in self.existing:
            for key, value in (
                ("dataset", config.dataset),
                ("sweep_seed", config.seed),
                ("normalize", pool_normalize),
            ):
                if row.get(key) != value:
                    raise NphError(
                        f"{self.path} holds rows of another sweep ({key} {row.get(key)!r}, "
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
            break  # every row of a file comes from one sweep; the first one tells

    def write(self, row: dict[str, Any]) -> None:
        """Append one row as one write, then flush and fsync."""
        if self._handle is None:
            try:
                self._handle = open(self.write_path, "a", encoding="utf-8", newline="")
            except OSError as error:
                raise NphError(
                    f"cannot write {self.write_path}: {error.strerror or error}"
                ) from None
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

    def abandon(self) -> None:
        """Close after an interruption, saying where the finished rows are."""
        self.close()
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


def _csv_line(values: list[Any]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(values)
    return buffer.getvalue()


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
