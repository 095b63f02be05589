"""Picture of retrieval runs: one column per query; rows of corrupted queries (one per distinct
corruption), one row per setting with what it retrieved, then the targets (or, for own queries
without targets, the stored pattern nearest to T(x) of the first setting).

Patterns are mapped back to pixels with the memory's recorded normalisation; values that are not
images are drawn as near-square blocks of their entries. Grey gutters part the cells, a white
band on the right names each row. .png is lossless; .jpg and .webp are for a quick look.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nphcli.core import normalize
from nphcli.core.atomic import atomic_write
from nphcli.core.errors import NphError
from nphcli.evaluation.corruption import image_shape
from nphcli.evaluation.report import RetrievalReport
from nphcli.memory.bank import MemoryBank
from nphcli.presentation.plot_data import short

ROWS = ("corrupted query", "retrieved", "target")
GUTTER = 0.5  # grey between cells, visible on black and white backgrounds
EMPTY = 1.0  # white where an item is smaller than its cell
FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP"}  # → pillow format
MAX_SCALE = 64


def check_image_output(path: str | os.PathLike, *, scale: int = 2) -> str:
    """The pillow format `path`'s extension names and a sane `scale`, checked before any work."""
    if isinstance(scale, bool) or not isinstance(scale, int) or not 1 <= scale <= MAX_SCALE:
        raise NphError(f"--scale must be a whole number from 1 to {MAX_SCALE}, got {scale!r}")
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise NphError(f"cannot tell the image format of {path}: name it .png, .jpg or .webp")
    from PIL import features

    if FORMATS[suffix] == "WEBP" and not features.check("webp"):
        raise NphError(f"this pillow cannot write WebP ({path}); name it .png or .jpg")
    return FORMATS[suffix]


def check_drawable(memory: MemoryBank) -> tuple[int, int, int]:
    """The (C, H, W) image shape of `memory`'s keys (the queries); NphError if not images."""
    shape = image_shape(memory.item_shape, memory.dim)
    if shape is None:
        raise NphError(
            "--save-grid needs image memories (an item_shape in the memory file); "
            f"{memory.path or 'this memory'} holds plain vectors"
        )
    return shape


def value_shape(memory: MemoryBank) -> tuple[int, int, int] | None:
    """The (C, H, W) image shape of `memory`'s values, or None for values that are not images:
    the recorded `value_shape`, else the keys' shape when values have the keys' size."""
    recorded = (memory.meta or {}).get("value_shape")
    if recorded:
        return image_shape(recorded, memory.value_dim)
    if memory.value_dim == memory.dim:
        return check_drawable(memory)
    return None


def save_comparison_grid(
    path: str | os.PathLike,
    reports: list[RetrievalReport],
    memory: MemoryBank,
    *,
    count: int = 8,
    force: bool = False,
    pad: int = 2,
    scale: int = 2,
) -> Path:
    """Write one picture of the first `count` queries of every report (settings evaluated on
    the same memory and queries), atomically, in the format the extension of `path` names."""
    labels, rows = comparison_rows(reports, memory, count=count)
    file_format = check_image_output(path, scale=scale)
    image = render_rows(rows, pad=pad, scale=scale, labels=labels)
    options = {"quality": 95} if file_format in ("JPEG", "WEBP") else {}
    with atomic_write(path, force=force) as tmp:
        image.save(tmp, format=file_format, **options)
    return Path(path)


def comparison_rows(
    reports: list[RetrievalReport], memory: MemoryBank, *, count: int = 8
) -> tuple[list[str], list[Tensor]]:
    """(row names, rows of pixels (n, C, H, W) in [0, 1]) of the picture of `reports`."""
    if not reports:
        raise NphError("a comparison picture needs at least one report")
    shape = check_drawable(memory)
    first = reports[0]
    n = min(count, first.retrieved.shape[0])
    chosen = first.per_query["query_row"][:n]
    for report in reports[1:]:
        if not torch.equal(report.per_query["query_row"][:n], chosen):
            raise NphError(
                "--save-grid draws settings on the same queries; these settings chose different "
                "ones (give one --seed and one --queries)"
            )
    if first.targets is not None:
        third = first.targets[:n]  # (n, d_v)
    else:  # the stored pattern nearest to T(x), in the output space
        _, third = memory.gather(first.per_query["nearest"][:n].to(memory.device))
    corruptions = {_corruption_key(r): r for r in reports}  # first report of each corruption
    several = len(corruptions) > 1
    labels = [
        f"corrupted query: {_corruption_text(r)}" if several else ROWS[0]
        for r in corruptions.values()
    ]
    rows = [to_pixels(r.queries[:n], shape, memory.meta) for r in corruptions.values()]
    if len(reports) == 1:
        labels.append(ROWS[1])
    else:
        shown = _distinguishing(reports)
        labels += [_setting_text(r, shown, several) for r in reports]
    labels.append(ROWS[2] if first.targets is not None else "nearest stored")
    values = [r.retrieved[:n] for r in reports] + [third]  # each (n, d_v)
    rows += _value_pixels(values, value_shape(memory), memory.meta)
    return labels, rows


def to_pixels(patterns: Tensor, shape: tuple[int, int, int], meta: dict[str, Any]) -> Tensor:
    """(N, C, H, W) float32 in [0, 1]: stored patterns (N, d) mapped back to pixel intensities
    by inverting the memory's recorded normalisation (`normalize.to_pixels`)."""
    pixels = normalize.to_pixels(patterns.detach().to("cpu"), meta.get("normalize"))  # (N, d)
    return pixels.reshape(-1, *shape)  # (N, C, H, W)


def _value_pixels(
    values: list[Tensor], shape: tuple[int, int, int] | None, meta: dict[str, Any]
) -> list[Tensor]:
    """Rows of values (each (n, d_v)) as pixels: images of `shape`, or for values that are not
    images near-square blocks of their entries, stretched over the range of all rows shown."""
    if shape is not None:
        return [to_pixels(v, shape, meta) for v in values]
    rows = [v.detach().to("cpu", torch.float32) for v in values]  # each (n, d_v)
    low = min(float(r.min()) for r in rows)
    span = max(float(r.max()) for r in rows) - low or 1.0
    dim = rows[0].shape[1]
    width = math.ceil(math.sqrt(dim))
    height = math.ceil(dim / width)
    out = []
    for row in rows:
        block = torch.full((row.shape[0], height * width), EMPTY)  # (n, h·w)
        block[:, :dim] = (row - low) / span
        out.append(block.reshape(-1, 1, height, width))  # (n, 1, h, w)
    return out


def _corruption_key(report: RetrievalReport) -> str:
    return json.dumps([report.config["seed"], report.config["corruption"]], sort_keys=True)


def _corruption_text(report: RetrievalReport) -> str:
    corruption = report.config["corruption"]
    parts = []
    if corruption.get("mask"):
        parts.append(f"mask {short(corruption['mask'])} {corruption.get('mask_mode', '')}")
    if corruption.get("noise"):
        parts.append(f"noise {short(corruption['noise'])}")
    return ", ".join(p.strip() for p in parts) or "none"


def _distinguishing(reports: list[RetrievalReport]) -> set[str]:
    """Parameters worth naming in a row: those whose value differs between the settings that
    take them, or that only some settings take (k of topk beside dense)."""
    taken = [r.config["params"] for r in reports]
    names = {name for params in taken for name in params}
    return {
        name
        for name in names
        if len({short(p.get(name)) for p in taken if name in p}) > 1
        or any(name not in p for p in taken)
    }


def _setting_text(report: RetrievalReport, shown: set[str], with_corruption: bool) -> str:
    """A setting's row name: model, the parameters that tell it apart (ASCII: the built-in
    font has no Greek), and its corruption when settings differ in it."""
    params = report.config["params"]
    parts = [report.config["model"]]
    parts += [f"{name}={short(value)}" for name, value in params.items() if name in shown]
    text = " ".join(parts)
    return f"{text} ({_corruption_text(report)})" if with_corruption else text


def render_rows(
    rows: list[Tensor], *, pad: int = 2, scale: int = 2, labels: list[str] | None = None
):
    """`rows` (each (n, C, h, w) in [0, 1], C = 1 or 3; items may differ in size between rows)
    tiled into one pillow image, each row named by `labels` in a band on the right."""
    from PIL import Image

    channel_counts = {row.shape[1] for row in rows}
    if not channel_counts <= {1, 3}:
        raise NphError(
            f"cannot draw images with {max(channel_counts)} channels; 1 or 3 are supported"
        )
    channels = max(channel_counts)
    columns = rows[0].shape[0]
    height = max(row.shape[2] for row in rows)
    width = max(row.shape[3] for row in rows)
    tall, wide = len(rows) * height + (len(rows) + 1) * pad, columns * width + (columns + 1) * pad
    canvas = torch.full((channels, tall, wide), GUTTER)  # (C, image H, image W)
    for r, row in enumerate(rows):
        top = pad + r * (height + pad)
        _, _, h, w = row.shape
        for c in range(columns):
            left = pad + c * (width + pad)
            canvas[:, top : top + height, left : left + width] = EMPTY
            canvas[:, top : top + h, left : left + w] = row[c]  # (1 or C, h, w) broadcast
    canvas = canvas.repeat_interleave(scale, dim=1).repeat_interleave(scale, dim=2)
    array = (canvas.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    image = Image.fromarray(
        array[:, :, 0] if channels == 1 else array, "L" if channels == 1 else "RGB"
    )
    if labels:
        row_centres = [scale * (pad + r * (height + pad) + height // 2) for r in range(len(rows))]
        image = _label_rows(image, labels, row_centres, scale=scale)
    return image


def _label_rows(image, labels: list[str], centres: list[int], *, scale: int):
    """`image` with a white band on the right holding each row's name, in black, at the height
    of the row's centre."""
    from PIL import Image, ImageDraw, ImageFont

    try:  # pillow ≥ 10.1 scales its built-in font
        font = ImageFont.load_default(size=6 * scale)
    except TypeError:  # pragma: no cover
        font = ImageFont.load_default()
    draw = ImageDraw.Draw(image)
    widths = [draw.textbbox((0, 0), text, font=font)[2] for text in labels]
    gap = 3 * scale
    labelled = Image.new(image.mode, (image.width + max(widths) + 2 * gap, image.height), "white")
    labelled.paste(image, (0, 0))
    draw = ImageDraw.Draw(labelled)
    for text, centre in zip(labels, centres, strict=True):
        draw.text((image.width + gap, centre), text, fill="black", font=font, anchor="lm")
    return labelled
