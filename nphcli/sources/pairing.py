"""Values and labels from files of their own, paired row by row with a source's patterns: how
`nph store SOURCE --values FILE --labels FILE` builds keys → values (hetero-associative) memories.

Row i of the values or labels file belongs to row i of SOURCE *before* `--n` picks a subset; the
same seeded subset is then taken from them, so a pair never comes apart.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nphcli.core.bounded import read_lines
from nphcli.core.errors import NphError
from nphcli.sources.base import IMAGE, SourceOptions, choose, load_source

if TYPE_CHECKING:
    from torch import Tensor

LABEL_SUFFIXES = (".npy", ".csv", ".txt")


def _selected(rows, meta: dict[str, Any], what: str):
    """`rows` (N, ...), a tensor or a list, reduced to the rows the source kept (`selection`)."""
    selection = meta.get("selection", {})
    available = selection.get("of", meta.get("M"))
    if selection.get("method") == "generated":
        available = selection.get("n")
    if len(rows) != available:
        raise NphError(
            f"{what} has {len(rows)} rows but the source has {available} patterns "
            "(before --n); give one row per pattern, in the source's order"
        )
    if selection.get("method") != "random_subset":
        return rows
    indices, _ = choose(available, selection["n"], selection["seed"], what=what)
    if indices is None:
        return rows
    return [rows[int(i)] for i in indices] if isinstance(rows, list) else rows[indices]


def load_values_and_items(
    path: str | os.PathLike, meta: dict[str, Any]
) -> tuple[Tensor, list[dict[str, Any]] | None]:
    """Values (M, d_v) float32 for the patterns a source gave (`meta`: its metadata, with the
    `normalize` record of the stored keys), from any file `nph store` reads: pixel data (uint8
    arrays, images) is normalised like the keys, numbers are taken as they are; and their items
    (id, text) when the file is a table or texts, embedded with the keys' embedder."""
    from nphcli.core.normalize import apply_record
    from nphcli.sources.tables import TEXT_SUFFIXES, holds_embeddings

    path = Path(path)
    if not path.exists():
        raise NphError(f"values file {path} not found")
    options = SourceOptions()
    texts = path.suffix.lower() in TEXT_SUFFIXES and not holds_embeddings(path)
    if texts and meta.get("embedder"):
        options.embed = meta["embedder"]["name"]
    loaded = load_source(str(path.resolve()), options)  # absolute: never a dataset name
    values = loaded.patterns  # (N, d_v)
    record = meta.get("normalize")
    if loaded.meta.get("kind") == IMAGE and record:
        values = apply_record(values, record)
    what = f"values file {path}"
    items = None if loaded.items is None else _selected(loaded.items, meta, what)
    return _selected(values, meta, what), items


def load_labels(path: str | os.PathLike, meta: dict[str, Any]) -> Tensor:
    """Integer labels (M,) int64 for the patterns a source gave: a .npy array (N,) or (N, 1),
    or a .csv/.txt file with one whole number per line."""
    import numpy as np
    import torch

    path = Path(path)
    if not path.exists():
        raise NphError(f"labels file {path} not found")
    suffix = path.suffix.lower()
    if suffix not in LABEL_SUFFIXES:
        raise NphError(f"labels file {path}: name a .npy, .csv or .txt file")
    try:
        if suffix == ".npy":
            array = np.load(path, allow_pickle=False)
        else:  # within the bounds of any text input (`core/bounded.py`)
            lines = (line for _, line in read_lines(path, what="labels file"))
            array = np.loadtxt(lines, delimiter=",", ndmin=1, dtype=np.float64)
    except (ValueError, OSError, EOFError) as error:
        raise NphError(f"cannot read labels file {path} ({error})") from None
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1 or array.size == 0 or array.dtype.kind not in "biuf":
        raise NphError(f"labels file {path} must hold one whole number per pattern (a column)")
    if not np.all(np.isfinite(array)) or not np.all(array == np.round(array)):
        raise NphError(f"labels file {path} holds values that are not whole numbers")
    labels = torch.from_numpy(array.astype(np.int64))  # (N,)
    return _selected(labels, meta, f"labels file {path}")


def in_store_dtype(values: Tensor, dtype: str) -> Tensor:
    """`values` cast to the memory's storage dtype; NphError if they do not fit in it."""
    import torch

    from nphcli.core.dtypes import torch_dtype

    stored = values.to(torch_dtype(dtype))  # (M, d_v)
    if not torch.isfinite(stored).all():
        advice = "scale them down" if stored.dtype == torch.float32 else "use --dtype float32"
        largest = float(values.abs().max())
        raise NphError(
            f"the values do not fit in {dtype} (largest magnitude {largest:.4g}); {advice}"
        )
    return stored
