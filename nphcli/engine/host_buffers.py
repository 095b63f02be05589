"""Large uninitialised CPU buffers backed by huge pages.

A fresh tensor from torch's CPU allocator takes a page fault for every 4 KB first written: for
the (1000, 60,000) float32 scores of one entmax batch (240 MB) about 0.17 s of a 0.75 s matrix
product on 2 cores. numpy asks Linux for transparent huge pages (`madvise`) on large arrays, a
fault per 2 MB, so large buffers are taken from it and shared with torch without a copy.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

# Below this many bytes a buffer comes from torch's allocator (reused blocks, no faults to save).
HUGE_PAGE_MIN_BYTES = 2**22

# A float's bits as a numpy integer of its size: numpy has no bfloat16, and the bits are all
# a buffer needs.
_WORDS = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> Tensor:
    """`torch.empty(shape, dtype, device)`; on the CPU, a large one is numpy's (huge pages)."""
    device = torch.device(device)
    item = torch.empty((), dtype=dtype).element_size()
    count = 1
    for size in shape:
        count *= size
    if device.type != "cpu" or count * item < HUGE_PAGE_MIN_BYTES or item not in _WORDS:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.from_numpy(np.empty(shape, _WORDS[item])).view(dtype)
