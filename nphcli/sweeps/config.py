"""What a sweep runs: a grid read from a preset, a TOML file or command-line options.

Its keys (docs/sweeps.md, "Grids") are the sweep's own (`OWN_FIELDS`), the retrieval fields and
the model parameters, read and checked exactly as `nph retrieve` and `nph batch` read them: one
value, or a list for several. Precedence, lowest first: defaults, the file's top level, its
`[datasets.<name>]` table for the chosen dataset, command-line options (a model parameter given
there replaces the [[models]] tables' values). Reading a file imports no torch.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from nphcli.core.errors import NphError
from nphcli.core.suggest import did_you_mean
from nphcli.schema.fields import check_keys, default, fields, get_field
from nphcli.schema.option import Field

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# The sweep's own keys, declared as fields so that their values are read and checked like the
# retrieval fields' (their group only says whether a key takes a list: setting groups do).
OWN_FIELDS = (
    Field("description", "str", None, "Text for people; shown nowhere.", group="input"),
    Field(
        "dataset",
        "str",
        "mnist",
        "mnist, cifar10, fashion-mnist, random, or a file `nph store` reads; memories are drawn "
        "from it.",
        group="input",
    ),
    Field(
        "normalize", "str", None, "minmax, centered, zscore, l2 or none, as in nph store.", "input"
    ),
    Field("sizes", "int", 100, "Memory sizes M, e.g. 10,50,100.", group="run", minimum=1),
    Field("trials", "int", 1, "Memories drawn per size, each a trial.", group="input", minimum=1),
    Field(
        "noise_variance", "float", None, "Noise variances v (σ = √v).", "corruption", minimum=0.0
    ),
)
_OWN = {f.name: f for f in OWN_FIELDS}
TABLES = ("models", "datasets")  # the file's tables: [[models]] and [datasets.<name>]
# Keys a [datasets.<name>] table may not hold: they choose the dataset or the models.
_NOT_PER_DATASET = ("description", "dataset", "model", *TABLES)


@dataclass(frozen=True)
class ModelSpec:
    """One model of the grid with its own list of values per parameter ([[models]] table)."""

    name: str  # a registered model name
    grid: dict[str, list[Any]] = field(default_factory=dict)  # parameter → values, file order

    def settings(self) -> list[dict[str, Any]]:
        """Every combination of the parameter values (the first parameter varies slowest)."""
        import itertools

        names = list(self.grid)
        return [
            dict(zip(names, combo, strict=True)) for combo in itertools.product(*self.grid.values())
        ]


@dataclass
class SweepConfig:
    """A resolved sweep: every value checked, lists never empty."""

    dataset: str  # source name or file path
    models: list[ModelSpec]
    sizes: list[int]  # memory sizes M
    trials: int  # memories drawn per size
    seed: int  # the sweep's single seed
    values: dict[str, list[Any]]  # retrieval fields and model parameters given → their values
    normalize: str | None = None  # None: the source's default
    root: str | None = None  # dataset root folder (datasets only)
    origin: str = "options"  # where the grid came from: "preset NAME", a file, or "options"
    noise_variance: list[float] | None = None  # the variances σ was computed from, if given so

    def values_of(self, name: str) -> list[Any]:
        """The values of retrieval field `name`: as given, else its default alone."""
        return self.values.get(name, [default(name)])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (for `--json` and the results' provenance): every field a
        sweep takes with its values, and the model parameters given for every model."""
        out = {
            "origin": self.origin,
            "dataset": self.dataset,
            "normalize": self.normalize,
            "models": [{"name": m.name, **m.grid} for m in self.models],
            "sizes": self.sizes,
            "trials": self.trials,
            "seed": self.seed,
            "noise_variance": self.noise_variance,
        }
        for f in fields(setting=True, surface="sweep"):
            if f.name not in ("model", "seed"):
                out[f.name] = self.values_of(f.name)
        out.update({name: v for name, v in self.values.items() if name not in out})
        return out


def own_field(name: str) -> Field:
    """The field of one of the sweep's own keys (sizes, trials, ...)."""
    return _OWN[name]


def _preset_folder():
    return resources.files("nphcli") / "presets"


def list_presets() -> list[str]:
    """Names of the presets shipped with nph (their .toml files in nphcli/presets/)."""
    folder = _preset_folder()
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def _source(preset: str | None, config: str | Path | None) -> tuple[str, str] | None:
    """(text, origin) of the --preset or --config file (not both); None when neither is given."""
    if preset is not None and config is not None:
        raise NphError("choose one of --preset and --config")
    if preset is not None:
        if preset not in list_presets():
            raise NphError(
                f"unknown preset {preset!r}; choose one of: {', '.join(list_presets())} "
                "(or give your own file with --config)"
            )
        return (_preset_folder() / f"{preset}.toml").read_text(encoding="utf-8"), f"preset {preset}"
    if config is None:
        return None
    path = Path(config)
    if not path.is_file():
        raise NphError(f"config file {path} not found")
    try:
        return path.read_text(encoding="utf-8"), str(config)
    except (OSError, UnicodeDecodeError) as error:
        raise NphError(f"cannot read config file {path}: {error}") from None


def source_text(preset: str | None, config: str | Path | None) -> str:
    """The text of the --preset or --config file (`--print-config`), ending in a newline."""
    source = _source(preset, config)
    if source is None:
        raise NphError("--print-config shows a --preset or --config file; name one")
    return source[0] if source[0].endswith("\n") else source[0] + "\n"


def parse(text: str, origin: str) -> dict[str, Any]:
    """Parse sweep TOML and check its keys (values are checked by `resolve`)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise NphError(f"{origin} is not valid TOML: {error}") from None
    _check_table_keys(data, origin, own=(*_OWN, *TABLES))
    if "model" in data and "models" in data:
        raise NphError(f"{origin}: give the models as `model = [...]` or [[models]], not both")
    datasets = data.get("datasets", {})
    if not isinstance(datasets, dict):
        raise NphError(f"{origin}: 'datasets' must be a table of [datasets.<name>] tables")
    for name, table in datasets.items():
        if not isinstance(table, dict):
            raise NphError(f"{origin}: [datasets.{name}] must be a table")
        per_dataset = [key for key in _OWN if key not in _NOT_PER_DATASET]
        _check_table_keys(table, f"{origin} [datasets.{name}]", own=per_dataset, model=False)
    return data


def _check_table_keys(table: dict, where: str, *, own, model: bool = True) -> None:
    """Refuse unknown keys, and retrieval fields a sweep refuses (with the reason)."""
    rest = [key for key in table if key not in own]
    unknown = [key for key in rest if get_field(key) is None or (key == "model" and not model)]
    if unknown:
        known = [*own, *(f.name for f in fields(surface="sweep"))]
        raise NphError(
            f"{where}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], known)}; keys are "
            f"{', '.join(own)}, the retrieval "
            'fields and model parameters (README, "Sweeps"; `nph models`)'
        )
    check_keys(rest, "sweep", where)


def load(preset: str | None = None, config: str | Path | None = None) -> tuple[dict, str]:
    """The parsed file of `preset` or `config` (not both), and its origin; ({}, "options")
    when neither is given."""
    source = _source(preset, config)
    return ({}, "options") if source is None else (parse(*source), source[1])


def resolve(
    data: dict[str, Any], origin: str, given: dict[str, Any], *, root: str | None = None
) -> SweepConfig:
    """Merge defaults, the file, its table for the chosen dataset and `given` (the options
    given, as file values: a value or a list) into a checked `SweepConfig`."""
    where = origin if origin == "options" else f"{origin} or the options"
    _check_table_keys(given, "the options", own=list(_OWN))
    top = {k: v for k, v in data.items() if k not in ("description", "datasets")}
    dataset = str(given.get("dataset", top.get("dataset", _OWN["dataset"].default)))
    table = data.get("datasets", {}).get(dataset, {})
    merged: dict[str, Any] = {}
    for layer, name in ((top, origin), (table, f"{origin} [datasets.{dataset}]"), (given, where)):
        merged.update(_noise_from(layer, name))
    tables = merged.pop("models", None)
    models = _models(merged.pop("model", None), tables, given, where)
    sizes = _own_values(merged.pop("sizes", [_OWN["sizes"].default]), "sizes", where)
    (trials,) = _own_values(merged.pop("trials", _OWN["trials"].default), "trials", where)
    normalize = _own_values(merged.pop("normalize", None), "normalize", where)[0]
    variance = merged.pop("noise_variance", None)
    merged.pop("dataset", None)
    # Errors name the key as its option, the flag a user also sees on the command line.
    values = {
        key: get_field(key).from_json(v, f"{where}: {get_field(key).flag}")
        for key, v in merged.items()
    }
    seeds = values.pop("seed", [default("seed")])
    if len(seeds) != 1:
        raise NphError(f"{where}: a sweep takes one seed (each trial derives its own), got {seeds}")
    _check_params(values, models, where)
    for queries in values.get("queries", []):
        if queries is not None and queries > min(sizes):
            raise NphError(
                f"{where}: queries = {queries} exceeds the smallest memory size {min(sizes)}"
            )
    return SweepConfig(
        dataset=dataset,
        models=models,
        sizes=sizes,
        trials=trials,
        seed=seeds[0],
        values=values,
        normalize=normalize,
        root=None if root is None else str(root),
        origin=origin,
        noise_variance=variance,
    )


def _own_values(value: Any, key: str, where: str) -> list[Any]:
    return _OWN[key].from_json(value, f"{where}: {key}")


def _models(names: Any, tables: Any, given: dict[str, Any], where: str) -> list[ModelSpec]:
    """The grid's models: named by `model` (the options' or the file's), else [[models]]
    tables, else dense. A model parameter given as an option replaces the tables' values."""
    if names is not None:
        return [ModelSpec(_card(name).name) for name in get_field("model").from_json(names, where)]
    if tables is None:
        return [ModelSpec(default("model"))]
    if not isinstance(tables, list) or not tables:
        raise NphError(f"{where}: models must be a non-empty list of [[models]] tables")
    declared = {f.name for f in fields()}
    replaced = {key for key in given if key not in declared and key not in _OWN}
    return [_model_spec(entry, where, replaced=replaced) for entry in tables]


def _model_spec(entry: Any, where: str, *, replaced: set[str]) -> ModelSpec:
    """A checked ModelSpec: a registered name, parameters it takes, values of the right type."""
    if not isinstance(entry, dict) or "name" not in entry:
        raise NphError(f'{where}: every [[models]] entry needs a name, e.g. name = "dense"')
    name = entry["name"]
    if not isinstance(name, str):
        raise NphError(f"{where}: a model name must be a string, got {name!r}")
    card = _card(name)
    grid: dict[str, list[Any]] = {}
    for key, raw in entry.items():
        if key == "name" or key in replaced:
            continue
        if not card.takes(key):
            takes = [p.name for p in card.params]
            raise NphError(
                f"{where}: model {name!r} has no parameter {key!r}{did_you_mean(key, takes)}; "
                f"it takes {', '.join(takes)}"
            )
        grid[key] = get_field(key).from_json(raw, f"{where}: model {name!r} {key}")
    return ModelSpec(name, grid)


def _check_params(values: dict[str, list], models: list[ModelSpec], where: str) -> None:
    """A model parameter given for the whole grid must be taken by one of its models."""
    from nphcli.schema.catalog import model_cards

    declared = {f.name for f in fields()}
    for name in values:
        if name in declared or any(_card(m.name).takes(name) for m in models):
            continue
        takers = [card.name for card in model_cards() if card.takes(name)]
        listed = ", ".join(m.name for m in models)
        raise NphError(
            f"{where}: no model of the grid ({listed}) takes {name!r}; "
            + (f"it is taken by {', '.join(takers)}" if takers else "no model takes it")
        )


def _card(name: str):
    from nphcli.schema.catalog import model_card

    return model_card(name.strip())


def _noise_from(table: dict[str, Any], where: str) -> dict[str, Any]:
    """`table` with noise_variance v turned into noise σ = √v (and kept for the record)."""
    out = dict(table)
    if "noise_variance" in out:
        if "noise" in out:
            raise NphError(f"{where}: give noise (σ) or noise_variance (σ²), not both")
        variances = _own_values(out["noise_variance"], "noise_variance", where)
        out["noise"] = [math.sqrt(v) for v in variances]
        out["noise_variance"] = variances
    elif "noise" in out:
        out["noise_variance"] = None
    return out
