"""Half precision: half inputs, float32 products, everything else in float32.

For half memories and queries the products X·Kᵀ and P·V return float32, never rounded to the
half dtype: cuBLAS's float32 accumulator on CUDA, operands widened exactly to float32 elsewhere
(a rounded bfloat16 score near 30 moves by 0.06, which β = 3000 makes 180 in the exponent and
a wrong pattern; the planners count the copy, `widened_row_bytes`). Weights, running sums and
each step's output are float32; `retrieve` casts the result back. float32 and float64 inputs
are untouched.

β never touches a half tensor (`scale_queries`, `matmul(..., scale=β)`), and a rounded half
product that leaves the half range is redone in float32: a score overflows only where float32
does.
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
    """Bytes per memory row of the float32 copy `matmul` makes of half blocks off CUDA."""
    if bank.dtype not in HALF_DTYPES or bank.device.type in FLOAT32_OUT_DEVICES:
        return 0
    return (bank.dim + bank.value_dim) * 4  # float32 bytes


def scale_queries(queries: Tensor, beta: float) -> tuple[Tensor, float]:
    """(x', s) with β⟨x, k⟩ = `matmul(x', kᵀ, scale=s)`: (β·x, 1), or (x, β) for half x."""
    if queries.dtype in HALF_DTYPES:
        return queries, beta
    return beta * queries, 1.0


def matmul(a: Tensor, b: Tensor, *, scale: float = 1.0) -> Tensor:
    """a @ b, times `scale`; float32 when either operand is half (see the module docstring)."""
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
    """Whether torch's mm/bmm with out_dtype=float32 takes these half operands."""
    return (
        a.is_cuda
        and not _FLOAT32_OUT["failed"]
        and a.ndim == b.ndim
        and a.ndim in (2, 3)
        and a.shape[:-2] == b.shape[:-2]
        and not (a.requires_grad or b.requires_grad)
    )
