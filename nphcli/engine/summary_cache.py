"""The kernel feature models' memory summaries, built once per memory and reused (at M = 10⁶ they
were nearly all of a one-query call). Keyed by `MemoryBank.summary_token()` and the model's key;
dropped when the memory's tensors are freed; never kept for memories without a token.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from nphcli.memory.bank import MemoryBank

T = TypeVar("T")

MAX_ENTRIES = 8  # summaries are small ((F, d_v) each); a sweep reuses one memory at a time

_entries: OrderedDict[tuple[Hashable, Hashable], Any] = OrderedDict()
_lock = threading.Lock()  # sweeps may run retrievals from threads


def cached_summary(bank: MemoryBank, key: Hashable, build: Callable[[], T]) -> T:
    """`build()`'s result for this memory and `key`, built on the first call and reused after."""
    stamp = bank.summary_token()
    if stamp is None:
        return build()
    token, anchors = stamp
    entry = (token, key)
    with _lock:
        if entry in _entries:
            _entries.move_to_end(entry)
            return _entries[entry]
    value = build()
    with _lock:
        _entries[entry] = value
        while len(_entries) > MAX_ENTRIES:
            _entries.popitem(last=False)
    for anchor in anchors:
        weakref.finalize(anchor, _forget, token)
    return value


def clear() -> None:
    """Drop every kept summary."""
    with _lock:
        _entries.clear()


def size() -> int:
    """How many summaries are kept."""
    return len(_entries)


def _forget(token: Hashable) -> None:
    with _lock:
        for entry in [entry for entry in _entries if entry[0] == token]:
            del _entries[entry]
