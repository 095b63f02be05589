"""Which memories a query may attend to: the shared helpers of the masked models.

`topk`, `random` and `window` all apply softmax over a per-query subset of memories (see
`functional.masked_softmax`). This module resolves their `--k` and builds the boolean masks
`(Q, M)`. Masks depend only on the query's scores or on (seed, query position, memory index),
never on how queries or memories are split into batches or blocks.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import Tensor

from nphcli.engine import host_buffers
from nphcli.errors import NphError

K_HELP = (
    "memories each query keeps: a whole count ≥ 1, or a fraction of M in (0, 1) "
    "giving max(1, ⌊k·M + ½⌋)"
)


def check_k(k: float) -> None:
    """Validate `--k` on its own; the comparison with M is `resolve_k`'s."""
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not math.isfinite(k) or k <= 0:
        raise NphError(
            f"--k must be a whole count ≥ 1 or a fraction in (0, 1) of the memories, got {k!r}"
        )
    if k >= 1 and k != int(k):
        raise NphError(
            f"--k {k} is ≥ 1, so it is a count and must be whole; "
            "use a fraction in (0, 1) for a share of the memories"
        )


def resolve_k(k: float, num_memories: int) -> int:
    """The number of memories each query keeps.

    k ≥ 1 is a count and must not exceed M. k in (0, 1) is a fraction of M, rounded half up and
    kept at least 1: max(1, ⌊k·M + ½⌋), so k = 0.2 is the paper's Top-20%.
    """
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
    """Mask (Q, M) of the k highest scores per row. Ties go to the lower memory index: a stable
    descending sort keeps equal scores in index order, so the choice is the same on every run
    and device, and a blockwise top-k merged by (score, −index) would agree with it."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices  # (Q, M)
    mask = torch.zeros_like(scores, dtype=torch.bool)  # (Q, M)
    return mask.scatter_(-1, order[:, :k], True)


_MASK32 = 0xFFFFFFFF


def _mul32(x, c: int):
    """x·c mod 2³² for x in [0, 2³²): x is split into 16-bit halves so no product exceeds 2⁴⁸,
    which keeps int64 tensors clear of (undefined) signed overflow on every device."""
    low = (x & 0xFFFF) * c
    high = (((x >> 16) * c) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _fmix32(x):
    """MurmurHash3's 32-bit finaliser: a bijection of [0, 2³²) in which every input bit
    affects every output bit. Works on Python ints and int64 tensors alike."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


# Entries hashed at a time. fmix32 makes several passes over its input: on chunks this size, with
# a reused scratch buffer, every pass stays in cache and nothing is allocated, an order of
# magnitude faster than passes over a fresh (Q, M) tensor.
_HASH_CHUNK = 2**17
_SIGN = -(2**31)  # int32 with only the sign bit set


# Devices whose hashes are computed with numpy's kernels (its arrays share the tensors' memory);
# elsewhere with torch's. Tests empty it to run torch's on the CPU.
NUMPY_DEVICES = ("cpu",)


def random_keys(seed: int, positions: Tensor, memory_indices: Tensor) -> Tensor:
    """Hash h(seed, position, memory index) as int64 in [0, 2³²), shape (Q, M).

    A counter-based hash: the seed's and the position's 32-bit words are folded in one at a
    time, h ← fmix32(h ⊕ word), then the memory index. For one (seed, position) the last step
    is a bijection of the memory index, so the memories of one query never tie.
    """
    return ordered_keys(seed, positions, memory_indices).to(torch.int64) - _SIGN


def ordered_keys(
    seed: int, positions: Tensor, memory_indices: Tensor, *, out: Tensor | None = None
) -> Tensor:
    """`random_keys` − 2³¹ as int32 (Q, M): the same order in half the bytes of int64.

    Hashed in 32-bit words, chunk by chunk: on the CPU with numpy's uint32 kernels
    (`_hash_numpy`), elsewhere with torch's int32 kernels (`_fmix32_`). Flipping the sign bit at
    the end maps [0, 2³²) in order onto int32. `out` (Q, M) int32, if given, receives them."""
    state = _to_int32(_query_state(seed, positions))  # (Q,)
    memory_indices = _to_int32(memory_indices.to(device=positions.device, dtype=torch.int64))
    num_queries, num_memories = state.shape[0], memory_indices.shape[0]
    if out is None:
        out = torch.empty(num_queries, num_memories, dtype=torch.int32, device=positions.device)
    if out.device.type in NUMPY_DEVICES:
        words = out.numpy().view(np.uint32)  # (Q, M)
        state, memory_indices = (w.numpy().view(np.uint32) for w in (state, memory_indices))
        _hash_numpy(state, memory_indices, words, flip=True)
        return out
    columns, rows = _chunk_shape(num_queries, num_memories)
    x, scratch = (out.new_empty(rows * columns) for _ in range(2))
    for row in range(0, num_queries, rows):
        for column in range(0, num_memories, columns):
            left = state[row : row + rows, None]  # (r, 1)
            right = memory_indices[None, column : column + columns]  # (1, c)
            shape = (left.shape[0], right.shape[1])
            chunk, spare = (buf[: shape[0] * shape[1]].reshape(shape) for buf in (x, scratch))
            torch.bitwise_xor(left, right, out=chunk)
            out[row : row + rows, column : column + columns] = _fmix32_(chunk, spare) ^ _SIGN
    return out


def _chunk_shape(num_queries: int, num_memories: int) -> tuple[int, int]:
    """Columns and rows of a hash chunk of about `_HASH_CHUNK` entries."""
    columns = min(num_memories, max(256, _HASH_CHUNK // max(1, num_queries)))
    return columns, min(num_queries, max(1, _HASH_CHUNK // columns))


def _hash_numpy(
    state: np.ndarray, index: np.ndarray, out: np.ndarray, *, flip: bool = False
) -> np.ndarray:
    """out (Q, M) uint32 ← fmix32(state[q] ⊕ index[m]), hashed in place chunk by chunk with
    numpy's uint32 kernels (SIMD; products wrap modulo 2³² by definition; about three times
    torch's int32 ones); `flip`: with the sign bit flipped, while each chunk is in cache.
    fmix32's first step x ← x ⊕ (x ≫ 16) distributes over the ⊕ of the two words, so it is
    applied to the Q + M words instead of the Q·M pairs."""
    state, index = (w ^ (w >> np.uint32(16)) for w in (state, index))  # (Q,), (M,)
    columns, rows = _chunk_shape(*out.shape)
    scratch = np.empty(rows * columns, np.uint32)
    for row in range(0, out.shape[0], rows):
        for column in range(0, out.shape[1], columns):
            x = out[row : row + rows, column : column + columns]  # (r, c), a view
            np.bitwise_xor(
                state[row : row + rows, None], index[None, column : column + columns], out=x
            )
            _fmix32_rest_numpy(x, scratch[: x.size].reshape(x.shape))
            if flip:
                np.bitwise_xor(x, np.uint32(2**31), out=x)
    return out


def _to_int32(x: Tensor) -> Tensor:
    """int64 values in [0, 2³²) as the int32 with the same 32 bits."""
    return (x - ((x >> 31) << 32)).to(torch.int32)


_FMIX_STEPS = ((16, 0x85EBCA6B), (13, 0xC2B2AE35), (16, None))  # `_fmix32`'s shifts, multipliers


def _fmix32_rest_numpy(x: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """`_fmix32` after its first xor-shift (already applied to x), of a uint32 array in place,
    with scratch (same shape)."""
    (_, first), *rest = _FMIX_STEPS
    x *= np.uint32(first)
    for shift, multiplier in rest:
        x ^= np.right_shift(x, shift, out=scratch)
        if multiplier is not None:
            x *= np.uint32(multiplier)
    return x


def _fmix32_(x: Tensor, scratch: Tensor) -> Tensor:
    """`_fmix32` of an int32 tensor holding 32-bit words, in place, with scratch (same shape):
    torch's int32 products wrap modulo 2³² (two's complement); its right shifts are arithmetic,
    so the sign bits they bring in are masked off."""
    for shift, multiplier in _FMIX_STEPS:
        torch.bitwise_right_shift(x, shift, out=scratch).bitwise_and_((1 << (32 - shift)) - 1)
        x.bitwise_xor_(scratch)
        if multiplier is None:
            return x
        x.mul_(multiplier - 2**32)  # the constant's 32 bits as an int32
    return x


# Queries whose keys `_each_kth` hashes and selects from at a time: their keys (about 1 MB at
# M = 60,000) stay in cache between hashing, selection and comparison, in buffers reused for
# every group, where a fresh (Q, M) table costs a page fault per 4 KB first touched.
_KEEP_CHUNK = 2**18


def random_keep(seed: int, positions: Tensor, num_memories: int, k: int) -> Tensor:
    """Mask (Q, M) of each query's k memories with the smallest hash (`random_subset`'s set,
    formed directly): the keys up to the row's k-th smallest, as they never tie."""
    mask = torch.empty(positions.shape[0], num_memories, dtype=torch.bool, device=positions.device)
    numpy = mask.device.type in NUMPY_DEVICES  # then `_each_kth`'s keys are numpy's
    target, less_equal = (mask.numpy(), np.less_equal) if numpy else (mask, torch.le)

    def write(rows: slice, keys, kth) -> None:
        less_equal(keys, kth, out=target[rows])

    _each_kth(seed, positions, num_memories, k, write)
    return mask


def random_bias(seed: int, positions: Tensor, num_memories: int, k: int, dtype) -> Tensor:
    """`random_keep` as an additive mask (Q, M) of `dtype`: 0 on the kept memories, −inf on the
    others. torch's fused attention adds such a mask to its scores; given a bool mask it first
    builds this one itself (`torch.where`, a further pass and allocation)."""
    if positions.device.type not in NUMPY_DEVICES:
        keep = random_keep(seed, positions, num_memories, k)  # (Q, M)
        return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(
            ~keep, -torch.inf
        )
    bias = host_buffers.empty((positions.shape[0], num_memories), dtype)  # (Q, M)
    words = bias.view(host_buffers.word_dtype(dtype)).numpy()  # written through its bits
    minus_inf = torch.full((1,), -torch.inf, dtype=dtype).view(host_buffers.word_dtype(dtype))

    def write(rows: slice, keys: np.ndarray, kth: np.ndarray) -> None:
        dropped = np.greater(keys, kth).view(np.int8)  # (R, M) 0 or 1
        np.multiply(dropped, minus_inf.numpy(), out=words[rows], casting="unsafe")

    _each_kth(seed, positions, num_memories, k, write)
    return bias


def _each_kth(seed: int, positions: Tensor, num_memories: int, k: int, write) -> None:
    """Calls write(rows, keys, kth) for groups of queries: rows a slice of the queries, keys
    (R, M) their hashes in hash order, kth (R, 1) each row's k-th smallest.

    On the CPU, keys are the hashes as uint32 numpy arrays, and the k-th smallest is found by
    numpy's introselect (SIMD; several times `torch.kthvalue` there); groups are shared among
    torch's threads (numpy releases the GIL), each with its own buffers. Elsewhere keys are
    `ordered_keys` and the k-th smallest is `torch.kthvalue`'s."""
    num_queries = positions.shape[0]
    rows = max(1, min(num_queries, _KEEP_CHUNK // num_memories))
    groups = [slice(start, start + rows) for start in range(0, num_queries, rows)]
    memory_index = torch.arange(num_memories, device=positions.device)  # (M,)
    if positions.device.type not in NUMPY_DEVICES:
        keys = torch.empty(rows, num_memories, dtype=torch.int32, device=positions.device)
        for group in groups:
            part = positions[group]  # (R,)
            these = ordered_keys(seed, part, memory_index, out=keys[: part.shape[0]])  # (R, M)
            write(group, these, torch.kthvalue(these, k, dim=1, keepdim=True).values)
        return
    state = _to_int32(_query_state(seed, positions)).numpy().view(np.uint32)  # (Q,)
    index = _to_int32(memory_index).numpy().view(np.uint32)  # (M,)
    workers = min(torch.get_num_threads(), len(groups))

    def run(first: int) -> None:
        keys, spare = (np.empty((rows, num_memories), np.uint32) for _ in range(2))
        for group in groups[first::workers]:
            part = state[group]  # (R,)
            these = _hash_numpy(part, index, keys[: part.shape[0]])  # (R, M)
            copy = spare[: these.shape[0]]
            np.copyto(copy, these)
            copy.partition(k - 1, axis=1)  # selection reorders its copy of the keys
            write(group, these, copy[:, k - 1 : k])

    if workers == 1:
        run(0)
        return
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(run, range(workers)))


def random_mask(seed: int, positions: Tensor, num_memories: int, k: int) -> Tensor:
    """Mask (Q, M) of the memories `random_choice` draws for each query: a uniformly random
    k-subset that is a pure function of (seed, position, M, k), whatever batch the query is in."""
    if not uses_floyd(num_memories, k):
        return random_keep(seed, positions, num_memories, k)
    chosen = floyd_subset(seed, positions, num_memories, k)  # (Q, k)
    mask = torch.zeros(positions.shape[0], num_memories, dtype=torch.bool, device=chosen.device)
    return mask.scatter_(-1, chosen, True)  # (Q, M)


# A query's subset is drawn by Floyd's algorithm (O(k²) work per query, no other memory index
# touched) while k ≤ FLOYD_MAX_K and k · FLOYD_RATIO ≤ M; otherwise by the k smallest of M hashes
# (O(M) per query, a few ns each), which is cheaper there: Floyd's k sequential steps cost a few
# small tensor operations each, and the masked path (k > M/8) reads every memory anyway.
FLOYD_MAX_K = 256
FLOYD_RATIO = 64


def uses_floyd(num_memories: int, k: int) -> bool:
    """Whether `random_choice` draws by Floyd's algorithm (else by the smallest hashes)."""
    return k <= FLOYD_MAX_K and k * FLOYD_RATIO <= num_memories


def random_choice(
    seed: int, positions: Tensor, num_memories: int, k: int, *, block_rows: int
) -> Tensor:
    """The k memories a query at each position keeps, (Q, k) ascending: `floyd_subset` where
    `uses_floyd`, else the k smallest hashes h(seed, position, index) (`random_subset`). Both
    draw every k-subset with equal probability."""
    if uses_floyd(num_memories, k):
        return floyd_subset(seed, positions, num_memories, k)
    return random_subset(seed, positions, num_memories, k, block_rows=block_rows)


def _query_state(seed: int, positions):
    """The per-query hash state (Q,) from the seed's and the position's 32-bit words; of a
    Python int position, a Python int."""
    state = _fmix32((seed & _MASK32) ^ 0x6A09E667)
    state = _fmix32(state ^ ((seed >> 32) & _MASK32))
    if isinstance(positions, Tensor):
        positions = positions.to(torch.int64)
    state = _fmix32(state ^ (positions & _MASK32))  # (Q,)
    return _fmix32(state ^ ((positions >> 32) & _MASK32))  # (Q,)


def floyd_subset(seed: int, positions: Tensor, num_memories: int, k: int) -> Tensor:
    """k distinct memories per query, (Q, k) ascending, by Floyd's sampling algorithm:

        for j = M − k … M − 1:  t ← uniform in [0, j];  keep j if t is kept already, else t

    which gives every k-subset of [0, M) probability 1 / C(M, k) (Floyd, CACM 1987). The uniform
    t comes from a 62-bit hash of (query state, j) reduced mod j + 1 (bias ≤ j / 2⁶², nil in
    practice), so the draw is a pure function of (seed, position, M, k). Work O(k²) per query:
    each step compares t with the k kept so far; no other memory index is touched.
    """
    state = _query_state(seed, positions)[:, None]  # (Q, 1)
    steps = torch.arange(num_memories - k, num_memories, device=positions.device)  # (k,) j
    # Every draw depends on (state, j) alone, so all k are hashed at once; only the choice
    # between t and j is sequential.
    draws = floyd_draws(state, steps)  # (Q, k), column j in [0, j]
    chosen = draws.clone()  # (Q, k)
    for step in range(1, k):
        taken = (chosen[:, :step] == draws[:, step : step + 1]).any(dim=1)  # (Q,)
        chosen[:, step] = torch.where(taken, steps[step], draws[:, step])
    return torch.sort(chosen, dim=1).values  # (Q, k)


def floyd_draws(state, step):
    """Floyd's uniform t in [0, j] for query state(s) and step(s) j, Python ints or int64
    tensors alike: a 62-bit hash of (state, j) reduced mod j + 1."""
    high = _fmix32(_fmix32(state ^ (step & _MASK32)) ^ ((step >> 32) & _MASK32) ^ 0x3C6EF372)
    low = _fmix32(high ^ 0xBB67AE85)
    return ((high >> 1) << 31 | (low >> 1)) % (step + 1)


def random_subset(
    seed: int, positions: Tensor, num_memories: int, k: int, *, block_rows: int
) -> Tensor:
    """The k memories with the smallest hash per query, as indices (Q, k) ascending, blockwise.

    Hashes are computed for `block_rows` memory indices at a time; each block's k smallest are
    merged with the k kept so far. No keys are read and no (Q, M) tensor is formed. A query's
    hashes never tie, so the k smallest are one well-defined set, the same as one-shot.
    """
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
    """The memories each query's window covers, as index (Q, c) and valid (Q, c), c =
    min(2w + 1, M): row p holds max(0, p − w) onward, valid up to min(M − 1, p + w). Invalid
    entries are clamped into range so they can be read, and must be given weight 0."""
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
