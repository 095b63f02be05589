"""Sizes checked before allocating: a request that cannot fit in this machine's memory fails at
once with one message saying what to reduce, instead of an allocator error (or swapping)."""

from __future__ import annotations

import contextlib
import math
import os

from nphcli.core.errors import NphError


def physical_memory() -> int | None:
    """Bytes of RAM of this machine, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def human_bytes(count: float) -> str:
    """1536 → '1.5 KiB' (1024-based, as --memory-budget reads sizes)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} PiB"


def check_allocation(shape: tuple[int, ...], itemsize: int, *, what: str, reduce: str) -> int:
    """The bytes of a tensor of `shape` with `itemsize`-byte entries; NphError if that exceeds
    the machine's RAM (it could never be allocated). `reduce` names the options to lower."""
    needed = math.prod(int(size) for size in shape) * itemsize
    available = physical_memory()
    if available is not None and needed > available:
        dims = " × ".join(str(int(s)) for s in shape)
        raise NphError(
            f"{what} ({dims}) need {human_bytes(needed)}, more than this machine's "
            f"{human_bytes(available)} of memory; {reduce}"
        )
    return needed


def fits_in_memory(nbytes: int) -> bool:
    """Whether `nbytes` can be loaded into RAM with room to spare: at most half of what the
    kernel reports available, and of the address space left under this process's limit
    (`ulimit -v`). Commands that can also read a file block by block ask this to choose."""
    room: list[int] = []
    with contextlib.suppress(OSError), open("/proc/meminfo") as handle:
        room += [int(line.split()[1]) * 1024 for line in handle if line.startswith("MemAvailable:")]
    with contextlib.suppress(ImportError, OSError, ValueError):
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as handle:
                used = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            room.append(limit - used)
    room = room or [total for total in (physical_memory(),) if total is not None]
    return not room or nbytes <= min(room) // 2
