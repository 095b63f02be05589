"""Large uninitialised CPU buffers backed by huge pages.

torch's CPU allocator faults every 4 KB first written (0.17 s of a 0.75 s product for 240 MB of
scores); numpy asks for transparent huge pages, a fault per 2 MB, and shares its arrays.
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
    """The integer dtype of `dtype`'s size (numpy has no bfloat16; a buffer needs only bits)."""
    return _WORDS[itemsize(dtype)]


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> Tensor:
    """`torch.empty(shape, dtype, device)`; on the CPU, a large one is numpy's (huge pages)."""
    device = torch.device(device)
    if device.type != "cpu" or math.prod(shape) * itemsize(dtype) < HUGE_PAGE_MIN_BYTES:
        return torch.empty(shape, dtype=dtype, device=device)
    words = torch.empty(0, dtype=word_dtype(dtype)).numpy().dtype  # numpy's integer of that size
    return torch.from_numpy(np.empty(shape, words)).view(dtype)
