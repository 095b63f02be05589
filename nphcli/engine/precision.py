"""Half precision: matrix products in the inputs' half dtype, everything else in float32.

For bfloat16 / float16 memories and queries, the products X·Kᵀ and P·V run in the half dtype
(tensor cores on a GPU) with float32 accumulation inside the kernel: on CUDA that float32 sum is
the result; elsewhere torch rounds it to the half dtype and it is cast back. Score normalisation
(softmax, sparsemax, entmax, top-k weights), running sums and outputs of each step are float32;
`retrieve` casts the final patterns back to the half dtype. float32 and float64 inputs are
computed as they are, untouched.

Two rules keep half precision from overflowing where float32 would not (float16 holds only up
to 65504; scores β⟨x, ξ⟩ at β = 3000 of 32-dimensional unit-variance patterns reach 10⁵):
- β never touches a half tensor: `scale_queries` leaves half queries as they are and β
  multiplies the product's float32 result (`matmul(..., scale=β)`);
- a half product whose rounded result leaves the half dtype's range is computed again in
  float32 (on CUDA the float32 accumulator is the result, so nothing is rounded).
So a score overflows only where float32 overflows, and the errors name float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nphcli.core import dtypes
from nphcli.core.dtypes import torch_dtype

HALF_DTYPES = tuple(torch_dtype(name) for name in dtypes.HALF_DTYPES)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype scores and running sums are kept in: float32 for half inputs, else `dtype`."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


def scale_queries(queries: Tensor, beta: float) -> tuple[Tensor, float]:
    """β split between the queries and their products' results: scores β⟨x, k⟩ are
    `matmul(x', kᵀ, scale=s)` for (x', s) returned here. float32 / float64: (β·x, 1), scaling
    Q·d entries once instead of Q·M scores. Half: (x, β), since β·x, or its product with the
    keys, may overflow the half dtype where the float32 scores do not."""
    if queries.dtype in HALF_DTYPES:
        return queries, beta
    return beta * queries, 1.0


def matmul(a: Tensor, b: Tensor, *, scale: float = 1.0) -> Tensor:
    """a @ b, times `scale`; when either operand is half, both are taken in that half dtype (a
    float32 weight matrix is rounded to it) and the product and its scaling are float32.

    A half result beyond the half dtype's range (infinite) is redone in float32, so the product
    overflows only where float32 does; a float16 score product at large norms, or P·V over a
    block whose unnormalised weights sum past 65504 / max|v|, takes that path."""
    low = b.dtype if b.dtype in HALF_DTYPES else a.dtype
    if low not in HALF_DTYPES:
        product = a @ b
        return product if scale == 1 else scale * product
    half_a, half_b = a.to(low), b.to(low)
    if _float32_out(half_a, half_b):  # cuBLAS writes its float32 accumulator: no rounding
        mm = torch.mm if half_a.ndim == 2 else torch.bmm
        try:
            product = mm(half_a, half_b, out_dtype=torch.float32)
            return product if scale == 1 else product.mul_(scale)
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, TypeError):  # a torch or GPU without it: round and cast instead
            _FLOAT32_OUT["failed"] = True
    product = (half_a @ half_b).to(torch.float32)
    if bool(torch.isinf(product).any()):  # beyond the half range, maybe not float32's
        product = a.to(torch.float32) @ b.to(torch.float32)
    return product if scale == 1 else product.mul_(scale)


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
