"""Patterns from the user's own files: arrays, tables and folders of images.

Nothing here unpickles: NumPy files load with `allow_pickle=False`, `.pt` files only through
`torch.load(weights_only=True)`. An array with more than two dimensions is one pattern per entry
of its first axis, flattened; its remaining shape is kept as `item_shape` ((M, H, W) is taken as
one-channel images, (1, H, W)). uint8 arrays and image folders hold pixel intensities 0..255.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nphcli.core.bounded import read_lines
from nphcli.core.errors import NphError
from nphcli.sources.base import (
    IMAGE,
    VECTOR,
    Loaded,
    SourceOptions,
    check_finite,
    choose,
    file_meta,
    register_source,
)
from nphcli.sources.vision import first_line

if TYPE_CHECKING:
    from torch import Tensor

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_GRAY_MODES = {"1", "L", "LA", "I", "I;16", "F"}


@register_source(
    "npy",
    summary="a NumPy .npy array, one pattern per row (M, d) or per item; --ids names its rows",
    options=("ids",),
    suffixes=(".npy",),
)
def load_npy(spec: str, options: SourceOptions) -> Loaded:
    import numpy as np

    try:
        array = np.load(spec, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise NphError(f"cannot read {spec} as a .npy array ({error})") from None
    return _from_array(spec, array, options, what=spec)


@register_source(
    "npz",
    summary="a NumPy .npz archive; --key names the array (default: its only array)",
    options=("key",),
    suffixes=(".npz",),
)
def load_npz(spec: str, options: SourceOptions) -> Loaded:
    import zipfile

    import numpy as np

    try:
        with np.load(spec, allow_pickle=False) as archive:
            key = _pick_key(spec, list(archive.files), options.key)
            array = archive[key]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise NphError(f"cannot read {spec} as a .npz archive ({error})") from None
    return _from_array(spec, array, options, what=f"{spec} ['{key}']", key=key)


@register_source(
    "safetensors",
    summary="a .safetensors file; --key names the tensor (default: its only tensor, or the "
    "patterns and labels of an nph memory file)",
    options=("key",),
    suffixes=(".safetensors",),
)
def load_safetensors(spec: str, options: SourceOptions) -> Loaded:
    from nphcli.memory import open_memory
    from nphcli.memory.format import (
        FORMAT_NAME,
        check_format_version,
        open_safetensors,
        read_metadata,
    )

    meta = read_metadata(spec)
    is_memory = meta.get("format") == FORMAT_NAME
    if is_memory:
        check_format_version(spec, meta)
    with open_safetensors(spec) as handle:
        keys = list(handle.keys())
        if options.key is None and len(keys) != 1 and is_memory:
            tensor = None
        else:
            key = _pick_key(spec, keys, options.key)
            tensor = handle.get_tensor(key)
    if tensor is not None:
        return _from_array(spec, tensor, options, what=f"{spec} ['{key}']", key=key)
    memory = open_memory(spec)
    shape = memory.item_shape and list(memory.item_shape)
    extra = {"key": "patterns", "classes": memory.meta.get("classes")}
    return _finish(spec, memory.patterns.float(), memory.labels, options, VECTOR, shape, extra)


@register_source(
    "pt",
    summary="a PyTorch .pt/.pth tensor or dict of tensors (--key), loaded with weights_only=True",
    options=("key",),
    suffixes=(".pt", ".pth"),
)
def load_pt(spec: str, options: SourceOptions) -> Loaded:
    import torch

    try:
        content = torch.load(spec, map_location="cpu", weights_only=True)
    except Exception as error:  # unpickling refused, not a torch file, truncated, ...
        first = first_line(error)
        raise NphError(
            f"cannot read {spec} with torch.load(weights_only=True): {first}. nph loads only "
            "tensors and dicts of tensors from .pt files (never arbitrary pickled objects)"
        ) from None
    if isinstance(content, torch.Tensor):
        if options.key is not None:
            raise NphError(f"{spec} holds a single tensor, not a dict: drop --key")
        return _from_array(spec, content, options, what=spec)
    if isinstance(content, dict):
        tensors = {str(k): v for k, v in content.items() if isinstance(v, torch.Tensor)}
        key = _pick_key(spec, list(tensors), options.key)
        return _from_array(spec, tensors[key], options, what=f"{spec} ['{key}']", key=key)
    raise NphError(
        f"{spec} holds a {type(content).__name__}; save a tensor, or a dict of tensors and pick "
        "one with --key"
    )


@register_source(
    "csv",
    summary="a .csv table of numbers, one pattern per row; a first row of names is a header",
    suffixes=(".csv",),
)
def load_csv(spec: str, options: SourceOptions) -> Loaded:
    import torch

    header, rows, lines = _read_csv(Path(spec))
    patterns = torch.tensor(rows, dtype=torch.float32)  # (M, d)
    check_finite(patterns, spec, row_name=lambda row: f"line {lines[row]}")
    return _finish(spec, patterns, None, options, VECTOR, None, {"columns": header})


@register_source(
    "folder",
    summary="a folder of PNG/JPEG images of one size (or --size WxH), read in file-name order",
    options=("size",),
)
def load_folder(spec: str, options: SourceOptions) -> Loaded:
    import numpy as np
    import torch
    from PIL import Image, UnidentifiedImageError

    folder = Path(spec)
    size = _parse_size(options.size)
    files = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    for path in files:
        if path.is_dir():
            raise NphError(f"{folder} contains a folder, {path.name}; nph reads a flat folder")
        if path.suffix.lower() not in IMAGE_SUFFIXES:
            raise NphError(f"{path} is not a PNG or JPEG image; nph reads only images here")
    if not files:
        raise NphError(f"{folder} holds no PNG or JPEG images")
    indices, selection = choose(len(files), options.n, options.seed, what=str(folder))
    chosen = files if indices is None else [files[i] for i in indices.tolist()]

    pictures = []
    for path in chosen:
        try:
            with Image.open(path) as picture:
                picture.load()
                pictures.append(picture.copy())
        except (UnidentifiedImageError, OSError) as error:
            raise NphError(f"cannot read image {path} ({error})") from None
    mode = "L" if all(p.mode in _GRAY_MODES for p in pictures) else "RGB"
    if size is None and len({p.size for p in pictures}) > 1:
        other = next(i for i, p in enumerate(pictures) if p.size != pictures[0].size)
        raise NphError(
            f"the images in {folder} differ in size ({chosen[0].name} is "
            f"{_wxh(pictures[0].size)}, {chosen[other].name} is "
            f"{_wxh(pictures[other].size)}); give them one size (`nph store --size WxH` "
            "resizes them as it stores them)"
        )
    arrays = []
    for picture in pictures:
        picture = picture.convert(mode)
        if size is not None and picture.size != size:
            picture = picture.resize(size, Image.Resampling.BILINEAR)
        array = np.asarray(picture, dtype=np.uint8)  # (H, W) or (H, W, 3)
        arrays.append(array[None] if array.ndim == 2 else array.transpose(2, 0, 1))
    images = torch.from_numpy(np.stack(arrays))  # (M, C, H, W)
    patterns = images.reshape(images.shape[0], -1).to(torch.float32)  # (M, C*H*W)
    meta = file_meta(spec, IMAGE, list(images.shape[1:]), len(files), selection, options)
    meta["files"] = "sorted by name"
    return Loaded(patterns, None, meta)


def _from_array(
    spec: str, array: Any, options: SourceOptions, *, what: str, key: str | None = None
) -> Loaded:
    """A NumPy array or torch tensor (M, ...) as raw patterns (M, d), checked."""
    import numpy as np
    import torch

    if isinstance(array, np.ndarray):
        if array.dtype.kind not in "biuf":
            raise NphError(f"{what} holds {array.dtype} values; nph stores numbers only")
        kind = IMAGE if array.dtype == np.uint8 else VECTOR
        tensor = torch.from_numpy(np.asarray(array, dtype=np.float32))
    else:
        if array.is_complex():
            raise NphError(f"{what} holds {array.dtype} values; nph stores real numbers only")
        kind = IMAGE if array.dtype == torch.uint8 else VECTOR
        tensor = array.to(torch.float32)
    if tensor.ndim < 2 or 0 in tensor.shape:
        raise NphError(
            f"{what} has shape {tuple(tensor.shape)}; nph needs one pattern per row, (M, d) "
            "with M, d ≥ 1 (or (M, ...) items to flatten)"
        )
    item_shape = list(tensor.shape[1:]) if tensor.ndim > 3 else None
    if tensor.ndim == 3:
        item_shape = [1, *tensor.shape[1:]]
    patterns = tensor.reshape(tensor.shape[0], -1)  # (M, d)
    check_finite(patterns, what)
    items = None
    if options.ids is not None:
        from nphcli.sources.tables import read_ids

        items = read_ids(options.ids, patterns.shape[0])
    return _finish(spec, patterns, None, options, kind, item_shape, {"key": key or None}, items)


def _finish(
    spec, patterns: Tensor, labels: Tensor | None, options, kind, item_shape, extra, items=None
):
    """The chosen subset of patterns (N, d) float32, labels (N,) and items, with its metadata
    (`extra` adds its keys that are not None)."""
    indices, selection = choose(patterns.shape[0], options.n, options.seed, what=spec)
    if indices is not None:
        patterns = patterns[indices]
        labels = None if labels is None else labels[indices]
        items = None if items is None else [items[int(i)] for i in indices]
    meta = file_meta(spec, kind, item_shape, selection["of"], selection, options)
    meta.update({k: v for k, v in extra.items() if v is not None})
    return Loaded(patterns.contiguous(), labels, meta, items)


def _pick_key(spec: str, keys: list[str], key: str | None) -> str:
    if key is not None:
        if key not in keys:
            raise NphError(f"{spec} has no array {key!r}; it has: {', '.join(keys) or 'none'}")
        return key
    if len(keys) == 1:
        return keys[0]
    if not keys:
        raise NphError(f"{spec} holds no arrays")
    raise NphError(f"{spec} holds several arrays ({', '.join(keys)}); pick one with --key")


def _read_csv(path: Path) -> tuple[list[str] | None, list[list[float]], list[int]]:
    """Numeric rows of a CSV file, an optional header, and each row's line number (1-based)."""
    header: list[str] | None = None
    rows: list[list[float]] = []
    lines: list[int] = []
    width_line = 0
    try:
        reader = csv.reader(text for _, text in read_lines(path, what="file", encoding="utf-8-sig"))
        for row in reader:
            line = reader.line_num
            cells = [cell.strip() for cell in row]
            if not any(cells):
                continue
            numbers = [_number(cell) for cell in cells]
            if header is None and not rows and all(v is None for v in numbers):
                header, width_line = cells, line
                continue
            if None in numbers:
                column = numbers.index(None)
                raise NphError(
                    f"{path}, line {line}, column {column + 1}: {cells[column]!r} is not a "
                    "number (only a first row of column names may hold text)"
                )
            width = len(header) if header else len(rows[0]) if rows else len(cells)
            if len(cells) != width:
                raise NphError(
                    f"{path}, line {line} has {len(cells)} values, but line "
                    f"{width_line or lines[0]} has {width}; every row needs the same count"
                )
            rows.append(numbers)
            lines.append(line)
    except UnicodeDecodeError as error:
        raise NphError(f"{path} is not a UTF-8 text file ({error.reason})") from None
    except csv.Error as error:
        raise NphError(f"{path} is not a readable CSV file ({error})") from None
    if not rows:
        raise NphError(f"{path} holds no rows of numbers")
    return header, rows, lines


def _number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def _parse_size(size: str | None) -> tuple[int, int] | None:
    if size is None:
        return None
    parts = size.lower().split("x")
    if len(parts) == 2 and all(p.strip().isdigit() and int(p) > 0 for p in parts):
        return int(parts[0]), int(parts[1])
    raise NphError(f"--size must look like WxH, e.g. 28x28, got {size!r}")


def _wxh(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"
