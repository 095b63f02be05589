"""Per-setting summaries of a sweep's rows: mean and standard deviation over trials.

The standard deviation is the population one (divided by the number of trials). Theory counts
are summed over trials, so a setting's ratios count every query of every trial.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from nphcli.schema.metrics import shown_in
from nphcli.sweeps.columns import COUNT_FIELDS
from nphcli.sweeps.grid import Setting

SUMMARY_METRICS = tuple(m.name for m in shown_in("summary"))  # `nphcli.schema.metrics`


@dataclass
class SummaryRow:
    """One setting's trials, aggregated."""

    setting: Setting
    trials: int
    metrics: dict[str, dict[str, float] | None]  # metric → {mean, std} over trials of its mean
    us_per_query: float | None  # mean over trials
    theory: dict[str, Any] = field(default_factory=dict)  # summed counts, extreme values

    def to_json(self) -> dict[str, Any]:
        """The row for `nph sweep --json`."""
        s, axes = self.setting, self.setting.axes
        out = {
            "setting": s.key,
            "label": s.label,
            "model": s.model,
            "params": dict(s.params),
            "M": s.size,
            "mask": axes["mask"],
            "mask_mode": s.settings.corruption.mask_mode,
            "noise": axes["noise"],
            "beta": axes["beta"],
            "trials": self.trials,
            "metrics": self.metrics,
            "us_per_query": self.us_per_query,
        }
        if self.theory:
            out["theory"] = self.theory
        return out


def mean_std(values: list[float]) -> dict[str, float] | None:
    """Mean and population standard deviation; None for no values."""
    if not values:
        return None
    mean = sum(values) / len(values)
    var = 0.0 if len(set(values)) == 1 else sum((v - mean) ** 2 for v in values) / len(values)
    return {"mean": mean, "std": math.sqrt(var)}


def summarize_settings(rows: list[dict[str, Any]], settings: list[Setting]) -> list[SummaryRow]:
    """Each setting of `settings` that has rows: mean ± std over its trials of each run's mean
    metric, in grid order. Theory counts are summed over trials."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(str(row.get("setting")), []).append(row)
    out = []
    for setting in settings:
        group = grouped.get(setting.key)
        if not group:
            continue
        metrics = {name: mean_std(_numbers(group, f"{name}_mean")) for name in SUMMARY_METRICS}
        timing = _numbers(group, "us_per_query")
        mean_time = sum(timing) / len(timing) if timing else None
        out.append(SummaryRow(setting, len(group), metrics, mean_time, _theory_summary(group)))
    return out


def _theory_summary(group: list[dict[str, Any]]) -> dict[str, Any]:
    """The theory columns of one setting's rows: counts summed, the largest implementation gap,
    separation means; empty when the rows have no theory columns."""
    theory: dict[str, Any] = {}
    if not any("theory_m" in row for row in group):
        return theory
    for key in COUNT_FIELDS:
        values = _numbers(group, key)
        theory[key.removeprefix("theory_")] = int(sum(values)) if values else None
    theory["queries"] = sum(int(row.get("Q") or 0) for row in group)
    gaps = _numbers(group, "theory_impl_gap_max")
    theory["impl_gap_max"] = max(gaps) if gaps else None
    for key in ("theory_m", "theory_R", "theory_delta_min"):
        values = _numbers(group, key)
        theory[key.removeprefix("theory_") + "_mean"] = (
            sum(values) / len(values) if values else None
        )
    return theory


def _numbers(rows: list[dict[str, Any]], key: str) -> list[float]:
    values = [row.get(key) for row in rows]
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return [float(v) for v in numbers if math.isfinite(v)]
