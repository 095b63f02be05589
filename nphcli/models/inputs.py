"""The checks of what `Retriever.retrieve` is given (one `NphError` when they cannot fit
together) and of its result, whose values are checked inside the one sync it already makes.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

import torch
from torch import Tensor

from nphcli.core.defaults import DEFAULT_MEMORY_BUDGET
from nphcli.core.devices import same_device
from nphcli.core.dtypes import COMPUTE_DTYPES
from nphcli.core.errors import NphError, score_overflow
from nphcli.engine.precision import accumulation_dtype
from nphcli.memory.bank import MemoryBank
from nphcli.memory.format import FLOAT_DTYPES
from nphcli.memory.given import as_table
from nphcli.memory.open import as_memory

_NAMES = ", ".join(COMPUTE_DTYPES)


def check_whole(value: Any, flag: str, low: int, high: int | None = None) -> None:
    """Reject anything but a whole number in [low, high) (bool is not a number here)."""
    whole = isinstance(value, int) and not isinstance(value, bool)
    if whole and value >= low and (high is None or value < high):
        return
    if high is None:
        raise NphError(f"{flag} must be a whole number ≥ {low}, got {value!r}")
    shown = f"2^{high.bit_length() - 1}" if high >= 2**32 and high & (high - 1) == 0 else high
    raise NphError(f"{flag} must be a whole number in [{low}, {shown}), got {value!r}")


def is_real(value: Any) -> bool:
    """Whether `value` is a finite real number (not a bool, string or tensor)."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def check_budget(budget: int | None) -> int:
    if budget is None:
        return DEFAULT_MEMORY_BUDGET
    check_whole(budget, "--memory-budget (bytes)", 1)
    return budget


def check_float(dtype: torch.dtype, label: str) -> None:
    """Refuse a dtype models do not compute in (integers, bool, complex), saying how to cast."""
    if dtype not in FLOAT_DTYPES:
        raise NphError(
            f"{label} must be floating point ({_NAMES}), got {str(dtype).removeprefix('torch.')};"
            " convert them, e.g. with .float()"
        )


def check_inputs(queries: Any, memory: Any, values: Any) -> tuple[Tensor, MemoryBank]:
    """Queries (Q, d) and the memory as a bank, once they are known to fit together."""
    queries = as_table(queries, "queries")
    bank = as_memory(memory, values)
    check_float(queries.dtype, "queries")
    check_float(bank.dtype, "memories")
    resident = bank.resident() if bank.hetero else None  # values given as a tensor
    if resident is not None:
        check_float(resident[1].dtype, "values")
    if bank.num_memories == 0:
        raise NphError("the memory holds no patterns (M = 0)")
    if bank.dim == 0:
        raise NphError("the patterns have no entries (d = 0); give memories and queries (·, d ≥ 1)")
    if queries.shape[1] != bank.dim:
        raise NphError(f"queries have dimension {queries.shape[1]} but memories have {bank.dim}")
    if resident is not None:
        if resident[1].shape[0] != bank.num_memories:
            raise NphError(
                f"{resident[1].shape[0]} values for {bank.num_memories} memories; counts must match"
            )
        if not same_device(resident[1].device, bank.device):
            raise NphError(_devices("values", resident[1].device, bank.device))
    if not same_device(queries.device, bank.device):
        raise NphError(_devices("queries", queries.device, bank.device))
    return queries, bank


def _devices(label: str, device: torch.device, memory: torch.device) -> str:
    return (
        f"{label} are on {device} but the memories on {memory}; move them to one device "
        "(e.g. .to(memories.device))"
    )


def check_output(patterns: Tensor, inputs=()) -> None:
    """Refuse a NaN or infinite result: the first non-finite input named, else an overflow of
    the accumulation dtype. One sum decides almost always (11 µs against 144 for isfinite)."""
    quick = patterns.sum()
    for _, tensor in inputs[:1]:  # a NaN query may give a finite answer: checked as well
        quick = quick + tensor.sum()  # in the same sync
    if bool(torch.isfinite(quick)):
        return
    finite = (patterns * 0 == 0).all()  # x·0 is NaN for ±inf and NaN: isfinite in 2 ops
    for _, tensor in inputs[:1]:
        finite = finite & (tensor * 0 == 0).all()
    if not bool(finite):
        _name_non_finite(inputs)  # checked only now: finite inputs pay no extra pass or sync
        raise score_overflow(accumulation_dtype(patterns.dtype))


def _name_non_finite(inputs) -> None:
    """NphError naming the first input row that holds NaN or infinity (not an overflow)."""
    for label, given in inputs:
        if isinstance(given, MemoryBank):  # keys, then values, block by block (error path)
            parts = [(label, start, keys) for start, keys in given.key_blocks(1 << 16)]
            if given.hetero:
                parts += [("values", start, v) for start, _, v in given.blocks(1 << 16)]
        else:
            parts = [(label, 0, given)] if isinstance(given, Tensor) else []
        for name, start, tensor in parts:
            bad = ~torch.isfinite(tensor)
            if bool(bad.any()):
                row = int(bad.any(dim=1).nonzero()[0, 0])
                kind = "NaN" if bool(tensor[row].isnan().any()) else "an infinite value"
                raise NphError(
                    f"{name} row {start + row} holds {kind}: every input must be finite; drop or "
                    "repair that row"
                )
