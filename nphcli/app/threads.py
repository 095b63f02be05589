"""How many CPU threads a command computes with: `--threads`, else $NPH_THREADS, else the
command's own default, set once before any work."""

from __future__ import annotations

import os

import torch

from nphcli.core.errors import NphError
from nphcli.schema.fields import get_field

THREADS_ENV = "NPH_THREADS"
_TORCH_THREADS = torch.get_num_threads()  # torch's own choice, before any command set one


def use_threads(threads: int | None = None, *, default: int | None = None) -> int:
    """Set torch's CPU threads for this process and return how many it uses: `threads` if given,
    else $NPH_THREADS, else `default` (None: torch's own, one per core).

    The one place nph sets threads, called once before a command's work. Intra-op threads only:
    nph runs no inter-op parallel work, and torch allows setting those only before any.
    Faiss follows (`nphcli.engine.exact_search` and `nphcli.ann` read torch's count).
    """
    field = get_field("threads")
    if threads is None:
        text = os.environ.get(THREADS_ENV, "").strip()
        if text:
            try:
                threads = int(text)
            except ValueError:
                raise NphError(f"{THREADS_ENV} must be a whole number ≥ 1, got {text!r}") from None
            field.check(threads, THREADS_ENV)
    else:
        field.check(threads)
    chosen = threads or default or _TORCH_THREADS
    if chosen != torch.get_num_threads():
        torch.set_num_threads(chosen)
    return torch.get_num_threads()
