"""Sweeps: a grid of retrieval evaluations over models, memory sizes, corruptions, β and trials.

The grid (`nphcli.sweep_config.SweepConfig`) expands into settings, one per combination of a
model setting (a model and one value of each parameter it sweeps), a memory size M, a mask
fraction, a noise σ and a β. Each setting runs once per trial. A run draws a memory of M
patterns from the sweep's pool (the dataset or file, loaded and normalised once) and calls
`nphcli.retrieval.evaluate` on it: every stored pattern (or `queries` of them) is corrupted and
retrieved, exactly as `nph retrieve` does.

Seeds. Everything follows from the sweep's one `seed` and the trial index t:

    memory_seed(t) = SeedSequence([seed, t, 0]),  run_seed(t) = SeedSequence([seed, t, 1])

each the first 64-bit word of numpy's `SeedSequence(...).generate_state`, with the top bit
cleared (seeds stay below 2⁶³, which every model accepts). The memory of size M in trial t is
the first M indices of a permutation of the pool drawn by a torch generator seeded with
memory_seed(t), sorted into pool order; so within a trial the memories of the different sizes
are nested, and every model, mask, noise level and β of trial t sees the same memory. The run
seed drives `evaluate` (query choice, mask and noise, and the model's own seed for `random`
and `random-feature`), so all models of a trial also see the same corrupted queries.

Rows. One row per (setting, trial): `ID_FIELDS`, then the fields of
`RetrievalReport.to_row()` (the flat row of `nph retrieve --csv`), then with `theory` the
fields of `nphcli.theory.ROW_FIELDS`. `summarize` gives each setting's mean and standard
deviation over its trials (population: divided by the number of trials).

Results files are JSON Lines (.jsonl, .ndjson) or CSV (.csv). Rows are appended as they finish,
each written whole, flushed and fsynced, so an interrupted sweep keeps every finished row and
`resume` continues it; a last line cut short by a kill is dropped and its run done again. An
existing file is replaced only with `force`: the new rows then go to NAME.partial.EXT beside
it (results.jsonl → results.partial.jsonl), renamed over the old file when the sweep completes,
so the old file survives an interruption (the notice says how to continue from the partial
file). Every other file nph writes is
replaced atomically; this one grows row by row on purpose.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nphcli.atomic import check_folder
from nphcli.errors import NphError, NphRuntimeError
from nphcli.notices import notice
from nphcli.sweep_config import SweepConfig

ID_FIELDS = ("setting", "label", "trial", "dataset", "normalize", "sweep_seed", "memory_seed")
SUMMARY_METRICS = ("sse", "success", "mse", "cosine", "pixel_success")
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
PARTIAL = ".partial"  # inserted before the ending of a --force sweep's temporary file


@dataclass(frozen=True)
class Setting:
    """One point of the grid (everything but the trial)."""

    model: str
    params: tuple[tuple[str, Any], ...]  # the swept parameters of this model setting
    size: int  # memory size M
    mask: float
    noise: float  # σ
    beta: float
    mask_mode: str | None

    @property
    def label(self) -> str:
        """The model setting, e.g. `topk k=0.2`: one line of a plot."""
        return " ".join([self.model, *(f"{k}={_text(v)}" for k, v in self.params)])

    @property
    def key(self) -> str:
        """The setting's identity in a results file (with the trial, a row's key)."""
        mode = self.mask_mode or "default"
        return (
            f"{self.label} | M={self.size} | mask={_text(self.mask)} {mode} | "
            f"noise={_text(self.noise)} | beta={_text(self.beta)}"
        )


def _text(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def expand(config: SweepConfig) -> list[Setting]:
    """The grid's settings in run order: size, mask, noise, β, then model settings."""
    settings = []
    for size in config.sizes:
        for mask in config.mask:
            for noise in config.noise:
                for beta in config.beta:
                    for spec in config.models:
                        for params in spec.settings():
                            settings.append(
                                Setting(
                                    spec.name,
                                    tuple(params.items()),
                                    size,
                                    mask,
                                    noise,
                                    beta,
                                    config.mask_mode,
                                )
                            )
    keys = [s.key for s in settings]
    if len(set(keys)) != len(keys):
        duplicate = next(k for k in keys if keys.count(k) > 1)
        raise NphError(f"the grid lists one setting twice ({duplicate}); remove the repeat")
    return settings


@dataclass(frozen=True)
class Task:
    setting: Setting
    trial: int

    @property
    def key(self) -> tuple[str, int]:
        return (self.setting.key, self.trial)


def plan(config: SweepConfig) -> list[Task]:
    """Every (setting, trial) in run order: trial by trial, so early trials of every setting
    finish first and an interrupted sweep already has comparable rows."""
    settings = expand(config)
    return [Task(s, t) for t in range(config.trials) for s in settings]


def derive_seed(seed: int, trial: int, stream: int) -> int:
    """A 63-bit seed for (sweep seed, trial, stream) from numpy's SeedSequence (module doc)."""
    import numpy as np

    words = np.random.SeedSequence([seed, trial, stream]).generate_state(2, dtype=np.uint32)
    return ((int(words[0]) << 32) | int(words[1])) & ((1 << 63) - 1)


def memory_seed(seed: int, trial: int) -> int:
    return derive_seed(seed, trial, 0)


def run_seed(seed: int, trial: int) -> int:
    return derive_seed(seed, trial, 1)


@dataclass
class Pool:
    """The patterns memories are drawn from: the whole source, normalised once."""

    patterns: Any  # (N, d) Tensor
    labels: Any  # (N,) Tensor or None
    meta: dict[str, Any]
    spec: str  # the dataset name or file it came from

    @property
    def size(self) -> int:
        return int(self.patterns.shape[0])

    @property
    def normalize(self) -> str:
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
    from nphcli.models import get_model_info

    largest = max(config.sizes)
    if largest > pool.size:
        origin = " (the offline fallback sample)" if pool.meta.get("fallback") else ""
        raise NphError(
            f"memory size {largest} exceeds the {pool.size} patterns of {pool.spec}{origin}; "
            f"use sizes ≤ {pool.size}, or give the full dataset (--root, $NPH_DATA; "
            "`nph store --download` fetches it)"
        )
    dim = int(pool.patterns.shape[1])
    for spec in config.models:
        info = get_model_info(spec.name)
        for params in spec.settings():
            model = info.cls(**params)
            for size in config.sizes:
                model.check_memory(size, dim)


def draw_memory(pool: Pool, size: int, seed: int):
    """A `Memory` of `size` patterns: the first `size` of a seeded permutation of the pool, kept
    in pool order."""
    import torch

    from nphcli.memory_file import Memory

    generator = torch.Generator().manual_seed(seed)
    rows = torch.randperm(pool.size, generator=generator)[:size].sort().values  # (M,)
    labels = None if pool.labels is None else pool.labels[rows]
    meta = {**pool.meta, "selection": {"method": "random_subset", "n": size, "of": pool.size}}
    return Memory(patterns=pool.patterns[rows], labels=labels, meta=meta)


def run(
    config: SweepConfig, pool: Pool, tasks: list[Task], *, theory: bool = False
) -> Iterator[dict[str, Any]]:
    """Evaluate `tasks` in order, yielding one row each (module docstring). A trial's memory of
    each size is drawn once and shared by every setting of that trial."""
    from nphcli.corruption import Corruption
    from nphcli.retrieval import RetrieveSettings, evaluate

    drawn: dict[tuple[int, int], Any] = {}
    for task in tasks:
        setting, trial = task.setting, task.trial
        m_seed = memory_seed(config.seed, trial)
        if (trial, setting.size) not in drawn:
            drawn = {(trial, setting.size): draw_memory(pool, setting.size, m_seed)}
        memory = drawn[(trial, setting.size)]
        settings = RetrieveSettings(
            model=setting.model,
            params={**dict(setting.params), "beta": setting.beta},
            corruption=Corruption(
                mask=setting.mask,
                mask_mode=setting.mask_mode,
                fill=config.fill,
                noise=setting.noise,
                noise_clip=config.noise_clip,
            ),
            queries=config.queries,
            seed=run_seed(config.seed, trial),
            device=config.device,
            dtype=config.dtype,
        )
        report = evaluate(memory, settings, sources={"memory": config.dataset})
        row = {
            "setting": setting.key,
            "label": setting.label,
            "trial": trial,
            "dataset": config.dataset,
            "normalize": pool.normalize,
            "sweep_seed": config.seed,
            "memory_seed": m_seed,
            **report.to_row(),
        }
        if theory:
            from nphcli.theory import row_fields

            row.update(row_fields(memory, report))
        yield row


# -- results files ---------------------------------------------------------------------------


def results_format(path: str | os.PathLike) -> str:
    """ "jsonl" or "csv", from the file name's ending."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise NphError(
            f"results file {path}: use a .jsonl (JSON Lines) or .csv name, not {suffix or 'none'}"
        )
    return FORMATS[suffix]


@dataclass
class Loaded:
    """A results file as read back."""

    rows: list[dict[str, Any]]
    header: list[str] | None  # CSV only
    good_bytes: int  # length of the part made of complete rows
    dropped: bool  # True when a cut-short last line was left out


def read_results(path: str | os.PathLike) -> Loaded:
    """Rows of a JSON Lines or CSV results file, numbers parsed, empty cells as None.

    A last line that is cut short (no newline, or not a complete row) is left out and reported
    in `dropped`; a damaged line elsewhere is an error.
    """
    path = Path(path)
    fmt = results_format(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise NphError(f"cannot read results file {path}: {error.strerror or error}") from None
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    dropped = bool(tail.strip())
    good = len(data) - len(tail)
    rows: list[dict[str, Any]] = []
    header = None
    offsets = []
    position = 0
    for line in lines:
        offsets.append(position)
        position += len(line) + 1
    for number, line in enumerate(lines):
        last = number == len(lines) - 1
        text = line.decode("utf-8", errors="replace").strip()
        if not text:
            continue
        parsed = _parse_line(text, fmt, header)
        if parsed is None:
            if last:
                dropped, good = True, offsets[number]
                break
            raise NphError(
                f"{path}, line {number + 1}: not a complete results row; the file is damaged "
                "(only a cut-short last line is repaired by --resume)"
            )
        if fmt == "csv" and header is None:
            header = parsed
            continue
        rows.append(parsed)
    return Loaded(rows, header, good, dropped)


def _parse_line(text: str, fmt: str, header: list[str] | None):
    if fmt == "jsonl":
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None
    cells = next(csv.reader([text]))
    if header is None:
        return cells
    if len(cells) != len(header):
        return None
    return {key: _cell(value) for key, value in zip(header, cells, strict=True)}


def _cell(text: str) -> Any:
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


class Results:
    """The results file of one sweep: rows already there, and appending new ones durably."""

    def __init__(self, path: str | os.PathLike, *, resume: bool = False, force: bool = False):
        self.path = Path(path)
        self.format = results_format(self.path)
        self.write_path = self.path
        self.existing: list[dict[str, Any]] = []
        self.header: list[str] | None = None
        self.written = 0
        self._handle: io.TextIOBase | None = None
        if resume and force:
            raise NphError("choose one of --resume (continue the file) and --force (replace it)")
        if resume and self.path.is_file():  # appends to the file itself: its folder may be locked
            if not os.access(self.path, os.W_OK):
                raise NphError(f"cannot continue {self.path}: the file is not writable")
        else:
            check_folder(self.path)
        if self.path.exists():
            if resume:
                self._load_existing()
            elif force:
                self.write_path = self.path.with_name(self.path.stem + PARTIAL + self.path.suffix)
                self.write_path.unlink(missing_ok=True)  # a partial file of an earlier --force
            else:
                raise NphError(
                    f"{self.path} already exists; pass --resume to continue it or --force to "
                    "replace it"
                )
        elif resume:
            notice(f"{self.path} does not exist yet: starting a new sweep")

    def _load_existing(self) -> None:
        loaded = read_results(self.path)
        self.existing, self.header = loaded.rows, loaded.header
        if loaded.dropped:
            notice(f"{self.path}: dropping a cut-short last line; its run is done again")
            with open(self.path, "r+b") as handle:
                handle.truncate(loaded.good_bytes)
                handle.flush()
                os.fsync(handle.fileno())

    def done(self) -> set[tuple[str, int]]:
        """Keys (setting, trial) of the rows already in the file."""
        return {(str(row.get("setting")), int(row.get("trial", -1))) for row in self.existing}

    def check_compatible(self, config: SweepConfig, pool_normalize: str, *, theory: bool) -> None:
        """A resumed file must come from the same sweep: dataset, seed, normalisation, and
        theory fields (present or not) as now."""
        for row in self.existing:
            for key, value in (
                ("dataset", config.dataset),
                ("sweep_seed", config.seed),
                ("normalize", pool_normalize),
            ):
                if row.get(key) != value:
                    raise NphError(
                        f"{self.path} holds rows of another sweep ({key} {row.get(key)!r}, "
                        f"now {value!r}); resume with the same settings or choose another --out"
                    )
            clipped = str(row.get("noise_clip", "")).lower() in ("true", "1")  # JSON or CSV
            if clipped != config.noise_clip:
                raise NphError(
                    f"{self.path} was written with noise_clip {not config.noise_clip}; resume "
                    "it the same way or choose another --out"
                )
            if ("theory_m" in row) != theory:
                had = "with" if "theory_m" in row else "without"
                raise NphError(f"{self.path} was written {had} --theory; resume it the same way")
            break  # every row of a file comes from one sweep; the first one tells

    def write(self, row: dict[str, Any]) -> None:
        """Append one row as one write, then flush and fsync."""
        if self._handle is None:
            try:
                self._handle = open(self.write_path, "a", encoding="utf-8", newline="")
            except OSError as error:
                raise NphError(
                    f"cannot write {self.write_path}: {error.strerror or error}"
                ) from None
            if self.format == "csv" and self.header is None:
                self.header = list(row)
                self._emit(_csv_line(self.header))
        if self.format == "csv":
            if list(row) != self.header:
                raise NphError(
                    f"{self.path} has other columns than this sweep's rows; it was written by "
                    "another version or grid of nph sweep: choose another --out"
                )
            self._emit(_csv_line(["" if v is None else v for v in row.values()]))
        else:
            clean = {k: (None if v == "" else _json_number(v)) for k, v in row.items()}
            self._emit(json.dumps(clean, allow_nan=False, ensure_ascii=False) + "\n")
        self.written += 1

    def _emit(self, line: str) -> None:
        assert self._handle is not None
        try:
            self._handle.write(line)
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as error:  # e.g. the disk filled up: not the input's fault
            raise NphRuntimeError(
                f"could not write {self.write_path}: {error.strerror or error}"
            ) from error

    def finish(self) -> None:
        """Close; a --force sweep's partial file now replaces the old results file."""
        self.close()
        if self.write_path != self.path:
            if not self.write_path.exists():  # nothing to run: an empty replacement
                self.write_path.touch()
            os.replace(self.write_path, self.path)
            _fsync_folder(self.path.parent)
            self.write_path = self.path

    def abandon(self) -> None:
        """Close after an interruption, saying where the finished rows are."""
        self.close()
        if self.write_path != self.path and self.write_path.exists():
            notice(
                f"interrupted: {self.path} is unchanged; the {self.written} rows finished are in "
                f"{self.write_path} (rename it to {self.path.name} and rerun with --resume to "
                "continue)"
            )
        elif self.written:
            notice(
                f"interrupted: {self.written} new rows are in {self.path}; rerun with --resume "
                "to continue"
            )

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def _csv_line(values: list[Any]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(values)
    return buffer.getvalue()


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- summary ---------------------------------------------------------------------------------


@dataclass
class SummaryRow:
    """One setting's trials, aggregated."""

    setting: Setting
    trials: int
    metrics: dict[str, dict[str, float] | None]  # metric → {mean, std} over trials of its mean
    us_per_query: float | None  # mean over trials
    theory: dict[str, Any] = field(default_factory=dict)  # summed counts, extreme values

    def to_json(self) -> dict[str, Any]:
        s = self.setting
        out = {
            "setting": s.key,
            "label": s.label,
            "model": s.model,
            "params": dict(s.params),
            "M": s.size,
            "mask": s.mask,
            "mask_mode": s.mask_mode,
            "noise": s.noise,
            "beta": s.beta,
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
    var = sum((v - mean) ** 2 for v in values) / len(values)
    return {"mean": mean, "std": math.sqrt(var)}


def summarize(rows: list[dict[str, Any]], settings: list[Setting]) -> list[SummaryRow]:
    """Each setting of `settings` that has rows: mean ± std over its trials of each run's mean
    metric, in grid order. Theory counts are summed over trials."""
    from nphcli.theory import COUNT_FIELDS

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
        theory: dict[str, Any] = {}
        if any("theory_m" in row for row in group):
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
        out.append(
            SummaryRow(
                setting=setting,
                trials=len(group),
                metrics=metrics,
                us_per_query=sum(timing) / len(timing) if timing else None,
                theory=theory,
            )
        )
    return out


def _numbers(rows: list[dict[str, Any]], key: str) -> list[float]:
    values = []
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            values.append(float(value))
    return values


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
    config: SweepConfig,
    results: Results,
    *,
    theory: bool = False,
    progress: Any = None,
) -> Outcome:
    """Load the pool, run every task not yet in `results`, append each row as it finishes.

    `progress`, if given, is called as progress(total) once and progress(None) after each row.
    On any exception (Ctrl-C included) the finished rows stay in the file and the notice says
    how to continue.
    """
    start = time.perf_counter()
    pool = load_pool(config)
    check_pool(config, pool)
    results.check_compatible(config, pool.normalize, theory=theory)
    settings = expand(config)
    tasks = plan(config)
    done = results.done()
    todo = [task for task in tasks if task.key not in done]
    skipped = len(tasks) - len(todo)
    if skipped == len(tasks):
        notice(f"all {skipped} runs are already in {results.path}; nothing to run")
    elif skipped:
        notice(f"{skipped} of {len(tasks)} runs are already in {results.path}; running the rest")
    keys = {s.key for s in settings}
    outside = sum(1 for row in results.existing if row.get("setting") not in keys)
    if outside:
        notice(f"{results.path} also holds {outside} rows of settings outside this grid; kept")
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
    return Outcome(config, settings, rows, len(todo), skipped, time.perf_counter() - start)


def _as_read(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if v == "" else v) for k, v in row.items()}
