"""Half precision: matrix products in the inputs' half dtype, everything else in float32.

For bfloat16 / float16 memories and queries, the products X·Kᵀ and P·V run in the half dtype
(tensor cores on a GPU; torch accumulates half products in float32 inside the kernel and rounds
the result to the half dtype), while score normalisation (softmax, sparsemax, entmax, top-k
weights), running sums and outputs of each step are float32; `retrieve` casts the final patterns
back to the half dtype. float32 and float64 inputs are computed as they are, untouched.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nphcli import dtypes
from nphcli.dtypes import torch_dtype

HALF_DTYPES = tuple(torch_dtype(name) for name in dtypes.HALF_DTYPES)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype scores and running sums are kept in: float32 for half inputs, else `dtype`."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b; when either operand is half, both are taken in that half dtype (a float32 weight
    matrix is rounded to it) and the product is returned in float32."""
    low = b.dtype if b.dtype in HALF_DTYPES else a.dtype
    if low in HALF_DTYPES:
        return (a.to(low) @ b.to(low)).to(torch.float32)
    return a @ b
