"""The counter-based hash of the random masks: h(seed, position, memory index) in 32-bit words.

MurmurHash3's 32-bit finaliser (`fmix32`) folded over the words, so a query's random subset
(`masks`) is the same on every device and in every batch. The (Q, M) keys are hashed with numpy
in cache-sized chunks on `NUMPY_DEVICES`, elsewhere with torch over the whole batch.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF


def _mul32(x, c: int):
    """x·c mod 2³² in 16-bit halves: no int64 product overflows."""
    low = (x & 0xFFFF) * c
    high = (((x >> 16) * c) & 0xFFFF) << 16
    return (low + high) & MASK32


def fmix32(x):
    """MurmurHash3's 32-bit finaliser, a bijection of [0, 2³²); ints or int64 tensors."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


_FMIX_STEPS = ((16, 0x85EBCA6B), (13, 0xC2B2AE35), (16, None))  # `fmix32`'s shifts, multipliers

_HASH_CHUNK = 2**17  # entries hashed at a time on the CPU: every pass stays in cache
_SIGN = -(2**31)  # int32 with only the sign bit set

# Devices hashed with numpy (tests empty it to run the GPU's route on the CPU).
NUMPY_DEVICES = ("cpu",)


def query_state(seed: int, positions):
    """The per-query hash state (Q,) from the seed's and the position's 32-bit words."""
    state = fmix32((seed & MASK32) ^ 0x6A09E667)
    state = fmix32(state ^ ((seed >> 32) & MASK32))
    if isinstance(positions, Tensor):
        positions = positions.to(torch.int64)
    state = fmix32(state ^ (positions & MASK32))  # (Q,)
    return fmix32(state ^ ((positions >> 32) & MASK32))  # (Q,)


def random_keys(seed: int, positions: Tensor, memory_indices: Tensor) -> Tensor:
    """h(seed, position, memory index) as int64 in [0, 2³²) (Q, M), h ← fmix32(h ⊕ word) over
    the words: a bijection of the memory index, so one query's memories never tie."""
    return ordered_keys(seed, positions, memory_indices).to(torch.int64) - _SIGN


def ordered_keys(seed: int, positions: Tensor, memory_indices: Tensor) -> Tensor:
    """`random_keys` − 2³¹ as int32 (Q, M): the same order in half the bytes."""
    state = mixed_words(query_state(seed, positions))  # (Q,)
    memory_indices = mixed_words(memory_indices.to(device=positions.device, dtype=torch.int64))
    shape = (state.shape[0], memory_indices.shape[0])
    out = torch.empty(shape, dtype=torch.int32, device=positions.device)  # (Q, M)
    if out.device.type in NUMPY_DEVICES:
        state, memory_indices = (w.numpy().view(np.uint32) for w in (state, memory_indices))
        hash_numpy(state, memory_indices, out.numpy().view(np.uint32), flip=True)
        return out
    torch.bitwise_xor(state[:, None], memory_indices[None, :], out=out)  # (Q, M)
    return _fmix32_(out, torch.empty_like(out), mixed=True).bitwise_xor_(_SIGN)


def mixed_words(words: Tensor) -> Tensor:
    """fmix32's first step x ⊕ (x ≫ 16) as int32: it distributes over ⊕, so it runs on the
    Q + M words, not the Q·M pairs."""
    return to_int32(words ^ (words >> 16))


def _chunk_shape(num_queries: int, num_memories: int) -> tuple[int, int]:
    """Columns and rows of a hash chunk of about `_HASH_CHUNK` entries."""
    columns = min(num_memories, max(256, _HASH_CHUNK // max(1, num_queries)))
    return columns, min(num_queries, max(1, _HASH_CHUNK // columns))


def hash_numpy(
    state: np.ndarray,
    index: np.ndarray,
    out: np.ndarray,
    *,
    flip: bool = False,
    copy: np.ndarray | None = None,
) -> np.ndarray:
    """out (Q, M) uint32 ← fmix32(state[q] ⊕ index[m]) chunk by chunk (`flip`: the sign bit
    flipped; `copy` receives them too, while in cache)."""
    columns, rows = _chunk_shape(*out.shape)
    scratch = np.empty(rows * columns, np.uint32)
    for row in range(0, out.shape[0], rows):
        for column in range(0, out.shape[1], columns):
            part = (slice(row, row + rows), slice(column, column + columns))
            x = out[part]  # (r, c), a view
            np.bitwise_xor(state[part[0], None], index[None, part[1]], out=x)
            _fmix32_rest_numpy(x, scratch[: x.size].reshape(x.shape))
            if flip:
                np.bitwise_xor(x, np.uint32(2**31), out=x)
            if copy is not None:
                np.copyto(copy[part], x)
    return out


def to_int32(x: Tensor) -> Tensor:
    """int64 values in [0, 2³²) as the int32 with the same 32 bits."""
    return (x - ((x >> 31) << 32)).to(torch.int32)


def _fmix32_rest_numpy(x: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """`fmix32` after its first xor-shift, of a uint32 array in place."""
    (_, first), *rest = _FMIX_STEPS
    x *= np.uint32(first)
    for shift, multiplier in rest:
        x ^= np.right_shift(x, shift, out=scratch)
        if multiplier is not None:
            x *= np.uint32(multiplier)
    return x


def _fmix32_(x: Tensor, scratch: Tensor, *, mixed: bool = False) -> Tensor:
    """`fmix32` of int32 words in place (`mixed`: first step done); the arithmetic shifts'
    sign bits are masked off."""
    for step, (shift, multiplier) in enumerate(_FMIX_STEPS):
        if step or not mixed:
            torch.bitwise_right_shift(x, shift, out=scratch).bitwise_and_((1 << (32 - shift)) - 1)
            x.bitwise_xor_(scratch)
        if multiplier is None:
            return x
        x.mul_(multiplier - 2**32)  # the constant's 32 bits as an int32
    return x
