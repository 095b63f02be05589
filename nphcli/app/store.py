"""`store_memory`: build a memory file from a source, with optional values and labels of its own
(what `nph store` does, callable from Python as `nphcli.store`)."""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nphcli.sources as sources
from nphcli.core.atomic import check_output
from nphcli.core.dtypes import torch_dtype
from nphcli.core.errors import NphError
from nphcli.core.notices import notice
from nphcli.memory.file import save_memory
from nphcli.memory.format import read_metadata
from nphcli.memory.items import record_file, remove_unnamed, staged_items
from nphcli.memory.segments import read_segments
from nphcli.memory.shards import new_manifest_path, split_rows, write_shards
from nphcli.sources.pairing import in_store_dtype, load_labels, load_values_and_items
from nphcli.theory.retrievable import META_KEY as RETRIEVABLE_KEY
from nphcli.theory.retrievable import count_unretrievable, unretrievable_notice

_SOURCE_OPTIONS = tuple(field.name for field in dataclasses.fields(sources.SourceOptions))


@dataclass(frozen=True)
class Stored:
    """What `store_memory` wrote."""

    path: Path  # the memory file
    meta: dict[str, Any]  # its metadata, as read back from it
    labelled: bool  # whether it holds labels
    manifest: Path | None  # the shard manifest beside it (`parts`), else None


def store_memory(
    source: str | os.PathLike,
    out: str | os.PathLike = "memory.safetensors",
    *,
    values: str | os.PathLike | None = None,
    labels: str | os.PathLike | None = None,
    normalize: str | None = None,
    dtype: str = "float32",
    parts: int | None = None,
    force: bool = False,
    **source_options: Any,
) -> Stored:
    """Read `source` (a dataset name, `random`, a file or a folder of images: `nph store
    --help`), normalise it, and write it to the memory file `out` in `dtype`. `values`,
    `labels`: files whose row i belongs to row i of the source (before `n` picks a
    subset): values make a hetero-associative memory; labels replace the source's own.
    `parts`: also split the memory into that many shards and a manifest beside `out`.
    `source_options`: the fields of `nphcli.sources.SourceOptions` (n, seed, split, root,
    download, key, size, dim, distribution). Everything is checked before anything is written;
    an existing `out` is replaced only with `force`."""
    out = Path(out)
    unknown = sorted(set(source_options) - set(_SOURCE_OPTIONS))
    if unknown:
        known = ", ".join(_SOURCE_OPTIONS)
        raise NphError(f"unknown source option(s) {', '.join(unknown)}; choose from {known}")
    # what is wrong with the request is said before "already exists" (--force would not help)
    options = sources.SourceOptions(**source_options)
    sources.resolve_source(str(source))  # an unknown name, with its "did you mean"
    if options.n is not None and options.n < 1:
        raise NphError(f"--n must be at least 1, got {options.n}")
    if out.suffix.lower() != ".safetensors":
        raise NphError(
            f"a memory file is a safetensors file: name it .safetensors, not {out.name} "
            "(nph reads .npy, .npz, .csv and .pt as SOURCE)"
        )
    inputs = [p for p in (source, values, labels) if p is not None and Path(p).exists()]
    check_output(out, force=force, protect=inputs)  # before any loading: fail fast
    if read_segments(out) is not None:  # its segments would outlive the new file
        raise NphError(
            f"{out} grew with `nph add`; store under another name, or `nph compact {out}` and "
            "then replace it"
        )
    for left in remove_unnamed(out, keep=inputs):
        notice(f"removed {left}, a sidecar no memory names (left by an interrupted store)")
    prepared = sources.prepare_memory(str(source), options, normalize=normalize, dtype=dtype)
    meta, stored_labels, stored_values, items = prepared.meta, prepared.labels, None, prepared.items
    if values is not None:
        loaded_values, value_items = load_values_and_items(values, meta)
        stored_values = in_store_dtype(loaded_values, dtype)  # (M, d_v)
        meta = {**meta, "values_file": Path(values).name, "d_v": stored_values.shape[1]}
        if value_items is not None:  # each row keeps what it recalls: the value's id and text
            keys = items or [{"id": row} for row in range(len(value_items))]
            items = [{**key, "value": value} for key, value in zip(keys, value_items, strict=True)]
    if labels is not None:
        stored_labels = load_labels(labels, meta)  # (M,)
        meta = {**meta, "labels_file": Path(labels).name}
        meta.pop("classes", None)  # the dataset's class names no longer apply
    if parts is not None:  # refused before anything is written
        split_rows(prepared.patterns.shape[0], parts)
        new_manifest_path(out, out.parent, force=force)
    found = count_unretrievable(prepared.patterns)
    meta = {**meta, RETRIEVABLE_KEY: found}
    replaced = _items_file(out)  # the sidecar the memory being replaced names, if any
    kept = {"labels": stored_labels, "values": stored_values, "dtype": torch_dtype(prepared.dtype)}
    write = functools.partial(save_memory, out, prepared.patterns, force=force, **kept)
    if items is None:
        write(meta=meta)
    else:  # the sidecar is placed under a new name right before the memory switches to it
        with staged_items(out, items) as (record, place):
            write(meta={**meta, "items": record}, before_switch=place)
    remove_unnamed(out, also=replaced, keep=inputs)
    if warning := unretrievable_notice(found):
        notice(warning)
    manifest = None if parts is None else write_shards(out, out.parent, parts=parts, force=force)
    return Stored(out, read_metadata(out), stored_labels is not None, manifest)


def _items_file(memory: Path) -> list[str]:
    """The name of the sidecar an existing memory file names (none if unreadable)."""
    try:
        record = read_metadata(memory).get("items") if memory.is_file() else None
    except (NphError, OSError, ValueError):
        return []
    return [name] if (name := record_file(record)) else []
