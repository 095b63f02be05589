"""Measured run times of the quick presets: the one source of the estimates that `--help`
states and of the numbers the docs report (a test checks that each docs page still says them).

Each entry is what one command took when measured, on the machine it names; `--help` quotes the
measurement itself ("4 min 24 s on 2 quiet CPU cores"), never a rounded guess beside it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Measured:
    """What one command took, in seconds (per part, where the parts ran apart), and where."""

    command: str  # as measured
    seconds: tuple[int, ...]  # one per part run separately (a data set each), summed for help
    machine: str  # the machine and the kind of time, in words
    page: str  # the docs page that reports it


MEASURED = {
    "mil-quick": Measured(
        "nph mil --preset quick", (574,), "on 2 quiet CPU cores", "docs/reproduction.md"
    ),
    "paper-mil-quick": Measured(
        "nph paper mil --protocol quick --threads 1 (Elephant and UCSB)",
        (253,),
        "of CPU time, one core",
        "docs/paper-tables.md",
    ),
    "paper-mil-reduced": Measured(
        "nph paper mil --protocol reduced --threads 1 (Elephant, UCSB)",
        (776, 535),
        "of CPU time, one core",
        "docs/paper-tables.md",
    ),
}


def duration(seconds: int) -> str:
    """`4 min 24 s`, `9 min 34 s`, `45 s`: as the docs write a measured time."""
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def estimate(name: str) -> str:
    """What `--help` says a preset takes: its measured total and the machine it ran on."""
    measured = MEASURED[name]
    return f"{duration(sum(measured.seconds))} {measured.machine}, measured"
