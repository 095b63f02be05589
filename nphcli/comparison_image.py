"""Picture of a retrieval run: corrupted queries, what came back, and what should have.

The image has three rows and one column per query (the first `count` queries): row 1 the
corrupted query, row 2 the retrieved pattern T(x), row 3 the target (for own queries without
targets: the stored pattern nearest to T(x)). Patterns are mapped back to pixel space with the
memory's recorded normalisation (files without a record: each pattern stretched from its own
minimum to maximum), clipped to [0, 1] and written as 8-bit grayscale (one channel)
or RGB (three channels), each cell enlarged `scale` times with nearest-neighbour sampling.

Size: width = scale·(n·W + (n + 1)·pad), height = scale·(3·H + 4·pad) pixels for n columns of
H × W images, with grey `pad`-pixel gutters between cells; then a white margin on the right
names each row. The file's extension picks the format: .png (lossless), .jpg/.jpeg or .webp
(lossy: only for a quick look).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nphcli import normalize
from nphcli.atomic import atomic_write
from nphcli.errors import NphError
from nphcli.evaluation.corruption import image_shape
from nphcli.evaluation.report import RetrievalReport
from nphcli.memory.bank import MemoryBank

ROWS = ("corrupted query", "retrieved", "target")
GUTTER = 0.5  # grey between cells, visible on black and white backgrounds
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
    """The (C, H, W) image shape of `memory`'s retrieved patterns; NphError if not images."""
    shape = image_shape(memory.item_shape, memory.dim)
    if shape is None:
        raise NphError(
            "--save-grid needs image memories (an item_shape in the memory file); "
            f"{memory.path or 'this memory'} holds plain vectors"
        )
    if memory.value_dim != memory.dim:
        raise NphError(
            "--save-grid needs retrieved patterns that are images like the stored ones; this "
            f"memory's values have dimension {memory.value_dim}, not {memory.dim}"
        )
    return shape


def save_comparison_image(
    path: str | os.PathLike,
    report: RetrievalReport,
    memory: MemoryBank,
    *,
    count: int = 8,
    force: bool = False,
    pad: int = 2,
    scale: int = 2,
) -> Path:
    """Write the comparison image of the first `count` queries of `report`, atomically, in the
    format the extension of `path` names (.png, .jpg, .webp)."""
    shape = check_drawable(memory)
    n = min(count, report.retrieved.shape[0])
    if report.targets is not None:
        third = report.targets[:n]  # (n, d_v)
    else:  # the stored pattern nearest to T(x), in the output space
        _, third = memory.gather(report.per_query["nearest"][:n].to(memory.device))
    rows = [report.queries[:n], report.retrieved[:n], third]
    pixels = [to_pixels(row, shape, memory.meta) for row in rows]  # each (n, C, H, W)
    labels = [*ROWS[:2], "target" if report.targets is not None else "nearest stored"]
    return save_image_rows(path, pixels, force=force, pad=pad, scale=scale, labels=labels)


def to_pixels(patterns: Tensor, shape: tuple[int, int, int], meta: dict[str, Any]) -> Tensor:
    """(N, C, H, W) float32 in [0, 1]: stored patterns (N, d) mapped back to pixel intensities
    by inverting the memory's recorded normalisation (`normalize.to_pixels`)."""
    pixels = normalize.to_pixels(patterns.detach().to("cpu"), meta.get("normalize"))  # (N, d)
    return pixels.reshape(-1, *shape)  # (N, C, H, W)


def save_image_rows(
    path: str | os.PathLike,
    rows: list[Tensor],
    *,
    force: bool = False,
    pad: int = 2,
    scale: int = 2,
    labels: list[str] | None = None,
) -> Path:
    """Tile `rows` (each (n, C, H, W) in [0, 1], C = 1 or 3) into one image, each row named by
    `labels` in a margin on the right, written atomically in the format of `path`'s extension."""
    from PIL import Image

    file_format = check_image_output(path, scale=scale)
    columns, channels, height, width = rows[0].shape
    if channels not in (1, 3):
        raise NphError(f"cannot draw images with {channels} channels; 1 or 3 are supported")
    canvas = torch.full(
        (
            channels,
            len(rows) * height + (len(rows) + 1) * pad,
            columns * width + (columns + 1) * pad,
        ),
        GUTTER,
    )  # (C, image H, image W)
    for r, row in enumerate(rows):
        top = pad + r * (height + pad)
        for c in range(columns):
            left = pad + c * (width + pad)
            canvas[:, top : top + height, left : left + width] = row[c]
    canvas = canvas.repeat_interleave(scale, dim=1).repeat_interleave(scale, dim=2)
    array = (canvas * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()  # (H, W, C)
    image = Image.fromarray(
        array[:, :, 0] if channels == 1 else array, "L" if channels == 1 else "RGB"
    )
    if labels:
        row_centres = [scale * (pad + r * (height + pad) + height // 2) for r in range(len(rows))]
        image = _label_rows(image, labels, row_centres, scale=scale)
    options = {"quality": 95} if file_format in ("JPEG", "WEBP") else {}
    with atomic_write(path, force=force) as tmp:
        image.save(tmp, format=file_format, **options)
    return Path(path)


def _label_rows(image, labels: list[str], centres: list[int], *, scale: int):
    """`image` with a white margin on the right holding each row's name, in black, at the height
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
