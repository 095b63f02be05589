"""Exact top-k inner-product search: each query's k highest scores ⟨x, ξ_μ⟩ and their indices.

Two kernels give the same answer. The torch one (`blocks.running_topk`: a `TopKAccumulator` over
memory blocks) works on every device, dtype and memory kind. FAISS's flat inner-product search
(`faiss.knn`, the optional `ann` extra) multiplies in cache-sized tiles and keeps a heap per
query, which on this CPU beats a torch matrix product followed by a selection (its BLAS product
alone is faster than torch's); it is used for float32 memories resident in CPU RAM.

Both follow nph's tie rule: among equal scores the lower memory index wins. FAISS's heap order
among equal scores is its own, so FAISS is asked for k + 1 neighbours: where the k-th and
(k+1)-th scores differ, the k best are one well-defined set; rows where they are equal (a tie
across the cut) are redone by the torch kernel. Scores from the two kernels can differ in the last
bit (different summation order), so two memories whose scores differ only by rounding may trade
places; with exactly representable scores the results are identical.

`NPH_EXACT_SEARCH` chooses: `auto` (default: FAISS when installed and applicable, at any number
of queries: it measured faster at every Q, `FAISS_SCAN_MAX_QUERIES`), `torch`, or `faiss` (an
error when FAISS is missing or the inputs do not fit it).
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


# FAISS scans the keys once per query (no matrix product) below `distance_compute_blas_threshold`
# (FAISS 1.15: 128,000, compared with Q·d, so below Q = 163 at d = 784) and multiplies in tiles
# above it. Measured one-threaded on the 2-core CI machine (M = 60,000, d = 784, k = 10,
# `benchmarks/cpu_pace.py`, CPU time): the scan took 0.91× torch's kernel at Q = 1 and 0.80× at
# Q = 2, but 11–20 ms per query, 2× torch's time at Q = 8 and 4–6× at Q = 32–160; the product
# took 0.67–0.81× torch's time from Q = 8 to 256. So FAISS scans for up to this many queries and
# multiplies in tiles above, and `auto` takes it at every Q.
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
