"""Half precision: half inputs, float32 products, everything else in float32.

For bfloat16 / float16 memories and queries, the products X·Kᵀ and P·V accumulate in float32
and return float32, never rounded to the half dtype: on CUDA the operands stay half (tensor
cores) and cuBLAS's float32 accumulator is the result; elsewhere (the CPU has no such kernel)
each half operand is widened to float32, exactly, and multiplied in float32. Only a CUDA torch
without the float32-output kernel rounds the half product and casts it back. Score
normalisation (softmax, sparsemax, entmax, top-k weights), running sums and each step's output
are float32; `retrieve` casts the final patterns back to the half dtype. float32 and float64
inputs are computed as they are, untouched.

Why the CPU widens rather than rounds: a score near 30 rounded to bfloat16 moves by up to 0.06,
which β = 3000 turns into 180 in the exponent, so of two nearly tied memories the rounded
scores could pick the other (sparse, entmax and topk returned the wrong pattern, multihead
with values was off by 0.13; issue 34). The price is a float32 copy of each half block, which
the planners count (`widened_row_bytes`); `benchmarks/half_cpu_products.py` measures the time.

Two rules keep half precision from overflowing where float32 would not (float16 holds only up
to 65504; scores β⟨x, ξ⟩ at β = 3000 of 32-dimensional unit-variance patterns reach 10⁵):
- β never touches a half tensor: `scale_queries` leaves half queries as they are and β
  multiplies the product's float32 result (`matmul(..., scale=β)`);
- where a half product is rounded (the fallback above) and leaves the half range, it is
  computed again in float32.
So a score overflows only where float32 overflows, and the errors name float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nphcli.core import dtypes
from nphcli.core.dtypes import torch_dtype
from nphcli.memory.bank import MemoryBank

HALF_DTYPES = tuple(torch_dtype(name) for name in dtypes.HALF_DTYPES)

# Devices whose half products can write a float32 result themselves (cuBLAS's out_dtype);
# elsewhere `matmul` widens the half operands to float32 first.
FLOAT32_OUT_DEVICES = ("cuda",)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype scores and running sums are kept in: float32 for half inputs, else `dtype`."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


def widened_row_bytes(bank: MemoryBank) -> int:
    """Bytes per memory row of the float32 copy `matmul` makes of a half block's keys and
    values off CUDA, (d + d_v) · 4, which the planners add to a block's working set; 0 for
    float32 / float64 banks and on CUDA (half operands go to the kernel as they are)."""
    if bank.dtype not in HALF_DTYPES or bank.device.type in FLOAT32_OUT_DEVICES:
        return 0
    return (bank.dim + bank.value_dim) * 4  # float32 bytes


def scale_queries(queries: Tensor, beta: float) -> tuple[Tensor, float]:
    """β split between the queries and their products' results: scores β⟨x, k⟩ are
    `matmul(x', kᵀ, scale=s)` for (x', s) returned here. float32 / float64: (β·x, 1), scaling
    Q·d entries once instead of Q·M scores. Half: (x, β), since β·x, or its product with the
    keys, may overflow the half dtype where the float32 scores do not."""
    if queries.dtype in HALF_DTYPES:
        return queries, beta
    return beta * queries, 1.0


def matmul(a: Tensor, b: Tensor, *, scale: float = 1.0) -> Tensor:
    """a @ b, times `scale`; when either operand is half, the product is float32: the sum of
    the half operands' exact products, accumulated in float32 (a float32 operand is first
    rounded to the half dtype on CUDA, where both must be half; the CPU keeps it float32).

    Only where a CUDA torch lacks float32 output is the half product rounded; a rounded result
    beyond the half dtype's range (infinite) is then redone in float32, so the product
    overflows only where float32 does."""
    low = b.dtype if b.dtype in HALF_DTYPES else a.dtype
    if low not in HALF_DTYPES:
        product = a @ b
        return product if scale == 1 else scale * product
    if a.device.type not in FLOAT32_OUT_DEVICES:  # no float32-output kernel: widen, exactly
        product = a.to(torch.float32) @ b.to(torch.float32)
        return product if scale == 1 else product.mul_(scale)
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
