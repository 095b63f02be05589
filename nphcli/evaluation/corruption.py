"""Seeded corruption of queries in the stored space, in this order: the mask (hidden entries set
to `fill`), the occluding square (images), salt-and-pepper, bit flips (±1 or 0/1 patterns), then
Gaussian noise N(0, σ²) on every entry and the optional clamp to [0, 1] (`noise_clip`). Counts
round half up: ⌊f·n + ½⌋. docs/retrieving.md, "Corruption", defines each exactly.

All randomness comes from the `torch.Generator` passed in and is drawn on the CPU, so the same
seed gives the same queries on every device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.schema.fields import get_field
from nphcli.schema.settings import Corruption

MASK_MODES: tuple[str, ...] = get_field("mask_mode").choices  # the field's, declared once
IMAGE_MODES = tuple(mode for mode in MASK_MODES if mode != "random")


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
    mode = corruption.mask_mode or ("bottom" if shape else "random")
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
    if corruption.occlude > 0:
        if shape is None:
            raise NphError(
                "--occlude hides a square of an image and needs image memories (an item_shape in "
                "the memory file); for plain vectors use --mask with --mask-mode random"
            )
        hidden |= occluded_square(num_queries, corruption.occlude, shape, generator)
    queries[hidden] = corruption.fill
    if corruption.salt_pepper > 0:
        _salt_and_pepper(queries, patterns, corruption.salt_pepper, generator)
    if corruption.flip > 0:
        _flip(queries, patterns, corruption.flip, generator)
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
    """Boolean (Q, d): which entries of each query are hidden (docs/retrieving.md)."""
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


def occluded_square(
    num_queries: int, side: float, shape: tuple[int, int, int], generator: torch.Generator
) -> Tensor:
    """Boolean (Q, d): a square of ⌊side·min(H, W) + ½⌋ pixels (all channels) per query, its
    top-left corner uniform over the places where it fits."""
    channels, height, width = shape
    size = _round_half_up(side * min(height, width))
    hidden = torch.zeros(num_queries, channels, height, width, dtype=torch.bool)
    if size == 0:
        return hidden.view(num_queries, -1)
    tops = torch.randint(0, height - size + 1, (num_queries,), generator=generator)  # (Q,)
    lefts = torch.randint(0, width - size + 1, (num_queries,), generator=generator)  # (Q,)
    rows = torch.arange(height)[None, :]  # (1, H)
    cols = torch.arange(width)[None, :]  # (1, W)
    in_rows = (rows >= tops[:, None]) & (rows < tops[:, None] + size)  # (Q, H)
    in_cols = (cols >= lefts[:, None]) & (cols < lefts[:, None] + size)  # (Q, W)
    square = in_rows[:, :, None] & in_cols[:, None, :]  # (Q, H, W)
    hidden |= square[:, None]
    return hidden.reshape(num_queries, -1)


def _salt_and_pepper(
    queries: Tensor, clean: Tensor, fraction: float, generator: torch.Generator
) -> None:
    """In place: ⌊p·d + ½⌋ entries per row set to the clean row's max or min, each with ½."""
    num_queries, dim = queries.shape
    chosen = _random_rows(num_queries, dim, _round_half_up(fraction * dim), generator)  # (Q, d)
    salt = torch.rand(num_queries, dim, generator=generator) < 0.5  # (Q, d)
    clean = clean.detach().to("cpu", queries.dtype)
    high = clean.amax(dim=1, keepdim=True).expand_as(queries)  # (Q, d)
    low = clean.amin(dim=1, keepdim=True).expand_as(queries)  # (Q, d)
    queries[chosen] = torch.where(salt, high, low)[chosen]


def _flip(queries: Tensor, clean: Tensor, fraction: float, generator: torch.Generator) -> None:
    """In place: ⌊p·d + ½⌋ entries per row flipped (−x for ±1 patterns, 1 − x for 0/1); the
    kind of pattern is read from the clean queries."""
    num_queries, dim = queries.shape
    chosen = _random_rows(num_queries, dim, _round_half_up(fraction * dim), generator)  # (Q, d)
    if bool((clean.abs() == 1).all()):
        queries[chosen] = -queries[chosen]
    elif bool(((clean == 0) | (clean == 1)).all()):
        queries[chosen] = 1 - queries[chosen]
    else:
        raise NphError(
            "--flip flips bits of ±1 or 0/1 patterns, but these queries hold other values; "
            "use --noise or --salt-pepper, or store binary patterns"
        )


def _random_rows(num_rows: int, width: int, count: int, generator: torch.Generator) -> Tensor:
    """Boolean (num_rows, width) with exactly `count` True entries per row, uniformly placed."""
    hidden = torch.zeros(num_rows, width, dtype=torch.bool)
    if count == 0:
        return hidden
    order = torch.rand(num_rows, width, generator=generator).argsort(dim=1)  # (rows, width)
    return hidden.scatter_(1, order[:, :count], True)


def _round_half_up(value: float) -> int:
    return math.floor(value + 0.5)
