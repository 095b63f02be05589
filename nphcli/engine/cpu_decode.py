"""One read of the memories for a few queries on the CPU (the `fast` extra: numba).

Dense retrieval of one query reads every key for its score and every value for the weighted
sum. BLAS does the two in separate calls, so the rows come from memory twice (1.5 × one GEMV);
torch's fused attention scores a tile and re-reads it from the last-level cache (1.4 ×). Here
each row's scores and its share of the sum are taken while the row is in L1: the online
softmax over blocks of rows, as flash attention does, compiled by numba. Same answer as
`triton_kernels.decode_partials`, the CUDA form, which `attention._decode` folds alike.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import torch
from torch import Tensor

BLOCK_ROWS = 64  # rows scored before their weighted adds: 64 · d floats stay in L2
MIN_ROWS_PER_THREAD = 4096  # below this a second thread costs more than it saves
_POOL: dict[tuple[int, int], ThreadPoolExecutor] = {}  # by (process, threads): a forked child
# inherits the parent's pools without their threads, so it makes its own


@numba.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def _slice_partials(queries, keys, values, scale, start, stop, best, norm, total):  # noqa: PLR0913
    """Rows [start, stop): per query the max score, Σ exp(s − max) and Σ exp(s − max) v."""
    num_queries = queries.shape[0]
    scores = np.empty((num_queries, BLOCK_ROWS), dtype=np.float32)
    for first in range(start, stop, BLOCK_ROWS):
        last = min(first + BLOCK_ROWS, stop)
        for q in range(num_queries):
            block_max = np.float32(-3.0e38)
            for i in range(first, last):
                s = np.float32(0.0)
                for j in range(keys.shape[1]):
                    s += keys[i, j] * queries[q, j]
                s *= scale
                scores[q, i - first] = s
                block_max = max(block_max, s)
            if first == start:
                best[q] = block_max
            elif block_max > best[q]:
                rescale = np.float32(math.exp(best[q] - block_max))
                norm[q] *= rescale
                for j in range(values.shape[1]):
                    total[q, j] *= rescale
                best[q] = block_max
            for i in range(first, last):
                w = np.float32(math.exp(scores[q, i - first] - best[q]))
                norm[q] += w
                for j in range(values.shape[1]):
                    total[q, j] += w * values[i, j]


def decode_partials(
    queries: Tensor, keys: Tensor, values: Tensor, *, scale: float, programs: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Each of up to `programs` slices of the memories' max (P, Q), normaliser (P, Q) and
    weighted sum (P, Q, d_v), float32, slices run on torch's intra-op thread count."""
    num_memories = keys.shape[0]
    parts = max(1, min(programs, num_memories // MIN_ROWS_PER_THREAD))
    edges = [num_memories * p // parts for p in range(parts + 1)]
    best = torch.empty(parts, queries.shape[0])
    norm = torch.zeros(parts, queries.shape[0])
    total = torch.zeros(parts, queries.shape[0], values.shape[1])
    x, k, v = (t.contiguous().numpy() for t in (queries.float(), keys, values))

    def run(p: int) -> None:
        out = (best[p].numpy(), norm[p].numpy(), total[p].numpy())
        _slice_partials(x, k, v, np.float32(scale), edges[p], edges[p + 1], *out)

    if parts == 1:
        run(0)
    else:
        key = (os.getpid(), parts)
        pool = _POOL.get(key) or _POOL.setdefault(key, ThreadPoolExecutor(parts, "nph-decode"))
        list(pool.map(run, range(parts)))
    return best, norm, total


def programs() -> int:
    """The slices `decode_partials` runs side by side: torch's intra-op thread count."""
    return torch.get_num_threads()
