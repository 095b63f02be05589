"""The columns of a sweep's results rows.

One row per (setting, trial): `ID_FIELDS`, then the fields of `RetrievalReport.to_row()` (the
flat row of `nph retrieve --csv`), then with `--theory` the `THEORY_FIELDS`. The theory fields
are the sweep's reading of `theory.checks`: the separation of the run's memory, and the counts of
the `QueryCheck` that `theory.check_report` returns, counted over the run's queries so that
trials add up. Fields that do not apply (a model Theorem 4.1 does not cover) are empty.

A sweep's memories are drawn from its pool (a new draw per trial, by design), so in its rows
`memory_sha256` is the pool's content hash (`nphcli.memory.provenance`; the same for every row
of one sweep) and `drawn_sha256`, a trial column like `memory_seed`, the drawn memory's.
"""

from __future__ import annotations

from typing import Any

from nphcli.sweeps.config import SweepConfig
from nphcli.sweeps.grid import Setting

ID_FIELDS = ("setting", "label", "trial", "dataset", "normalize", "sweep_seed", "memory_seed")

# Counts of `QueryCheck.summary()` that a sweep summary adds up over trials, in row order.
CHECK_COUNTS = (
    "well_separated",
    "in_support",
    "in_sphere",
    "premises",
    "premises_well_separated",
    "stated_holds",
    "stated_holds_premises",
    "stated_holds_premises_well_separated",
    "query_holds",
    "corollary_holds",
)
# Counts of the bounds that do hold (`nphcli.theory.bounds`), and their tightness (bound / error).
BOUND_COUNTS = ("lemma_holds", "tight_holds", "weight_holds", "stated_self_holds_premises")
TIGHTNESS = (
    "stated_tightness_min",
    "query_tightness_min",
    "lemma_tightness_min",
    "tight_tightness_min",
    "tight_tightness_median",
)
COUNT_FIELDS = tuple(f"theory_{name}" for name in (*CHECK_COUNTS, *BOUND_COUNTS))
SEPARATION_FIELDS = ("theory_m", "theory_R", "theory_delta_min", "theory_delta_mean")
THEORY_FIELDS = (
    *SEPARATION_FIELDS,
    "theory_k_mean",
    *(f"theory_{name}" for name in CHECK_COUNTS),
    "theory_impl_gap_max",
    *(f"theory_{name}" for name in (*BOUND_COUNTS, *TIGHTNESS)),
)


def id_columns(
    config: SweepConfig, setting: Setting, trial: int, normalize: str, memory_seed: int
) -> dict[str, Any]:
    """The ID_FIELDS of one run: which setting and trial, and what a resumed file must match."""
    return {
        "setting": setting.key,
        "label": setting.label,
        "trial": trial,
        "dataset": config.dataset,
        "normalize": normalize,
        "sweep_seed": config.seed,
        "memory_seed": memory_seed,
    }


def pool_provenance(pool: Any, drawn: str) -> dict[str, Any]:
    """The memory columns of a sweep row: the pool's content hash as `memory_sha256`, the drawn
    memory's (`drawn`) as `drawn_sha256` (see the module docstring)."""
    return {"memory_sha256": pool.content_sha256(), "drawn_sha256": drawn}


def theory_columns(memory: Any, report: Any) -> dict[str, Any]:
    """The THEORY_FIELDS of one run: separation of its memory always, the per-query checks when
    Theorem 4.1 covers the model (else empty)."""
    from nphcli.theory.checks import check_report
    from nphcli.theory.separation import separation

    sep = separation(memory.patterns, max_rows=None)
    delta = sep.delta_summary()
    out: dict[str, Any] = dict.fromkeys(THEORY_FIELDS, "")
    out.update(
        theory_m=sep.m,
        theory_R="" if sep.R is None else sep.R,
        theory_delta_min="" if delta is None else delta["min"],
        theory_delta_mean="" if delta is None else delta["mean"],
    )
    check = check_report(memory, report)
    if check is None:
        return out
    for key, value in check.summary().items():
        if f"theory_{key}" in out:
            out[f"theory_{key}"] = "" if value is None else value
    return out
