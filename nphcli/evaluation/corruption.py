"""Seeded corruption of queries in the stored space: masking, then additive Gaussian noise.

Order: first `mask` hides a fraction of each query (hidden entries are set to `fill`), then
`noise` adds i.i.d. Gaussian noise N(0, σ²) to every element, hidden entries included. So
`--mask 0.5 --noise 0.1` is a half-masked query with noise over the whole pattern.

Mask modes (the fraction f = `mask`, rounded half up to whole rows, columns or entries):
- images (memory metadata `item_shape` (C, H, W) or (H, W)):
  `bottom` hides the last ⌊f·H + ½⌋ rows, `top` the first ⌊f·H + ½⌋ rows, `left` the first
  ⌊f·W + ½⌋ columns, `right` the last ⌊f·W + ½⌋ columns (all channels);
  `random` hides ⌊f·H·W + ½⌋ whole pixels (all channels of a pixel), chosen per query;
- plain vectors (no image shape): `random` hides exactly ⌊f·d + ½⌋ entries per query.
The default mode is `bottom` for images (the paper's half-masked digit is `--mask 0.5`) and
`random` for plain vectors.

`noise` is the standard deviation σ. The paper states its noise levels as a variance σ²: a
variance v is `--noise √v` (variance 0.5 → σ ≈ 0.7071; variance 1.4 → σ ≈ 1.1832).

`noise_clip` (`--noise-clip`): after the noise, every entry of the query is clamped to [0, 1],
x_i ← min(1, max(0, x_i)), as the paper's released code does with its noisy images; it is meant
for pixels stored in [0, 1] (`--normalize unit`, the image default). Without noise it changes
nothing (the query is left as masked).

All randomness comes from the `torch.Generator` passed in and is drawn on the CPU, so the same
seed gives the same queries on every device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from nphcli.core.errors import NphError

IMAGE_MODES = ("bottom", "top", "left", "right")
MASK_MODES = (*IMAGE_MODES, "random")


@dataclass(frozen=True)
class Corruption:
    """How to corrupt a query. The defaults leave it unchanged."""

    mask: float = 0.0  # fraction of each query to hide, in [0, 1]
    mask_mode: str | None = None  # one of MASK_MODES; None: bottom for images, random otherwise
    fill: float = 0.0  # value written into hidden entries
    noise: float = 0.0  # standard deviation σ of the added Gaussian noise, ≥ 0
    noise_clip: bool = False  # clamp noisy queries to [0, 1] (the released code's noise)

    def __post_init__(self) -> None:
        if not (_is_number(self.mask) and 0.0 <= self.mask <= 1.0):
            raise NphError(f"--mask must be a fraction in [0, 1], got {self.mask}")
        if not (_is_number(self.noise) and self.noise >= 0.0):
            raise NphError(
                f"--noise must be a standard deviation ≥ 0, got {self.noise} "
                "(for a noise variance v, pass √v)"
            )
        if not isinstance(self.noise_clip, bool):
            raise NphError(f"noise_clip must be true or false, got {self.noise_clip!r}")
        if not _is_number(self.fill):
            raise NphError(f"--fill must be a finite number, got {self.fill}")
        if self.mask_mode is not None and self.mask_mode not in MASK_MODES:
            raise NphError(
                f"unknown --mask-mode {self.mask_mode!r}; choose one of: {', '.join(MASK_MODES)}"
            )


@dataclass(frozen=True)
class Corrupted:
    queries: Tensor  # (Q, d) the corrupted queries
    hidden: Tensor  # (Q, d) bool: True where an entry was hidden (set to fill)
    mask_mode: str  # the mode actually used


def image_shape(item_shape: tuple[int, ...] | None, dim: int) -> tuple[int, int, int] | None:
    """(C, H, W) for an image memory's `item_shape`, or None for plain vectors."""
    if not item_shape:
        return None
    shape = tuple(int(s) for s in item_shape)
    if len(shape) == 2:
        shape = (1, *shape)
    if len(shape) != 3 or math.prod(shape) != dim:
        raise NphError(
            f"the memory's item_shape {list(item_shape)} does not describe its {dim}-dimensional "
            "patterns as (C, H, W) images; fix the file's metadata or store it again"
        )
    return shape  # type: ignore[return-value]


def default_mask_mode(item_shape: tuple[int, ...] | None) -> str:
    return "bottom" if item_shape else "random"


def corrupt(
    patterns: Tensor,
    corruption: Corruption,
    *,
    generator: torch.Generator,
    item_shape: tuple[int, ...] | None = None,
) -> Corrupted:
    """Corrupt each row of `patterns` (Q, d): hide a fraction (set to `fill`), then add noise.

    Returns new tensors; `patterns` is not modified. The result has the dtype of `patterns`
    (float32 at least) and lives on the CPU.
    """
    if patterns.ndim != 2:
        raise NphError(f"queries must be a 2-D (Q, d) tensor, got shape {tuple(patterns.shape)}")
    num_queries, dim = patterns.shape
    shape = image_shape(item_shape, dim)
    mode = corruption.mask_mode or default_mask_mode(shape)
    if mode in IMAGE_MODES and shape is None:
        raise NphError(
            f"--mask-mode {mode} needs image memories (an item_shape in the memory file); "
            "these patterns are plain vectors, so use --mask-mode random"
        )
    work = torch.float64 if patterns.dtype == torch.float64 else torch.float32
    queries = patterns.detach().to("cpu", work).clone()  # (Q, d)
    largest = torch.finfo(work).max
    if corruption.mask > 0 and abs(corruption.fill) > largest:
        raise NphError(
            f"--fill {corruption.fill:g} does not fit in the {str(work)[6:]} queries "
            f"(largest {largest:.3g})"
        )
    hidden = mask_entries(num_queries, dim, corruption.mask, mode, shape, generator)  # (Q, d)
    queries[hidden] = corruption.fill
    if corruption.noise > 0:
        noise = torch.randn(num_queries, dim, generator=generator, dtype=work)  # (Q, d)
        queries += corruption.noise * noise
        if not bool(torch.isfinite(queries).all()):
            raise NphError(
                f"--noise {corruption.noise:g} makes query values overflow {str(work)[6:]}; "
                "use a smaller σ"
            )
        if corruption.noise_clip:
            queries.clamp_(0.0, 1.0)
    return Corrupted(queries=queries, hidden=hidden, mask_mode=mode)


def mask_entries(
    num_queries: int,
    dim: int,
    fraction: float,
    mode: str,
    shape: tuple[int, int, int] | None,
    generator: torch.Generator,
) -> Tensor:
    """Boolean (Q, d): which entries of each query are hidden (see the module docstring)."""
    if fraction == 0:
        return torch.zeros(num_queries, dim, dtype=torch.bool)
    if shape is None:  # plain vectors: `fraction` of the entries, drawn per query
        return _random_rows(num_queries, dim, _round_half_up(fraction * dim), generator)
    channels, height, width = shape
    if mode == "random":  # whole pixels, drawn per query, hidden in every channel
        count = _round_half_up(fraction * height * width)
        pixels = _random_rows(num_queries, height * width, count, generator)  # (Q, H·W)
        pixels = pixels.view(num_queries, 1, height, width)  # (Q, 1, H, W)
    else:
        pixels = torch.zeros(1, 1, height, width, dtype=torch.bool)  # same region for all
        rows, cols = _round_half_up(fraction * height), _round_half_up(fraction * width)
        if mode == "bottom" and rows:
            pixels[..., height - rows :, :] = True
        elif mode == "top":
            pixels[..., :rows, :] = True
        elif mode == "left":
            pixels[..., :, :cols] = True
        elif mode == "right" and cols:
            pixels[..., :, width - cols :] = True
    full = pixels.expand(num_queries, channels, height, width)  # (Q, C, H, W)
    return full.reshape(num_queries, dim).contiguous()  # (Q, d)


def _random_rows(num_rows: int, width: int, count: int, generator: torch.Generator) -> Tensor:
    """Boolean (num_rows, width) with exactly `count` True entries per row, uniformly placed."""
    hidden = torch.zeros(num_rows, width, dtype=torch.bool)
    if count == 0:
        return hidden
    order = torch.rand(num_rows, width, generator=generator).argsort(dim=1)  # (rows, width)
    return hidden.scatter_(1, order[:, :count], True)


def _round_half_up(value: float) -> int:
    return math.floor(value + 0.5)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
