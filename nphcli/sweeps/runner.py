"""Running a sweep: each (setting, trial) evaluated in order, as `nph retrieve` evaluates it, on
a memory drawn from the pattern pool (the sweep's source, loaded and normalised once; the
memories drawn from it are nested within a trial: docs/sweeps.md, "Seeds"); its row appended as
it finishes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nphcli.core.errors import NphError
from nphcli.core.notices import notice
from nphcli.sweeps.columns import check_settings, id_columns, run_settings, theory_columns
from nphcli.sweeps.config import SweepConfig
from nphcli.sweeps.grid import Setting, Task, expand, memory_seed, plan, run_seed
from nphcli.sweeps.results import Results


@dataclass
class Pool:
    """The patterns memories are drawn from: the whole source, normalised once."""

    patterns: Any  # (N, d) Tensor
    labels: Any  # (N,) Tensor or None
    meta: dict[str, Any]
    spec: str  # the dataset name or file it came from
    digest: str | None = None  # its content hash, once computed (`content_sha256`)

    @property
    def size(self) -> int:
        """N, the number of patterns a memory can be drawn from."""
        return int(self.patterns.shape[0])

    def content_sha256(self) -> str:
        """The pool's content hash (`nphcli.memory.provenance`), computed once."""
        if self.digest is None:
            from nphcli.memory.provenance import tensors_digest

            tensors = {"patterns": self.patterns}
            if self.labels is not None:
                tensors["labels"] = self.labels
            self.digest = tensors_digest(tensors)
        return self.digest

    @property
    def normalize(self) -> str:
        """The normalisation applied (a results column: a resumed file must match it)."""
        record = self.meta.get("normalize") or {}
        return record.get("method", "none")


def load_pool(config: SweepConfig) -> Pool:
    """Load and normalise the sweep's source once (`nph store`'s loaders: datasets fall back to
    the bundled real samples offline, with a notice)."""
    from nphcli.sources import SourceOptions, prepare_memory

    options = SourceOptions(root=Path(config.root) if config.root else None)
    prepared = prepare_memory(config.dataset, options, normalize=config.normalize)
    return Pool(prepared.patterns, prepared.labels, prepared.meta, config.dataset)


def check_pool(config: SweepConfig, pool: Pool) -> None:
    """Refuse sizes the pool cannot fill, and parameters that do not fit a size, before work."""
    largest = max(config.sizes)
    if largest > pool.size:
        origin = " (the offline fallback sample)" if pool.meta.get("fallback") else ""
        raise NphError(
            f"memory size {largest} exceeds the {pool.size} patterns of {pool.spec}{origin}; "
            f"use sizes ≤ {pool.size}, or give the full dataset (--root, $NPH_DATA; "
            "`nph store --download` fetches it)"
        )
    from nphcli.evaluation.settings import build_model
    from nphcli.memory.bank import TensorBank
    from nphcli.sweeps.grid import distinct_models

    for settings in distinct_models(config):
        model = build_model(settings)
        for size in config.sizes:
            model.check_memory(TensorBank(pool.patterns[:size]))  # the shape of every draw


def draw_memory(pool: Pool, size: int, seed: int) -> Any:
    """A `Memory` of `size` patterns: the first `size` of a seeded permutation of the pool, kept
    in pool order."""
    import torch

    from nphcli.memory.file import Memory

    generator = torch.Generator().manual_seed(seed)
    rows = torch.randperm(pool.size, generator=generator)[:size].sort().values  # (M,)
    labels = None if pool.labels is None else pool.labels[rows]
    meta = {**pool.meta, "selection": {"method": "random_subset", "n": size, "of": pool.size}}
    return Memory(patterns=pool.patterns[rows], labels=labels, meta=meta)


def run(
    config: SweepConfig, pool: Pool, tasks: list[Task], *, theory: bool = False
) -> Iterator[dict[str, Any]]:
    """Evaluate `tasks` in order, yielding one row each (`nphcli.sweeps.columns`). A trial's
    memory of each size is drawn once and shared by every setting of that trial."""
    from nphcli.evaluation.evaluate import evaluate

    drawn: dict[tuple[int, int], Any] = {}
    for task in tasks:
        setting, trial = task.setting, task.trial
        m_seed = memory_seed(config.seed, trial)
        if (trial, setting.size) not in drawn:
            drawn = {(trial, setting.size): draw_memory(pool, setting.size, m_seed)}
        memory = drawn[(trial, setting.size)]
        settings = replace(setting.settings, seed=run_seed(config.seed, trial))
        report = evaluate(memory, settings, sources={"memory": config.dataset})
        row = {**id_columns(config, setting, trial, pool.normalize, m_seed), **report.to_row()}
        # memory_sha256 names the pool, drawn_sha256 this trial's draw (`nphcli.sweeps.columns`)
        row.update(memory_sha256=pool.content_sha256(), drawn_sha256=row["memory_sha256"])
        row["run_settings"] = json.dumps(run_settings(setting), separators=(",", ":"))
        if theory:
            row.update(theory_columns(memory, report))
        yield row


@dataclass
class Outcome:
    """What `execute` did."""

    config: SweepConfig
    settings: list[Setting]
    rows: list[dict[str, Any]]  # every row of the file now (earlier ones included)
    ran: int  # rows computed now
    skipped: int  # rows found in the file and not run again
    wall_s: float


def execute(
    config: SweepConfig, results: Results, *, theory: bool = False, progress: Any = None
) -> Outcome:
    """Load the pool, run every task not yet in `results`, append each row as it finishes.

    `progress`, if given, is called as progress(total) once and progress(None) after each row.
    On any exception (Ctrl-C included) the finished rows stay in the file and the notice says
    how to continue.
    """
    start = time.perf_counter()
    pool = load_pool(config)
    check_pool(config, pool)
    try:  # the file is locked: released before any error
        results.check_compatible(config, pool.normalize, theory=theory)
        settings = expand(config)
        tasks = plan(config)
        check_settings(results.existing, tasks, results.path)
    except NphError:
        results.release()
        raise
    done = results.done()
    todo = [task for task in tasks if task.key not in done]
    _notice_existing(results, settings, len(tasks), len(tasks) - len(todo))
    new_rows = []
    if progress is not None:
        progress(len(todo))
    try:
        for row in run(config, pool, todo, theory=theory):
            results.write(row)
            new_rows.append(row)
            if progress is not None:
                progress(None)
    except BaseException:
        results.abandon()
        raise
    results.finish()
    # Rows as written and read back (JSON nulls), so a summary of a resumed file and of a
    # fresh one treat empty cells alike.
    rows = results.existing + [_as_read(row) for row in new_rows]
    skipped = len(tasks) - len(todo)
    return Outcome(config, settings, rows, len(todo), skipped, time.perf_counter() - start)


def _notice_existing(results: Results, settings: list[Setting], total: int, skipped: int) -> None:
    """Say what a resumed file already holds: runs skipped, and rows outside this grid."""
    if skipped == total:
        notice(f"all {skipped} runs are already in {results.path}; nothing to run")
    elif skipped:
        notice(f"{skipped} of {total} runs are already in {results.path}; running the rest")
    keys = {s.key for s in settings}
    outside = sum(1 for row in results.existing if row.get("setting") not in keys)
    if outside:
        notice(f"{results.path} also holds {outside} rows of settings outside this grid; kept")


def _as_read(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if v == "" else v) for k, v in row.items()}
