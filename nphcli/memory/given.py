"""What the Python API accepts as patterns (queries, memories, values), turned into tensors by
one rule (docs/python-api.md, "What the functions accept"): a tensor as it is, a numpy array
shared (`torch.from_numpy`, its dtype kept), a list or tuple of numbers as float32 on the CPU;
anything else, a ragged list and a meta-device tensor are one `NphError`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from nphcli.core.errors import NphError

ACCEPTED = "a torch tensor, a numpy array or a list of rows"


def as_patterns(value: Any, label: str) -> Tensor:
    """`value` (see the module docstring) as a tensor; `label` names it in errors."""
    if isinstance(value, Tensor):
        tensor = value
    elif isinstance(value, np.ndarray):
        try:
            tensor = torch.from_numpy(value)
        except TypeError:  # object or string arrays
            raise NphError(
                f"{label}: a numpy array of {value.dtype} is not numbers; give float32 or float64"
            ) from None
    elif isinstance(value, (list, tuple)):
        try:
            tensor = torch.tensor(value, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError) as error:
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise NphError(
                f"{label}: the list is not a table of numbers with rows of one length ({first})"
            ) from None
    else:
        raise NphError(f"{label} must be {ACCEPTED}, got {type(value).__name__}")
    if tensor.is_meta:
        raise NphError(
            f"{label} are a meta-device tensor, which holds no values; give a tensor with data "
            "(on the CPU or a GPU)"
        )
    return tensor


def as_table(value: Any, label: str) -> Tensor:
    """`as_patterns`, refused unless it is a 2-D (rows, dim) table."""
    tensor = as_patterns(value, label)
    if tensor.ndim != 2:
        raise NphError(f"{label} must be a 2-D (rows, dim) table, got shape {tuple(tensor.shape)}")
    return tensor
