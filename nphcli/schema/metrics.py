"""The metrics a run reports, described once: name, label, which way is better (None: a
description of the run), and the tables that show it ("compare": `nph retrieve` with several
settings; "summary": `nph sweep`; "report": `nph report`, best value marked). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str  # the key in JSON, the column (with _mean, _std, _median) in rows
    label: str  # what an axis or a column title says
    better: str | None  # "higher", "lower", or None
    shown: tuple[str, ...] = ()  # "compare", "summary", "report"


# Per-query metrics of a run, in the order of `nph retrieve --json` and its CSV columns.
METRICS: tuple[Metric, ...] = (
    Metric(
        "success",
        "success rate (nearest stored pattern is the target)",
        "higher",
        ("compare", "summary", "report"),
    ),
    Metric("sse", "sum of squared errors ‖T(x) − ξ‖²", "lower", ("compare", "summary", "report")),
    Metric("mse", "mean squared error ‖T(x) − ξ‖² / d", "lower", ("summary", "report")),
    Metric("cosine", "cosine similarity of T(x) and ξ", "higher", ("compare", "summary", "report")),
    Metric("nearest_distance", "distance from T(x) to the nearest stored pattern", None),
    Metric(
        "support", "support size (memories with non-zero weight)", "lower", ("compare", "report")
    ),
    Metric("steps", "update steps", None),
    Metric(
        "pixel_success",
        "per-pixel success rate (every clamped entry within 0.1 of the target)",
        "higher",
        ("summary", "report"),
    ),
    Metric("at_pattern", "share of queries that reached one stored pattern", "higher", ("report",)),
    Metric("at_metastable", "share of queries that reached a metastable state", None),
    Metric("at_global", "share of queries that reached the global average", None),
    Metric(
        "attractor_size",
        "size s of the state reached (memories holding 90 % of the weight)",
        "lower",
        ("report",),
    ),
    Metric("energy", "energy E(y) of the final state", None),
)
# A run's speed, a column of results rows beside the metrics.
SPEED = Metric("us_per_query", "retrieval time per query (µs)", "lower", ("report",))
ALL_METRICS = (*METRICS, SPEED)
METRIC_NAMES = tuple(m.name for m in METRICS)
LABELS = {m.name: m.label for m in ALL_METRICS}


def shown_in(table: str) -> tuple[Metric, ...]:
    """The metrics `table` ("compare", "summary", "report") has a column of, in order."""
    return tuple(m for m in ALL_METRICS if table in m.shown)
