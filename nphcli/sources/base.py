"""The source registry, the options every source shares, and seeded subset selection.

A source turns a name (`mnist`) or a path (`vectors.npy`) into a `Loaded`. No torch or numpy
at import, so `nph store --help` lists the sources cheaply; the loaders import what they need.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from nphcli.core.errors import NphError
from nphcli.core.suggest import did_you_mean

if TYPE_CHECKING:
    from torch import Tensor

IMAGE = "image"  # raw values are pixel intensities 0..255; item_shape is (C, H, W)
VECTOR = "vector"  # raw values are numbers as read


class Loaded(NamedTuple):
    """What a source returns, before normalisation."""

    patterns: Tensor  # (M, d) float32 raw values: pixel intensities 0..255 for images
    labels: Tensor | None  # (M,) int64, or None when the source has none
    meta: dict[str, Any]  # source, origin, fallback, split, kind, item_shape, selection, ...
    items: list[dict[str, Any]] | None = None  # per row: id, text, meta (`memory.items`)


@dataclass
class SourceOptions:
    """Options of `nph store`, named like its flags. None means "not given"."""

    n: int | None = None  # patterns to keep (a seeded random subset); for `random`, how many
    seed: int = 0  # seed of the subset choice and of `random`
    split: str | None = None  # train | test (datasets only; default train)
    root: Path | None = None  # dataset root (else $NPH_DATA, else the per-user cache folder)
    download: bool = False  # allow torchvision to download a missing dataset
    key: str | None = None  # array name inside .npz / .safetensors / .pt
    size: str | None = None  # WxH to resize a folder of images
    dim: int | None = None  # `random`: values per pattern
    distribution: str | None = None  # `random`: gaussian | binary
    ids: Path | None = None  # .npy rows: a file of their ids (one a line, or .jsonl with id/text)
    embed: str | None = None  # texts: the embedder (`nphcli.sources.embedders`)
    # not an option: a long load reports to it (the CLI's progress protocol, `cli/progress.py`)
    progress: Callable[[int | None], None] | None = None

    def __post_init__(self) -> None:  # a wrong type from Python is one line, not a torch trace
        for name in ("n", "dim", "seed"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise NphError(f"--{name} must be a whole number, got {value!r}")
        for name in ("split", "key", "size", "distribution"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise NphError(f"--{name} must be text, got {value!r}")


# Options every source reads; the others are listed per source and rejected elsewhere.
_COMMON = {"n", "seed", "progress"}


@dataclass(frozen=True)
class SourceInfo:
    """A registered source."""

    name: str  # CLI name (`mnist`) or, for files, the kind of file (`npy`)
    summary: str  # one line for --help and the README
    loader: Callable[[str, SourceOptions], Loaded]  # (spec, options) -> Loaded
    options: frozenset[str]  # SourceOptions fields it reads beyond n and seed
    suffixes: tuple[str, ...] = ()  # file endings it reads; empty for named sources


_NAMED: dict[str, SourceInfo] = {}
_FILES: dict[str, SourceInfo] = {}


def register_source(
    name: str, *, summary: str, options: tuple[str, ...] = (), suffixes: tuple[str, ...] = ()
):
    """Function decorator: add a loader to the registry (by name, or by file ending)."""

    def decorator(loader: Callable[[str, SourceOptions], Loaded]):
        table = _FILES if suffixes or name == "folder" else _NAMED
        if name in table:
            raise ValueError(f"source {name!r} is registered twice")
        table[name] = SourceInfo(name, summary, loader, frozenset(options), suffixes)
        return loader

    return decorator


def list_sources() -> list[SourceInfo]:
    """Named sources first, then file kinds, each in registration order."""
    return [*_NAMED.values(), *_FILES.values()]


def resolve_source(spec: str) -> SourceInfo:
    """The source that reads `spec`: a registered name, a folder, or a file by its ending."""
    if spec in _NAMED:
        return _NAMED[spec]
    path = Path(spec)
    if path.is_dir():
        return _FILES["folder"]
    if not path.exists():
        raise NphError(
            f"unknown source {spec!r}{did_you_mean(spec, _NAMED)}: not one of "
            f"{', '.join(_NAMED)}, and no such file or folder"
        )
    suffix = path.suffix.lower()
    for info in _FILES.values():
        if suffix in info.suffixes:
            return info
    endings = ", ".join(s for info in _FILES.values() for s in info.suffixes)
    raise NphError(
        f"cannot read {spec!r}: unsupported file type {suffix or '(none)'!r}; nph reads "
        f"{endings} files and folders of PNG/JPEG images"
    )


def load_source(spec: str, options: SourceOptions | None = None) -> Loaded:
    """Load source `spec` with `options`; an option the source does not use is an error."""
    options = options or SourceOptions()
    info = resolve_source(spec)
    defaults = SourceOptions()
    for f in dataclasses.fields(SourceOptions):
        value = getattr(options, f.name)
        if f.name in _COMMON or f.name in info.options or value == getattr(defaults, f.name):
            continue
        users = [s.name for s in list_sources() if f.name in s.options]
        raise NphError(
            f"--{f.name} does not apply to {info.name} sources (it applies to: {', '.join(users)})"
        )
    if options.seed < 0:
        raise NphError(f"--seed must be 0 or more, got {options.seed}")
    return info.loader(spec, options)


def choose(available: int, n: int | None, seed: int, *, what: str) -> tuple[Tensor | None, dict]:
    """Indices of a seeded random subset of `n` of `available` items, without replacement.

    The indices come back in increasing order, so the stored patterns keep the dataset's order.
    `n=None` keeps everything (indices None). Returns (indices, selection metadata).
    """
    if n is not None and n <= 0:
        raise NphError(f"--n must be at least 1, got {n}")
    if n is None or n == available:
        return None, {"method": "all", "n": available, "of": available}
    if n > available:
        raise NphError(f"--n {n} asks for more than the {available} patterns in {what}")
    import torch

    generator = torch.Generator().manual_seed(seed)
    indices = torch.randperm(available, generator=generator)[:n].sort().values  # (n,)
    selection = {"method": "random_subset", "n": n, "of": available, "seed": seed}
    return indices, selection


def file_meta(spec, kind, item_shape, available, selection, options) -> dict[str, Any]:
    """The metadata of patterns read from the file `spec`."""
    meta: dict[str, Any] = {
        "source": f"file:{Path(spec).name}",
        "kind": kind,
        "origin": str(Path(spec).resolve()),
        "fallback": False,
        "available": available,
        "selection": selection,
        "seed": options.seed,
    }
    if item_shape:
        meta["item_shape"] = item_shape
    if kind == IMAGE:
        meta["pixel_range"] = [0, 255]
    return meta


def check_finite(patterns: Tensor, what: str, row_name: Callable[[int], str] | None = None):
    """Raise an NphError naming the first NaN or infinite value (row and column, 1-based)."""
    import torch

    bad = ~torch.isfinite(patterns)
    if bad.any():
        row, col = (int(i) for i in bad.nonzero()[0])
        where = row_name(row) if row_name else f"row {row + 1}"
        raise NphError(
            f"{what} contains NaN or infinite values (first at {where}, column {col + 1}); "
            "nph stores finite numbers only"
        )
