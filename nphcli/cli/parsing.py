"""Text from the command line turned into the library's values (torch-free)."""

from __future__ import annotations

import re

from nphcli.errors import NphError


def parse_size(text: str, flag: str = "--memory-budget") -> int:
    """Bytes from a size such as 1048576, 64K, 256M, 1.5G or 512MiB (K, KB and KiB alike are
    powers of 1024, any letter case); NphError naming `flag` unless it is ≥ 1 byte."""
    match = re.fullmatch(
        r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmg])(?:i?b)?|b)?\s*", text, re.IGNORECASE
    )
    if match is None:
        raise NphError(
            f"{flag} must be a size in bytes such as 1048576, 64K, 256M or 2GiB, got {text!r}"
        )
    number, unit = match.groups()
    scale = 1024 ** (" kmg".index(unit.lower()) if unit else 0)
    size = float(number) * scale
    if size < 1 or size != int(size):
        raise NphError(f"{flag} must be a whole number of bytes ≥ 1, got {text!r}")
    return int(size)


def parse_indices(text: str, flag: str = "--target-indices") -> list[int]:
    """Whole numbers separated by commas or spaces, e.g. "3,17,42"."""
    parts = [part for part in text.replace(",", " ").split() if part]
    try:
        return [int(part) for part in parts]
    except ValueError:
        raise NphError(f"{flag} must be whole numbers separated by commas, got {text!r}") from None
