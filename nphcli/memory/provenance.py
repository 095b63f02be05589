"""What a memory is, for the results that come from it: its content hash, path, normalisation
and shape (`provenance`). The content hash is `format.tensors_sha256` (each tensor's name, dtype
code, shape and bytes, in name order; metadata left out), computed once per memory:
- a file nph wrote records it (`content_sha256`), so opening it costs nothing more;
- a file without the record is hashed from disk once per process (by path, size and mtime);
- a shard manifest records its source's; an older one stands for the digest of its shards'
  checksums (`shards:` prefix, so it never equals a file's);
- a memory built in Python is hashed from its tensors once, kept on the bank.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nphcli.memory.format import is_manifest, tensors_sha256
from nphcli.memory.reader import DTYPES

META_KEY = "content_sha256"
_CODES = {dtype: code for code, dtype in DTYPES.items()}
_FILE_DIGESTS: dict[tuple[str, int, int], str] = {}
_ATTRIBUTE = "_nph_content_sha256"


def tensors_digest(tensors: dict[str, Tensor]) -> str:
    """`format.tensors_sha256` of the safetensors file these tensors would be written as."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        digest.update(json.dumps([name, dtype_code(tensor.dtype), list(tensor.shape)]).encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())  # no copy of the bytes
    return digest.hexdigest()


def file_digest(path: str | Path) -> str:
    """`tensors_sha256(path)`, computed once per process for each (path, size, mtime)."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    key = (str(resolved), stat.st_size, stat.st_mtime_ns)
    if key not in _FILE_DIGESTS:
        _FILE_DIGESTS[key] = tensors_sha256(resolved)
    return _FILE_DIGESTS[key]


def content_sha256(bank: Any) -> str:
    """The content hash of a `MemoryBank` (see the module docstring). A bank whose tensors are
    in RAM is hashed again once they changed in place or were replaced since it was hashed (or
    loaded: `stamp`), so a memory edited in Python never keeps its first hash."""
    cached = getattr(bank, _ATTRIBUTE, None)
    if cached is not None and _current(bank, cached[0]):
        return cached[1]
    path = getattr(bank, "path", None)
    recorded = (bank.meta or {}).get(META_KEY)
    if cached is None and path is not None and recorded:
        digest = str(recorded)
    elif cached is None and path is not None and not is_manifest(path):
        digest = file_digest(path)
    else:
        keys, values = bank.resident()
        named = {"patterns": keys, "values": values if bank.hetero else None, "labels": bank.labels}
        digest = tensors_digest({name: t for name, t in named.items() if t is not None})
    stamp(bank, digest)
    return digest


def stamp(bank: Any, digest: str) -> None:
    """Record `digest` as the content hash of `bank` as its tensors are now (`load_memory`, once
    it checked them against it; `TensorBank.to`, for the moved copy)."""
    tensors = [getattr(bank, name, None) for name in ("keys", "values", "_labels")]
    state = [(weakref.ref(t), t._version) for t in tensors if isinstance(t, Tensor)]
    try:
        setattr(bank, _ATTRIBUTE, (state, digest))
    except AttributeError:  # a bank that takes no attributes: computed again next time
        pass


def _current(bank: Any, state: list) -> bool:
    """Whether the tensors of `bank` are the ones, unchanged, that `state` recorded."""
    tensors = [getattr(bank, name, None) for name in ("keys", "values", "_labels")]
    tensors = [t for t in tensors if isinstance(t, Tensor)]
    pairs = zip(state, tensors, strict=False)  # of one length, or not current
    return len(tensors) == len(state) and all(r() is t and v == t._version for (r, v), t in pairs)


def provenance(bank: Any) -> dict[str, Any]:
    """{sha256, path, normalize, shape} of a memory: what a result row records about it."""
    path = getattr(bank, "path", None)
    record = (bank.meta or {}).get("normalize") or {}
    shape = [bank.num_memories, bank.dim]
    if bank.hetero:
        shape.append(bank.value_dim)
    return {
        "sha256": content_sha256(bank),
        "path": None if path is None else str(Path(path).resolve()),
        "normalize": record.get("method") if isinstance(record, dict) else None,
        "shape": shape,
    }


def dtype_code(dtype: torch.dtype) -> str:
    """safetensors' code for `dtype` ("F32", "I64", ...)."""
    return _CODES[dtype]
