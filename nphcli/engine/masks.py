"""The masked models' (`topk`, `random`, `window`) subsets of memories per query: `--k`, and masks
(Q, M) that depend only on the scores or on (seed, position, memory index), never on batching.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.engine import hashing, host_buffers
from nphcli.engine.hashing import (
    MASK32,
    fmix32,
    hash_numpy,
    mixed_words,
    ordered_keys,
    query_state,
    random_keys,
)

K_HELP = (
    "memories each query keeps: a whole count ≥ 1, or a fraction of M in (0, 1) "
    "giving max(1, ⌊k·M + ½⌋)"
)


def check_k(k: float) -> int | float:
    """Validate `--k` alone: a count as an int (10, never 10.0 in a report), else a fraction."""
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not math.isfinite(k) or k <= 0:
        raise NphError(
            f"--k must be a whole count ≥ 1 or a fraction in (0, 1) of the memories, got {k!r}"
        )
    if k >= 1 and k != int(k):
        raise NphError(
            f"--k {k} is ≥ 1, so it is a count and must be whole; "
            "use a fraction in (0, 1) for a share of the memories"
        )
    return int(k) if k >= 1 else float(k)


def resolve_k(k: float, num_memories: int) -> int:
    """Memories each query keeps: a count k ≤ M, or max(1, ⌊k·M + ½⌋) for k in (0, 1)."""
    if k >= 1:
        count = int(k)
        if count > num_memories:
            raise NphError(
                f"--k {count} exceeds the {num_memories} stored memories; "
                "use a count ≤ M or a fraction in (0, 1)"
            )
        return count
    return max(1, math.floor(k * num_memories + 0.5))


def topk_mask(scores: Tensor, k: int) -> Tensor:
    """Mask (Q, M) of the k highest scores per row, ties to the lower memory index."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices  # (Q, M)
    mask = torch.zeros_like(scores, dtype=torch.bool)  # (Q, M)
    return mask.scatter_(-1, order[:, :k], True)


_KEEP_CHUNK = 2**18  # keys `_each_kth` takes at a time: they stay in cache, in reused buffers
# Bytes per entry the whole-batch route holds beside the mask: keys, scratch, kthvalue, compare.
WHOLE_BATCH_KEY_BYTES = 12


def mask_key_bytes(device: torch.device, num_memories: int) -> int:
    """Bytes per query `random_keep` and `random_bias` take beside their (Q, M) result."""
    return 0 if device.type in hashing.NUMPY_DEVICES else WHOLE_BATCH_KEY_BYTES * num_memories


def random_keep(seed: int, positions: Tensor, num_memories: int, k: int) -> Tensor:
    """Mask (Q, M) of each query's k memories with the smallest hash (`random_subset`'s)."""
    if positions.device.type not in hashing.NUMPY_DEVICES:
        keys, kth = _kth_smallest(seed, positions, num_memories, k)  # (Q, M), (Q, 1)
        return keys <= kth
    mask = torch.empty(positions.shape[0], num_memories, dtype=torch.bool)  # (Q, M)
    target = mask.numpy()

    def write(rows: slice, keys: np.ndarray, kth: np.ndarray) -> None:
        np.less_equal(keys, kth, out=target[rows])

    _each_kth(seed, positions, num_memories, k, write)
    return mask


def random_bias(seed: int, positions: Tensor, num_memories: int, k: int, dtype) -> Tensor:
    """`random_keep` as an additive mask (Q, M) of `dtype` (0 or −inf), which fused attention
    takes as it is (a bool mask it converts first)."""
    if positions.device.type not in hashing.NUMPY_DEVICES:
        keys, kth = _kth_smallest(seed, positions, num_memories, k)  # (Q, M), (Q, 1)
        bias = torch.zeros(keys.shape, dtype=dtype, device=keys.device)  # (Q, M)
        return bias.masked_fill_(keys > kth, -torch.inf)
    bias = host_buffers.empty((positions.shape[0], num_memories), dtype)  # (Q, M)
    words = bias.view(host_buffers.word_dtype(dtype)).numpy()  # written through its bits
    minus_inf = torch.full((1,), -torch.inf, dtype=dtype).view(host_buffers.word_dtype(dtype))
    minus_inf = minus_inf.numpy()[0]  # −inf's bits as a word

    def write(rows: slice, keys: np.ndarray, kth: np.ndarray) -> None:
        dropped = np.greater(keys, kth, out=words[rows])  # (R, M) 0 or 1
        np.multiply(dropped, minus_inf, out=dropped)

    _each_kth(seed, positions, num_memories, k, write)
    return bias


def _kth_smallest(seed: int, positions: Tensor, num_memories: int, k: int) -> tuple[Tensor, Tensor]:
    """The whole batch's `ordered_keys` (Q, M) and each row's k-th smallest (Q, 1)."""
    memory_index = torch.arange(num_memories, device=positions.device)  # (M,)
    keys = ordered_keys(seed, positions, memory_index)  # (Q, M)
    return keys, torch.kthvalue(keys, k, dim=1, keepdim=True).values


def _each_kth(seed: int, positions: Tensor, num_memories: int, k: int, write) -> None:
    """On the CPU, write(rows, keys, kth) for groups of queries: their uint32 hashes (R, M) and
    each row's k-th smallest (R, 1) by numpy's partition, groups shared among threads."""
    num_queries = positions.shape[0]
    rows = max(1, min(num_queries, _KEEP_CHUNK // num_memories))
    groups = [slice(start, start + rows) for start in range(0, num_queries, rows)]
    state = mixed_words(query_state(seed, positions)).numpy().view(np.uint32)  # (Q,)
    index = mixed_words(torch.arange(num_memories)).numpy().view(np.uint32)  # (M,)
    workers = min(torch.get_num_threads(), len(groups))

    def run(first: int) -> None:
        keys, spare = (np.empty((rows, num_memories), np.uint32) for _ in range(2))
        for group in groups[first::workers]:
            part = state[group]  # (R,)
            copy = spare[: part.shape[0]]  # (R, M)
            these = hash_numpy(part, index, keys[: part.shape[0]], copy=copy)  # (R, M)
            copy.partition(k - 1, axis=1)  # selection reorders its copy of the keys
            write(group, these, copy[:, k - 1 : k])

    if workers == 1:
        run(0)
        return
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(run, range(workers)))


def random_mask(seed: int, positions: Tensor, num_memories: int, k: int) -> Tensor:
    """Mask (Q, M) of the k memories `random_choice` draws for each query."""
    if not uses_floyd(num_memories, k):
        return random_keep(seed, positions, num_memories, k)
    chosen = floyd_subset(seed, positions, num_memories, k)  # (Q, k)
    mask = torch.zeros(positions.shape[0], num_memories, dtype=torch.bool, device=chosen.device)
    return mask.scatter_(-1, chosen, True)  # (Q, M)


# Floyd's O(k²) draw for small k; else the k smallest of M hashes (O(M), a few ns each).
FLOYD_MAX_K = 256
FLOYD_RATIO = 64


def uses_floyd(num_memories: int, k: int) -> bool:
    """Whether `random_choice` draws by Floyd's algorithm (else by the smallest hashes)."""
    return k <= FLOYD_MAX_K and k * FLOYD_RATIO <= num_memories


def random_choice(
    seed: int, positions: Tensor, num_memories: int, k: int, *, block_rows: int
) -> Tensor:
    """The k memories each query keeps (Q, k) ascending, every k-subset equally likely."""
    if uses_floyd(num_memories, k):
        return floyd_subset(seed, positions, num_memories, k)
    return random_subset(seed, positions, num_memories, k, block_rows=block_rows)


def floyd_subset(seed: int, positions: Tensor, num_memories: int, k: int) -> Tensor:
    """k distinct memories per query, (Q, k) ascending, by Floyd's sampling algorithm:

        for j = M − k … M − 1:  t ← uniform in [0, j];  keep j if t is kept already, else t

    which gives every k-subset of [0, M) probability 1 / C(M, k) (Floyd, CACM 1987); t comes
    from a 62-bit hash of (query state, j) (`floyd_draws`).
    """
    state = query_state(seed, positions)[:, None]  # (Q, 1)
    steps = torch.arange(num_memories - k, num_memories, device=positions.device)  # (k,) j
    draws = floyd_draws(state, steps)  # (Q, k), column j in [0, j]
    chosen = draws.clone()  # (Q, k)
    for step in range(1, k):
        taken = (chosen[:, :step] == draws[:, step : step + 1]).any(dim=1)  # (Q,)
        chosen[:, step] = torch.where(taken, steps[step], draws[:, step])
    return torch.sort(chosen, dim=1).values  # (Q, k)


def floyd_draws(state, step):
    """Floyd's t in [0, j]: a 62-bit hash of (state, j) mod j + 1 (ints or int64 tensors)."""
    high = fmix32(fmix32(state ^ (step & MASK32)) ^ ((step >> 32) & MASK32) ^ 0x3C6EF372)
    low = fmix32(high ^ 0xBB67AE85)
    return ((high >> 1) << 31 | (low >> 1)) % (step + 1)


def random_subset(
    seed: int, positions: Tensor, num_memories: int, k: int, *, block_rows: int
) -> Tensor:
    """The k memories with the smallest hash per query (Q, k) ascending, a block of indices at a
    time; a query's hashes never tie, so the set is the one-shot one."""
    kept_hashes = kept_index = None
    for start in range(0, num_memories, block_rows):
        index = torch.arange(start, min(num_memories, start + block_rows), device=positions.device)
        hashes = random_keys(seed, positions, index)  # (Q, B)
        index = index.expand(positions.shape[0], -1)  # (Q, B)
        if kept_hashes is not None:
            hashes = torch.cat([kept_hashes, hashes], dim=1)  # (Q, k + B)
            index = torch.cat([kept_index, index], dim=1)  # (Q, k + B)
        if hashes.shape[1] > k:
            smallest = torch.topk(hashes, k, dim=1, largest=False).indices  # (Q, k)
            hashes, index = hashes.gather(1, smallest), index.gather(1, smallest)
        kept_hashes, kept_index = hashes, index
    return torch.sort(kept_index, dim=1).values  # (Q, k)


def window_band(positions: Tensor, num_memories: int, window: int) -> tuple[Tensor, Tensor]:
    """Each query's window as index (Q, c) and valid (Q, c), c = min(2w + 1, M), from
    max(0, p − w); invalid entries are clamped into range and must weigh 0."""
    width = min(2 * window + 1, num_memories)
    positions = positions.to(torch.int64)
    low = (positions - window).clamp(min=0)  # (Q,)
    high = (positions + window).clamp(max=num_memories - 1)  # (Q,)
    index = low[:, None] + torch.arange(width, device=positions.device)  # (Q, c)
    valid = index <= high[:, None]  # (Q, c)
    return index.clamp(max=num_memories - 1), valid


def window_mask(positions: Tensor, num_memories: int, window: int) -> Tensor:
    """Mask (Q, M) of memories μ with |μ − p| ≤ window for the query at position p."""
    memory_indices = torch.arange(num_memories, device=positions.device)  # (M,)
    offsets = memory_indices[None, :] - positions.to(torch.int64)[:, None]  # (Q, M)
    return offsets.abs() <= window
