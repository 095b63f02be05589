"""Index files: a FAISS inner-product index of a memory file's patterns, bound to that file.

A safetensors file, written atomically: tensors `faiss` (the serialized index) and, for the IVF
kinds, `centroids` (nlist, d) and `radii` (nlist,) that bound unseen scores; JSON metadata with
the versions, kind, parameters, seed, max ‖ξ‖ and the SHA-256 of the FAISS bytes and of the
memory file. Opening refuses a stale, foreign, damaged or newer index in one message.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from nphcli.core.atomic import atomic_write
from nphcli.core.errors import NphError
from nphcli.memory.bank import MemoryBank, TensorBank
from nphcli.memory.segments import manifest_path, read_segments
from nphcli.version import __version__

FORMAT_NAME = "nph-index"
FORMAT_VERSION = 1
KINDS = ("flat", "ivf", "hnsw", "ivfpq")
ADD_ROWS = 65_536  # patterns added per FAISS call, so long builds can report progress
HNSW_NEIGHBOURS = 32  # graph degree of HNSW (FAISS's M); 32 is FAISS's recommended default

Progress = Callable[[str, int, int], None]  # (phase, done, total)


def require_faiss():
    """The faiss module, or the error that says how to install it."""
    try:
        import faiss
    except ImportError:
        raise NphError(
            "approximate indexes need FAISS: pip install faiss-cpu (in a checkout, the ann extra: "
            'pip install -e ".[ann]")'
        ) from None
    return faiss


def version_tuple(text: str) -> tuple[int, ...]:
    """'1.15.1' → (1, 15, 1); non-numeric parts stop the tuple."""
    parts = []
    for part in str(text).split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


_CHECKSUMS: dict[tuple[str, int, int], str] = {}


def file_checksum(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes and, for a memory that grew (`nph add`), its segments manifest's
    (cached per path, size and modification time)."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as error:
        raise NphError(f"cannot read {path}: {error.strerror or error}") from None
    grown = read_segments(path) is not None
    segments = manifest_path(path).read_bytes() if grown else b""
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, segments)
    if key not in _CHECKSUMS:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 24):
                digest.update(chunk)
        digest.update(segments)
        _CHECKSUMS[key] = digest.hexdigest()
    return _CHECKSUMS[key]


def default_lists(num_memories: int) -> int:
    """IVF lists: about √M, and at least 39 patterns per list (FAISS's k-means minimum)."""
    return max(1, min(round(math.sqrt(num_memories)), num_memories // 39))


def default_subquantizers(dim: int) -> int:
    """PQ sub-quantizers: the fewest that divide d with at most 8 dimensions each."""
    return next(m for m in range(math.ceil(dim / 8), dim + 1) if dim % m == 0)


def default_index_path(memory_path: str | os.PathLike, kind: str) -> Path:
    """Beside the memory: memory.safetensors → memory.KIND.index."""
    memory_path = Path(memory_path)
    return memory_path.with_name(f"{memory_path.stem}.{kind}.index")


@dataclass
class AnnIndex:
    """An opened, verified index file."""

    path: Path
    kind: str
    meta: dict[str, Any]
    faiss_index: Any
    centroids: Tensor | None  # (nlist, d) for the IVF kinds
    radii: Tensor | None  # (nlist,): max ‖ξ − c_j‖ over list j, −inf for an empty list
    max_norm: float  # max_μ ‖ξ_μ‖


def check_seed(seed: int) -> int:
    """FAISS keeps its training seed in a C int: refuse one it cannot hold before any work."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise NphError(f"--seed of an index must be within 0…{2**31 - 1}, got {seed}")
    return seed


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise NphError(f"unknown index kind {kind!r}; choose one of: {', '.join(KINDS)}")
    return kind


def build_index(
    memory: MemoryBank,
    memory_path: str | os.PathLike,
    *,
    kind: str = "ivf",
    seed: int = 0,
    lists: int | None = None,
    progress: Progress | None = None,
) -> tuple[Any, dict[str, Any], dict[str, Tensor]]:
    """Train (seeded: k-means, PQ) and fill a FAISS inner-product index of the keys (M, d): the
    FAISS index, the metadata and the extra tensors of the index file."""
    faiss = require_faiss()
    check_kind(kind)
    check_seed(seed)
    report = progress or (lambda phase, done, total: None)
    resident = memory.resident()
    num_memories, dim = memory.num_memories, memory.dim
    if resident is not None:
        keys = resident[0].detach().to("cpu", torch.float32).contiguous()  # (M, d)
        blocks = _read_blocks(TensorBank(keys))
    else:  # streamed from disk (a file larger than RAM): rows read block by block
        keys = None
        blocks = _read_blocks(memory)
    params: dict[str, Any] = {}
    if kind in ("ivf", "ivfpq"):
        lists = default_lists(num_memories) if lists is None else lists
        if isinstance(lists, bool) or not isinstance(lists, int) or not 1 <= lists <= num_memories:
            raise NphError(
                f"--lists must be a whole number in [1, M = {num_memories}], got {lists}"
            )
        params["lists"] = lists
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
        params["neighbours"] = HNSW_NEIGHBOURS
    elif kind == "ivf":
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, lists, faiss.METRIC_INNER_PRODUCT)
    else:
        if num_memories < 256:
            raise NphError(
                "--kind ivfpq trains 256 codes per sub-space: it needs M ≥ 256, "
                f"got M = {num_memories}"
            )
        quantizer = faiss.IndexFlatIP(dim)
        sub = default_subquantizers(dim)
        index = faiss.IndexIVFPQ(quantizer, dim, lists, sub, 8, faiss.METRIC_INNER_PRODUCT)
        index.pq.cp.seed = seed
        params["subquantizers"] = sub
        params["bits"] = 8
    faiss.omp_set_num_threads(torch.get_num_threads())
    if kind in ("ivf", "ivfpq"):
        index.cp.seed = seed
        report("train", 0, 1)
        index.train(_training_rows(memory, keys, lists, seed))
        report("train", 1, 1)
    largest = 0.0
    for start, block in blocks():
        index.add(block.numpy())
        largest = max(largest, float(torch.linalg.vector_norm(block, dim=1).max()))
        report("add", min(start + ADD_ROWS, num_memories), num_memories)
    extra = _list_geometry(faiss, index, blocks) if kind in ("ivf", "ivfpq") else {}
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "nph_version": __version__,
        "faiss_version": faiss.__version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "kind": kind,
        "params": params,
        "seed": seed,
        "M": num_memories,
        "d": dim,
        "max_norm": largest,
        "memory_file": Path(memory_path).name,
        "memory_sha256": file_checksum(memory_path),
    }
    return index, meta, extra


def _read_blocks(memory: MemoryBank) -> Callable[[], Any]:
    """(start, rows) blocks of ADD_ROWS float32 rows of a memory (views of keys in RAM)."""
    return lambda: (
        (s, block.to("cpu", torch.float32).contiguous()) for s, block in memory.key_blocks(ADD_ROWS)
    )


def _training_rows(memory: MemoryBank, keys: Tensor | None, lists: int, seed: int) -> Any:
    """k-means' rows: the keys in RAM, or a seeded sample of 256 rows per list from disk."""
    if keys is not None:
        return keys.numpy()
    count = min(memory.num_memories, 256 * lists)
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randperm(memory.num_memories, generator=generator)[:count].sort().values
    return memory.gather(rows)[0].to("cpu", torch.float32).contiguous().numpy()  # (count, d)


def _list_geometry(faiss, index, blocks: Callable[[], Any]) -> dict[str, Tensor]:
    """Centroids (nlist, d) and radii (nlist,): max ‖ξ − c_j‖ over list j's patterns."""
    lists = index.nlist
    centroids = torch.from_numpy(index.quantizer.reconstruct_n(0, lists)).clone()  # (nlist, d)
    radii = torch.full((lists,), -torch.inf)  # (nlist,)
    for _, block in blocks():  # (B, d)
        _, assigned = index.quantizer.search(block.numpy(), 1)  # (B, 1)
        assigned = torch.from_numpy(assigned[:, 0])  # (B,)
        distance = torch.linalg.vector_norm(block - centroids[assigned], dim=1)  # (B,)
        radii = radii.scatter_reduce(0, assigned, distance, reduce="amax")
    return {"centroids": centroids, "radii": radii}


def write_index(
    path: str | os.PathLike,
    faiss_index: Any,
    meta: dict[str, Any],
    extra: dict[str, Tensor],
    *,
    force: bool = False,
) -> Path:
    """Write the index file atomically (never a half-written file)."""
    faiss = require_faiss()
    payload = np.asarray(faiss.serialize_index(faiss_index), dtype=np.uint8)
    meta = {**meta, "payload_sha256": hashlib.sha256(payload.tobytes()).hexdigest()}
    tensors = {"faiss": torch.from_numpy(payload), **{k: v.contiguous() for k, v in extra.items()}}
    encoded = {key: json.dumps(value) for key, value in meta.items()}
    with atomic_write(path, force=force) as tmp:
        save_file(tensors, str(tmp), metadata=encoded)
    return Path(path)


def read_index_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The index file's metadata, checked for format and versions (FAISS payload not read)."""
    path = Path(path)
    if not path.is_file():
        raise NphError(f"index file {path} does not exist; build one with `nph index MEMORY`")
    try:
        with safe_open(str(path), framework="pt") as handle:
            raw = handle.metadata() or {}
            names = set(handle.keys())
        meta = {key: json.loads(value) for key, value in raw.items()}
    except (SafetensorError, OSError, ValueError) as error:
        raise NphError(f"{path} is not a readable nph index file ({error})") from None
    if meta.get("format") != FORMAT_NAME or "faiss" not in names:
        raise NphError(f"{path} is not an nph index file; build one with `nph index MEMORY`")
    if not isinstance(meta.get("format_version"), int) or meta["format_version"] > FORMAT_VERSION:
        raise NphError(
            f"{path} has index format {meta.get('format_version')}, newer than this nph reads "
            f"({FORMAT_VERSION}); upgrade nph or rebuild the index"
        )
    if version_tuple(meta.get("nph_version", "0")) > version_tuple(__version__):
        raise NphError(
            f"{path} was built by nph {meta['nph_version']}, newer than this nph ({__version__}); "
            "upgrade nph or rebuild the index with this one"
        )
    if meta.get("kind") not in KINDS:
        raise NphError(f"{path}: unknown index kind {meta.get('kind')!r}; rebuild the index")
    return meta


def check_index_file(
    path: str | os.PathLike, memory_path: str | os.PathLike, *, memory_sha256: str | None = None
) -> dict[str, Any]:
    """Refuse an index that is unreadable, newer than this nph or FAISS, or built from another
    memory file; `memory_sha256`: the checksum when the caller vouches for it."""
    faiss = require_faiss()
    meta = read_index_meta(path)
    built = version_tuple(meta.get("faiss_version", "0"))[:2]
    if built > version_tuple(faiss.__version__)[:2]:
        raise NphError(
            f"{path} was built with FAISS {meta['faiss_version']}, newer than the installed "
            f"{faiss.__version__}; upgrade faiss-cpu or rebuild the index"
        )
    expected = file_checksum(memory_path) if memory_sha256 is None else memory_sha256
    if meta.get("memory_sha256") != expected:
        raise NphError(
            f"{path} indexes another memory ({meta.get('memory_file')}, different checksum) "
            f"than {memory_path}; rebuild it: nph index {memory_path} --force"
        )
    return meta


def open_index(
    path: str | os.PathLike, memory_path: str | os.PathLike, *, memory_sha256: str | None = None
) -> AnnIndex:
    """Read and verify an index file for the memory file at `memory_path`."""
    faiss = require_faiss()
    path = Path(path)
    meta = check_index_file(path, memory_path, memory_sha256=memory_sha256)
    try:
        with safe_open(str(path), framework="pt") as handle:
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except (SafetensorError, OSError, ValueError) as error:
        raise NphError(f"{path} is damaged ({error}); rebuild it") from None
    payload = tensors["faiss"].numpy()
    if hashlib.sha256(payload.tobytes()).hexdigest() != meta.get("payload_sha256"):
        raise NphError(f"{path} is damaged (its FAISS data fails the checksum); rebuild it")
    try:
        faiss_index = faiss.deserialize_index(payload)
    except RuntimeError as error:
        raise NphError(f"{path}: FAISS cannot read the index ({error}); rebuild it") from None
    if faiss_index.ntotal != meta.get("M") or faiss_index.d != meta.get("d"):
        raise NphError(f"{path} is damaged (its size disagrees with its metadata); rebuild it")
    return AnnIndex(
        path=path,
        kind=meta["kind"],
        meta=meta,
        faiss_index=faiss_index,
        centroids=tensors.get("centroids"),
        radii=tensors.get("radii"),
        max_norm=float(meta["max_norm"]),
    )
