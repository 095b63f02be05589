"""Exact top-k inner-product search: each query's k highest scores ⟨x, ξ_μ⟩ and their indices.

`blocks.running_topk` works everywhere; FAISS's flat search (the `ann` extra), faster on the CPU,
serves float32 memories resident in CPU RAM. Ties go to the lower index: FAISS is asked for k + 1
and rows tied across the cut are redone by torch (scores may differ in the last bit).
`NPH_EXACT_SEARCH`: `auto` (FAISS where it applies), `torch` or `faiss`.
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch
from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.engine.blocks import running_topk
from nphcli.memory.bank import MemoryBank, TensorBank

ENVIRONMENT = "NPH_EXACT_SEARCH"
CHOICES = ("auto", "torch", "faiss")
TIED_BLOCK_ELEMENTS = 1 << 24  # scores per block when rows tied across the cut are redone


@lru_cache(maxsize=1)
def faiss_available() -> bool:
    """Whether the optional FAISS package imports (the `ann` extra)."""
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def search_choice() -> str:
    """The kernel `NPH_EXACT_SEARCH` asks for (auto, torch or faiss)."""
    choice = os.environ.get(ENVIRONMENT, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise NphError(f"{ENVIRONMENT} must be one of {', '.join(CHOICES)}, got {choice!r}")
    return choice


# FAISS's per-query scan beat torch up to Q = 2 and was 2–6× slower above, where its tiled
# product took 0.67–0.81× torch's time (M = 60,000, d = 784, one thread, `benchmarks/cpu_pace.py`).
FAISS_SCAN_MAX_QUERIES = 2


def _faiss_fits(queries: Tensor, bank: MemoryBank) -> bool:
    resident = bank.resident()
    return (
        resident is not None
        and bank.collective.world_size == 1  # a rank's own rows: the merge is torch's
        and queries.device.type == "cpu"
        and bank.device.type == "cpu"
        and queries.dtype == torch.float32
        and bank.dtype == torch.float32
        and not queries.requires_grad
        and not resident[0].requires_grad
    )


def use_faiss(queries: Tensor, bank: MemoryBank) -> bool:
    """Whether `exact_topk` takes the FAISS kernel for these inputs."""
    choice = search_choice()
    if choice == "torch":
        return False
    fits = _faiss_fits(queries, bank)
    if choice == "faiss":
        if not faiss_available():
            raise NphError(f"{ENVIRONMENT}=faiss needs FAISS: pip install faiss-cpu, or unset it")
        if not fits:
            raise NphError(
                f"{ENVIRONMENT}=faiss searches float32 memories held in CPU RAM only; "
                "use --dtype float32 --device cpu without --stream, or unset it"
            )
        return True
    return fits and faiss_available()


def exact_topk(
    queries: Tensor, bank: MemoryBank, k: int, *, block_rows: int
) -> tuple[Tensor, Tensor]:
    """The k largest scores xᵀξ_μ per query and their memory indices, both (Q, k), sorted by
    (score descending, index ascending); FAISS or torch (see the module docstring)."""
    if use_faiss(queries, bank):
        return faiss_topk(queries, bank.resident()[0], k)
    return torch_topk(queries, bank, k, block_rows=block_rows)


def torch_topk(
    queries: Tensor, bank: MemoryBank, k: int, *, block_rows: int
) -> tuple[Tensor, Tensor]:
    """`exact_topk` by a running top-k over memory blocks (any device, dtype, memory kind)."""
    top = running_topk(queries, bank, k, block_rows=block_rows)
    return top.scores, top.index


def faiss_topk(queries: Tensor, keys: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """`exact_topk` by FAISS's flat inner-product search over keys (M, d), float32 on the CPU."""
    import faiss

    num_queries, num_memories = queries.shape[0], keys.shape[0]
    wanted = min(k + 1, num_memories)  # one more, to see ties across the cut
    faiss.omp_set_num_threads(torch.get_num_threads())
    xq = queries.detach().contiguous().numpy()
    xb = keys.detach().contiguous().numpy()
    threshold = faiss.cvar.distance_compute_blas_threshold  # a global: restored below
    if num_queries > FAISS_SCAN_MAX_QUERIES:
        faiss.cvar.distance_compute_blas_threshold = 0  # tiles from here (see above)
    try:
        found, ids = faiss.knn(xq, xb, wanted, metric=faiss.METRIC_INNER_PRODUCT)  # (Q, k + 1)
    finally:
        faiss.cvar.distance_compute_blas_threshold = threshold
    scores = torch.from_numpy(found)  # (Q, k + 1), descending
    index = torch.from_numpy(ids)  # (Q, k + 1)
    if wanted > k:
        tied = scores[:, k - 1] == scores[:, k]  # (Q,) a tie straddles the cut
        scores, index = scores[:, :k], index[:, :k]
    else:
        tied = torch.zeros(num_queries, dtype=torch.bool)
    # Within the kept k, order equal scores by index: sort by index, then stably by score.
    by_index = torch.sort(index, dim=1)
    scores, index = scores.gather(1, by_index.indices), by_index.values
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices  # (Q, k)
    scores, index = scores.gather(1, order), index.gather(1, order)
    if bool(tied.any()):
        rows = tied.nonzero().squeeze(1)  # (T,)
        block = max(k + 1, TIED_BLOCK_ELEMENTS // rows.numel())  # (T, block) scores at a time
        redo = torch_topk(queries[rows], TensorBank(keys), k, block_rows=block)
        scores = scores.index_copy(0, rows, redo[0])
        index = index.index_copy(0, rows, redo[1])
    return scores, index
