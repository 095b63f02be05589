"""A run's inputs read from files: the memory (loaded, or opened for streaming, by
`nphcli.memory.open_memory`) and optional own queries and targets, timed."""

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
from nphcli.schema.holders import holds


@dataclass(frozen=True)
@holds("input")
class InputSpec:
    """What a request reads: one attribute per input field, defaults from there."""

    memory: str  # memory file or shard manifest
    queries_file: str | None  # own queries; None: corrupted stored patterns
    query_text: str | None  # one own query as text, embedded as the memory's texts were
    targets_file: str | None  # targets of own queries (Q, d_v)
    target_indices: list[int] | None  # stored row of each own query's target
    stream: bool  # read the memory block by block instead of loading it

    def __post_init__(self) -> None:
        if self.queries_file is not None and self.query_text is not None:
            raise NphError("give own queries either as a file or as --query-text, not both")
        if self.targets_file is not None and self.target_indices is not None:
            raise NphError("give targets either as a file or as indices, not both")
        own = self.queries_file or self.query_text is not None
        if (self.targets_file or self.target_indices is not None) and not own:
            raise NphError("targets go with own queries: add --queries-file")

    def files(self) -> list[Path]:
        """The files read, which no output may overwrite."""
        named = (self.memory, self.queries_file, self.targets_file)
        return [Path(name) for name in named if name is not None]


@dataclass
class Inputs:
    """A run's inputs as read from files, and how long reading took."""

    memory: MemoryBank  # what `open_memory` gives: in RAM, streamed, or sharded
    queries: Tensor | None = None  # (Q, d) own queries
    targets: Tensor | None = None  # (Q, d_v)
    target_indices: Tensor | None = None  # (Q,) int64
    sources: dict[str, str | None] = field(default_factory=dict)  # file names, for the config
    load_s: float = 0.0


def load_inputs(
    memory_path: str | os.PathLike,
    *,
    queries_file: str | os.PathLike | None = None,
    targets_file: str | os.PathLike | None = None,
    target_indices: list[int] | None = None,
    stream: bool = False,
    query_text: str | None = None,
) -> Inputs:
    """Open the memory (a memory file or a shard manifest) and read optional own queries and
    targets, timing it.

    With `stream`, the memory is opened, not read: blocks and rows are read when a model or a
    metric asks for them.
    """
    InputSpec(
        memory=str(memory_path),
        queries_file=queries_file,
        query_text=query_text,
        targets_file=targets_file,
        target_indices=target_indices,
        stream=stream,
    )
    t0 = time.perf_counter()
    memory = open_memory(memory_path, stream=stream)
    return inputs_with(
        memory, memory_path, queries_file, targets_file, target_indices, t0, query_text
    )


def inputs_with(
    memory: MemoryBank,
    memory_path: str | os.PathLike,
    queries_file: str | os.PathLike | None,
    targets_file: str | os.PathLike | None,
    target_indices: list[int] | None,
    started: float,
    query_text: str | None = None,
) -> Inputs:
    """`Inputs` around an opened memory: own queries and targets read (normalised as the memory
    records; a `query_text` embedded as its texts were), load time counted from `started` (a
    `time.perf_counter()` reading)."""
    queries = None if queries_file is None else read_rows(queries_file, "queries", memory)
    if query_text is not None:
        from nphcli.sources.tables import embed_queries

        queries = embed_queries([query_text], memory.meta, str(memory_path))  # (1, d)
        queries_file = "--query-text"
    targets = None if targets_file is None else read_rows(targets_file, "targets", memory)
    indices = None if target_indices is None else torch.tensor(target_indices, dtype=torch.int64)
    return Inputs(
        memory=memory,
        queries=queries,
        targets=targets,
        target_indices=indices,
        sources={
            "memory": str(memory_path),
            "queries": None if queries_file is None else str(queries_file),
            "targets": None if targets_file is None else str(targets_file),
        },
        load_s=time.perf_counter() - started,
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
