"""Half precision: matrix products in the inputs' half dtype, everything else in float32.

For bfloat16 / float16 memories and queries, the products X·Kᵀ and P·V run in the half dtype
(tensor cores on a GPU) with float32 accumulation inside the kernel: on CUDA that float32 sum is
the result; elsewhere torch rounds it to the half dtype and it is cast back. Score normalisation
(softmax, sparsemax, entmax, top-k weights), running sums and outputs of each step are float32;
`retrieve` casts the final patterns back to the half dtype. float32 and float64 inputs are
computed as they are, untouched.
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
    if low not in HALF_DTYPES:
        return a @ b
    a, b = a.to(low), b.to(low)
    if _float32_out(a, b):  # cuBLAS writes its float32 accumulator: no rounding, no cast pass
        product = torch.mm if a.ndim == 2 else torch.bmm
        try:
            return product(a, b, out_dtype=torch.float32)
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, TypeError):  # a torch or GPU without it: round and cast instead
            _FLOAT32_OUT["failed"] = True
    return (a @ b).to(torch.float32)


_FLOAT32_OUT = {"failed": False}


def _float32_out(a: Tensor, b: Tensor) -> bool:
    """Whether torch's mm/bmm with out_dtype=float32 takes these half operands: CUDA only (the
    CPU has no such kernel), and no broadcasting, which those ops do not do."""
    return (
        a.is_cuda
        and not _FLOAT32_OUT["failed"]
        and a.ndim == b.ndim
        and a.ndim in (2, 3)
        and a.shape[:-2] == b.shape[:-2]
        and not (a.requires_grad or b.requires_grad)
    )
