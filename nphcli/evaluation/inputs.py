"""A run's inputs read from the files an `InputSpec` names: the memory (loaded, or opened for
streaming, by `nphcli.memory.open_memory`) and optional own queries and targets, timed."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.core.normalize import apply_record
from nphcli.core.notices import notice
from nphcli.memory import open_memory
from nphcli.memory.bank import MemoryBank
from nphcli.schema.settings import InputSpec


@dataclass
class Inputs:
    """A run's inputs as read from files, and how long reading took."""

    memory: MemoryBank  # what `open_memory` gives: in RAM, streamed, or sharded
    queries: Tensor | None = None  # (Q, d) own queries
    targets: Tensor | None = None  # (Q, d_v)
    target_indices: Tensor | None = None  # (Q,) int64
    sources: dict[str, str | None] = field(default_factory=dict)  # file names, for the config
    load_s: float = 0.0


def read_inputs(spec: InputSpec, memory: MemoryBank | None = None) -> Inputs:
    """The inputs `spec` names: the memory (a memory file or a shard manifest; `memory` when the
    caller opened it already, e.g. from a cache or on a rank) and the own queries and targets,
    normalised as the memory records (a `query_text` embedded as its texts were), timed.

    With `spec.stream`, the memory is opened, not read: blocks and rows are read when a model or
    a metric asks for them.
    """
    started = time.perf_counter()
    own = (spec.queries_file, spec.query_text, spec.targets_file)
    reads = memory is None or any(value is not None for value in own)
    if memory is None:
        memory = open_memory(spec.memory, stream=spec.stream)
    queries, source = None, spec.queries_file
    if spec.queries_file is not None:
        queries = read_rows(spec.queries_file, "queries", memory)
    if spec.query_text is not None:
        from nphcli.sources.tables import embed_queries

        queries = embed_queries([spec.query_text], memory.meta, spec.memory)  # (1, d)
        source = "--query-text"
    targets = None if spec.targets_file is None else read_rows(spec.targets_file, "targets", memory)
    indices = None
    if spec.target_indices is not None:
        indices = torch.tensor(spec.target_indices, dtype=torch.int64)
    return Inputs(
        memory=memory,
        queries=queries,
        targets=targets,
        target_indices=indices,
        sources={"memory": spec.memory, "queries": source, "targets": spec.targets_file},
        load_s=time.perf_counter() - started if reads else 0.0,  # a given memory: nothing read
    )


def read_rows(path: str | os.PathLike, what: str, memory: MemoryBank) -> Tensor:
    """Own queries or targets (rows, dim) from any file `nph store` reads: .npy, .npz,
    .safetensors, .pt, .csv, a folder of PNG/JPEG images (`nphcli.sources`), or texts and
    tables (.txt, .jsonl, .parquet), whose texts are embedded as the memory's were.

    Rows must be in the memory's stored space. Pixel data (uint8 arrays, image files) holds
    raw intensities 0..255, so it is normalised the way the memory's patterns were (its
    `normalize` record); numbers are taken as they are.
    """
    from nphcli.sources import IMAGE, load_source
    from nphcli.sources.tables import TEXT_SUFFIXES, read_query_rows

    path = Path(path)
    if not path.exists():
        raise NphError(f"{what} file {path} not found")
    if path.suffix.lower() in TEXT_SUFFIXES:  # texts (embedded as the memory's) or a table
        return read_query_rows(path, memory.meta, what)
    loaded = load_source(str(path.resolve()))  # absolute: never mistaken for a dataset name
    if loaded.meta.get("kind") != IMAGE:
        return loaded.patterns
    record = memory.meta.get("normalize")
    if not record:
        notice(
            f"{path} holds pixel values 0..255 and the memory records no normalisation: "
            "using them as they are"
        )
        return loaded.patterns
    return apply_record(loaded.patterns, record)
