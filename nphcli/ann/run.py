"""A retrieval run over an index: the checks made before any work, the model that searches the
index, and the report of what the approximation cost (`nph retrieve --index`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nphcli.ann.index_file import AnnIndex, open_index
from nphcli.ann.search import IndexedModel, candidate_rule, check_depth, search_depth
from nphcli.core.errors import NphError
from nphcli.memory.bank import MemoryBank
from nphcli.memory.format import is_manifest
from nphcli.memory.segments import manifest_path
from nphcli.schema.settings import IndexSettings


def check_index_run(
    settings: IndexSettings, memory_path: str | os.PathLike, model: Any, device: torch.device
) -> None:
    """Refuse, before the memory is loaded, an index that does not fit the run; `device` is the
    resolved one (`auto` without a GPU is the CPU, where a search runs)."""
    if not isinstance(device, torch.device):  # a bug: the caller skipped resolve_device
        raise TypeError(f"check_index_run takes a resolved torch.device, not {device!r}")
    if device.type != "cpu":
        raise NphError(
            f"--index searches on the CPU, and this run is on {device}; use --device cpu"
        )
    if is_manifest(memory_path):  # --index names the kind of the shards' indexes
        from nphcli.ann.shard_index import check_shard_indexes

        kind, rows = settings.path, check_shard_indexes(memory_path, settings.path).num_memories
    else:
        opened = _open(settings.path, memory_path)  # every file check, the FAISS bytes included
        kind, rows = opened.kind, opened.meta["M"]
    check_depth(kind, settings.nprobe, settings.ef, str(settings.path))
    if model.steps != 1:
        raise NphError("--index retrieves one step; use --steps 1")
    candidate_rule(model, rows)


# The index opened by the checks, reused by the run (keyed by the files' identities).
_OPENED: dict[tuple, AnnIndex] = {}


def _open(path: str | os.PathLike, memory_path: str | os.PathLike) -> AnnIndex:
    grown = manifest_path(memory_path)  # a memory that grew is its file and this manifest
    key = tuple(_identity(p) for p in (path, memory_path, grown))
    if key not in _OPENED:
        _OPENED.clear()  # hold one index at a time
        _OPENED[key] = open_index(path, memory_path)
    return _OPENED[key]


def _identity(path: str | os.PathLike) -> tuple:
    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        return (str(path),)  # open_index reports the missing file
    return (str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def indexed_model(model: Any, settings: IndexSettings, memory: MemoryBank) -> IndexedModel:
    """The model retrieving over the opened, verified index of `memory`'s file."""
    if memory.path is None:
        raise NphError("--index needs the memory's file, to check the index was built from it")
    if is_manifest(memory.path):
        from nphcli.ann.shard_index import sharded_indexed_model

        return sharded_indexed_model(model, settings, memory)
    index = _open(settings.path, memory.path)
    indexed = IndexedModel(
        model, index, candidates=settings.candidates, nprobe=settings.nprobe, ef=settings.ef
    )
    indexed.check_memory(memory)
    return indexed


def index_report(
    model: IndexedModel,
    settings: IndexSettings,
    memory: MemoryBank,
    queries: Tensor,
    positions: Tensor,
    targets: Tensor | None,
    *,
    seed: int,
) -> dict[str, Any]:
    """The report's `index` section: the index, its settings, the share certified exact, and
    the comparison with exact retrieval on a sample."""
    from nphcli.ann.shard_index import ShardedIndexedModel

    index = model.index
    certified = model.certified_at(positions)
    sharded = isinstance(model, ShardedIndexedModel)
    report: dict[str, Any] = {
        "file": str(model.manifest.path if sharded else index.path),
        "kind": index.kind,
        "params": index.meta.get("params", {}),
        **search_depth(index, model.count(memory.num_memories), settings.nprobe, settings.ef),
        "candidates": model.count(memory.num_memories),
        "certified_fraction": None if certified is None else float(certified.float().mean()),
        "check_exact": None,
    }
    if sharded:  # what crossed between ranks per query (ids and scores out, Σ w·v back)
        seen = max(1, model.queries_seen)
        report["shards"] = len(model.manifest.parts)
        report["shard_params"] = [entry["params"] for entry in model.record["parts"]]
        report["bytes_sent_per_query"] = model.bytes_sent / seen
    if settings.check_exact > 0:
        cpu_memory = memory.to(device="cpu")
        report["check_exact"] = model.compare_exact(
            queries.to(device="cpu", dtype=cpu_memory.dtype),
            cpu_memory,
            sample=settings.check_exact,
            seed=seed,
            targets=None if targets is None else targets.to(device="cpu", dtype=torch.float32),
        )
    return report
