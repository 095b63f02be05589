"""Where patterns come from, and how they become the contents of a memory file.

Named sources (`mnist`, `fashion-mnist`, `cifar10`, `random`) and files (.npy, .npz,
.safetensors, .pt, .csv, a folder of images) all register in `base.py`; `load_source` returns
raw patterns (M, d) with labels and metadata, and `prepare_memory` adds normalisation and the
storage dtype. Importing this package does not import torch.

Add a source: one decorated loader function in a module imported below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nphcli.core.dtypes import STORE_DTYPES
from nphcli.sources import datasets, files, synthetic, tables  # noqa: F401  (register sources)
from nphcli.sources.base import (
    IMAGE,
    VECTOR,
    Loaded,
    SourceInfo,
    SourceOptions,
    list_sources,
    load_source,
    resolve_source,
)
from nphcli.sources.datasets import data_root

if TYPE_CHECKING:
    from torch import Tensor


@dataclass
class Prepared:
    """Everything `save_memory` needs, ready to write."""

    patterns: Tensor  # (M, d) in the storage dtype
    labels: Tensor | None  # (M,) int64
    meta: dict[str, Any]
    dtype: str
    items: list[dict[str, Any]] | None = None  # per row: id, text, meta (the items sidecar)


def prepare_memory(
    spec: str,
    options: SourceOptions | None = None,
    *,
    normalize: str | None = None,
    dtype: str = "float32",
) -> Prepared:
    """Load `spec`, normalise it (default: `centered` for images, else `none`), cast to `dtype`.
    The metadata gains `normalize` (the record `core.normalize.to_pixels` reads) and
    `value_range` ([min, max] of the stored values, after the cast)."""
    import torch

    from nphcli.core import normalize as norm
    from nphcli.core.dtypes import check_dtype
    from nphcli.core.dtypes import torch_dtype as dtype_of
    from nphcli.core.errors import NphError

    torch_dtype = dtype_of(check_dtype(dtype, allowed=STORE_DTYPES))
    loaded = load_source(spec, options)
    kind = loaded.meta.get("kind", VECTOR)
    method = normalize or norm.default_method(kind)
    pixel_range = norm.PIXEL_RANGE if kind == IMAGE else None
    patterns, record = norm.normalize(loaded.patterns, method, pixel_range=pixel_range)
    stored = patterns.to(torch_dtype)  # (M, d)
    if not torch.isfinite(stored).all():
        wider = "" if torch_dtype == torch.float32 else "--dtype float32 or "  # float32: the widest
        raise NphError(
            f"the {method}-normalised values do not fit in {dtype} (largest magnitude "
            f"{float(patterns.abs().max()):.4g}); use {wider}another --normalize"
        )
    low, high = torch.aminmax(stored.to(torch.float32))
    meta = {**loaded.meta, "normalize": record, "value_range": [float(low), float(high)]}
    return Prepared(stored, loaded.labels, meta, dtype, loaded.items)


__all__ = [
    "IMAGE",
    "VECTOR",
    "Loaded",
    "Prepared",
    "SourceInfo",
    "SourceOptions",
    "data_root",
    "list_sources",
    "load_source",
    "prepare_memory",
    "resolve_source",
]
