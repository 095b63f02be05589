"""Large uninitialised CPU buffers backed by huge pages.

A fresh tensor from torch's CPU allocator takes a page fault for every 4 KB first written: for
the (1000, 60,000) float32 scores of one entmax batch (240 MB) about 0.17 s of a 0.75 s matrix
product on 2 cores. numpy asks Linux for transparent huge pages (`madvise`) on large arrays, a
fault per 2 MB, so large buffers are taken from it and shared with torch without a copy.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from nphcli.engine.planning import itemsize

# Below this many bytes a buffer comes from torch's allocator (reused blocks, no faults to save).
HUGE_PAGE_MIN_BYTES = 2**22

_WORDS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def word_dtype(dtype: torch.dtype) -> torch.dtype:
    """The integer dtype of `dtype`'s size: a float's bits as a word (numpy has no bfloat16, and
    a buffer, or a mask written bit by bit, needs only the bits)."""
    return _WORDS[itemsize(dtype)]


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> Tensor:
    """`torch.empty(shape, dtype, device)`; on the CPU, a large one is numpy's (huge pages)."""
    device = torch.device(device)
    if device.type != "cpu" or math.prod(shape) * itemsize(dtype) < HUGE_PAGE_MIN_BYTES:
        return torch.empty(shape, dtype=dtype, device=device)
    words = torch.empty(0, dtype=word_dtype(dtype)).numpy().dtype  # numpy's integer of that size
    return torch.from_numpy(np.empty(shape, words)).view(dtype)
