"""The float dtypes nph computes and stores in: one table, one parser.

Names are what users type (`--dtype bfloat16`, a JSON job's `"dtype"`, a sweep file's `dtype`;
memory files record safetensors codes: `memory.reader.DTYPES`). Torch-free at import, so the
command line can check a name before torch loads; `torch_dtype` imports torch when it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nphcli.core.errors import NphError

if TYPE_CHECKING:
    import torch

# What retrieval runs in, in the order help texts list them.
COMPUTE_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "float64")
STORE_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")  # what `nph store` writes
HALF_DTYPES: tuple[str, ...] = ("float16", "bfloat16")  # products accumulate in float32


def check_dtype(
    name: str, *, allowed: tuple[str, ...] = COMPUTE_DTYPES, flag: str = "--dtype"
) -> str:
    """The canonical name of dtype `name` (case and spaces ignored); NphError naming the
    choices when it is not one of `allowed`."""
    text = name.strip().lower() if isinstance(name, str) else name
    if text not in allowed:
        raise NphError(f"unknown dtype {name!r} for {flag}; choose one of: {', '.join(allowed)}")
    return text


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a dtype name (checked with `check_dtype`)."""
    import torch

    return getattr(torch, check_dtype(name))


def dtype_name(dtype: torch.dtype) -> str:
    """The name of a float torch dtype, e.g. torch.bfloat16 → 'bfloat16'."""
    name = str(dtype).removeprefix("torch.")
    if name not in COMPUTE_DTYPES:
        raise NphError(f"nph computes in {', '.join(COMPUTE_DTYPES)}, not {name}")
    return name
