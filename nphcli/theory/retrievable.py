"""Stored patterns that no β retrieves, and the one-line notice that says so.

Pattern μ is a fixed point of retrieval from itself only if no other stored pattern is more
similar to it than it is to itself: Δ_μ = ⟨ξ_μ, ξ_μ⟩ − max_{ν≠μ} ⟨ξ_μ, ξ_ν⟩ > 0
(`separation.py`). With Δ_μ < 0 the scores β⟨ξ_μ, ξ_ν⟩ of the query ξ_μ favour ν over μ at
every β > 0, and as β grows the retrieved pattern tends to ξ_ν: no β returns ξ_μ. Pixels in
[0, 1] (`--normalize minmax`) do this to every digit that a brighter one covers.

The count is exact when the check is small (M²·d ≤ `EXACT_WORK`); otherwise it is taken on a
seeded sample of `SAMPLE_ROWS` patterns, each compared with all M, and the notice says so.
"""

from __future__ import annotations

from typing import Any

EXACT_WORK = 4e9  # multiply-adds of the exact check (M² d): about a second on one CPU core
SAMPLE_ROWS = 1000
META_KEY = "unretrievable"  # what `nph store` records, so `nph retrieve` need not redo it


def count_unretrievable(patterns: Any) -> dict[str, int]:
    """{"count": patterns with Δ_μ < 0 among those checked, "checked": how many, "of": M}."""
    from nphcli.theory.separation import separation

    M, d = patterns.shape
    if M < 2:
        return {"count": 0, "checked": M, "of": M}
    sep = separation(patterns, max_rows=None if _exact(M, d) else SAMPLE_ROWS, seed=0)
    return {"count": int((sep.delta < 0).sum()), "checked": int(sep.rows.numel()), "of": M}


def recorded_or_counted(memory: Any) -> dict[str, int] | None:
    """A memory's count: as its file records it, else counted when its keys are in RAM and the
    check is cheap; None when neither (a streamed or very large unrecorded memory)."""
    recorded = (memory.meta or {}).get(META_KEY)
    if isinstance(recorded, dict) and {"count", "checked", "of"} <= set(recorded):
        return recorded
    resident = memory.resident()
    if resident is None or not _exact(memory.num_memories, memory.dim):
        return None
    return count_unretrievable(resident[0])


def _exact(num_memories: int, dim: int) -> bool:
    """Whether every pair of M patterns is cheap enough to compare (M·M·d ≤ EXACT_WORK)."""
    return num_memories * num_memories * dim <= EXACT_WORK


def unretrievable_notice(found: dict[str, int] | None) -> str | None:
    """The one line saying how many stored patterns no β retrieves and what to do; None when
    none (or unknown)."""
    if not found or not found["count"]:
        return None
    count, checked, total = found["count"], found["checked"], found["of"]
    share = f"{count} of {total}" if checked == total else f"{count} of a sample of {checked}"
    return (
        f"{share} stored patterns cannot be retrieved by any β (another stored pattern has a "
        "larger inner product with each than it has with itself, Δ_μ < 0); store them centred "
        "(`nph store ... --normalize centered`) or with --normalize l2"
    )
