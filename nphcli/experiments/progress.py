"""A one-line progress bar with ETA for long training runs (stderr, terminals only)."""

from __future__ import annotations

import sys
import time


class Progress:
    """A one-line progress bar with ETA on stderr, drawn only on a terminal."""

    def __init__(self, total: int, *, enabled: bool | None = None) -> None:
        self.total, self.done, self.label = max(total, 1), 0, ""
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.started = time.monotonic()

    def note(self, message: str) -> None:
        print(message, file=sys.stderr)

    def step(self) -> None:
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.started
        eta = elapsed / self.done * (self.total - self.done)
        width = 24
        filled = round(width * self.done / self.total)
        print(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} epochs "
            f"ETA {int(eta) // 60:d}:{int(eta) % 60:02d}  {self.label:<28}",
            end="",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        if self.enabled:
            print(file=sys.stderr)
