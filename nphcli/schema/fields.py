"""The fields of a retrieval run, declared once.

Every surface that describes a retrieval derives from `FIELDS` and the model catalog: the
options of `nph retrieve` (generated from them, help text included), the keys of an `nph batch`
job, the keys of a sweep file, and the checks that a value is of the right type and range. A
field that a surface cannot take is refused there by name, with the reason (`Field.refused`).

Many values, one syntax: any setting field (and any model parameter) takes several values, as a
comma list on the command line (`--k 1,5 --noise 0,0.5`) or as a list in a JSON job or a sweep file
(`"k": [1, 5]`, `k = [1, 5]`); every combination is one setting (`nphcli.evaluation.settings`).

Torch-free, so that building the command line reads no torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePath
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
from nphcli.core.suggest import did_you_mean

# Groups of fields, in the order `--help` shows them. Those of SETTING_GROUPS decide a setting
# (what `RetrieveSettings` holds); the others say what is read, how the work is spread and what
# is written.
GROUPS = (
    *("input", "model", "corruption", "run", "device", "index", "distributed", "output"),
    "analysis",
)
SETTING_GROUPS = ("model", "corruption", "run", "device", "index")
# Where a field's value goes (`Field.holder`): the object that holds it, built by routing every
# field of that holder into it (`nphcli.schema.holders`), never by a list of names.
#   run: `RetrieveSettings` itself; corruption: its `Corruption`; index: its `IndexSettings`;
#   input: `InputSpec`; output: `OutputSpec`; request: `RetrieveRequest` (how work is spread);
#   analysis: `AnalysisRequest` (`nph analyze`'s own options, `ANALYSIS_FIELDS`).
HOLDERS = ("run", "corruption", "index", "input", "output", "request", "analysis")
_GROUP_HOLDER = {
    "input": "input",
    "model": "run",
    "corruption": "corruption",
    "run": "run",
    "device": "run",
    "index": "index",
    "distributed": "request",
    "output": "output",
    "analysis": "analysis",
}

_KIND_WORDS = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "str": "text",
    "path": "a file name",
    "size": "a size in bytes",
    "indices": "a list of whole numbers",
}


@dataclass(frozen=True)
class Field:
    """One option of a retrieval run: its name is the key in JSON jobs, sweep files and the
    Python API; its flag on the command line is `--` + the name with `-` for `_`."""

    name: str
    kind: str  # int, float, bool, str, path, size (bytes; text such as 64M) or indices
    default: Any  # None: unset (the help says what that means)
    help: str  # one sentence for `--help`, the CLI reference and the docs
    group: str = "run"  # one of GROUPS
    minimum: float | None = None  # numbers: smallest value allowed (inclusive)
    above: float | None = None  # numbers: values must exceed this (exclusive)
    choices: tuple[str, ...] | None = None  # text: the values allowed
    refused: dict[str, str] = field(default_factory=dict)  # surface → why it refuses the field
    metavar: str | None = None
    maximum: float | None = None  # numbers: largest value allowed (inclusive)
    meaning: str | None = None  # what a value is, for errors: "a fraction", "a standard deviation"
    hint: str = ""  # said after a range error, e.g. how to convert a variance
    holder: str | None = None  # one of HOLDERS; None: the group's (`destination`)
    attribute: str | None = None  # its name in the holder; None: the field's name
    short: str | None = None  # a one-letter flag beside the long one, e.g. -o

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"field {self.name!r}: unknown group {self.group!r}")
        if self.destination not in HOLDERS:
            raise ValueError(f"field {self.name!r}: unknown holder {self.holder!r}")

    @property
    def destination(self) -> str:
        """The holder the value goes to (see HOLDERS)."""
        return self.holder or _GROUP_HOLDER[self.group]

    @property
    def key(self) -> str:
        """The field's attribute in its holder."""
        return self.attribute or self.name

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def setting(self) -> bool:
        """Whether the field decides a setting (and so takes many values: a comma list on the
        command line, a list in a file)."""
        return self.group in SETTING_GROUPS

    @property
    def many(self) -> bool:
        return self.setting

    def from_text(self, text: str) -> list[Any]:
        """The value(s) of `--FLAG TEXT`: a comma list for fields that take many values."""
        if self.kind == "indices":
            return [self.check(_indices(text, self.flag))]
        parts = [part.strip() for part in text.split(",")] if self.many else [text.strip()]
        values = [self.check(self._parse(part, text)) for part in parts]
        if self.many and len(values) > 1 and self.kind in ("path",):
            raise NphError(f"{self.flag} takes one value, got {text!r}")
        return values

    def one_from_text(self, text: str) -> Any:
        """One value of `--FLAG TEXT`, commas and all: a command's own option whose text is one
        value, even a list it reads itself (`nph mil --models dense,sparse`)."""
        if self.kind == "indices":
            return self.check(_indices(text, self.flag))
        return self.check(self._parse(text.strip(), text, listed=False))

    def from_json(self, value: Any, where: str) -> list[Any]:
        """The value(s) of a JSON or TOML value: a list means several values, for fields that
        take many (`where` names the key for the error)."""
        if self.kind == "indices":
            return [self.check(value, where)]
        if isinstance(value, list):
            if not self.many:
                raise NphError(f"{where} takes one value, got a list {value!r}")
            if not value:
                raise NphError(f"{where} needs at least one value")
            return [self.check(self._coerce(v, where), where) for v in value]
        return [self.check(self._coerce(value, where), where)]

    def check(self, value: Any, where: str | None = None) -> Any:
        """`value` if it is of this field's type and range (None is 'unset'); NphError else."""
        where = where or self.flag
        if value is None:
            return None
        if self.kind in ("int", "size"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise NphError(f"{where} must be {_KIND_WORDS[self.kind]}, got {value!r}")
        elif self.kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise NphError(f"{where} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise NphError(f"{where} must be a finite number, got {value!r}")
            value = float(value)
        elif self.kind == "bool":
            if not isinstance(value, bool):
                raise NphError(f"{where} must be true or false, got {value!r}")
        elif self.kind == "indices":
            if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value
            ):
                raise NphError(f"{where} must be a list of whole numbers, got {value!r}")
        elif not (isinstance(value, str) or self.kind == "path" and isinstance(value, PurePath)):
            raise NphError(f"{where} must be {_KIND_WORDS[self.kind]}, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise NphError(f"{where} must be one of {', '.join(self.choices)}, got {value!r}")
        low, high = self.minimum, self.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            raise NphError(f"{where} must be {self._range()}, got {value!r}{self.hint}")
        if self.above is not None and value <= self.above:
            raise NphError(f"{where} must be > {self.above:g}, got {value!r}{self.hint}")
        return value

    def _range(self) -> str:
        """The allowed range in words: 'a fraction in [0, 1]', 'a whole number ≥ 1', '≥ 0'."""
        noun = self.meaning or ("a whole number" if self.kind in ("int", "size") else "")
        noun = f"{noun} " if noun else ""
        if self.minimum is not None and self.maximum is not None:
            return f"{noun}in [{self.minimum:g}, {self.maximum:g}]"
        if self.minimum is not None:
            return f"{noun}≥ {self.minimum:g}"
        return f"{noun}≤ {self.maximum:g}"

    def _parse(self, part: str, text: str, *, listed: bool = True) -> Any:
        """One piece of command-line text as this field's type (`listed`: the text may be a
        comma list of such pieces)."""
        try:
            if self.kind == "int":
                return int(part)
            if self.kind == "float":
                return float(part)
            if self.kind == "size":
                return parse_size(part, self.flag)
            if self.kind == "bool":
                return _boolean(part, self.flag)
        except ValueError:
            several = " (or a comma list of them)" if self.many and listed else ""
            raise NphError(
                f"{self.flag} takes {_KIND_WORDS[self.kind]}{several}, got {text!r}"
            ) from None
        return part

    def _coerce(self, value: Any, where: str) -> Any:
        """A JSON/TOML value as this field's type: 5 for a float field is 5.0, and a size may be
        written as text ("64M")."""
        if self.kind == "float" and type(value) is int:
            return float(value)
        if self.kind == "size" and isinstance(value, str):
            return parse_size(value, where)
        return value


def parse_size(text: str, flag: str = "--memory-budget") -> int:
    """Bytes from a size such as 1048576, 64K, 256M, 1.5G or 512MiB (K, KB and KiB alike are
    powers of 1024, any letter case); NphError naming `flag` unless it is ≥ 1 byte."""
    match = re.fullmatch(
        r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmg])(?:i?b)?|b)?\s*", text, re.IGNORECASE
    )
    if match is None:
        raise NphError(
            f"{flag} must be a size in bytes such as 1048576, 64K, 256M or 2GiB, got {text!r}"
        )
    number, unit = match.groups()
    scale = 1024 ** (" kmg".index(unit.lower()) if unit else 0)
    size = float(number) * scale
    if size < 1 or size != int(size):
        raise NphError(f"{flag} must be a whole number of bytes ≥ 1, got {text!r}")
    return int(size)


INDEX_FILE_LIMIT = 64 << 20  # bytes of an @FILE of indices: about 10^7 numbers


def _indices(text: str, flag: str) -> list[int]:
    """Whole numbers separated by commas or spaces, e.g. "3,17,42"; `@FILE` reads them from a
    text file (commas, spaces or one a line)."""
    if text.startswith("@"):
        text = _index_file(text[1:], flag)
    parts = [part for part in text.replace(",", " ").split() if part]
    try:
        return [int(part) for part in parts]
    except ValueError:
        raise NphError(f"{flag} must be whole numbers separated by commas, got {text!r}") from None


def _index_file(name: str, flag: str) -> str:
    import os

    try:
        if os.path.getsize(name) > INDEX_FILE_LIMIT:
            raise NphError(f"{flag} @{name}: the file is over {INDEX_FILE_LIMIT >> 20} MiB")
        with open(name, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or "not UTF-8 text"
        raise NphError(f"{flag} @{name}: cannot read it ({reason})") from None


def _boolean(text: str, flag: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise NphError(f"{flag} takes true or false, got {text!r}")


_SWEEP_DRAWS = "a sweep draws its memories and queries from its dataset"
_ONE_PROCESS = "it runs every job in this one process; use `nph retrieve --workers` per setting"
_JSON_ONLY = "it prints one JSON object per setting; use `nph retrieve` for files and tables"
_ROWS = "a sweep writes one row per run to its --out results file"
_WHOLE_PROCESS = "threads are the whole process's: give --threads to the command"
# Declared here once; commands whose options are not generated (sweep, batch, analyze, mil) build
# their --threads from this text (`nphcli.cli.options.Threads`).
THREADS_HELP = (
    "CPU threads torch computes with (also $NPH_THREADS) [default: 1 for nph sweep, whose runs "
    "are small; else one per core]. Changes speed, not the setting (float32 sums may round "
    "differently in the last bits); on a busy machine, or beside other nph runs, use 1."
)


def output_field(help_text: str, default: Any = None, *, name: str = "out", **extra: Any) -> Field:
    """The file or folder a command writes, the same option in every command: `-o, --out PATH`
    (`name` for a flag of its own, e.g. shard's --out-dir), in the output panel. `help_text`
    says what is written there; `extra` are further Field settings (e.g. `refused`)."""
    return Field(name, "path", default, help_text, group="output", short="-o", **extra)


FIELDS: tuple[Field, ...] = (
    # What is read.
    Field(
        "memory",
        "path",
        "memory.safetensors",
        "Memory file written by `nph store`, or a shard manifest from `nph shard`.",
        group="input",
        refused={"sweep": _SWEEP_DRAWS},
    ),
    Field(
        "queries_file",
        "path",
        None,
        "Own queries, one per row: any file `nph store` reads (.npy, .npz, .csv, .safetensors, "
        ".pt, a folder of images).",
        group="input",
        refused={"sweep": _SWEEP_DRAWS},
    ),
    Field(
        "query_text",
        "str",
        None,
        "A text to recall from, embedded with the memory's own embedder (a memory stored from "
        "texts with --embed; docs/text.md). For several, a .txt or .jsonl --queries-file.",
        group="input",
        refused={"sweep": _SWEEP_DRAWS},
    ),
    Field(
        "targets_file",
        "path",
        None,
        "Targets for own queries, one row per query (Q, d_v).",
        group="input",
        refused={"sweep": _SWEEP_DRAWS},
    ),
    Field(
        "target_indices",
        "indices",
        None,
        "Stored row of each own query's target, e.g. 3,17,42, or @FILE: a text file of them "
        "(commas, spaces or one a line).",
        group="input",
        refused={"sweep": _SWEEP_DRAWS},
    ),
    Field(
        "stream",
        "bool",
        False,
        "Read the memory file from disk block by block instead of loading it, so a file larger "
        "than RAM can be searched.",
        group="input",
        refused={"sweep": _SWEEP_DRAWS},
    ),
    # What decides one setting.
    Field(
        "model",
        "str",
        "dense",
        "Retrieval model (`nph models` lists them with their parameters, which are options "
        "too). Any setting option takes a comma list (e.g. --model dense,topk --k 1,5 "
        "--noise 0,0.5): every combination is evaluated on the memory read once.",
        group="model",
    ),
    Field(
        "seed",
        "int",
        0,
        "Seed of every random choice the command makes (samples, queries, corruption, the "
        "model's own randomness); same seed, same output.",
        minimum=0,
    ),
    Field("queries", "int", None, "Use N queries drawn with the seed [default: all].", minimum=1),
    Field(
        "mask",
        "float",
        0.0,
        "Fraction of each query to hide, in [0, 1].",
        metavar="NUMBER",
        group="corruption",
        minimum=0.0,
        maximum=1.0,
        meaning="a fraction",
    ),
    Field(
        "mask_mode",
        "str",
        None,
        "bottom, top, left, right (images) or random [default: bottom for images, random for "
        "vectors].",
        choices=("bottom", "top", "left", "right", "random"),
        group="corruption",
    ),
    Field("fill", "float", 0.0, "Value written into hidden entries.", group="corruption"),
    Field(
        "noise",
        "float",
        0.0,
        "Gaussian noise standard deviation σ (for a variance v: √v).",
        metavar="NUMBER",
        group="corruption",
        minimum=0.0,
        meaning="a standard deviation",
        hint=" (for a noise variance v, pass √v)",
    ),
    Field(
        "noise_clip",
        "bool",
        False,
        "Clamp noisy queries to [0, 1] after the noise, as the paper's released code does (for "
        "pixels stored in [0, 1]).",
        group="corruption",
    ),
    Field(
        "occlude",
        "float",
        0.0,
        "Side of a square hidden at a random place of each image query (set to --fill), as a "
        "fraction of the image's shorter side, in [0, 1].",
        metavar="NUMBER",
        group="corruption",
        minimum=0.0,
        maximum=1.0,
        meaning="a fraction",
    ),
    Field(
        "salt_pepper",
        "float",
        0.0,
        "Fraction of each query's entries set to its largest or smallest value (salt-and-pepper "
        "noise), in [0, 1].",
        metavar="NUMBER",
        group="corruption",
        minimum=0.0,
        maximum=1.0,
        meaning="a fraction",
    ),
    Field(
        "flip",
        "float",
        0.0,
        "Fraction of each query's entries flipped (±1 patterns: −x; 0/1 patterns: 1 − x), in "
        "[0, 1].",
        metavar="NUMBER",
        group="corruption",
        minimum=0.0,
        maximum=1.0,
        meaning="a fraction",
    ),
    Field("device", "str", "cpu", "cpu, cuda, cuda:N, mps or auto.", group="device"),
    Field(
        "dtype",
        "str",
        "float32",
        f"{', '.join(COMPUTE_DTYPES)}: the dtype of memories and queries during retrieval.",
        choices=COMPUTE_DTYPES,
        group="device",
    ),
    Field(
        "tf32",
        "bool",
        False,
        "float32 matrix products on TF32 tensor cores (CUDA, Ampere and later): faster, relative "
        "error ~1e-3 instead of ~1e-6. Off by default.",
        group="device",
    ),
    Field(
        "batch_size",
        "int",
        None,
        "Queries per model call [default: all; models bound their own memory].",
        minimum=1,
    ),
    Field("repeat", "int", 1, "Time the retrieval N times; report min and median.", minimum=1),
    Field(
        "memory_budget",
        "size",
        None,
        "Working memory of the model and of the metrics' nearest-pattern search, in bytes, "
        "e.g. 64M or 2GiB (K/M/G = 1024-based) "
        f"[default: {size_text(DEFAULT_MEMORY_BUDGET)}]; changes speed, not results.",
        minimum=1,
    ),
    Field(
        "index",
        "path",
        None,
        "Approximate index built by `nph index` for this memory (topk, sparse, entmax): "
        "candidates from the index, their scores exact; for a shard manifest, the KIND of its "
        "shard indexes (ivf, ivfpq, ...); see docs/ann.md, docs/ann-shards.md.",
        refused={"sweep": "an index belongs to one memory file, and a sweep draws its memories"},
        group="index",
        attribute="path",
    ),
    Field(
        "nprobe",
        "int",
        None,
        f"With an ivf/ivfpq --index: lists searched [default: {DEFAULT_NPROBE}].",
        minimum=1,
        refused={"sweep": "it goes with --index"},
        group="index",
    ),
    Field(
        "ef",
        "int",
        None,
        f"With an hnsw --index: search breadth [default: {DEFAULT_EF}].",
        minimum=1,
        refused={"sweep": "it goes with --index"},
        group="index",
    ),
    Field(
        "candidates",
        "int",
        None,
        f"With --index: candidates per query [default: max({DEFAULT_CANDIDATES}, topk's k)].",
        minimum=1,
        refused={"sweep": "it goes with --index"},
        group="index",
    ),
    Field(
        "check_exact",
        "int",
        DEFAULT_CHECK_EXACT,
        "With --index: compare this many seeded queries with exact retrieval (recall@k, pattern "
        "and error differences); 0 skips it.",
        minimum=0,
        refused={"sweep": "it goes with --index"},
        group="index",
    ),
    # How the work is spread.
    Field(
        "workers",
        "int",
        1,
        "Run on N local processes (gloo; NCCL with a GPU each), each reading its own shards of a "
        "--memory manifest from `nph shard`; results equal one process's. Under torchrun, leave "
        "at 1.",
        group="distributed",
        minimum=1,
        refused={"batch": _ONE_PROCESS, "sweep": _SWEEP_DRAWS},
    ),
    Field(
        "timeout",
        "float",
        120.0,
        "Seconds each exchange between ranks (--workers, torchrun) waits for the others before "
        "every rank stops with an error naming the rank. A rank that stops answering is reported "
        "when the others next need it plus this timeout (plus about 2 s to stop --workers), not "
        "this long after it stopped.",
        group="distributed",
        minimum=0.1,  # shorter ends before any rank can answer; 0 reached gloo as a C++ abort
        maximum=1e6,  # about 11.6 days; 1e20 overflowed the timedelta torch is given
        refused={"batch": _ONE_PROCESS, "sweep": _SWEEP_DRAWS},
    ),
    Field(
        "threads",
        "int",
        None,
        THREADS_HELP,
        group="distributed",
        minimum=1,
        refused={"batch": _WHOLE_PROCESS, "sweep": _WHOLE_PROCESS},
    ),
    # What is written.
    Field(
        "per_query",
        "bool",
        False,
        "Also report every query's metrics (JSON, CSV or table).",
        group="output",
        refused={"sweep": _ROWS},
    ),
    Field(
        "trace",
        "bool",
        False,
        "Also report, for each of the --steps iterations (recomputed in float64), the energy "
        "E(x_t) and ‖T(x_t) − x_t‖ (JSON `trace`, or a table); docs/theory.md, 'Energies'.",
        group="output",
        refused={"batch": _JSON_ONLY, "sweep": _ROWS},
    ),
    Field(
        "json",
        "bool",
        False,
        "Print JSON (one object) instead of a table.",
        group="output",
        refused={"batch": "it always prints JSON Lines", "sweep": _ROWS},
    ),
    Field(
        "csv",
        "bool",
        False,
        "Print a CSV header and one row per setting.",
        group="output",
        refused={"batch": _JSON_ONLY, "sweep": _ROWS},
    ),
    Field(
        "no_header",
        "bool",
        False,
        "With --csv: omit the header, for appending to a file.",
        group="output",
        refused={"batch": _JSON_ONLY, "sweep": _ROWS},
    ),
    output_field(
        "Save retrieved patterns, nearest stored index and queries: .safetensors or .npz, as the "
        "extension says.",
        refused={"batch": _JSON_ONLY, "sweep": _ROWS},
    ),
    Field(
        "save_grid",
        "path",
        None,
        "Picture of corrupted / retrieved / target for the first queries, one retrieved row per "
        "setting, rows labelled: .png, .jpg or .webp, as the extension says.",
        group="output",
        refused={"batch": _JSON_ONLY, "sweep": _ROWS},
    ),
    Field(
        "scale",
        "int",
        2,
        "With --save-grid: enlarge every image pixel N times.",
        group="output",
        refused={"batch": _JSON_ONLY, "sweep": _ROWS},
    ),
    Field(
        "force",
        "bool",
        False,
        "Replace output files that exist.",
        group="output",
        refused={"batch": _JSON_ONLY, "sweep": _ROWS},
    ),
)
_BY_NAME = {f.name: f for f in FIELDS}

# `nph analyze`'s own options (not retrieve's: its --per-query lists each query's check), held by
# `AnalysisRequest` (`nphcli.theory.analysis`).
ANALYSIS_FIELDS: tuple[Field, ...] = (
    Field(
        "theorem_k",
        "float",
        None,
        "Support size k in the conditions: a count ≥ 1 or a fraction of M [default: M, dense; "
        "with --model, the model's support]. The model's own k is --k.",
        group="analysis",
        above=0,
    ),
    Field(
        "sample",
        "int",
        2000,
        "Use a seeded sample of this many patterns for R and Δ when M is larger; 0 uses every "
        "pattern (R is then exact).",
        group="analysis",
        minimum=0,
    ),
    Field(
        "fixed_point",
        "int",
        0,
        "With --model: also iterate N steps from each corrupted query, and dense retrieval "
        "beside it, and count fixed points, energy descent and final errors (Corollary 4.3); 0 "
        f"skips it. With --capacity: the iterations run to reach a fixed point (0 means "
        f"{CAPACITY_STEPS}).",
        group="analysis",
        minimum=0,
        meaning="a number of steps",
    ),
    Field(
        "per_pattern",
        "bool",
        False,
        "List Δ_μ and the well-separation verdict of every pattern.",
        group="analysis",
    ),
    Field("per_query", "bool", False, "With --model: list every query's check.", group="analysis"),
)


def holder_fields(holder: str) -> list[Field]:
    """Every field whose value goes to `holder` (see HOLDERS), in declared order."""
    if holder not in HOLDERS:
        raise ValueError(f"unknown holder {holder!r}; holders are {', '.join(HOLDERS)}")
    return [f for f in (*FIELDS, *ANALYSIS_FIELDS) if f.destination == holder]


def get_field(name: str, among: Iterable[Field] = ()) -> Field | None:
    """The field called `name` (first among a command's own fields `among`, then the declared
    ones), or a model parameter's field, or None."""
    found = {f.name: f for f in among}.get(name) or _BY_NAME.get(name)
    return found if found is not None else _param_fields().get(name)


def fields(*, setting: bool | None = None, surface: str | None = None) -> list[Field]:
    """The declared fields (not model parameters): all, or only those that decide a setting
    (`setting=True`) or only the others (False); those `surface` (batch, sweep) refuses are left
    out."""
    return [
        f
        for f in FIELDS
        if (setting is None or f.setting == setting)
        and (surface is None or surface not in f.refused)
    ]


def param_fields() -> list[Field]:
    """One field per model parameter (from the model catalog), each taking many values."""
    return list(_param_fields().values())


def default(name: str) -> Any:
    """The default of a declared field (the one place defaults live)."""
    return _BY_NAME[name].default


def refusal(name: str, surface: str) -> str | None:
    """Why `surface` refuses the field `name`, or None if it takes it."""
    found = _BY_NAME.get(name)
    return None if found is None else found.refused.get(surface)


def check_keys(keys: Iterable[str], surface: str, where: str) -> None:
    """Refuse, by name, keys that are no field or model parameter, and fields `surface` refuses
    (with the reason)."""
    params = _param_fields()
    for key in keys:
        reason = refusal(key, surface)
        if reason is not None:
            raise NphError(f"{where} does not take {key!r}: {reason}")
        if key not in _BY_NAME and key not in params:
            taken = [f.name for f in fields(surface=surface)]
            hint = did_you_mean(key, [*taken, *params])
            raise NphError(
                f"{where}: unknown key {key!r}{hint}; keys are {', '.join(taken)} and model "
                "parameters by name (`nph models`)"
            )


def _param_fields() -> dict[str, Field]:
    """Model parameters as fields: their type, default and help from the catalog."""
    from nphcli.schema.catalog import model_cards, param_cards

    total = len(model_cards())
    out = {}
    for card, models in param_cards():
        if card.name in _BY_NAME:  # the run's --seed also seeds a model that takes one
            continue
        takers = "every model" if len(models) == total else ", ".join(models)
        text = card.help[:1].upper() + card.help[1:]
        out[card.name] = Field(
            card.name,
            card.type,
            None,
            f"{text} [model default: {card.default}; taken by {takers}].",
            group="model",
            metavar={"float": "NUMBER", "int": "INTEGER", "bool": "BOOLEAN"}.get(card.type, "TEXT"),
        )
    return out
