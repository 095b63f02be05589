"""What a sweep runs: a grid read from a preset, a TOML file or command-line options.

A sweep grid is models × memory sizes × masks × noise levels × β values, repeated for a number of
trials. The same TOML format serves the shipped presets (`nphcli/presets/*.toml`, listed by
`list_presets`) and the user's own `--config FILE`; `nph sweep --preset NAME --print-config`
prints a preset to copy and edit. Keys (every one optional):

    description = "text"                # shown nowhere but the file; for people
    dataset     = "mnist"               # a source name (mnist, fashion-mnist, cifar10, random)
                                        # or a file nph store reads
    normalize   = "unit"                # as `nph store --normalize` (default: the source's own)
    sizes       = [10, 50, 100]         # memory sizes M
    trials      = 50                    # memories drawn per size
    seed        = 0                     # the sweep's one seed (see nphcli.sweeps.grid)
    beta        = [0.01]                # inverse temperatures β
    mask        = [0.5]                 # fractions hidden
    mask_mode   = "bottom"              # as `nph retrieve --mask-mode`
    fill        = 0.0                   # value of hidden entries
    noise       = [0.0]                 # Gaussian noise standard deviations σ ...
    noise_variance = [0.1, 1.4]         # ... or variances v (σ = √v); not both
    queries     = 100                   # queries per run (default: every stored pattern)
    dtype       = "float32"             # retrieval dtype

    [[models]]                          # one table per model; every other key is one of the
    name = "topk"                       # model's parameters (`nph models`), a value or a list
    k = [0.2, 0.5, 0.8]                 # k as a fraction of M: the paper's top-20/50/80%

    [datasets.cifar10]                  # keys that apply only when the dataset is cifar10
    beta = [0.1]

Precedence, lowest first: built-in defaults, the file's top level, its `[datasets.<name>]` table
for the chosen dataset, command-line options. This module imports no torch: model names and
parameters are checked against the registry only when `resolve` runs.
"""

from __future__ import annotations

import itertools
import math
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from nphcli.defaults import DEFAULT_BETA
from nphcli.errors import NphError
from nphcli.sweeps.parsing import (
    check_keys,
    float_list,
    int_list,
    parse_number,
    typed,
    whole,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Keys allowed at the top level of a sweep file, and inside a [datasets.<name>] table.
TOP_KEYS = (
    "description",
    "dataset",
    "normalize",
    "sizes",
    "trials",
    "seed",
    "beta",
    "mask",
    "mask_mode",
    "fill",
    "noise",
    "noise_variance",
    "noise_clip",
    "queries",
    "dtype",
    "models",
    "datasets",
)
DATASET_KEYS = tuple(
    k for k in TOP_KEYS if k not in ("description", "dataset", "datasets", "models")
)
DEFAULTS: dict[str, Any] = {
    "dataset": "mnist",
    "normalize": None,
    "sizes": [100],
    "trials": 1,
    "seed": 0,
    "beta": [DEFAULT_BETA],  # the retrieve default
    "mask": [0.0],
    "mask_mode": None,
    "fill": 0.0,
    "noise": [0.0],
    "noise_clip": False,
    "queries": None,
    "dtype": "float32",
    "models": [{"name": "dense"}],
}


@dataclass(frozen=True)
class ModelSpec:
    """One model of the grid with a list of values per parameter it sweeps."""

    name: str  # a registered model name
    grid: dict[str, list[Any]] = field(default_factory=dict)  # parameter → values, file order

    def settings(self) -> list[dict[str, Any]]:
        """Every combination of the parameter values (the first parameter varies slowest)."""
        names = list(self.grid)
        return [
            dict(zip(names, combo, strict=True)) for combo in itertools.product(*self.grid.values())
        ]


@dataclass
class SweepConfig:
    """A resolved sweep: every field checked, lists never empty."""

    dataset: str  # source name or file path
    models: list[ModelSpec]
    sizes: list[int]  # memory sizes M
    trials: int  # memories drawn per size
    seed: int  # the sweep's single seed
    beta: list[float]  # inverse temperatures
    mask: list[float]  # fractions hidden
    noise: list[float]  # noise standard deviations σ
    mask_mode: str | None = None  # None: bottom for images, random for vectors
    fill: float = 0.0  # value of hidden entries
    queries: int | None = None  # queries per run; None: every stored pattern
    normalize: str | None = None  # None: the source's default
    dtype: str = "float32"  # retrieval dtype
    device: str = "cpu"  # cpu, cuda, cuda:N, mps or auto
    root: str | None = None  # dataset root folder (datasets only)
    origin: str = "options"  # where the grid came from: "preset NAME", a file, or "options"
    noise_variance: list[float] | None = None  # the variances σ was computed from, if given so
    noise_clip: bool = False  # clamp noisy queries to [0, 1] (corruption.py)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (for `--json` and the results' provenance)."""
        return {
            "origin": self.origin,
            "dataset": self.dataset,
            "normalize": self.normalize,
            "models": [{"name": m.name, **m.grid} for m in self.models],
            "sizes": self.sizes,
            "trials": self.trials,
            "seed": self.seed,
            "beta": self.beta,
            "mask": self.mask,
            "mask_mode": self.mask_mode,
            "fill": self.fill,
            "noise": self.noise,
            "noise_variance": self.noise_variance,
            "noise_clip": self.noise_clip,
            "queries": self.queries,
            "dtype": self.dtype,
            "device": self.device,
        }


def _preset_folder():
    return resources.files("nphcli") / "presets"


def list_presets() -> list[str]:
    """Names of the presets shipped with nph (their .toml files in nphcli/presets/)."""
    folder = _preset_folder()
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def preset_text(name: str) -> str:
    """The TOML text of preset `name`; NphError naming the presets when there is none."""
    if name not in list_presets():
        raise NphError(
            f"unknown preset {name!r}; choose one of: {', '.join(list_presets())} "
            "(or give your own file with --config)"
        )
    return (_preset_folder() / f"{name}.toml").read_text(encoding="utf-8")


def config_text(path: str | Path) -> str:
    """The text of a user's sweep file; NphError when it is missing or unreadable."""
    path = Path(path)
    if not path.is_file():
        raise NphError(f"config file {path} not found")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise NphError(f"cannot read config file {path}: {error}") from None


def parse(text: str, origin: str) -> dict[str, Any]:
    """Parse sweep TOML and check its keys (values are checked by `resolve`)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise NphError(f"{origin} is not valid TOML: {error}") from None
    check_keys(data, TOP_KEYS, origin)
    datasets = data.get("datasets", {})
    if not isinstance(datasets, dict):
        raise NphError(f"{origin}: 'datasets' must be a table of [datasets.<name>] tables")
    for name, table in datasets.items():
        if not isinstance(table, dict):
            raise NphError(f"{origin}: [datasets.{name}] must be a table")
        check_keys(table, DATASET_KEYS, f"{origin} [datasets.{name}]")
    return data


def load(preset: str | None = None, config: str | Path | None = None) -> tuple[dict, str]:
    """The parsed file of `preset` or `config` (not both), and its origin; ({}, "options")
    when neither is given."""
    if preset is not None and config is not None:
        raise NphError("choose one of --preset and --config")
    if preset is not None:
        origin = f"preset {preset}"
        return parse(preset_text(preset), origin), origin
    if config is not None:
        return parse(config_text(config), str(config)), str(config)
    return {}, "options"


def resolve(data: dict[str, Any], origin: str, overrides: dict[str, Any]) -> SweepConfig:
    """Merge defaults, the file, its table for the chosen dataset and `overrides` (CLI options
    that were given; None values are ignored) into a checked `SweepConfig`."""
    given = {key: value for key, value in overrides.items() if value is not None}
    merged = _merge(data, origin, given)
    dataset = merged["dataset"]
    where = origin if origin == "options" else f"{origin} or the options"
    sizes = int_list(merged["sizes"], "sizes", where, minimum=1)
    trials = whole(merged["trials"], "trials", where, minimum=1)
    seed = whole(merged["seed"], "seed", where, minimum=0)
    beta = float_list(merged["beta"], "beta", where, positive=True)
    mask = float_list(merged["mask"], "mask", where)
    noise = float_list(merged["noise"], "noise", where)
    for value in mask:
        if not 0.0 <= value <= 1.0:
            raise NphError(f"{where}: mask values are fractions in [0, 1], got {value}")
    for value in noise:
        if value < 0:
            raise NphError(f"{where}: noise values are standard deviations ≥ 0, got {value}")
    queries = _queries(merged["queries"], sizes, where)
    fill = merged["fill"]
    if isinstance(fill, bool) or not isinstance(fill, (int, float)) or not math.isfinite(fill):
        raise NphError(f"{where}: fill must be a finite number, got {fill!r}")
    if not isinstance(merged["noise_clip"], bool):
        raise NphError(f"{where}: noise_clip must be true or false, got {merged['noise_clip']!r}")
    for key in ("mask_mode", "normalize", "dtype", "dataset"):
        value = merged[key]
        if value is not None and not isinstance(value, str):
            raise NphError(f"{where}: {key} must be a string, got {value!r}")
    models = merged["models"]
    if isinstance(models, str):
        models = parse_models(models)
    else:
        models = [_model_spec(entry, where) for entry in _table_list(models, where)]
    return SweepConfig(
        dataset=dataset,
        models=models,
        sizes=sizes,
        trials=trials,
        seed=seed,
        beta=beta,
        mask=mask,
        noise=noise,
        mask_mode=merged["mask_mode"],
        fill=float(fill),
        queries=queries,
        normalize=merged["normalize"],
        dtype=merged["dtype"],
        device=str(given.get("device", "cpu")),
        root=None if given.get("root") is None else str(given["root"]),
        origin=origin,
        noise_variance=merged.get("noise_variance") if "noise" not in given else None,
        noise_clip=merged["noise_clip"],
    )


def _merge(data: dict[str, Any], origin: str, given: dict[str, Any]) -> dict[str, Any]:
    """Defaults, then the file's top level, its table for the chosen dataset, and `given`."""
    merged: dict[str, Any] = dict(DEFAULTS)
    top = {k: v for k, v in data.items() if k not in ("description", "datasets")}
    merged.update(_noise_from(top, origin))
    dataset = str(given.get("dataset", merged["dataset"]))
    table = data.get("datasets", {}).get(dataset, {})
    merged.update(_noise_from(table, f"{origin} [datasets.{dataset}]"))
    merged.update(given)
    merged["dataset"] = dataset
    return merged


def _queries(queries: Any, sizes: list[int], where: str) -> int | None:
    """Queries per run: None for every stored pattern, else at most the smallest memory."""
    if queries is None:
        return None
    queries = whole(queries, "queries", where, minimum=1)
    if queries > min(sizes):
        raise NphError(
            f"{where}: queries = {queries} exceeds the smallest memory size {min(sizes)}"
        )
    return queries


def parse_models(text: str) -> list[ModelSpec]:
    """`--models` text: comma-separated models, each `name` or `name:param=v1/v2/...`, e.g.
    `dense,sparse,topk:k=0.2/0.5/0.8,random:k=0.5:seed=3`."""
    specs = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, *params = (piece.strip() for piece in item.split(":"))
        entry: dict[str, Any] = {"name": name}
        for param in params:
            key, sep, values = param.partition("=")
            if not sep or not key.strip() or not values.strip():
                raise NphError(
                    f"--models: cannot read {param!r} in {item!r}; write name:param=v1/v2, "
                    "e.g. topk:k=0.2/0.5/0.8"
                )
            entry[key.strip()] = [parse_number(v.strip()) for v in values.split("/")]
        specs.append(_model_spec(entry, "--models"))
    if not specs:
        raise NphError("--models names no model; e.g. --models dense,topk:k=0.2/0.5")
    return specs


def _model_spec(entry: Any, where: str) -> ModelSpec:
    """A checked ModelSpec: a registered name, parameters it takes, values of the right type."""
    from nphcli.models import get_model_info

    if not isinstance(entry, dict) or "name" not in entry:
        raise NphError(f'{where}: every [[models]] entry needs a name, e.g. name = "dense"')
    name = entry["name"]
    if not isinstance(name, str):
        raise NphError(f"{where}: a model name must be a string, got {name!r}")
    info = get_model_info(name)  # NphError for unknown names, listing the registry
    types = {p.name: p.type for p in info.params}
    grid: dict[str, list[Any]] = {}
    for key, raw in entry.items():
        if key == "name":
            continue
        if key == "beta":
            raise NphError(
                f"{where}: set beta for the whole grid (top-level `beta` or --beta), not in "
                f"model {name!r}"
            )
        if key not in types:
            takes = ", ".join(p for p in types if p != "beta")
            raise NphError(f"{where}: model {name!r} has no parameter {key!r}; it takes {takes}")
        values = raw if isinstance(raw, list) else [raw]
        if not values:
            raise NphError(f"{where}: model {name!r}: {key} has no values")
        grid[key] = [typed(v, types[key], f"{where}: model {name!r} {key}") for v in values]
    spec = ModelSpec(name, grid)
    for params in spec.settings():  # the models' own checks (e.g. k > 0), before any work
        info.cls(**params)
    return spec


def _table_list(models: Any, where: str) -> list:
    if not isinstance(models, list) or not models:
        raise NphError(f"{where}: models must be a non-empty list of [[models]] tables")
    return models


def _noise_from(table: dict[str, Any], where: str) -> dict[str, Any]:
    """`table` with noise_variance v turned into noise σ = √v (and kept for the record)."""
    out = dict(table)
    if "noise_variance" in out:
        if "noise" in out:
            raise NphError(f"{where}: give noise (σ) or noise_variance (σ²), not both")
        variances = float_list(out["noise_variance"], "noise_variance", where)
        if any(v < 0 for v in variances):
            raise NphError(f"{where}: noise_variance values must be ≥ 0")
        out["noise"] = [math.sqrt(v) for v in variances]
        out["noise_variance"] = variances
    elif "noise" in out:
        out["noise_variance"] = None
    return out
