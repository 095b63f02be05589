"""The columns of a sweep's results rows: `ID_FIELDS`, then those of `RetrievalReport.to_row()`
(`nph retrieve --csv`'s), `drawn_sha256` and `run_settings` (docs/sweeps.md, "Results"), then
with `--theory` the `THEORY_FIELDS`: the separation of the run's memory and the counts of the
`QueryCheck` that `theory.check_report` returns, counted over the run's queries so that trials
add up (empty where Theorem 4.1 does not cover the model). A sweep draws its memories from a
pool, so its `memory_sha256` is the pool's content hash, `drawn_sha256` the drawn memory's;
`run_settings` is the setting's whole `RetrieveSettings`, which `--resume` checks.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from nphcli.core.errors import NphError
from nphcli.core.jsontext import parse_json
from nphcli.core.notices import notice
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
# Counts of the bounds that do hold (`nphcli.theory.checks`), and their tightness (bound / error).
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
    values = (setting.key, setting.label, trial, config.dataset, normalize, config.seed)
    return dict(zip(ID_FIELDS, (*values, memory_seed), strict=True))


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


def run_settings(setting: Setting) -> dict[str, Any]:
    """Everything that decides a run of `setting` besides its memory and seeds, flat and
    JSON-ready: model, its parameters, the corruption, then the other retrieval fields."""
    raw = dataclasses.asdict(setting.settings)
    raw.pop("seed")  # the trial's run seed, a column of its own
    params = {k: v for k, v in raw.pop("params").items() if k != "seed"}
    out = {"model": raw.pop("model"), "M": setting.size, **params, **raw.pop("corruption")}
    out.update(raw)
    out["tf32"] = out.pop("tf32")  # last: the cell reads as in files written before
    return json.loads(json.dumps(out, default=str))  # as a row read back holds it


def check_settings(rows: list[dict[str, Any]], tasks: list[Any], path: Any) -> None:
    """Refuse to resume when a row already in the file for one of `tasks` (`Task`s) was made
    with other settings, naming the first that differs. Rows of nph before `run_settings`
    cannot be checked: a notice says so."""
    wanted = {task.key: task.setting for task in tasks}
    unchecked = 0
    for row in rows:
        setting = wanted.get((str(row.get("setting")), row.get("trial")))
        if setting is None:
            continue  # a run outside this grid: kept, never reported as this sweep's
        text = row.get("run_settings")
        if text is None:
            unchecked += 1
            continue
        try:
            had = parse_json(str(text), what="a run_settings cell")
        except NphError:
            had = None
        now = run_settings(setting)
        if not isinstance(had, dict):
            raise NphError(
                f"{path}: the run_settings of {setting.key!r}, trial {row.get('trial')} cannot "
                "be read; the file is damaged: choose another --out"
            )
        for name in [*now, *(k for k in had if k not in now)]:
            if had.get(name) != now.get(name):
                raise NphError(
                    f"{path} was made with other settings: {name} {had.get(name)!r} (now "
                    f"{now.get(name)!r}) in {setting.key!r}; resume with the same settings or "
                    "choose another --out"
                )
    if unchecked:
        notice(
            f"{path}: {unchecked} rows were written by an nph that did not record their "
            "settings (run_settings); resumed as they are, unchecked"
        )
