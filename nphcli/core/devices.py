"""Which device and dtype a command computes on, checked up front, and honest device timing.

`--device` is `cpu`, `cuda`, `cuda:N`, `mps` or `auto` (CUDA if present, else MPS, else CPU).
A device that is named but not present is an error, never a silent fallback to the CPU: a
script that asked for a GPU and got the CPU would report wrong timings without knowing it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from nphcli.core.dtypes import torch_dtype
from nphcli.core.errors import NphError

DEVICE_CHOICES = "cpu, cuda, cuda:N, mps, auto"
_DEVICE_PATTERN = re.compile(r"^(cpu|mps|auto|cuda(?::(\d+))?)$")


def unpinned_cuda(name: str) -> bool:
    """Whether a `--device` string computes on CUDA without naming a GPU: `cuda`, or `auto`
    with CUDA present (what `resolve_device` gives it). Each process may then take its own GPU;
    `cuda:N` pins every process to GPU N."""
    match = _DEVICE_PATTERN.match(name.strip().lower())
    unnamed = match is not None and match.group(1) in ("cuda", "auto")
    return unnamed and torch.cuda.is_available()


def resolve_device(name: str) -> torch.device:
    """The torch device for a `--device` string; NphError if it is unknown or not present."""
    text = name.strip().lower()
    match = _DEVICE_PATTERN.match(text)
    if match is None:
        raise NphError(f"unknown device {name!r}; choose one of: {DEVICE_CHOICES}")
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "mps" if _mps_available() else "cpu"
    if text == "cpu":
        return torch.device("cpu")
    if text == "mps":
        if not _mps_available():
            raise NphError(
                "--device mps: Apple's Metal (MPS) backend is not available on this machine; "
                "use --device cpu, or --device auto to take the best device present"
            )
        return torch.device("mps")
    if not torch.cuda.is_available():
        raise NphError(
            f"--device {name}: no CUDA device is available (torch {torch.__version__}, "
            f"CUDA build {torch.version.cuda or 'none'}); use --device cpu, or --device auto to "
            "take the best device present"
        )
    count = torch.cuda.device_count()
    index = int(match.group(2)) if match.group(2) is not None else torch.cuda.current_device()
    if index >= count:
        raise NphError(
            f"--device {name}: this machine has {count} CUDA device(s), numbered 0…{count - 1}"
        )
    return torch.device("cuda", index)


def resolve_dtype(name: str, device: torch.device | None = None) -> torch.dtype:
    """The torch dtype for a `--dtype` string; NphError if unknown or unusable on `device`."""
    dtype = torch_dtype(name)
    if device is not None:
        try:  # some backends (e.g. older MPS) lack bfloat16 or float64
            torch.zeros(2, dtype=dtype, device=device).sum()
        except (RuntimeError, TypeError) as error:
            raise NphError(f"--dtype {name} is not supported on {device}: {error}") from None
    return dtype


def synchronize(device: torch.device) -> None:
    """Wait until all work queued on `device` is done, so a timer read next measures it all
    (GPU kernels run asynchronously: a timer would stop when work is queued, not done)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@contextmanager
def tf32_matmuls(enabled: bool) -> Iterator[None]:
    """float32 matrix products on TensorFloat-32 tensor cores (CUDA, Ampere and later) while
    inside, when `enabled`; the previous setting is restored after.

    TF32 keeps float32's range but rounds the inputs of each product to 10 mantissa bits
    (relative error about 1e-3 instead of 1e-6), for several times the speed. Off by default:
    it changes results. No effect on other devices.
    """
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    previous = (matmul.allow_tf32, cudnn.allow_tf32)
    matmul.allow_tf32 = cudnn.allow_tf32 = bool(enabled)
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = previous


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def canonical_device(device: torch.device | str) -> torch.device:
    """`device` with its index filled in: "cuda" means the current CUDA device, so a tensor made
    on "cuda" (which reports "cuda:0") and a bank placed on "cuda" compare equal."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def same_device(a: torch.device | str, b: torch.device | str) -> bool:
    """Whether two devices are the same hardware (see `canonical_device`)."""
    return canonical_device(a) == canonical_device(b)
