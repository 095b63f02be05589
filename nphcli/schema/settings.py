"""The settings of a retrieval, each declared once on the plain dataclass that receives it.

The command line, an `nph batch` job, a sweep and the Python API build the same objects and pass
them down whole: `InputSpec` (what is read), `RetrieveSettings` (one setting, with its
`Corruption` and optional `IndexSettings`), `Spread` (processes, threads), `OutputSpec` (what is
written); `AnalysisOptions` are `nph analyze`'s own. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nphcli.core.defaults import (
    CAPACITY_STEPS,
    DEFAULT_CANDIDATES,
    DEFAULT_CHECK_EXACT,
    DEFAULT_EF,
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_NPROBE,
    size_text,
)
from nphcli.core.dtypes import COMPUTE_DTYPES
from nphcli.core.errors import NphError
from nphcli.schema.catalog import model_card
from nphcli.schema.option import Limits, check_settings, nested, output_field_setting, setting

# Why a surface refuses an option (`Field.refused`).
_SWEEP_DRAWS = "a sweep draws its memories and queries from its dataset"
_ONE_PROCESS = "it runs every job in this one process; use `nph retrieve --workers` per setting"
_JSON_ONLY = "it prints one JSON object per setting; use `nph retrieve` for files and tables"
_ROWS = "a sweep writes one row per run to its --out results file"
_WHOLE_PROCESS = "threads are the whole process's: give --threads to the command"
_WITH_INDEX = "it goes with --index"
_SEARCH: Limits = {"minimum": 1, "refused": {"sweep": _WITH_INDEX}}  # how an --index is searched
# Commands whose options are not generated (batch, mil) build their --threads from this text.
THREADS_HELP = (
    "CPU threads torch computes with (also $NPH_THREADS) [default: 1 for nph sweep, whose runs "
    "are small; else one per core]. Changes speed, not the setting (float32 sums may round "
    "differently in the last bits); on a busy machine, or beside other nph runs, use 1."
)
_FRACTION: Limits = {"minimum": 0.0, "maximum": 1.0, "meaning": "a fraction", "metavar": "NUMBER"}
_DRAWN: Limits = {"refused": {"sweep": _SWEEP_DRAWS}}


@dataclass(frozen=True, kw_only=True)
class InputSpec:
    """What a request reads: the memory, and optionally own queries and their targets."""

    memory: str = setting(
        "memory.safetensors",
        "Memory file written by `nph store`, or a shard manifest from `nph shard`.",
        kind="path",
        **_DRAWN,
    )
    queries_file: str | None = setting(
        None,
        "Own queries, one per row: any file `nph store` reads (.npy, .npz, .csv, .safetensors, "
        ".pt, a folder of images).",
        kind="path",
        **_DRAWN,
    )
    query_text: str | None = setting(
        None,
        "A text to recall from, embedded with the memory's own embedder (a memory stored from "
        "texts with --embed; docs/text.md). For several, a .txt or .jsonl --queries-file.",
        **_DRAWN,
    )
    targets_file: str | None = setting(
        None, "Targets for own queries, one row per query (Q, d_v).", kind="path", **_DRAWN
    )
    target_indices: list[int] | None = setting(
        None,
        "Stored row of each own query's target, e.g. 3,17,42, or @FILE: a text file of them "
        "(commas, spaces or one a line).",
        **_DRAWN,
    )
    stream: bool = setting(
        False,
        "Read the memory file from disk block by block instead of loading it, so a file larger "
        "than RAM can be searched.",
        **_DRAWN,
    )

    def __post_init__(self) -> None:
        check_settings(self)
        if self.queries_file is not None and self.query_text is not None:
            raise NphError("give own queries either as a file or as --query-text, not both")
        if self.targets_file is not None and self.target_indices is not None:
            raise NphError("give targets either as a file or as indices, not both")
        own = self.queries_file or self.query_text is not None
        if (self.targets_file or self.target_indices is not None) and not own:
            raise NphError("targets go with own queries: add --queries-file")

    def files(self) -> list[Path]:
        """The files read, which no output may overwrite."""
        named = (self.memory, self.queries_file, self.targets_file)
        return [Path(name) for name in named if name is not None]


@dataclass(frozen=True, kw_only=True)
class Corruption:
    """How to corrupt a query (`nphcli.evaluation.corruption.corrupt`: mask, occlusion, noise,
    salt-and-pepper, flips, in that order). The defaults leave it unchanged; each argument is
    the option of the same name (`nph retrieve --help`), e.g. `Corruption(mask=0.5, noise=0.1)`.
    """

    mask: float = setting(0.0, "Fraction of each query to hide, in [0, 1].", **_FRACTION)
    mask_mode: str | None = setting(
        None,
        "bottom, top, left, right (images) or random [default: bottom for images, random for "
        "vectors].",
        choices=("bottom", "top", "left", "right", "random"),
    )
    fill: float = setting(0.0, "Value written into hidden entries.")
    noise: float = setting(
        0.0,
        "Gaussian noise standard deviation σ (for a variance v: √v).",
        metavar="NUMBER",
        minimum=0.0,
        meaning="a standard deviation",
        hint=" (for a noise variance v, pass √v)",
    )
    noise_clip: bool = setting(
        False,
        "Clamp noisy queries to [0, 1] after the noise, as the paper's released code does (for "
        "pixels stored in [0, 1]).",
    )
    occlude: float = setting(
        0.0,
        "Side of a square hidden at a random place of each image query (set to --fill), as a "
        "fraction of the image's shorter side, in [0, 1].",
        **_FRACTION,
    )
    salt_pepper: float = setting(
        0.0,
        "Fraction of each query's entries set to its largest or smallest value (salt-and-pepper "
        "noise), in [0, 1].",
        **_FRACTION,
    )
    flip: float = setting(
        0.0,
        "Fraction of each query's entries flipped (±1 patterns: −x; 0/1 patterns: 1 − x), in "
        "[0, 1].",
        **_FRACTION,
    )

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True, kw_only=True)
class IndexSettings:
    """An approximate index written by `nph index` and how it is searched."""

    path: str = setting(
        None,  # required: an index needs its file
        "Approximate index built by `nph index` for this memory (topk, sparse, entmax): "
        "candidates from the index, their scores exact; for a shard manifest, the KIND of its "
        "shard indexes (ivf, ivfpq, ...); see docs/ann.md, docs/ann-shards.md.",
        name="index",
        kind="path",
        refused={"sweep": "an index belongs to one memory file, and a sweep draws its memories"},
    )
    nprobe: int | None = setting(
        None, f"With an ivf/ivfpq --index: lists searched [default: {DEFAULT_NPROBE}].", **_SEARCH
    )
    ef: int | None = setting(
        None, f"With an hnsw --index: search breadth [default: {DEFAULT_EF}].", **_SEARCH
    )
    candidates: int | None = setting(
        None,
        f"With --index: candidates per query [default: max({DEFAULT_CANDIDATES}, topk's k)].",
        **_SEARCH,
    )
    check_exact: int = setting(
        DEFAULT_CHECK_EXACT,
        "With --index: compare this many seeded queries with exact retrieval (recall@k, pattern "
        "and error differences); 0 skips it.",
        minimum=0,
        refused=_SEARCH["refused"],
    )

    def __post_init__(self) -> None:
        if self.path is None:
            raise NphError("an index needs its file: --index PATH")
        check_settings(self)
        if self.nprobe is not None and self.ef is not None:
            raise NphError("choose one of --nprobe (ivf, ivfpq) and --ef (hnsw)")


@dataclass(frozen=True, kw_only=True)
class RetrieveSettings:
    """Everything that decides a retrieval run, apart from the memory and own queries. Each
    argument is the option of the same name (`nph retrieve --help`); `params` holds the model's
    parameters by name, e.g. `RetrieveSettings(model="topk", params={"k": 10},
    corruption=Corruption(noise=0.5), queries=100)`."""

    model: str = setting(
        "dense",
        "Retrieval model (`nph models` lists them with their parameters, which are options "
        "too). Any setting option takes a comma list (e.g. --model dense,topk --k 1,5 "
        "--noise 0,0.5): every combination is evaluated on the memory read once.",
        group="model",
    )
    params: dict[str, Any] = field(default_factory=dict)  # model parameters; unset: its default
    seed: int = setting(
        0,
        "Seed of every random choice the command makes (samples, queries, corruption, the "
        "model's own randomness); same seed, same output.",
        minimum=0,
    )
    queries: int | None = setting(
        None, "Use N queries drawn with the seed [default: all].", minimum=1
    )
    corruption: Corruption = nested(Corruption, group="corruption")  # applied to every query
    device: str = setting("cpu", "cpu, cuda, cuda:N, mps or auto.", group="device")
    dtype: str = setting(
        "float32",
        f"{', '.join(COMPUTE_DTYPES)}: the dtype of memories and queries during retrieval.",
        choices=COMPUTE_DTYPES,
        group="device",
    )
    tf32: bool = setting(
        False,
        "float32 matrix products on TF32 tensor cores (CUDA, Ampere and later): faster, relative "
        "error ~1e-3 instead of ~1e-6. Off by default.",
        group="device",
    )
    batch_size: int | None = setting(
        None, "Queries per model call [default: all; models bound their own memory].", minimum=1
    )
    repeat: int = setting(1, "Time the retrieval N times; report min and median.", minimum=1)
    memory_budget: int | None = setting(
        None,
        "Working memory of the model and of the metrics' nearest-pattern search, in bytes, "
        "e.g. 64M or 2GiB (K/M/G = 1024-based) "
        f"[default: {size_text(DEFAULT_MEMORY_BUDGET)}]; changes speed, not results.",
        kind="size",
        minimum=1,
    )
    index: IndexSettings | None = nested(IndexSettings, group="index", optional=True)

    def __post_init__(self) -> None:
        model_card(self.model)
        check_settings(self)
        if not isinstance(self.params, Mapping) or not all(isinstance(k, str) for k in self.params):
            raise NphError(
                f"params must be a dict of parameter names, e.g. {{'k': 10}}, got {self.params!r}"
            )
        if not isinstance(self.corruption, Corruption):
            raise NphError(
                f"corruption must be a Corruption, e.g. nph.Corruption(noise=0.5), got "
                f"{self.corruption!r}"
            )
        if self.index is not None and not isinstance(self.index, IndexSettings):
            raise NphError(f"index must be an IndexSettings or None, got {self.index!r}")

    @property
    def budget(self) -> int:
        """Bytes of working memory: `memory_budget`, or the default."""
        return self.memory_budget or DEFAULT_MEMORY_BUDGET


@dataclass(frozen=True, kw_only=True)
class Spread:
    """How a request's work is spread over processes and threads."""

    workers: int = setting(
        1,
        "Run on N local processes (gloo; NCCL with a GPU each), each reading its own shards of a "
        "--memory manifest from `nph shard`; results equal one process's. Under torchrun, leave "
        "at 1.",
        minimum=1,
        refused={"batch": _ONE_PROCESS, "sweep": _SWEEP_DRAWS},
    )
    timeout: float = setting(
        120.0,
        "Seconds each exchange between ranks (--workers, torchrun) waits for the others before "
        "every rank stops with an error naming the rank. A rank that stops answering is reported "
        "when the others next need it plus this timeout (plus about 2 s to stop --workers), not "
        "this long after it stopped.",
        minimum=0.1,  # shorter ends before any rank can answer; 0 reached gloo as a C++ abort
        maximum=1e6,  # about 11.6 days; 1e20 overflowed the timedelta torch is given
        refused={"batch": _ONE_PROCESS, "sweep": _SWEEP_DRAWS},
    )
    threads: int | None = setting(
        None, THREADS_HELP, minimum=1, refused={"batch": _WHOLE_PROCESS, "sweep": _WHOLE_PROCESS}
    )

    def __post_init__(self) -> None:
        check_settings(self)


_NOT_IN_BATCH: Limits = {"refused": {"batch": _JSON_ONLY, "sweep": _ROWS}}


@dataclass(frozen=True, kw_only=True)
class OutputSpec:
    """What a request reports and writes."""

    per_query: bool = setting(
        False, "Also report every query's metrics (JSON, CSV or table).", refused={"sweep": _ROWS}
    )
    trace: bool = setting(
        False,
        "Also report, for each of the --steps iterations (recomputed in float64), the energy "
        "E(x_t) and ‖T(x_t) − x_t‖ (JSON `trace`, or a table); docs/theory.md, 'Energies'.",
        **_NOT_IN_BATCH,
    )
    json: bool = setting(
        False,
        "Print JSON (one object) instead of a table.",
        refused={"batch": "it always prints JSON Lines", "sweep": _ROWS},
    )
    csv: bool = setting(False, "Print a CSV header and one row per setting.", **_NOT_IN_BATCH)
    no_header: bool = setting(
        False, "With --csv: omit the header, for appending to a file.", **_NOT_IN_BATCH
    )
    out: Path | None = output_field_setting(
        "Save retrieved patterns, nearest stored index and queries: .safetensors or .npz, as the "
        "extension says.",
        **_NOT_IN_BATCH,
    )
    save_grid: Path | None = setting(
        None,
        "Picture of corrupted / retrieved / target for the first queries, one retrieved row per "
        "setting, rows labelled: .png, .jpg or .webp, as the extension says.",
        **_NOT_IN_BATCH,
    )
    scale: int = setting(2, "With --save-grid: enlarge every image pixel N times.", **_NOT_IN_BATCH)
    force: bool = setting(False, "Replace output files that exist.", **_NOT_IN_BATCH)

    def __post_init__(self) -> None:
        check_settings(self)
        if self.json and self.csv:
            raise NphError("choose one of --json and --csv")
        if self.no_header and not self.csv:
            raise NphError("--no-header goes with --csv")
        if self.out is not None and self.save_grid is not None:
            if Path(self.out).resolve() == Path(self.save_grid).resolve():
                raise NphError("--out and --save-grid name the same file")

    def files(self) -> list[Path]:
        return [Path(path) for path in (self.out, self.save_grid) if path is not None]


@dataclass(frozen=True, kw_only=True)
class AnalysisOptions:
    """`nph analyze`'s own options (beside the retrieval options it shares)."""

    theorem_k: float | None = setting(
        None,
        "Support size k in the conditions: a count ≥ 1 or a fraction of M [default: M, dense; "
        "with --model, the model's support]. The model's own k is --k.",
        above=0,
    )
    sample: int = setting(
        2000,
        "Use a seeded sample of this many patterns for R and Δ when M is larger; 0 uses every "
        "pattern (R is then exact).",
        minimum=0,
    )
    fixed_point: int = setting(
        0,
        "With --model: also iterate N steps from each corrupted query, and dense retrieval "
        "beside it, and count fixed points, energy descent and final errors (Corollary 4.3); 0 "
        f"skips it. With --capacity: the iterations run to reach a fixed point (0 means "
        f"{CAPACITY_STEPS}).",
        minimum=0,
        meaning="a number of steps",
    )
    per_pattern: bool = setting(False, "List Δ_μ and the well-separation verdict of every pattern.")
    per_query: bool = setting(False, "With --model: list every query's check.")

    def __post_init__(self) -> None:
        check_settings(self)
