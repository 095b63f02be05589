"""The one progress bar of the CLI. A long job takes a `progress` callable and calls it as
progress(total) once, then progress(None) after each unit of work (optionally with a label);
this bar draws it on stderr with an ETA, only on a terminal and without --quiet.
"""

from __future__ import annotations

import sys

from nphcli.cli.app import quiet
from nphcli.cli.render import stderr_console


class ProgressBar:
    """`with ProgressBar("sweep") as progress: run(..., progress=progress)`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._bar = None
        self._task = None

    def __enter__(self) -> ProgressBar:
        if sys.stderr.isatty() and not quiet():
            from rich import progress as rp

            self._bar = rp.Progress(
                rp.TextColumn("{task.description}"),
                rp.BarColumn(),
                rp.MofNCompleteColumn(),
                rp.TimeElapsedColumn(),
                rp.TextColumn("ETA"),
                rp.TimeRemainingColumn(),
                console=stderr_console(),
                transient=True,
            )
            self._bar.__enter__()
        return self

    def __call__(self, total: int | None, label: str | None = None) -> None:
        """progress(total) starts the count; progress(None, label) marks one unit done."""
        if self._bar is None:
            return
        description = self.name if label is None else f"{self.name} {label}"
        if self._task is None:
            self._task = self._bar.add_task(description, total=total)
        else:
            self._bar.update(self._task, advance=1, description=description)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
