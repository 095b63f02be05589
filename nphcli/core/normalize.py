"""Normalisation of stored patterns, recorded so later commands can map patterns back to pixels.

Notation: r is a raw pattern, (M, d) for the whole set. Raw values are pixel intensities 0..255
for images (datasets, image folders, uint8 arrays) and the numbers as read for everything else.
[lo, hi] is [0, 255] for images, and the smallest and largest raw value of the stored set
otherwise. `METHODS` defines each method (the text --help and the README show; zscore's σ is
the population one); `unit` is a deprecated alias of `minmax`.

The default is `centered` for images (with the paper's `minmax` about half of MNIST's digits
have Δ_μ < 0 and no β retrieves them: docs/models.md) and `none` for other numbers. The record
(`meta["normalize"]`) holds the method, its definition, lo, hi, and μ, σ for zscore.

Importing this module does not import torch (the CLI reads `METHODS` for its help text).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nphcli.core.errors import NphError

if TYPE_CHECKING:
    from torch import Tensor

METHODS = {
    "minmax": "x = (r − lo)/(hi − lo), in [0, 1]; for images lo, hi = 0, 255 (pixel/255)",
    "centered": "x = (r − lo)/(hi − lo) − 0.5, in [−0.5, 0.5]",
    "zscore": "x = (r − μ)/σ; μ, σ: mean and standard deviation of all M·d stored raw values",
    "l2": "x_μ = r_μ/‖r_μ‖₂: each pattern scaled to unit Euclidean norm (zero rows stay zero)",
    "none": "x = r: raw values (pixel intensities 0..255 for images)",
}
DEFAULT_FOR_KIND = {"image": "centered", "vector": "none"}
ALIASES = {"unit": "minmax"}  # old name → name; the old name still works, with a notice
PIXEL_RANGE = (0.0, 255.0)


def default_method(kind: str) -> str:
    """The normalisation used when none is asked for: `centered` for images, `none` otherwise."""
    return DEFAULT_FOR_KIND.get(kind, "none")


def canonical_method(method: str, *, warn: bool = True) -> str:
    """`method`'s current name: an old alias (`unit`) becomes its new name, with a notice."""
    if method in ALIASES:
        if warn:
            from nphcli.core.notices import notice

            notice(f"--normalize {method} is now called {ALIASES[method]}; the old name goes away")
        return ALIASES[method]
    return method


def normalize(
    raw: Tensor, method: str, *, pixel_range: tuple[float, float] | None = None
) -> tuple[Tensor, dict[str, Any]]:
    """Apply `method` (see the module docstring) to raw patterns (M, d).

    `pixel_range` is (lo, hi) for images (0, 255); None means "use the data's own range".
    Returns the normalised float32 patterns (M, d) and the record to store in the metadata.
    """
    import torch

    method = canonical_method(method)
    if method not in METHODS:
        raise NphError(f"unknown normalisation {method!r}; choose one of: {', '.join(METHODS)}")
    raw = raw.to(torch.float32)
    if pixel_range is not None:
        lo, hi = float(pixel_range[0]), float(pixel_range[1])
    else:
        lo, hi = (float(v) for v in torch.aminmax(raw))
    info: dict[str, Any] = {"method": method, "definition": METHODS[method], "lo": lo, "hi": hi}
    if method == "none":
        return raw, info
    if method in ("minmax", "centered"):
        span = hi - lo if hi > lo else 1.0  # a constant set maps to 0 rather than dividing by 0
        x = (raw - lo) / span
        return (x - 0.5 if method == "centered" else x), info
    if method == "zscore":
        mean = raw.mean(dtype=torch.float64)
        std = (raw - mean.float()).square().mean(dtype=torch.float64).sqrt()
        if not std > 0:
            raise NphError("cannot z-score patterns whose values are all equal (σ = 0)")
        info.update(mean=float(mean), std=float(std))
        return (raw - float(mean)) / float(std), info
    norms = torch.linalg.vector_norm(raw, dim=1, keepdim=True)  # (M, 1)
    return raw / norms.clamp_min(torch.finfo(torch.float32).tiny), info


def apply_record(raw: Tensor, info: Mapping[str, Any]) -> Tensor:
    """Normalise new raw rows (N, d) exactly as a stored set was, from its record: the same
    lo and hi, or the same μ and σ for zscore (never the new rows' own statistics)."""
    import torch

    method = canonical_method(info.get("method", "none"), warn=False)
    if method == "zscore":
        return (raw.to(torch.float32) - float(info["mean"])) / float(info["std"])
    pixel_range = (info.get("lo", PIXEL_RANGE[0]), info.get("hi", PIXEL_RANGE[1]))
    rows, _ = normalize(raw, method, pixel_range=pixel_range)
    return rows


def to_raw(x: Tensor, info: Mapping[str, Any]) -> Tensor:
    """Invert `normalize`: patterns (N, d) back to raw values. Not possible for `l2`."""
    method = canonical_method(info.get("method", "none"), warn=False)  # older files: unit
    lo, hi = info.get("lo", 0.0), info.get("hi", 1.0)
    span = hi - lo if hi > lo else 1.0
    if method == "none":
        return x
    if method == "minmax":
        return x * span + lo
    if method == "centered":
        return (x + 0.5) * span + lo
    if method == "zscore":
        return x * info["std"] + info["mean"]
    if method == "l2":
        raise NphError("l2-normalised patterns cannot be mapped back exactly (norms not stored)")
    raise NphError(f"unknown normalisation {method!r} in the memory file")


def to_pixels(x: Tensor, info: Mapping[str, Any] | None) -> Tensor:
    """Patterns (N, d) as display intensities in [0, 1]: (to_raw(x) − lo)/(hi − lo), clamped;
    for `l2` and files without a record, each pattern rescaled by its own min and max."""
    import torch

    x = x.to(torch.float32)
    if not info or info.get("method") == "l2" or "lo" not in info:
        low = x.amin(dim=1, keepdim=True)  # (N, 1)
        span = (x.amax(dim=1, keepdim=True) - low).clamp_min(torch.finfo(torch.float32).tiny)
        return (x - low) / span
    lo, hi = info["lo"], info["hi"]
    span = hi - lo if hi > lo else 1.0
    return ((to_raw(x, info) - lo) / span).clamp(0.0, 1.0)
