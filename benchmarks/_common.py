"""Shared by the benchmark scripts: a `--device` that is not present ends the script in one
line (exit 2), as `nph retrieve --device cuda` does, instead of a traceback mid-run."""

from __future__ import annotations

import sys

import torch

from nphcli.devices import resolve_device
from nphcli.errors import NphError


def device_or_exit(name: str) -> torch.device:
    """The torch device `name` names, or `Error: ...` on stderr and exit status 2."""
    try:
        return resolve_device(name)
    except NphError as error:
        sys.stderr.write(f"Error: {error}\n")
        raise SystemExit(2) from None
